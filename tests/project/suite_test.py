"""The test suite's own machinery (tests/conftest.py): the covering design, one-stack runs, the TF buffers' shelf."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import pathlib
import zlib
from typing import Any

import conftest
import contract_test
import numpy as np
import pytest
from conftest import batch, fill, make_buffer, to_numpy, underlying

from tfbuffers.testing import contract

TESTS = pathlib.Path(__file__).resolve().parents[1]


@dataclasses.dataclass
class Callspec:
    params: dict[str, Any]


@dataclasses.dataclass
class Item:
    """What `conftest.covered` and `conftest.one_stack` read of a pytest item."""

    nodeid: str
    callspec: Callspec
    name: str = ""
    originalname: str = ""
    path: pathlib.Path = TESTS / "contract_test.py"

    def get_closest_marker(self, name: str) -> None:
        return None


def contract_cases() -> list[str]:
    """The contract's test functions that take a buffer kind (`kind` or `uniform_kind`)."""
    return [
        name
        for name, value in vars(contract_test).items()
        if name.startswith("test_") and {"kind", "uniform_kind"} & set(inspect.signature(value).parameters)
    ]


def kept(case: str, kind: str) -> bool:
    return conftest.covered(Item(f"tests/contract_test.py::{case}[{kind}]", Callspec({"kind": kind})))


def test_the_covering_design_runs_every_pair_of_case_kind_and_mode():
    cases = contract_cases()
    assert len(cases) >= 30
    names = [*conftest.BUFFER_KINDS, conftest.REVERB_KIND.name, conftest.RAY_KIND.name]
    assert set(names) == set(conftest.CORE_KINDS) | set(conftest.COVERED_KINDS)
    for case in cases:
        for name in conftest.CORE_KINDS:  # the execution modes' own classes: every case in both modes
            assert all(kept(case, f"{name}_{mode}") for mode in conftest.MODES)
        modes = []
        for name in conftest.COVERED_KINDS:  # every other kind: each case in exactly one mode
            (mode,) = [mode for mode in conftest.MODES if kept(case, f"{name}_{mode}")]
            modes.append(mode)
        assert set(modes) == set(conftest.MODES), case  # and the case in both modes among them
    for name in conftest.COVERED_KINDS:  # each kind in both modes over the cases, about half each
        eager = sum(kept(case, f"{name}_eager") for case in cases)
        assert 0.25 * len(cases) < eager < 0.75 * len(cases), name


def test_the_covering_design_is_one_choice_per_case_on_every_worker():
    # xdist's workers must collect the same items: the choice rests on the node id alone (crc32, not hash()).
    nodeid = "tests/contract_test.py::test_clear[py_memmap_function]"
    case = nodeid.replace("py_memmap_function", "")
    expected = conftest.MODES[(zlib.crc32(case.encode()) + conftest.COVERED_KINDS.index("py_memmap")) % 2]
    assert kept("test_clear", "py_memmap_function") == (expected == "function")
    assert conftest.covered(Item("tests/buffers/specs_test.py::test_x[a-b]", Callspec({"x": "a"})))  # no kind: kept
    assert conftest.kind_and_mode(Item("x", Callspec({"kind": "py_dict_eager", "n": 3}))) == ("py_dict", "eager")
    assert conftest.kind_and_mode(Item("x", Callspec({"name": "not_a_kind_eager"}))) is None


def test_every_one_stack_and_slow_test_key_names_a_test_that_exists():
    for key, stack in [*conftest.ONE_STACK.items(), *((key, "both") for key in conftest.SLOW_TESTS)]:
        assert stack in ("pinned", "current", "both"), key
        module, _, function = key.partition("::")
        (path,) = TESTS.rglob(module)  # module names are unique across the folders
        source = path.read_text()
        if function:
            function = function.split("[")[0]
            functions = {node.name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.FunctionDef)}
            assert function in functions, key


def test_one_stack_takes_the_most_specific_key():
    def item(module: str, function: str, case: str = "") -> Item:
        name = f"{function}[{case}]" if case else function
        return Item(f"tests/{module}::{name}", Callspec({}), name, function, TESTS / module)

    assert conftest.one_stack(item("colabs_test.py", "test_notebook_runs", "tutorial.ipynb")) == "current"
    assert conftest.one_stack(item("colabs_test.py", "test_notebook_runs", "reverb_and_scaling.ipynb")) is None
    assert conftest.one_stack(item("colabs_test.py", "test_notebook_runs_in_a_kernel", "x")) == "pinned"
    assert conftest.one_stack(item("concurrency_test.py", "test_wait_for_writers_must_be_a_bool")) == "pinned"
    assert conftest.one_stack(item("contract_test.py", "test_clear", "tf_eager")) is None


def test_the_slow_kinds_cases_are_found_by_kind_and_mode_or_by_bare_name_outside_the_kept_modules():
    def item(module: str, params: dict[str, Any]) -> Item:
        return Item(f"tests/{module}::test_x", Callspec(params), path=TESTS / module)

    assert conftest.SLOW_KINDS == ("tf_prioritized", "tf_dict", "tf_kept", "ray")
    assert conftest.on_a_slow_kind(item("contract_test.py", {"kind": "tf_dict_function"}))
    assert conftest.on_a_slow_kind(item("contract_test.py", {"kind": "tf_prioritized_eager"}))
    assert conftest.on_a_slow_kind(item("compat_test.py", {"kind": "tf_prioritized_function"}))  # kind-mode: always
    assert conftest.on_a_slow_kind(item("n_step_test.py", {"name": "tf_prioritized"}))
    assert not conftest.on_a_slow_kind(item("compat_test.py", {"name": "tf_prioritized"}))  # kept fast
    assert not conftest.on_a_slow_kind(item("storage_test.py", {"name": "tf_prioritized", "n": 3}))
    assert not conftest.on_a_slow_kind(item("contract_test.py", {"kind": "tf_eager"}))
    assert not conftest.on_a_slow_kind(item("n_step_test.py", {"name": "tf_uniform"}))
    assert not conftest.on_a_slow_kind(item("specs_test.py", {}))


@pytest.mark.parametrize("kind", ["tf_prioritized_eager", "tf_prioritized_function", "tf_eager"])
def test_a_shelved_buffer_comes_back_cleared_as_a_new_one_is(kind, monkeypatch):
    shelf = contract.Shelf(conftest.SHELVED_KINDS)
    monkeypatch.setattr(contract, "shelf", shelf)
    buffer = make_buffer(kind)
    fill(buffer, 7)
    if underlying(buffer).prioritized:
        underlying(buffer).update_priorities(np.array([18, 19]), np.array([50.0, 0.5]))
    shelf.returned(passed=True)  # as the fixture does after a passed test
    again = make_buffer(kind)
    assert again is buffer
    assert int(again.num_frames()) == 0 and to_numpy(again.gather_all())["step"].shape == (3, 0)
    assert to_numpy(again.add_batch(batch(3, 0))).tolist() == [0, 1, 2]
    _, info = again.get_next(sample_batch_size=300)
    # The priorities and the largest of them are a new buffer's: each of the three frames 1/3.
    np.testing.assert_array_equal(to_numpy(info.probabilities), np.full([300], np.float32(1 / 3)))
    shelf.returned(passed=False)  # a failed case's buffers are dropped
    assert make_buffer(kind) is not buffer
    assert shelf.key(kind, 3, 5, conftest.fresh_spec(), {}) is None  # another spec: never shelved
    assert shelf.key("py_eager", 3, 5, conftest.SPEC, {}) is None  # the py kinds trace nothing to keep
    assert shelf.key(kind, 3, 5, conftest.SPEC, {"sampler": [1]}) is None  # unhashable options
