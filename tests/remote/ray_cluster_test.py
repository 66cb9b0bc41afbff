"""RayReplayBuffer on a real Ray cluster of two nodes on this machine (loopback only): `two_nodes_scenario.py`.

The buffer's actor on one node, writer sessions on the other joining and leaving while a learner samples:
closed, dropped without `close()`, or killed (SIGKILL) mid-run, and the buffer's actor killed once (Ray
restarts it from its directory). Every add a session returned is in the buffer once, in order; a killed
session's are a prefix of what it made (the adds it had not sent are its documented loss); no window is torn
or crosses from one session into another.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.ray

SCENARIO = pathlib.Path(__file__).with_name("two_nodes_scenario.py")
SECONDS = 5  # a floor: the scenario runs on until six sessions (two of each end) and the buffer's death


def test_writers_on_another_node_come_go_and_die_and_every_returned_add_is_kept(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCENARIO), str(tmp_path / "buffer"), str(SECONDS)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    result = json.loads(line[len("RESULT ") :])
    # Two nodes, both on loopback; the buffer on one, every writer session on the other.
    assert sorted(result["nodes"].values()) == ["127.0.0.1", "127.0.0.1"]
    writer_nodes = {session["node"] for session in result["sessions"]}
    assert writer_nodes == set(result["nodes"]) - {result["buffer_node"]}
    assert result["buffer_restarted"]
    hows = [session["how"] for session in result["sessions"]]
    assert len(hows) >= 6 and set(hows) == {"close", "drop", "kill"}
    for session in result["sessions"]:
        stored = result["stored"].get(str(session["writer"]), [])
        if session["how"] == "kill":  # what it sent, in order; the rest died with it
            assert stored == list(range(len(stored))) and len(stored) < session["steps"], session
        else:  # closed or dropped: every add that returned, once, in order, in the segment it claimed
            assert stored == list(range(session["returned"])), session
            assert result["segments_of"][str(session["writer"])] == [session["segment"]], session
    report = result["report"]
    assert report["claims"] == {} and report["lost_adds"] == 0  # every claim ended; no dropped writer lost adds
    assert result["sampled"]["batches"] > 0 and result["sampled"]["bad_windows"] == 0
