"""Shared fixtures: every buffer kind behind one factory, and integer-coded frames.

A frame of segment `b` at add `t` carries the code `1000 * b + t` in every field,
so that any returned item can be checked to be whole and to be the right one.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import zlib
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TF-Agents 0.19 builds its networks with Keras 2: on TensorFlow 2.16+ that is tf-keras, chosen by this
# variable before Keras is first used, where tf-keras is installed (TensorFlow 2.15 has Keras 2 anyway).
if importlib.util.find_spec("tf_keras") is not None:  # with TensorFlow 2.15 the variable would break Keras
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tfbuffers

tfbuffers.quiet_start_up()  # first: TensorFlow imported without the start-up lines about absent hardware

# isort: split
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import settings

import tfbuffers.kinds
import tfbuffers.specs
import tfbuffers.state
import tfbuffers.storage
from tfbuffers.testing import contract
from tfbuffers.testing.contract import (
    SPEC,
    BufferKind,
    FunctionWrapped,
    assert_whole,
    batch,
    code,
    fill,
    frames,
    fresh_spec,
    make,
    make_buffer,
    new_directory,
    to_numpy,
    underlying,
)
from tfbuffers.testing.contract.remote import RAY_KIND, RAY_SKIPS, REVERB_KIND, REVERB_SKIPS

# TensorFlow runs graph calls on as many inter-op threads as the machine has cores (2 here). A graph call that waits
# inside an op (a host buffer's `tf.numpy_function`, a graph writer waiting its turn) holds one, and a test's threads,
# or one that an earlier test of the same worker left waiting out its timeout, can hold them all: any graph call of
# the process then waits (docs/concurrency.md, "Threads"). The tests run with more threads than cores, at least 16:
# with 8, a CI run's `test_graph_calls_waiting_in_an_op_leave_the_others_running` saw one of its two calls not
# reach its op in 30 s (2026-11-29, the machine at a load of 4): probably the other threads held by earlier waits.
INTER_OP_THREADS = max(16, (os.cpu_count() or 1) + 2)
tf.config.threading.set_inter_op_parallelism_threads(INTER_OP_THREADS)

# The contract's frames, kinds and helpers (`tfbuffers.testing.contract`), which the tests import from here.
__all__ = [
    "RAY_KIND",
    "RAY_SKIPS",
    "REVERB_KIND",
    "REVERB_SKIPS",
    "SPEC",
    "BufferKind",
    "FunctionWrapped",
    "assert_whole",
    "batch",
    "code",
    "fill",
    "frames",
    "fresh_spec",
    "make",
    "make_buffer",
    "new_directory",
    "to_numpy",
    "underlying",
]

# The fixtures' folders (tests/data/before_*): their make.py scripts are run by hand, as each says, not collected.
collect_ignore = ["data"]

# Hypothesis profiles (tests/fuzz_test.py, the one module that draws examples): "thorough" for `make test`, "ci"
# for .ci/run (TFBUFFERS_HYPOTHESIS=ci: a sixth of the examples on each of its two stacks, new ones each run, so a
# CI run draws a third of them, every machine on both stacks, and runs add up).
settings.register_profile("thorough", max_examples=30)
settings.register_profile("ci", max_examples=5)
settings.load_profile(os.environ.get("TFBUFFERS_HYPOTHESIS", "thorough"))


def _buffer_kinds() -> dict[str, BufferKind]:
    """The contract's kinds: tfbuffers' own, and the storages and sampler written here, one entry each.

    `contract.builtin_kinds()` are the registry's kinds of any data spec (ids without "_uniform": "tf", "py"),
    frame stacks and memory maps; `contract.with_storage` and `contract.with_sampler` add the parts written here.
    """
    kinds = [
        *contract.builtin_kinds(),
        contract.with_storage("py_dict", "py_uniform", DictStorage),
        contract.with_storage("tf_dict", "tf_uniform", DictVariables),
        # A sampler written here (`KeptAddsUniform`, stateful), on each buffer: one entry each.
        contract.with_sampler("py_kept", "py_uniform", KeptAddsUniform),
        contract.with_sampler("tf_kept", "tf_uniform", KeptAddsUniform),
    ]
    contract.register(*kinds)
    return {kind.name: kind for kind in kinds}


class DictStorage(tfbuffers.storage.Storage):
    """A storage written here, with only what `Storage` requires: each field's rows in a dict by path.

    It joins every multi-buffer test through its entry in `_buffer_kinds`, with no buffer class written for it.
    """

    def __init__(self, fields: Any, num_rows: int) -> None:
        super().__init__(fields, num_rows)
        self.rows = {
            field.path: np.zeros([num_rows, *field.spec.shape.as_list()], field.spec.dtype.as_numpy_dtype)
            for field in fields
        }

    def write_rows(self, index: int, first_row: int, rows: np.ndarray) -> None:
        self.rows[self.fields[index].path][first_row : first_row + len(rows)] = rows

    def read(self, rows: np.ndarray, fields: Any = None) -> list[np.ndarray]:
        chosen = range(len(self.fields)) if fields is None else fields
        return [self.rows[self.fields[index].path][rows] for index in chosen]

    def nbytes(self) -> int:
        return sum(array.nbytes for array in self.rows.values())


class DictVariables(tfbuffers.storage.GraphStorage):
    """A graph storage written here, with only what `GraphStorage` requires: each field's rows flattened, by path.

    A dict of `[num_rows, elements]` variables, one per field path: reads gather and reshape to the field's
    shape, writes reshape and scatter. It joins every multi-buffer test through its entry in `_buffer_kinds`.
    """

    def __init__(self, fields: Any, num_rows: int, device: str) -> None:
        super().__init__(fields, num_rows, device)
        self.rows = {
            field.path: tf.Variable(
                tf.zeros([num_rows, field.spec.shape.num_elements()], field.spec.dtype), trainable=False
            )
            for field in fields
        }

    def row_variables(self) -> list[tf.Variable]:
        return list(self.rows.values())

    def read(self, rows: Any, fields: Any = None) -> list[tf.Tensor]:
        chosen = range(len(self.fields)) if fields is None else fields
        return [
            tf.reshape(
                tf.gather(self.rows[self.fields[i].path], rows),
                tf.concat([tf.shape(rows, out_type=tf.int64), self.fields[i].spec.shape.as_list()], 0),
            )
            for i in chosen
        ]

    def write_field(self, index: int, rows: Any, values: Any) -> Any:
        flat = tf.reshape(values, [-1, self.fields[index].spec.shape.num_elements()])
        return self.rows[self.fields[index].path].scatter_update(tf.IndexedSlices(flat, rows))


NEWEST = 2


class NewestAdds(tfbuffers.sampling.Sampler):
    """A sampler written here: uniform over the windows that start in each segment's newest `NEWEST` adds.

    Its draws say their mass (the windows' count), so the Ray buffer weighs its segments by it. sampling_test,
    ray_replay_buffer_test and manager_test pass it as `sampler=` to each buffer that takes one.
    """

    keeps_episode_boundaries = False

    def sample(self, backend: Any, added: Any, sample_batch_size: Any, num_steps: Any) -> Any:
        shape = [] if sample_batch_size is None else [sample_batch_size]
        first, windows, checks = self.stored_windows(backend, added, num_steps)
        low = backend.ops.maximum(first, first + windows - NEWEST * self.batch_size)
        count = first + windows - low
        starts = backend.uniform_integers([*shape, 1], low, first + windows, checks)
        ids = starts + backend.ops.arange(num_steps or 1, self.batch_size)
        ids = ids if num_steps else ids[..., 0]
        rows = ids % (self.max_length * self.batch_size)
        return tfbuffers.sampling.Sample(ids, rows, backend.full_inverse(shape, count), mass=count)


class KeptAddsUniform(tfbuffers.sampling.UniformSampler):
    """A sampler written here that keeps state: each storage row's add number, told by the buffer's events.

    Uniform as `UniformSampler`, whose draws it checks against its state: every drawn row must hold the add its
    id names (`id // batch_size`), or the sample fails naming the sampler. So a missed or misordered add, clear or
    restore fails the contract cases on it. Its state is an extra of the storage (`storage.extra`), a numpy array
    on the host and a variable in the graph; a restore rebuilds it from the counter, so states and files need not
    carry it. It joins every multi-buffer test through its entries in `_buffer_kinds` (`py_kept`, `tf_kept`).
    """

    MISMATCH = "KeptAddsUniform: a drawn row does not hold the add its id names"

    def bind(self, storage: Any, backend: Any, step_field: Any) -> None:
        super().bind(storage, backend, step_field)
        self.kept = storage.extra("kept_adds", np.full([self.batch_size * self.max_length], -1, np.int64))

    def on_add(self, added: Any, rows: Any) -> list[Any]:
        events = super().on_add(added, rows)
        if not self._graph:
            self.kept[rows] = added
            return events
        return [*events, self.kept.scatter_update(tf.IndexedSlices(tf.fill([self.batch_size], added), rows))]

    def on_clear(self) -> list[Any]:
        events = super().on_clear()
        if not self._graph:
            self.kept[:] = -1
            return events
        return [*events, self.kept.assign(tf.fill([self.batch_size * self.max_length], tf.constant(-1, tf.int64)))]

    def restore_targets(self) -> list[Any]:
        return [*super().restore_targets(), self.kept]

    def on_restore(self, added: Any, step_types: Any, extras: Any) -> list[Any]:
        values = super().on_restore(added, step_types, extras)
        # Position p of each segment holds the newest add a < added with a % max_length == p (-1 for none).
        positions = np.arange(self.max_length)
        newest = added - 1 - (added - 1 - positions) % self.max_length
        kept = np.repeat(np.where(newest >= 0, newest, -1), self.batch_size).astype(np.int64)
        if self._graph:
            return [*values, kept]
        np.copyto(self.kept, kept)
        return values

    def sample(self, backend: Any, added: Any, sample_batch_size: Any, num_steps: Any) -> Any:
        sample = super().sample(backend, added, sample_batch_size, num_steps)
        holds = backend.tree.gather(self.kept, sample.rows) == sample.ids // self.batch_size
        if not self._graph:
            backend.require(np.all(holds), self.MISMATCH)
            return sample
        holds = tf.reduce_all(holds)
        if sample.valid is True:
            return sample._replace(valid=holds, invalid_message=self.MISMATCH)
        message = backend.select(sample.valid, self.MISMATCH, sample.invalid_message)
        return sample._replace(valid=holds & sample.valid, invalid_message=message)


# Every local kind in tfbuffers.kinds joins every contract, cross-check, fuzz, files and concurrency test here.
BUFFER_KINDS = _buffer_kinds()


HAS_REVERB = importlib.util.find_spec("reverb") is not None
HAS_RAY = importlib.util.find_spec("ray") is not None
# The contract suite's kinds: every local kind, Reverb on the stack that has it (the pinned one) and Ray (run on the
# current stack, on a local cluster the first buffer starts), with the cases each cannot support skipped, saying why
# (`contract.remote.REVERB_SKIPS`, `RAY_SKIPS`).
contract.register(REVERB_KIND, RAY_KIND)


# (source, target) kinds whose states restore into each other: a TF buffer's into a py buffer and back.
RESTORABLE = [
    (source, target)
    for source in BUFFER_KINDS
    for target in BUFFER_KINDS
    if BUFFER_KINDS[source].state_format == BUFFER_KINDS[target].state_format
]
# (source, target) kinds of different formats: every restore between them is refused.
UNRESTORABLE = [
    (source, target)
    for source in BUFFER_KINDS
    for target in BUFFER_KINDS
    if BUFFER_KINDS[source].state_format != BUFFER_KINDS[target].state_format
]

# Each buffer kind called eagerly and with every call inside `tf.function`.
KINDS = [f"{name}_{mode}" for name in BUFFER_KINDS for mode in ("eager", "function")]
UNIFORM_KINDS = [kind for kind in KINDS if BUFFER_KINDS[kind.rsplit("_", 1)[0]].uniform]
CONTRACT_KINDS = [
    *KINDS,
    *(["reverb_eager", "reverb_function"] if HAS_REVERB else []),
    *(["ray_eager", "ray_function"] if HAS_RAY else []),  # marked `ray`: run on the current stack (MARKER_STACK)
]


# The TF and Ray kinds' buffers of SPEC, kept on a shelf per worker process between tests (`contract.Shelf`): a test
# that asks `make_buffer` for one made alike gets a kept one, cleared, instead of a new one whose every `tf.function`
# traces again, or whose actor starts again (the Ray cases took 103 s without the shelf, 27 s with it, measured on 2
# cores). `--every-combination` runs without the shelf.
SHELVED_KINDS = ("tf", "tf_prioritized", "tf_dict", "tf_kept", "ray")
_PASSED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Records whether a test's call passed, for `_shelve_tf_buffers`."""
    report = yield
    if report.when == "call":
        item.stash[_PASSED] = report.passed
    return report


def pytest_configure(config: pytest.Config) -> None:
    contract.shelf = None if config.getoption("--every-combination") else contract.Shelf(SHELVED_KINDS)


@pytest.fixture(autouse=True)
def _shelve_tf_buffers(request: pytest.FixtureRequest) -> Any:
    """After each test, its TF buffers back on the shelf if it passed (`contract.make_buffer`)."""
    yield
    if contract.shelf is not None:
        contract.shelf.returned(request.node.stash.get(_PASSED, False))


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    tf.random.set_seed(1234)
    return request.param


@pytest.fixture(params=UNIFORM_KINDS)
def uniform_kind(request: pytest.FixtureRequest) -> str:
    """The kinds whose sampling is uniform: the contract's cases that assert uniform probabilities."""
    tf.random.set_seed(1234)
    return request.param


# Docstring examples (in tfbuffers/, collected with the tests) that need dm-reverb, which installs on the
# pinned stack only. The hook sees every collected item, the package's doctests included.
NEEDS_REVERB = ("tfbuffers/remote/reverb/buffer.py", "tfbuffers/manager.py")


# Modules marked slow as a whole: those whose tests start processes, train agents, run notebooks, soak or fuzz,
# and the long parametrized suites beyond the contract (prioritized, episodes, files, cross-checks, statistics,
# observers, Reverb). `make test-fast` (`-m "not slow"`) runs the rest, the contract suite and the unit tests (less
# SLOW_TESTS and SLOW_KINDS below), in about 80 seconds; make test runs everything of its stack.
SLOW_MODULES = {
    "actors_test.py",
    "colabs_test.py",
    "composition_test.py",
    "collect_test.py",
    "concurrency_test.py",
    "cross_check_test.py",
    "episodes_test.py",
    "files_test.py",
    "fuzz_test.py",
    "hygiene_test.py",
    "keras_test.py",
    "manager_test.py",
    "observers_test.py",
    "packaging_test.py",
    "prioritized_test.py",
    "ray_replay_buffer_test.py",
    "replay_server_test.py",
    "reverb_replay_buffer_test.py",
    "sampling_stats_test.py",
    "scripts_test.py",
    "tf_agents_examples_test.py",
    "tf_agents_tests_test.py",
    "timeout_test.py",
}


# The covering design over buffer kind x execution mode x case (docs/development.md, "Tests"). A
# kind-mode parameter ("<kind>_eager", "<kind>_function") crosses every case with every kind in both modes. What
# the mode changes is the execution layer of the buffer's class: TFUniformReplayBuffer's graph calls (GraphCalls
# eagerly, the caller's trace inside tf.function) and PyUniformReplayBuffer's host bridge (tfbuffers.host). The
# two kinds that are those classes as they are ("tf", "py") run every case in both modes. Every other kind is one
# of them with another storage (py_frames, py_dict, py_memmap, tf_dict), sampler and priorities (the prioritized
# kinds) or home (Reverb and Ray, through the same host bridge), none of which the mode reaches: each runs every case
# in one mode, the two modes alternating over cases and, for one case, over kinds. So every (case, kind), (case, mode)
# and (kind, mode) pair still runs; `--every-combination` runs the whole cross product.
CORE_KINDS = ("tf", "py")
COVERED_KINDS = (
    "tf_prioritized",
    "py_prioritized",
    "py_frames",
    "py_dict",
    "py_memmap",
    "reverb",
    "tf_dict",
    "py_kept",
    "tf_kept",
    "ray",
)
MODES = ("eager", "function")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--every-stack",
        action="store_true",
        help="tfbuffers: run here the long runs kept to the other stack too (conftest.py ONE_STACK)",
    )
    parser.addoption(
        "--full-size-notebooks",
        action="store_true",
        help="tfbuffers: run the notebooks in a kernel at the sizes they ship with, not the tests' small ones",
    )
    parser.addoption(
        "--every-combination",
        action="store_true",
        help="tfbuffers: run every case on every buffer kind in both modes, each on a new buffer (conftest.py)",
    )


def kind_and_mode(item: pytest.Item) -> tuple[str, str] | None:
    """The buffer kind and mode a test item runs on (its "<kind>_<mode>" parameter), or None."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    for value in params.values():
        if isinstance(value, str) and value.endswith(tuple(f"_{mode}" for mode in MODES)):
            name, mode = value.rsplit("_", 1)
            if name in BUFFER_KINDS or name in (REVERB_KIND.name, RAY_KIND.name):
                return name, mode
    return None


def covered(item: pytest.Item) -> bool:
    """Whether the covering design runs `item`: core kinds always, other kinds in the mode their case draws."""
    found = kind_and_mode(item)
    if found is None or found[0] not in COVERED_KINDS:
        return True
    name, mode = found
    case = item.nodeid.replace(f"{name}_{mode}", "")  # the case: the test and its other parameters
    return MODES[(zlib.crc32(case.encode()) + COVERED_KINDS.index(name)) % 2] == mode


# The two stacks (the Makefile's rule: Python 3.11 is the pinned one). Both run the contract and unit suites whole;
# a few long runs, whose code is the same on both stacks (processes, threads, files, Ray), run on one stack only
# (docs/development.md, "Tests"; `--every-stack` runs them here too): the notebooks in a kernel, the
# benchmark's smoke runs and the Reverb-backed tests on the pinned stack; the long kill, soak and stress runs, and
# Ray, on the current one. A key is a module, a test function ("module::function") or one of its cases
# ("module::function[id]"); the most specific key found decides, "both" undoing a wider key.
STACK = "pinned" if sys.version_info[:2] == (3, 11) else "current"
ONE_STACK = {
    "colabs_test.py::test_notebook_runs_in_a_kernel": "pinned",
    # Each notebook's cells and checks at small sizes on the current stack (Colab's); on the pinned stack a kernel
    # runs every cell (small, or at full size with --full-size-notebooks), and the checks only where the pinned
    # stack adds a backend (Reverb).
    "colabs_test.py::test_notebook_runs": "current",
    "colabs_test.py::test_notebook_runs[reverb_and_scaling.ipynb]": "both",
    "scripts_test.py::test_quick_benchmark_completes_and_writes_its_outputs": "pinned",  # Reverb's peers too
    # The harness's check of itself (TF-Agents' buffers against their own tests), where TF-Agents' pins install;
    # both stacks run TF-Agents' tests against tfbuffers.
    "tf_agents_tests_test.py::test_against_tf_agents_itself_every_test_passes": "pinned",
    "scripts_test.py::test_the_atari_workload_stores_frame_stacks_and_compares_them": "pinned",
    # The peers run in processes of their own environments, the same on either stack.
    "scripts_test.py::test_the_benchmark_measures_flashbax_in_its_own_env": "pinned",
    "scripts_test.py::test_the_benchmark_measures_torchrl_in_its_own_env": "pinned",
    "scripts_test.py::test_a_seeded_dqn_run_repeats_exactly_and_prints_only_its_results": "pinned",
    # The thread tests on the stack whose workers start no Ray cluster: on the current one, CI's runs saw graph calls
    # wait past 30 s for their ops twice (2026-11-29), probably starved by the other worker's Ray processes.
    "concurrency_test.py": "pinned",
    "memmap_test.py::test_a_writer_killed_at_random_moments_loses_no_returned_add_and_tears_nothing": "current",
    "files_test.py::test_a_save_killed_at_random_moments_leaves_the_previous_or_the_new_file": "current",
    "files_test.py::test_saves_beside_a_writer_are_consistent_snapshots": "current",
    "scripts_test.py::test_a_short_soak_checks_frames_and_records_memory": "current",
    "scripts_test.py::test_the_quick_sweep_measures_every_local_kind_at_every_point": "current",
    "scripts_test.py::test_the_her_comparison_writes_its_table_and_figure": "current",
}
# Tests marked `ray` (a local Ray cluster) run on the current stack, as the Reverb ones run on the pinned stack; the
# pinned stack installs the wheel with the ray extra and runs a Ray buffer from it (tests/project/packaging_test.py).
MARKER_STACK = {"ray": "current"}


def one_stack(item: pytest.Item) -> str | None:
    """The one stack `item` runs on (ONE_STACK, MARKER_STACK), or None for both."""
    module = item.path.name
    function = f"{module}::{getattr(item, 'originalname', item.name)}"
    case = f"{module}::{item.name}"
    for key in (case, function, module):
        if key in ONE_STACK:
            return None if ONE_STACK[key] == "both" else ONE_STACK[key]
    return next((stack for marker, stack in MARKER_STACK.items() if item.get_closest_marker(marker)), None)


# Tests that need an optional dependency, by module (the rest carry the marker themselves: the contract's and the
# manager's Reverb cases, the scripts' and the actors' runs on a server): `pytest -m "not reverb"` and the like.
NEEDS = {
    "reverb": ("reverb", {"reverb_replay_buffer_test.py", "replay_server_test.py"}),
    "ray": ("ray", {"ray_replay_buffer_test.py"}),
    "offline": ("minari", {"offline_test.py"}),
}


# Tests of the fast modules marked slow too, so that `make test-fast` fits its 90 s (docs/development.md): those
# that start processes, and the multi-kind cases on the TF prioritized kind, whose traces take a third of the fast
# subset's time (its own module, tests/sampling/prioritized_test.py, and make test run them; storage_test.py and
# compat_test.py keep its priorities and restores in the fast subset), and on the TF test storage (14 s more; the
# TF buffer's code is the "tf" kind's, and storage_test.py keeps its own cases fast).
SLOW_TESTS = {
    "memmap_test.py::test_a_directory_reopened_in_another_process_holds_the_buffer_and_goes_on",
    "memmap_test.py::test_one_writer_a_second_is_refused_naming_the_directory_and_process",
    "memmap_test.py::test_a_killed_writer_releases_the_directory",
    "memmap_test.py::test_anonymous_resident_memory_stays_under_a_tenth_of_the_stored_bytes",
    "sum_tree_test.py::test_numba_is_used_unless_switched_off",
    "compat_test.py::test_a_ray_buffer_saved_or_mapped_before_the_composition_loads_and_reopens",  # a Ray cluster
    # Each starts a Python that imports TensorFlow (or mkdocs): what import tfbuffers and quiet_start_up change.
    "hygiene_test.py::test_quiet_start_up_keeps_tensorflows_start_up_lines_off",
    "hygiene_test.py::test_importing_tfbuffers_changes_nothing_in_the_process",
    "hygiene_test.py::test_quiet_start_up_keeps_the_programs_warnings_filters_in_front",
    "readme_test.py::test_the_api_reference_builds_with_warnings_as_errors_and_covers_every_public_module",
}
SLOW_KINDS = ("tf_prioritized", "tf_dict", "tf_kept", "ray")
KEEP_SLOW_KINDS_FAST = ("storage_test.py", "compat_test.py")  # the modules whose slow kinds' cases stay fast


def on_a_slow_kind(item: pytest.Item) -> bool:
    """Whether `item` is a case on a kind of SLOW_KINDS: a "<kind>_<mode>" parameter, or the kind's bare name."""
    found = kind_and_mode(item)
    if found is not None:
        return found[0] in SLOW_KINDS
    params = getattr(getattr(item, "callspec", None), "params", {}).values()
    return item.path.name not in KEEP_SLOW_KINDS_FAST and any(
        value in SLOW_KINDS for value in params if isinstance(value, str)
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks slow and dependency-needing tests, skips those this stack cannot run saying why, keeps the covering design.

    The docstring examples whose dependency this stack lacks are skipped too.
    """
    skips = {
        marker: pytest.mark.skip(reason=f"needs the {marker} extra ({module} does not import here)")
        for marker, (module, _) in NEEDS.items()
        if importlib.util.find_spec(module) is None
    }
    if "reverb" in skips:
        skips["reverb"] = pytest.mark.skip(reason="dm-reverb installs on the pinned stack only (Python 3.11)")
    kept, deselected = [], []
    for item in items:
        function = f"{item.path.name}::{getattr(item, 'originalname', item.name)}"
        found = kind_and_mode(item)
        if item.path.name in SLOW_MODULES or function in SLOW_TESTS or on_a_slow_kind(item):
            item.add_marker(pytest.mark.slow)
        for marker, (_, modules) in NEEDS.items():
            if item.path.name in modules:
                item.add_marker(marker)
        if found is not None and found[0] in (REVERB_KIND.name, RAY_KIND.name):
            item.add_marker(found[0])  # "reverb" or "ray": the stack that runs it, the extra it needs
        if str(item.path).replace("\\", "/").endswith(NEEDS_REVERB):
            item.add_marker("reverb")
        for marker, skip in skips.items():
            if item.get_closest_marker(marker) is not None:
                item.add_marker(skip)
        stack = one_stack(item)
        if stack not in (None, STACK) and not config.getoption("--every-stack"):
            item.add_marker(pytest.mark.skip(reason=f"runs on the {stack} stack only (tests/conftest.py ONE_STACK)"))
        (kept if config.getoption("--every-combination") or covered(item) else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept
