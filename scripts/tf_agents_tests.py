"""Run TF-Agents' own replay-buffer tests against tfbuffers, with only their imports changed.

The switch tfbuffers promises (change an import) checked with TF-Agents' tests themselves: the test files of
the installed `tf_agents/replay_buffers/` (tf_uniform_replay_buffer_test.py, py_replay_buffers_test.py,
replay_buffer_test.py) are copied to a temporary directory, each `from tf_agents.replay_buffers import X`
becomes an import of a small module naming tfbuffers' classes by TF-Agents' names, and pytest runs them.
TF-Agents' py buffers return items alone from `get_next` and `as_dataset` where tfbuffers' return
`(items, BufferInfo)`: the module drops the info for those tests. Nothing of TF-Agents' is changed or kept.

Each test that does not pass is one of:
  - different on purpose: TF-Agents expects what tfbuffers refuses (the README's table of differences);
  - reads a private member: the test calls a buffer's `_`-prefixed internals (TF-Agents' own, not the API);
  - failed: anything else. The run exits 1 if any test of the public API fails.

    python scripts/tf_agents_tests.py                       # against tfbuffers (about 30 s)
    python scripts/tf_agents_tests.py --buffers tf_agents   # against TF-Agents itself: checks the harness
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import _args  # noqa: E402

TEST_FILES = ("tf_uniform_replay_buffer_test.py", "py_replay_buffers_test.py", "replay_buffer_test.py")
IMPORT = re.compile(r"^from tf_agents\.replay_buffers import (\w+)[ \t]*$", re.MULTILINE)
SHIM = "buffers_under_test"
# What TF-Agents' tests expect and tfbuffers refuses on purpose (README, "What behaves differently").
DIFFERENT_ON_PURPOSE = {
    "replay_buffer_test.py::ReplayBufferInitTest::": "the abstract ReplayBuffer enforces its hooks when a subclass "
    "is made",
    "py_replay_buffers_test.py::PyUniformReplayBufferTest::testEmptyBuffer": "an empty PyUniformReplayBuffer raises "
    "instead of returning unfilled rows",
    "py_replay_buffers_test.py::PyUniformReplayBufferTest::testSampleDoesNotCrossHead": "an int64 array is not cast "
    "into an int32 field",
}
# Tests that call TF-Agents' internals on the buffer, and which.
READS_PRIVATE = {
    "tf_uniform_replay_buffer_test.py::TFUniformReplayBufferTest::testClear": "_get_last_id",
    "tf_uniform_replay_buffer_test.py::TFUniformReplayBufferTest::testClearAllVariables": "_clear, _get_last_id",
    "tf_uniform_replay_buffer_test.py::TFUniformReplayBufferTest::testMultiStepStackedBatchedSampling": "_get_next",
    "tf_uniform_replay_buffer_test.py::TFUniformReplayBufferTest::testNumFrames": "_capacity",
}
SHIMS = {
    "tfbuffers": '''
import tensorflow as tf
import tfbuffers


class _ItemsOnly(tf.Module):
    """A tfbuffers py buffer returning items alone from get_next and as_dataset, as TF-Agents' py buffers do."""

    def __init__(self, buffer):
        super().__init__()
        self.buffer = buffer

    def get_next(self, *args, **kwargs):
        return self.buffer.get_next(*args, **kwargs)[0]

    def as_dataset(self, *args, **kwargs):
        return self.buffer.as_dataset(*args, **kwargs).map(lambda items, _: items)

    def __getattr__(self, name):
        if name.startswith("_") or name == "buffer":
            raise AttributeError(name)
        return getattr(self.buffer, name)


ReplayBuffer = tfbuffers.ReplayBuffer
TFUniformReplayBuffer = tfbuffers.TFUniformReplayBuffer
PyUniformReplayBuffer = lambda *args, **kwargs: _ItemsOnly(tfbuffers.PyUniformReplayBuffer(*args, **kwargs))
PyHashedReplayBuffer = lambda *args, **kwargs: _ItemsOnly(tfbuffers.PyHashedReplayBuffer(*args, **kwargs))
FrameBuffer = tfbuffers.FrameBuffer
''',
    "tf_agents": """
from tf_agents.replay_buffers.replay_buffer import ReplayBuffer
from tf_agents.replay_buffers.tf_uniform_replay_buffer import TFUniformReplayBuffer
from tf_agents.replay_buffers.py_uniform_replay_buffer import PyUniformReplayBuffer
from tf_agents.replay_buffers.py_hashed_replay_buffer import PyHashedReplayBuffer, FrameBuffer
""",
}
PYTEST_INI = """[pytest]
addopts = -p no:cacheprovider -q -rN --tb=native
timeout = 300
timeout_method = thread
filterwarnings = ignore::DeprecationWarning
"""


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = _args.new_parser(__doc__)
    parser.add_argument("--buffers", choices=sorted(SHIMS), default="tfbuffers", help="whose buffers the tests use")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (tests, pytest's log)")
    return parser


def tf_agents_tests() -> pathlib.Path:
    """The installed `tf_agents/replay_buffers` directory (found without importing TF-Agents)."""
    spec = importlib.util.find_spec("tf_agents")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("tf-agents is not installed here: pip install 'tfbuffers[agents]' (see the README)")
    return pathlib.Path(spec.origin).parent / "replay_buffers"


def copy_tests(source: pathlib.Path, work: pathlib.Path, buffers: str) -> None:
    """The test files, their replay-buffer imports naming the shim; the shim and a pytest configuration."""
    for name in TEST_FILES:
        text = IMPORT.sub(lambda match: f"import {SHIM} as {match[1]}", (source / name).read_text())
        left = [line for line in text.splitlines() if "tf_agents.replay_buffers" in line and "import" in line]
        if left:
            raise RuntimeError(f"{name}: an import this script does not rewrite: {left[0]!r}")
        (work / name).write_text(text)
    (work / f"{SHIM}.py").write_text(SHIMS[buffers])
    (work / "pytest.ini").write_text(PYTEST_INI)


def outcomes(report: pathlib.Path) -> dict[str, tuple[str, str]]:
    """Each test's node id (`file::Class::test`) -> (passed, failed or skipped; the error's last line)."""
    results = {}
    for case in ElementTree.parse(report).iter("testcase"):
        module, _, cls = case.get("classname", "").rpartition(".")
        node = f"{module}.py::{cls}::{case.get('name')}"
        problem = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
        if problem is not None and problem.tag == "skipped" and "Not a test." in (problem.get("message") or ""):
            continue  # tf.test.TestCase's `test_session`, a helper that pytest collects and TensorFlow skips
        if problem is None:
            results[node] = ("passed", "")
        else:
            outcome = "skipped" if problem.tag == "skipped" else "failed"
            text = (problem.get("message") or problem.text or "").strip().splitlines()
            results[node] = (outcome, text[-1] if text else "")
    return results


def kind_of(node: str, buffers: str) -> tuple[str, str]:
    """The test's kind (public, reads a private member, different on purpose) and why."""
    if buffers == "tfbuffers":
        for prefix, reason in DIFFERENT_ON_PURPOSE.items():
            if node.startswith(prefix) and "WithHashing" not in node:  # the hashed buffer returns zeros, as expected
                return "different on purpose", reason
    for prefix, members in READS_PRIVATE.items():
        if node.startswith(prefix):
            return "reads a private member", members
    return "public", ""


def main(argv: list[str] | None = None) -> int:
    """Copies, runs and reports; 0 if every test of the public API passed."""
    args = build_parser().parse_args(argv)
    source = tf_agents_tests()
    work = pathlib.Path(tempfile.mkdtemp(prefix="tf_agents_tests_"))
    copy_tests(source, work, args.buffers)
    report = work / "report.xml"
    command = [sys.executable, "-m", "pytest", "-c", str(work / "pytest.ini"), f"--junitxml={report}", str(work)]
    with open(work / "pytest.log", "w") as log:
        subprocess.run(command, cwd=work, stdout=log, stderr=subprocess.STDOUT, timeout=1800)
    results = outcomes(report)
    counts: dict[str, list[int]] = {"public": [0, 0], "reads a private member": [0, 0], "different on purpose": [0, 0]}
    for node, (outcome, detail) in sorted(results.items()):
        kind, why = kind_of(node, args.buffers)
        counts[kind][0] += outcome == "passed"
        counts[kind][1] += 1
        if outcome != "passed":
            print(f"{outcome:8} {kind:22} {node}\n{'':31}{why or detail}")
    public, private, different = (counts[kind] for kind in counts)
    print(
        f"TF-Agents' replay-buffer tests against {args.buffers}: public {public[0]}/{public[1]} passed; "
        f"reading a private member {private[0]}/{private[1]}; different on purpose {different[0]}/{different[1]}"
    )
    if args.keep or public[0] != public[1]:
        print(f"tests and pytest's log: {work}")
    return 0 if public[0] == public[1] and public[1] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
