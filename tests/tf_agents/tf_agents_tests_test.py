"""scripts/tf_agents_tests.py: TF-Agents' own replay-buffer tests, against tfbuffers and against TF-Agents."""

from __future__ import annotations

import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "tf_agents_tests.py"


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=900)


def test_every_public_test_of_tf_agents_passes_against_tfbuffers():
    result = run()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.splitlines()[-1] == (
        "TF-Agents' replay-buffer tests against tfbuffers: public 43/43 passed; reading a private member 0/6; "
        "different on purpose 0/7"
    )
    # Each test that does not pass says why: a difference of the README's table, or the member it reads.
    assert "an empty PyUniformReplayBuffer raises instead of returning unfilled rows" in result.stdout
    assert "an int64 array is not cast into an int32 field" in result.stdout
    assert "\n                               _get_last_id\n" in result.stdout


def test_against_tf_agents_itself_every_test_passes():
    # The harness's own check: TF-Agents' buffers under the same rewriting pass all of their tests.
    result = run("--buffers", "tf_agents")
    assert result.returncode == 0, result.stdout[-3000:]
    assert result.stdout.splitlines()[-1] == (
        "TF-Agents' replay-buffer tests against tf_agents: public 50/50 passed; reading a private member 6/6; "
        "different on purpose 0/0"
    )
