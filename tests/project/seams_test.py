"""The package's seams: one registry of kinds, and no module reading another object's underscore attributes."""

from __future__ import annotations

import ast
import inspect
import pathlib

import numpy as np
import pytest
import tensorflow as tf

import tfbuffers
from tfbuffers import kinds, sampling

PACKAGE = pathlib.Path(tfbuffers.__file__).parent
NAMEDTUPLE_API = {"_fields", "_replace", "_asdict", "_make"}  # public, underscored so as not to clash with fields


SCRIPTS = PACKAGE.parent / "scripts"


def foreign_reads(source: str) -> list[str]:
    """The reads and writes of another object's underscore attributes in `source`.

    Not `self`'s, `cls`'s or `super()`'s.
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute) or isinstance(node.ctx, ast.Del):
            continue
        if not node.attr.startswith("_") or node.attr.startswith("__") or node.attr in NAMEDTUPLE_API:
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
            continue
        found.append(ast.unparse(node))
    return found


def test_foreign_underscore_reads_are_found_and_own_ones_are_not():
    source = (
        "class A:\n"
        "    def f(self, other):\n"
        "        self._own = other._theirs + self._own + super()._inherited + cls._x\n"
        "        other._written = True\n"
        "        return other.point._replace(x=1), other._more.public, other.__len__()\n"
    )
    assert sorted(foreign_reads(source)) == ["other._more", "other._theirs", "other._written"]


def test_no_module_reads_or_writes_another_objects_underscore_attributes():
    modules = sorted(PACKAGE.rglob("*.py"))
    found = [f"{path.relative_to(PACKAGE)}: {read}" for path in modules for read in foreign_reads(path.read_text())]
    assert found == []


def test_no_script_reads_or_writes_an_underscore_attribute_of_the_package_or_tensorflow():
    scripts = sorted(SCRIPTS.glob("*.py"))
    assert len(scripts) >= 8
    found = [f"{path.name}: {read}" for path in scripts for read in foreign_reads(path.read_text())]
    assert found == []


def imports(package: pathlib.Path) -> dict[str, set[str]]:
    """The package's modules (dotted names) and the package modules each imports, at its top or in a function."""
    modules = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found |= {f"{node.module}.{alias.name}" for alias in node.names} | {node.module}
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
        root = package.name
        graph[name] = {module for module in found if module in modules and module not in (name, root)}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_import_cycles_are_found(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from pkg import a\n")
    (package / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text("def f():\n    import pkg.c\n")  # in a function: still an arrow
    (package / "c.py").write_text("from pkg import a, d\n")
    (package / "d.py").write_text("import os\n")
    assert cycles(imports(package)) == [["pkg.a", "pkg.c", "pkg.sub.b"]]


PARTS = ("tfbuffers.remote.ray", "tfbuffers.remote.reverb")


def test_only_the_public_contract_imports_pytest():
    # tfbuffers.testing.contract's cases are a pytest suite (the `testing` extra); no other module needs pytest.
    importers = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                if any(name.split(".")[0] == "pytest" for name in names):
                    importers.add(path.relative_to(PACKAGE).as_posix())
    assert importers == {"testing/contract/suite.py", "testing/contract/holding.py", "testing/contract/refusing.py"}


def test_no_import_cycle_in_the_package():
    # The remote buffers' shared options and sharding live in tfbuffers.remote: Ray's module does not import
    # Reverb's, nor Reverb's Ray's (they did, each for what the other defined).
    graph = imports(PACKAGE)
    assert cycles(graph) == []
    assert "tfbuffers.reverb_replay_buffer" not in graph["tfbuffers.ray_replay_buffer"]
    assert "tfbuffers.ray_replay_buffer" not in graph["tfbuffers.reverb_replay_buffer"]
    for reverb in [name for name in graph if name.startswith("tfbuffers.remote.reverb")]:
        assert not [module for module in graph[reverb] if "ray" in module.split(".")], reverb
    for ray in [name for name in graph if name.startswith("tfbuffers.remote.ray")]:
        assert not [module for module in graph[ray] if "reverb" in module], ray
    shared = [name for name in graph if name.startswith("tfbuffers.remote") and not name.startswith(PARTS)]
    lower = {
        "tfbuffers.remote.base",
        "tfbuffers.replay_buffer",
        "tfbuffers.execution",
        "tfbuffers.execution.host",
        "tfbuffers.sampling",
    }
    assert {module for name in shared for module in graph[name]} == lower
    for path in (PACKAGE / "remote").glob("*.py"):  # nor Reverb, nor Ray: a name check needs neither
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                assert not [name for name in names if name.split(".")[0] in ("reverb", "ray")], path


def test_a_tf_kind_refuses_a_seed_rather_than_ignoring_it():
    with pytest.raises(ValueError, match=r"seed: expected None for tf_uniform \(the TF kinds draw from TensorFlow's "):
        kinds.make("tf_uniform", {"x": tf.TensorSpec([], tf.int64)}, batch_size=2, max_length=4, seed=3)


@pytest.mark.parametrize("name", sorted(kinds.KINDS))
def test_constructor_options_are_the_public_properties_of_the_same_names(name):
    kind = kinds.get(name)
    signature = inspect.signature(kind.buffer_class.__init__).parameters
    recorded = [
        option
        for option in signature
        if option not in ("self", "data_spec", "capacity", "batch_size", "max_length", "seed", "storage", "sampler")
    ]
    for option in recorded:
        assert isinstance(getattr(kind.buffer_class, option), property), option


def test_every_class_the_package_exports_is_in_the_registry_once():
    exported = {
        name
        for name in tfbuffers.__all__
        if isinstance(getattr(tfbuffers, name), type) and issubclass(getattr(tfbuffers, name), tfbuffers.ReplayBuffer)
    }
    # The base, and the buffers of a Reverb server and of a Ray actor (whose segments are registered py buffers).
    local = exported - {"ReplayBuffer", "ReverbReplayBuffer", "RayReplayBuffer"}
    assert sorted(kind.class_name for kind in kinds.KINDS.values()) == sorted(local)
    for kind in kinds.KINDS.values():
        assert kind.buffer_class is getattr(tfbuffers, kind.class_name)
        assert kinds.BY_CLASS[kind.class_name] is kind


@pytest.mark.parametrize("name", sorted(name for name, kind in kinds.KINDS.items() if kind.any_spec))
def test_a_kind_is_what_the_registry_says(name):
    kind = kinds.get(name)
    seed = 0 if kind.host else None
    buffer = kinds.make(name, {"x": tf.TensorSpec([], tf.int64)}, batch_size=2, max_length=4, seed=seed)
    assert type(buffer).__name__ == kind.class_name
    assert buffer.prioritized is kind.prioritized is hasattr(buffer, "update_priorities")
    buffer.add_batch({"x": np.array([1, 2], np.int64)})
    assert int(buffer.num_frames()) == 2


def test_the_remote_kinds_are_registered_apart_from_the_local_ones():
    # Ray's buffer, one kind per sampler: known to get and make (the contract tests run ray_uniform), never to
    # files, tfbuffers.open or configs, which name local classes (BY_CLASS).
    assert sorted(kinds.REMOTE_KINDS) == ["ray_prioritized", "ray_uniform"]
    for name, kind in kinds.REMOTE_KINDS.items():
        assert kinds.get(name) is kind and not kind.local and kind.host
        assert kind.buffer_class is tfbuffers.RayReplayBuffer
        assert dict(kind.preset) == {"sampler": name.removeprefix("ray_")} and kind.prioritized == (
            "prioritized" in name
        )
    assert "RayReplayBuffer" not in kinds.BY_CLASS and all(kind.local for kind in kinds.KINDS.values())


def test_an_unknown_kind_is_refused_naming_those_there_are():
    with pytest.raises(
        ValueError, match=r"buffer: expected one of \['py_hashed', .*'ray_uniform', .*'tf_uniform'\], got 'ring'"
    ):
        kinds.get("ring")


def test_the_registry_and_files_import_no_buffer_module_and_not_the_package():
    # The classes are imported when asked for (Kind.buffer_class): no import loop through files.
    sources = [PACKAGE / "kinds.py", *sorted((PACKAGE / "files").glob("*.py"))]
    imported = {
        alias.name if isinstance(node, ast.Import) else f"{node.module}.{alias.name}"
        for source in sources
        for node in ast.walk(ast.parse(source.read_text()))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert sorted(
        name for name in imported if name.startswith("tfbuffers") and not name.startswith("tfbuffers.files.")
    ) == ["tfbuffers.kinds", "tfbuffers.prioritized", "tfbuffers.specs", "tfbuffers.state"]


def test_the_preset_constructors_have_the_signatures_users_call_them_by():
    def names(cls):
        return [
            f"{name}={parameter.default!r}" if parameter.default is not inspect.Parameter.empty else name
            for name, parameter in inspect.signature(cls).parameters.items()
        ]

    common = ["dataset_drop_remainder=False", "dataset_window_shift=None", "stateful_dataset=False"]
    assert names(tfbuffers.TFPrioritizedReplayBuffer) == [
        "data_spec",
        "batch_size",
        "max_length=1000",
        "priority_exponent=0.6",
        "scope='TFPrioritizedReplayBuffer'",
        "device='cpu:*'",
        *common,
        "episode_boundaries=False",
        "wait_for_writers=True",
        "storage=None",  # issue 49: a graph storage, as the py buffers take theirs (additive, keyword-only)
    ]
    py_options = ["capacity=None", "batch_size=1", "max_length=None"]
    assert names(tfbuffers.PyPrioritizedReplayBuffer) == [
        "data_spec",
        *py_options,
        "priority_exponent=0.6",
        "seed=None",
        *common,
        "episode_boundaries=False",
        "frame_stacks=None",
        "storage=None",
        "directory=None",
    ]
    assert names(tfbuffers.PyHashedReplayBuffer) == [
        "data_spec",
        "capacity=None",
        "log_interval=None",
        "batch_size=1",
        "max_length=None",
        "seed=None",
        *common,
        "episode_boundaries=False",
    ]


def test_a_preset_constructor_takes_positional_options_and_refuses_unknown_ones():
    spec = {"x": tf.TensorSpec([], tf.int64)}
    buffer = tfbuffers.TFPrioritizedReplayBuffer(spec, 2, 4, 0.5, "mine", "cpu:0", True)
    assert (buffer.priority_exponent, buffer.scope, buffer.device, buffer.dataset_drop_remainder) == (
        0.5,
        "mine",
        "cpu:0",
        True,
    )
    assert buffer.wait_for_writers is True
    with pytest.raises(TypeError) as raised:
        tfbuffers.PyPrioritizedReplayBuffer(spec, 8, sampler=None)
    assert str(raised.value) == (
        "PyPrioritizedReplayBuffer: got an unexpected keyword argument 'sampler'; expected arguments among "
        "['data_spec', 'capacity', 'batch_size', 'max_length', 'priority_exponent', 'seed', 'dataset_drop_remainder', "
        "'dataset_window_shift', 'stateful_dataset', 'episode_boundaries', 'frame_stacks', 'storage', "
        "'directory']"
    )
    with pytest.raises(TypeError, match=r"^PyHashedReplayBuffer: got an unexpected keyword argument 'storage'; "):
        tfbuffers.PyHashedReplayBuffer(spec, 8, storage=None)
    with pytest.raises(TypeError, match=r"^PyPrioritizedReplayBuffer: too many positional arguments; expected "):
        tfbuffers.PyPrioritizedReplayBuffer(spec, 8, 2)


@pytest.mark.parametrize("name", ["py_prioritized", "tf_prioritized"])
def test_a_prioritized_buffer_is_a_uniform_one_holding_priorities(name):
    # A preset, not a subclass per feature: the class spells out its constructor (the uniform buffer's, with
    # priority_exponent, passing a sampling.PrioritizedSampler) and adds update_priorities' argument handling;
    # the writes are the uniform buffer's, and the priorities are its sampler's state, told of every event.
    kind = kinds.get(name)
    defined = {attribute for attribute in vars(kind.buffer_class) if not attribute.startswith("__")} - {"_abc_impl"}
    handling = "_update_value" if kind.host else "_update_tensors"
    assert defined == {"_PRIORITIZED", "priority_exponent", "update_priorities", handling}
    uniform = tfbuffers.PyUniformReplayBuffer if kind.host else tfbuffers.TFUniformReplayBuffer
    assert kind.buffer_class.__mro__[1] is uniform
    assert "__init__" in vars(kind.buffer_class)
    spec = {"x": tf.TensorSpec([], tf.int64)}
    buffer = kinds.make(name, spec, batch_size=2, max_length=4, seed=0 if kind.host else None)
    assert isinstance(buffer.sampler, sampling.PrioritizedSampler)
    assert list(buffer.storage.extras) == ["priority", "max_priority", "sum_tree"]


MODULE_LINES = 600
CLASS_LINES = 350  # docstrings included: a class this long holds more than one concept


def test_no_module_is_over_600_lines_and_no_class_over_350():
    modules, classes = {}, {}
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        modules[str(path.relative_to(PACKAGE))] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                classes[f"{path.relative_to(PACKAGE)}:{node.name}"] = node.end_lineno - node.lineno + 1
    assert {name: lines for name, lines in modules.items() if lines > MODULE_LINES} == {}
    assert {name: lines for name, lines in classes.items() if lines > CLASS_LINES} == {}
