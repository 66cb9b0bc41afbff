r"""Mutation testing: realistic bugs put into a copy of the library, one at a time; does a test fail?

Each mutation is one small edit of the library's core (an exact snippet, present exactly once in its
file, and its replacement): an index off by one, a window across segments, a torn read taken as whole,
a priority not updated, a restore by position, a journal never marked, a segment claimed twice, a window
across an episode's end, a wrong probability, a wrong dtype accepted. For each, the checkout is copied
to a temporary directory (never edited in place), the edit is made there, and pytest runs against the
copy (cwd and PYTHONPATH the copy, so its `tfbuffers` is the one imported: checked before any run).
A failed test means caught (exit 1, or exit 2 with a test's FAILED line: xdist's `-x` ends the run as
interrupted); 0, every test passed, means survived. Anything else (a collection or import error, no
tests, a timeout) is an error, not a catch.

Most mutations run the fast subset (`-m "not slow"`); those whose bug only slow modules can see
(concurrency, Ray) name their tests. The unmutated copy runs each selection first (a baseline that
must pass) unless --no-baseline. Exit status: 0 if every mutation run was caught; 1 if one survived
or ended in an error; 2 for a bad command line, or a mutation whose snippet is not exactly once in
its file under --root; 3 if a baseline failed or the copy imports another tfbuffers.

    python scripts/mutations.py --list
    python scripts/mutations.py --only ring-row-off-by-one priority-update-skips-newest --json out/mutations.json
    git worktree add /tmp/old v0.1 && python scripts/mutations.py --root /tmp/old
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import _args  # noqa: E402

FAST = ("-m", "not slow")
"""The fast subset: every test module tests/conftest.py does not mark slow, and the package's doctests."""
SELF_TEST = "tests/project/mutations_test.py"
"""Checks that each snippet is in the tree: it fails in every mutated copy, so the runs leave it out."""


@dataclasses.dataclass(frozen=True)
class Mutation:
    """One deliberate bug.

    Attributes:
      id: A short slug (`--only` takes it).
      description: One line: the bug as a reviewer would name it.
      file: The file it edits, relative to the checkout.
      old: An exact snippet that occurs exactly once in `file`.
      new: What replaces it.
      catches: The test expected to fail, found by reading the tests (and why).
      tests: pytest's arguments selecting what runs: the fast subset, or named tests where only slow modules
        can see the bug.
    """

    id: str
    description: str
    file: str
    old: str
    new: str
    catches: str
    tests: tuple[str, ...] = FAST


MUTATIONS = (
    Mutation(
        id="ring-row-off-by-one",
        description="_ring.rows_of_ids: a frame id's storage row one too far ((id + 1) % capacity), for every read",
        file="tfbuffers/_ring.py",
        old="return ids % (max_length * batch_size)",
        new="return (ids + 1) % (max_length * batch_size)",
        catches="tests/contract_test.py::test_adds_before_wrap (gather_all reads the next segment's frames), and "
        "test_single_frames_come_from_the_stored_frames (ids no longer those of the codes read)",
    ),
    Mutation(
        id="window-crosses-segments",
        description="UniformSampler: a window's frames are consecutive ids (step 1, not batch_size): they come from "
        "neighbouring segments",
        file="tfbuffers/sampling/uniform.py",
        old="ids = ids + backend.ops.arange(steps, self.batch_size)",
        new="ids = ids + backend.ops.arange(steps)",
        catches="tests/contract_test.py::test_windows_stay_in_one_segment_and_in_time (codes within a window "
        "differ by 1000, not 1), on the uniform kinds",
    ),
    Mutation(
        id="torn-read-undetected",
        description="TF seqlock check: a read begun during a rewrite (odd generation: clear, restore, priority "
        "update) counts as whole and is not read again; slow concurrency_test only: runs its test",
        file="tfbuffers/execution/_tf_concurrency.py",
        old="unchanged = tf.equal(self.generation.read_value() + generation % 2, generation)",
        new="unchanged = tf.equal(self.generation.read_value(), generation)",
        catches="tests/execution/concurrency_test.py::test_reads_torn_every_time_fail_with_read_busy_then_the_buffer_reads_again"
        "[tf] (DID NOT RAISE: reads under an odd generation return instead of failing with READ_BUSY)",
        tests=(
            "tests/execution/concurrency_test.py::test_reads_torn_every_time_fail_with_read_busy_then_the_buffer_reads_again",
        ),
    ),
    Mutation(
        id="priority-update-skips-newest",
        description="_ring.ids_stored: the newest add's frames count as overwritten, so update_priorities "
        "leaves their priorities and sum-tree leaves unchanged (compiled by XLA too)",
        file="tfbuffers/_ring.py",
        old="return (adds >= oldest_add(ops, added, max_length)) & (adds < added)",
        new="return (adds >= oldest_add(ops, added, max_length)) & (adds < added - 1)",
        catches="tests/contract_test.py::test_reads_inside_a_graph_run_when_the_graph_runs[tf_eager] first (the reads"
        "' check, `are_stored`, shares the rule: the newest frames read as overwritten); "
        "tests/storage/storage_test.py::test_a_buffer_keeps_its_priorities_and_record_of_episode_ends_in_its_storage"
        "[py_prioritized] too (ids 6, 7 are the newest add's: their priorities stay [1, 1], not [3, 0.5])",
    ),
    Mutation(
        id="restore-by-position",
        description="StateCheckpoint restore: counters, fields and extras taken by position among the checkpoint's "
        "(sorted) keys, not by name",
        file="tfbuffers/state.py",
        old="return {name: values[_key(prefix, name)] for name in names}",
        new="return dict(zip(names, [value for key, value in values.items() if key.startswith(prefix)]))",
        catches="tests/buffers/state_test.py::test_a_checkpoint_restores_by_field_path_into_any_kind"
        "[tf_prioritized-tf_prioritized], contract_test::test_checkpoint_round_trip and compat_test::"
        "test_a_checkpoint_written_before_the_storage_seam_restores on the prioritized kinds (extra:max_priority "
        "sorts before extra:priority: the priorities get the scalar, refused by shape)",
    ),
    Mutation(
        id="memmap-journal-unmarked",
        description="memmap write_block: the overwritten rows are copied to the journal but it is never marked "
        "(JOURNAL_ADD stays -1), so an add cut short by a kill is not undone on open",
        file="tfbuffers/storage/memmap.py",
        old="state[JOURNAL_ADD] = state[ADDED]",
        new="state[JOURNAL_ADD] = -1",
        catches="tests/storage/memmap_test.py::test_an_add_cut_short_is_undone_from_the_journal[ring full] (the "
        "reopened rows are the torn ones) and [ring filling] (priorities not put back); memmap_test is in the fast "
        "subset",
    ),
    Mutation(
        id="elastic-stream-goes-on",
        description="Ray's elastic layout: a new claim of a segment does not end the last writer's stream, so windows "
        "join one writer's frames to the next one's",
        file="tfbuffers/remote/ray/elastic.py",
        old="        if stream is not None:\n            self._streams.close(stream)\n"
        "            self._open[segment] = None\n",
        new="        pass\n",
        catches="tests/remote/elastic_test.py::test_a_new_writer_on_a_segment_starts_a_stream_no_window_crosses_into "
        "(a window (8, 9, 100) is drawn)",
        tests=("tests/remote/elastic_test.py", "tests/remote/streams_test.py"),
    ),
    Mutation(
        id="elastic-window-count-off-by-one",
        description="Streams.windows: a stream gives one window more than its frames hold, so uniform probabilities "
        "are 1 / (windows + streams) and the last index reads past the newest frame",
        file="tfbuffers/remote/ray/streams.py",
        old="limit = s.frames - num_steps + 1",
        new="limit = s.frames - num_steps + 2",
        catches="tests/remote/streams_test.py::test_windows_stay_within_one_stream (a window past the newest frame), "
        "and tests/remote/elastic_test.py (probabilities 1 / 16 and the windows drawn)",
        tests=("tests/remote/elastic_test.py", "tests/remote/streams_test.py"),
    ),
    Mutation(
        id="ray-segment-claimed-twice",
        description="Ray claims: free segments tested against the writers' tokens, not the claimed segments, "
        "so a second writer claims segments already held; slow ray_replay_buffer_test only: runs two of its tests",
        file="tfbuffers/remote/ray/claims.py",
        old="free = [s for s in order if s not in self._holder]",
        new="free = [s for s in order if s not in self._holder.values()]",
        catches="tests/remote/ray_replay_buffer_test.py::test_a_py_observer_adds_a_drivers_frames_through_a_writer_of_its_"
        "own_segments (the second writer gets [0, 1], not [1, 2]); test_actor_processes_add_while_a_learner_samples_"
        "and_updates_priorities (three actors share segments 0 and 1)",
        tests=(
            "tests/remote/ray_replay_buffer_test.py::test_a_py_observer_adds_a_drivers_frames_through_a_writer_of_its_own_"
            "segments",
            "tests/remote/ray_replay_buffer_test.py::test_actor_processes_add_while_a_learner_samples_and_updates_priorities",
        ),
    ),
    Mutation(
        id="episode-window-crosses-end",
        description="episode_boundaries: a drawn window whose last frame is one past its episode's LAST is kept "
        "(distance >= num_steps - 1), so windows cross into the next episode",
        file="tfbuffers/sampling/base.py",
        old="return (distance == 0) | (distance >= num_steps)",
        new="return (distance == 0) | (distance >= num_steps - 1)",
        catches="tests/buffers/compat_test.py::test_a_file_written_before_the_storage_seam_loads_into_the_buffer_it_was"
        "[py_episodes] and [tf_episodes], and test_a_checkpoint_written_before_the_storage_seam_restores (windows "
        "of two start at ids 4, 5: across adds 2 (LAST) and 3); slow: "
        "episodes_test::test_every_window_is_within_one_episode_with_exact_probabilities",
    ),
    Mutation(
        id="uniform-probability-over-frames",
        description="UniformSampler: the probability reported for windows of several frames is 1 / stored frames, "
        "not 1 / windows",
        file="tfbuffers/sampling/uniform.py",
        old="backend.full_inverse(shape, windows), mass=windows)",
        new="backend.full_inverse(shape, windows + (steps - 1) * self.batch_size), mass=windows)",
        catches="tests/contract_test.py::test_probabilities_are_uniform_over_stored_windows (1/15 where 9 windows "
        "of 3 give 1/9), on the uniform kinds",
    ),
    Mutation(
        id="wrong-dtype-accepted",
        description="specs.NumpyFastPath (every add_batch tries it first): a numpy leaf's dtype is not checked, so "
        "a float32 array for a uint8 field is stored, silently cast",
        file="tfbuffers/specs.py",
        old="if type(value) is np.ndarray and value.dtype == dtype and value.shape == shape:",
        new="if type(value) is np.ndarray and value.shape == shape:",
        catches="tests/contract_test.py::test_bad_batches_are_rejected_and_change_nothing, its 'wrong dtype' case "
        "(py kinds: DID NOT RAISE; TF kinds: the variable's own error, not the contract's message)",
    ),
)
BY_ID = {mutation.id: mutation for mutation in MUTATIONS}


class MutationError(ValueError):
    """A mutation that cannot be applied: its snippet is not exactly once in its file."""


# The copy: everything a test may read (docs, colabs, tests/data, scripts), none of the environments, caches,
# git metadata or build outputs.
_IGNORED_AT_TOP = {".git", "build", "dist", "out"}
_IGNORED_ANYWHERE = ("__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", "*.egg-info", "*.pyc", ".venv*")

_SUMMARY = re.compile(r"^(FAILED|ERROR) (\S+?(?:\[[^\]]*\])?)(?: - |$)")
_EXIT_CODES = {
    2: "pytest was interrupted (a collection error?)",
    3: "pytest's internal error",
    4: "pytest usage error (a conftest that does not import?)",
    5: "no tests collected",
}


def occurrences(mutation: Mutation, root: pathlib.Path) -> int:
    """How many times `mutation.old` occurs in its file under `root` (0 if there is no such file)."""
    path = root / mutation.file
    return _read(path).count(mutation.old) if path.is_file() else 0


def check(mutation: Mutation, root: pathlib.Path) -> None:
    """Raises `MutationError`, naming the mutation, unless its snippet occurs exactly once in its file."""
    count = occurrences(mutation, root)
    if mutation.old == mutation.new:
        raise MutationError(f"mutation {mutation.id}: old and new are the same")
    if count != 1:
        where = mutation.file if (root / mutation.file).is_file() else f"{mutation.file} (no such file)"
        raise MutationError(
            f"mutation {mutation.id}: expected its snippet exactly once in {where} under {root}, found it {count} "
            f"times: {mutation.old!r}"
        )


def apply(mutation: Mutation, root: pathlib.Path) -> None:
    """Edits `mutation.file` under `root` (a copy): its snippet replaced; `MutationError` if not exactly once."""
    check(mutation, root)
    path = root / mutation.file
    mutated = _read(path).replace(mutation.old, mutation.new, 1)
    with open(path, "w", encoding="utf-8", newline="") as file:
        file.write(mutated)


def _read(path: pathlib.Path) -> str:
    with open(path, encoding="utf-8", newline="") as file:
        return file.read()


def copy_checkout(root: pathlib.Path, destination: pathlib.Path) -> pathlib.Path:
    """Copies the checkout at `root` to `destination` (made), leaving out environments, caches and `.git`."""
    top = os.path.realpath(root)

    def ignore(directory: str, names: list[str]) -> set[str]:
        at_top = os.path.realpath(directory) == top
        return {
            name
            for name in names
            if (at_top and name in _IGNORED_AT_TOP) or any(fnmatch.fnmatch(name, p) for p in _IGNORED_ANYWHERE)
        }

    shutil.copytree(root, destination, ignore=ignore, symlinks=True)
    return destination


def environment(copy: pathlib.Path) -> dict[str, str]:
    """The environment a run in `copy` gets: the copy first on PYTHONPATH (ahead of the editable install)."""
    paths = [str(copy), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def check_imported_from(python: str, copy: pathlib.Path, *, full: bool) -> None:
    """Raises a RuntimeError unless `python` run in `copy` imports the copy's `tfbuffers`.

    `full`: import the package (TensorFlow included, seconds); else only find it as the import would.
    """
    code = (
        "import tfbuffers; print(tfbuffers.__file__)"
        if full
        else "import importlib.util; print(importlib.util.find_spec('tfbuffers').origin)"
    )
    try:
        run = subprocess.run(
            [python, "-c", code], cwd=copy, env=environment(copy), capture_output=True, text=True, timeout=600
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise RuntimeError(f"{python} could not be run in the copy {copy}: {error}") from None
    found = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    expected = copy / "tfbuffers" / "__init__.py"
    if run.returncode != 0 or not found or os.path.realpath(found) != os.path.realpath(expected):
        raise RuntimeError(
            f"{python} run in the copy {copy} imports tfbuffers from {found or 'nowhere'} (exit {run.returncode}), "
            f"not from {expected}: the copy's package must come first on sys.path. {run.stderr.strip()[-2000:]}"
        )


def pytest_command(python: str, selection: Sequence[str], workers: int, every_stack: bool = False) -> list[str]:
    """The pytest command line of one run (pyproject's addopts still apply: -ra, doctests, xdist's worksteal).

    `every_stack`: the checkout's tests keep some long runs to one stack (tests/conftest.py ONE_STACK); a
    mutation's run takes them on this one too, so that the tests it names run wherever it runs.
    """
    options = ["-x", "-q", "-p", "no:cacheprovider", "-n", str(workers), f"--ignore={SELF_TEST}"]
    return [python, "-m", "pytest", *options, *(["--every-stack"] if every_stack else []), *selection]


def knows_every_stack(copy: pathlib.Path) -> bool:
    """Whether the checkout's tests take `--every-stack` (older checkouts ran everything on both stacks)."""
    return "--every-stack" in (copy / "tests" / "conftest.py").read_text(encoding="utf-8")


@dataclasses.dataclass
class Run:
    """One pytest run: its exit code (None: timed out), seconds and output."""

    exit_code: int | None
    seconds: float
    output: str


def run_pytest(
    python: str, copy: pathlib.Path, selection: Sequence[str], workers: int, timeout: float, log: pathlib.Path
) -> Run:
    """Runs pytest in `copy` (its own session: a timeout kills it and its workers), its output to `log`."""
    start = time.monotonic()
    with open(log, "w", encoding="utf-8") as out:
        process = subprocess.Popen(
            pytest_command(python, selection, workers, knows_every_stack(copy)),
            cwd=copy,
            env=environment(copy),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            code: int | None = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            if process.poll() is None:  # timed out, or this script interrupted
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    return Run(code, time.monotonic() - start, log.read_text(encoding="utf-8", errors="replace"))


def first_failure(output: str) -> str | None:
    """The node id of the first `FAILED` line of pytest's short summary (else its first `ERROR` line), or None."""
    found: dict[str, str] = {}
    for line in output.splitlines():
        match = _SUMMARY.match(line)
        if match:
            found.setdefault(match.group(1), match.group(2))
    return found.get("FAILED") or found.get("ERROR")


def as_expected(mutation: Mutation, failure: str | None) -> bool:
    """Whether the failing test (a node id) is the one `mutation.catches` names (by its function's name)."""
    return failure is not None and failure.split("::")[-1].split("[")[0] in mutation.catches


def failed_a_test(run: Run) -> bool:
    """Whether a test failed: exit 1, or exit 2 with a test's FAILED line (xdist's `-x` ends a run as interrupted)."""
    if run.exit_code == 1:
        return True
    failure = first_failure(run.output)
    return run.exit_code == 2 and failure is not None and "::" in failure and "\nFAILED " in "\n" + run.output


def outcome(run: Run) -> str:
    """`caught` (a test failed), `survived` (all passed: 0), or `error` (anything else, a timeout too)."""
    if run.exit_code is None:
        return "error"
    if failed_a_test(run):
        return "caught"
    return "survived" if run.exit_code == 0 else "error"


def detail(run: Run, timeout: float) -> str:
    """What a run's outcome rests on: the first failing test, or what went wrong."""
    if run.exit_code is None:
        return f"timed out after {timeout:g} s"
    if failed_a_test(run):
        return first_failure(run.output) or "a test failed (no FAILED line found)"
    if run.exit_code == 0:
        return "-"
    return _EXIT_CODES.get(run.exit_code, f"exit code {run.exit_code}")


def tail(text: str, lines: int = 40) -> str:
    """The last `lines` lines of `text`."""
    return "\n".join(text.splitlines()[-lines:])


def describe(mutations: Sequence[Mutation], root: pathlib.Path) -> str:
    """`--list`'s text: each mutation, its file, its tests, the test expected to catch it, and its snippet's state."""
    blocks = []
    for mutation in mutations:
        count = occurrences(mutation, root)
        state = "applies" if count == 1 else f"does NOT apply here: its snippet occurs {count} times"
        blocks.append(
            f"{mutation.id}  ({mutation.file}; {state})\n"
            f"  {mutation.description}\n"
            f"  - {mutation.old}\n"
            f"  + {mutation.new}\n"
            f"  runs:    pytest {shlex.join(mutation.tests)}\n"
            f"  catches: {mutation.catches}"
        )
    return "\n\n".join(blocks)


def table(rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table, its first row the header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = _args.new_parser(__doc__)
    parser.add_argument("--python", default=sys.executable, help="the Python that runs pytest (tfbuffers' venv)")
    parser.add_argument("--only", nargs="+", metavar="ID", default=None, help="run these mutations only (by id)")
    parser.add_argument("--list", action="store_true", help="print the mutations and whether each applies, and exit")
    parser.add_argument(
        "--timeout", type=_args.positive_float, default=900.0, help="seconds each pytest run may take (wall clock)"
    )
    parser.add_argument(
        "--root",
        type=pathlib.Path,
        default=pathlib.Path(__file__).resolve().parent.parent,
        help="the checkout copied and mutated (a git worktree of another commit, say); never edited",
    )
    parser.add_argument("--json", type=pathlib.Path, default=None, metavar="PATH", help="write the results here")
    parser.add_argument("--workers", type=_args.non_negative_int, default=2, help="pytest-xdist workers (-n)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated runs that must pass first")
    parser.add_argument("--keep", action="store_true", help="keep the temporary copies and pytest logs")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked."""
    parser = build_parser()
    args = parser.parse_args(argv)
    unknown = [mutation_id for mutation_id in args.only or [] if mutation_id not in BY_ID]
    if unknown:
        parser.error(f"argument --only: expected ids among {sorted(BY_ID)}, got {unknown}")
    args.root = args.root.resolve()
    needed = ("tfbuffers/__init__.py", "tests/conftest.py", "pyproject.toml")
    missing = [name for name in needed if not (args.root / name).is_file()]
    if missing:
        parser.error(f"argument --root: expected a tfbuffers checkout, got {str(args.root)!r}, which lacks {missing}")
    python = shutil.which(args.python)
    if python is None:
        parser.error(f"argument --python: expected an executable Python, got {args.python!r}")
    args.python = python
    if args.json is not None and (args.json.is_dir() or not args.json.resolve().parent.is_dir()):
        parser.error(f"argument --json: expected a file path in an existing directory, got {str(args.json)!r}")
    args.mutations = [BY_ID[mutation_id] for mutation_id in dict.fromkeys(args.only)] if args.only else MUTATIONS
    if not args.list:
        problems = []
        for mutation in args.mutations:
            try:
                check(mutation, args.root)
            except MutationError as error:
                problems.append(str(error))
        if problems:
            parser.error("; ".join(problems) + " (--list shows which apply; --only runs some)")
    return args


def _write_json(path: pathlib.Path | None, report: dict[str, Any]) -> None:
    if path is not None:
        path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


def run_all(args: argparse.Namespace, work: pathlib.Path) -> int:
    """The baselines, then each mutation in its own copy; prints progress and the table; returns the exit status."""
    report: dict[str, Any] = {"root": str(args.root), "python": args.python, "baseline": [], "mutations": []}
    imported_checked = False
    if not args.no_baseline:
        copy = copy_checkout(args.root, work / "baseline" / args.root.name)
        check_imported_from(args.python, copy, full=True)
        imported_checked = True
        selections = list(dict.fromkeys(mutation.tests for mutation in args.mutations))
        for index, selection in enumerate(selections, 1):
            label = f"[baseline {index}/{len(selections)}]"
            print(f"{label} unmutated: pytest {shlex.join(selection)}", flush=True)
            run = run_pytest(args.python, copy, selection, args.workers, args.timeout, work / f"baseline-{index}.log")
            report["baseline"].append(
                {"tests": list(selection), "exit_code": run.exit_code, "seconds": round(run.seconds, 1)}
            )
            _write_json(args.json, report)
            if run.exit_code != 0:
                why = detail(run, args.timeout)
                print(tail(run.output), file=sys.stderr)
                print(
                    f"{label} failed in {run.seconds:.0f} s ({why}): the unmutated tests must pass first "
                    "(--no-baseline skips this)",
                    file=sys.stderr,
                )
                return 3
            print(f"{label} passed in {run.seconds:.0f} s", flush=True)
        if not args.keep:
            shutil.rmtree(work / "baseline", ignore_errors=True)
    rows = [["id", "result", "seconds", "first failing test (caught) / why (error)"]]
    for index, mutation in enumerate(args.mutations, 1):
        label = f"[{index}/{len(args.mutations)}] {mutation.id}"
        copy = copy_checkout(args.root, work / mutation.id / args.root.name)
        check_imported_from(args.python, copy, full=not imported_checked)  # before the edit: it may break imports
        imported_checked = True
        apply(mutation, copy)
        print(f"{label}: {mutation.file} mutated; pytest {shlex.join(mutation.tests)}", flush=True)
        run = run_pytest(args.python, copy, mutation.tests, args.workers, args.timeout, work / f"{mutation.id}.log")
        result, why = outcome(run), detail(run, args.timeout)
        failure = first_failure(run.output) if result == "caught" else None
        if failure is not None and not as_expected(mutation, failure):
            why += " (not the test expected; see --list)"
        if result == "error":
            print(tail(run.output, 20), flush=True)
        print(f"{label}: {result} in {run.seconds:.0f} s ({why})", flush=True)
        rows.append([mutation.id, result, f"{run.seconds:.0f}", why])
        report["mutations"].append(
            {
                "id": mutation.id,
                "file": mutation.file,
                "description": mutation.description,
                "expected": mutation.catches,
                "tests": list(mutation.tests),
                "result": result,
                "exit_code": run.exit_code,
                "seconds": round(run.seconds, 1),
                "first_failure": failure,
                "expected_test_failed": as_expected(mutation, failure),
                "detail": why,
                "output_tail": tail(run.output),
            }
        )
        _write_json(args.json, report)
        if not args.keep:
            shutil.rmtree(work / mutation.id, ignore_errors=True)
    print()
    print(table(rows))
    caught = sum(row[1] == "caught" for row in rows[1:])
    print(f"\n{caught} of {len(rows) - 1} mutations caught")
    return 0 if caught == len(rows) - 1 else 1


def main(argv: list[str] | None = None) -> int:
    """Parses the command line, then lists the mutations or runs them."""
    args = parse_args(argv)
    if args.list:
        print(describe(args.mutations, args.root))
        return 0
    work = pathlib.Path(tempfile.mkdtemp(prefix="tfbuffers-mutations-"))
    try:
        return run_all(args, work)
    except RuntimeError as error:  # the copy imports another tfbuffers
        print(f"error: {error}", file=sys.stderr)
        return 3
    finally:
        if args.keep:
            print(f"copies and logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
