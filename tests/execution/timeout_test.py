"""A test that runs past the time limit fails, wherever the timeout lands (pytest-timeout's method, pyproject.toml)."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import textwrap

CHECKOUT = pathlib.Path(__file__).resolve().parents[2]

# The limit expires inside a garbage-collector callback, as it did inside hypothesis' (issue 29): the signal
# method's exception is raised there, reported as unraisable and the test passes.
SLOW_IN_A_GC_CALLBACK = """
import gc, time

def test_sleeps_in_a_gc_callback():
    def callback(phase, info):
        if phase == "start":
            time.sleep(4)
    gc.callbacks.append(callback)
    try:
        gc.collect()
    finally:
        gc.callbacks.remove(callback)
"""


def run_pytest(tmp_path: pathlib.Path, *options: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_slow.py").write_text(textwrap.dedent(SLOW_IN_A_GC_CALLBACK))
    command = [sys.executable, "-m", "pytest", "-c", str(CHECKOUT / "pyproject.toml"), "--rootdir", str(tmp_path)]
    command += ["-p", "no:cacheprovider", "-o", "timeout=1", *options, str(tmp_path / "test_slow.py")]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)


def test_a_timeout_inside_a_gc_callback_fails_the_test(tmp_path):
    run = run_pytest(tmp_path, "-n", "1")  # as the suite runs: in xdist workers
    assert run.returncode == 1, run.stdout
    # The thread method dumps the stacks and ends the worker; xdist reports the test failed with it.
    assert "worker 'gw0' crashed while running 'test_slow.py::test_sleeps_in_a_gc_callback'" in run.stdout
    assert run.stdout.splitlines()[-1].strip("= ").startswith("1 failed")


def test_the_signal_method_would_have_swallowed_it(tmp_path):
    # The demonstration that the test above can fail: the same test under the signal method passes.
    run = run_pytest(tmp_path, "-n", "0", "-o", "timeout_method=signal")
    assert run.returncode == 0, run.stdout
    assert "1 passed" in run.stdout.splitlines()[-1]
