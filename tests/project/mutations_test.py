"""scripts/mutations.py: every mutation applies, exactly once, to this tree; no pytest run is started here.

The mutation runs leave this module out (`--ignore`): in a mutated copy its snippet checks fail by design.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _load_script():
    spec = importlib.util.spec_from_file_location("mutations_script", ROOT / "scripts" / "mutations.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


mutations = _load_script()
MUTATIONS = mutations.MUTATIONS


def files(root: pathlib.Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


def test_ids_are_unique_slugs_and_each_mutation_says_what_it_breaks_and_what_catches_it():
    ids = [mutation.id for mutation in MUTATIONS]
    assert len(set(ids)) == len(ids)
    assert 8 <= len(ids) <= 12  # a list a `make mutations` run gets through in about 20 minutes
    for mutation in MUTATIONS:
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", mutation.id), mutation.id
        assert mutation.description and "\n" not in mutation.description, mutation.id
        assert mutation.catches.startswith("tests/"), mutation.id
        assert mutation.tests == mutations.FAST or all(t.startswith("tests/") for t in mutation.tests), mutation.id


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[mutation.id for mutation in MUTATIONS])
def test_each_snippet_occurs_exactly_once_in_its_file_and_changes_it(mutation):
    assert mutation.old != mutation.new
    assert mutation.file.startswith("tfbuffers/") and (ROOT / mutation.file).is_file()
    assert (ROOT / mutation.file).read_text(encoding="utf-8").count(mutation.old) == 1
    assert mutations.occurrences(mutation, ROOT) == 1
    mutations.check(mutation, ROOT)  # raises otherwise
    for test in mutation.tests:  # named tests are in files that exist
        if test.startswith("tests/"):
            assert (ROOT / test.split("::")[0]).is_file(), test


def test_applying_a_mutation_to_a_copy_changes_exactly_its_file(tmp_path):
    copy = mutations.copy_checkout(ROOT, tmp_path / "checkout")
    assert not (copy / ".git").exists() and not list(copy.glob(".venv*")) and not list(copy.rglob("__pycache__"))
    assert (copy / "tests" / "conftest.py").is_file() and (copy / "pyproject.toml").is_file()
    before = files(copy)
    real = {mutation.file: (ROOT / mutation.file).read_bytes() for mutation in MUTATIONS}
    for mutation in MUTATIONS:
        mutations.apply(mutation, copy)
        after = files(copy)
        assert [name for name in after if after[name] != before[name]] == [mutation.file], mutation.id
        text = before[mutation.file].decode("utf-8")
        assert after[mutation.file].decode("utf-8") == text.replace(mutation.old, mutation.new), mutation.id
        with pytest.raises(mutations.MutationError, match=f"mutation {mutation.id}: .* found it 0 times"):
            mutations.apply(mutation, copy)  # applied: its snippet is gone
        (copy / mutation.file).write_bytes(before[mutation.file])
    assert {name: (ROOT / name).read_bytes() for name in real} == real  # the checkout itself is never edited


def test_a_snippet_found_twice_or_not_at_all_is_refused_naming_the_mutation(tmp_path):
    (tmp_path / "tfbuffers").mkdir()
    (tmp_path / "tfbuffers" / "m.py").write_text("x = 1\nx = 1\n")
    twice = mutations.Mutation("twice", "d", "tfbuffers/m.py", "x = 1", "x = 2", "tests/x_test.py")
    with pytest.raises(mutations.MutationError, match="mutation twice: expected its snippet exactly once .* 2 times"):
        mutations.apply(twice, tmp_path)
    absent = mutations.Mutation("absent", "d", "tfbuffers/none.py", "x = 1", "x = 2", "tests/x_test.py")
    with pytest.raises(mutations.MutationError, match=r"mutation absent: .*none\.py \(no such file\)"):
        mutations.check(absent, tmp_path)
    assert (tmp_path / "tfbuffers" / "m.py").read_text() == "x = 1\nx = 1\n"


def test_exit_codes_and_the_first_failing_test_are_read_from_pytest():
    def run(code, output=""):
        return mutations.Run(code, 1.0, output)

    assert [mutations.outcome(run(code)) for code in (1, 0, 2, 3, 4, 5, None)] == ["caught", "survived"] + ["error"] * 5
    # xdist's -x stops the other worker and ends the run as interrupted (exit 2): a test failed all the same.
    stopped = (
        "FAILED tests/contract_test.py::test_clear[tf_eager] - AssertionError\n!!! stopping after 1 failures !!!\n"
    )
    assert mutations.outcome(run(2, stopped)) == "caught"
    assert mutations.outcome(run(2, "ERROR tests/contract_test.py - ImportError\n")) == "error"  # a collection error
    output = (
        "..F\n=========================== short test summary info ============================\n"
        "ERROR tests/a_test.py::test_setup[x] - RuntimeError\n"
        "FAILED tests/contract_test.py::test_x[refused at once (default)-py_eager] - AssertionError: a - b\n"
        "FAILED tests/b_test.py::test_y\n"
    )
    assert mutations.first_failure(output) == "tests/contract_test.py::test_x[refused at once (default)-py_eager]"
    assert mutations.first_failure("ERROR tests/a_test.py::test_setup - E\n") == "tests/a_test.py::test_setup"
    assert mutations.first_failure("1 passed\n") is None
    ring = mutations.BY_ID["ring-row-off-by-one"]
    assert mutations.as_expected(ring, "tests/contract_test.py::test_adds_before_wrap[tf_eager]")
    assert not mutations.as_expected(ring, "tests/buffers/specs_test.py::test_other")
    assert not mutations.as_expected(ring, None)
    command = mutations.pytest_command("python", mutations.FAST, 2)
    assert command[:3] == ["python", "-m", "pytest"] and "-x" in command and "no:cacheprovider" in command
    assert f"--ignore={mutations.SELF_TEST}" in command and command[-2:] == ["-m", "not slow"]
    assert "--every-stack" not in command
    assert "--every-stack" in mutations.pytest_command("python", mutations.FAST, 2, every_stack=True)
    assert mutations.knows_every_stack(ROOT)


def test_the_command_line_is_checked_and_list_needs_no_run(capsys):
    for argv, message in (
        (["--only", "nope"], "argument --only: expected ids among"),
        (["--timeout", "0"], "argument --timeout: expected a positive number, got 0.0"),
        (["--root", str(ROOT / "docs")], "argument --root: expected a tfbuffers checkout"),
        (["--python", str(ROOT / "no-such-python")], "argument --python: expected an executable Python"),
    ):
        with pytest.raises(SystemExit) as exited:
            mutations.parse_args(argv)
        assert exited.value.code == 2
        assert message in capsys.readouterr().err
    assert mutations.main(["--list", "--only", MUTATIONS[0].id]) == 0
    listed = capsys.readouterr().out
    assert listed.startswith(f"{MUTATIONS[0].id}  ({MUTATIONS[0].file}; applies)") and "catches:" in listed
