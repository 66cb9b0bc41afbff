"""Many processes on loopback: scripts/replay_server.py, two scripts/collect.py actors, scripts/train_dqn.py learning.

One actor stops when done; the other is killed (SIGKILL) in the middle of an
episode. Every item on the server is read back (sampled until every key was
seen) and traced to the frames each actor recorded (`collect.py --record`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("reverb") is None, reason="dm-reverb: pinned stack only")

SCRIPTS = pathlib.Path(__file__).resolve().parent.parent / "scripts"
FIRST, LAST = 0, 2
OBSERVATION_SIZE = 4  # CartPole


def launch(tmp_path, name, script, *args):
    """Starts a script with its output in files (a pipe nobody reads could fill and block it)."""
    out = open(tmp_path / f"{name}.out", "w")  # noqa: SIM115 (the process holds it)
    err = open(tmp_path / f"{name}.err", "w")  # noqa: SIM115
    return subprocess.Popen([sys.executable, str(SCRIPTS / script), *map(str, args)], stdout=out, stderr=err)


def output(tmp_path, name):
    return (tmp_path / f"{name}.out").read_text() + (tmp_path / f"{name}.err").read_text()


def wait_for(condition, what, timeout=180):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def start_server(tmp_path, name, port):
    server = launch(tmp_path, name, "replay_server.py", "--port", port, "--checkpoint-dir", tmp_path / "replay")
    wait_for(lambda: "serving table" in output(tmp_path, name) or server.poll() is not None, "the server")
    assert server.poll() is None, output(tmp_path, name)
    return server


def rows(path):
    sys.path.insert(0, str(SCRIPTS))
    from collect import read_record

    return read_record(path, OBSERVATION_SIZE)


def windows(record, num_envs):
    """The items (pairs of observations, as bytes) the recorded frames make, by the buffer's rules.

    Returns every item, and those of episodes that ended (LAST) before the last
    recorded step: the actor had returned from adding them, so they were flushed.
    """
    last_step = len(record) // num_envs - 1
    every, committed = set(), set()
    for env in range(num_envs):
        episode = []
        for row in np.flatnonzero(record[:, 0] == env):
            frame = record[row]
            if frame[1] == FIRST and episode:
                episode = []
            episode.append(frame[2:].astype(np.float32))
            if len(episode) >= 2:
                every.add(np.stack(episode[-2:]).tobytes())
            if frame[1] == LAST and row // num_envs < last_step:
                committed |= {np.stack(episode[i : i + 2]).tobytes() for i in range(len(episode) - 1)}
    return every, committed


def every_item(address):
    """{key: observation pair as bytes} of every item in the table, sampled until every key was seen."""
    from scripts_test_helpers import cartpole_trajectory_spec

    import tfbuffers

    with tfbuffers.ReverbReplayBuffer(cartpole_trajectory_spec(), 2, address=address) as reader:
        size = int(reader.num_frames())
        items = {}
        deadline = time.monotonic() + 120
        while len(items) < size:
            assert time.monotonic() < deadline, f"saw {len(items)} of {size} items"
            batch, info = reader.get_next(sample_batch_size=1000, num_steps=2)
            for key, pair in zip(info.ids.tolist(), batch.observation):
                items[key] = pair.astype(np.float32).tobytes()
        assert int(reader.num_frames()) == size  # nothing came or went while reading
    return items


def test_two_actors_and_a_learner_share_one_server_and_a_killed_actor_loses_no_committed_item(tmp_path):
    from replay_server_test import free_port

    port = free_port()
    address = f"localhost:{port}"
    server = start_server(tmp_path, "server", port)
    processes = [server]
    try:
        learner = launch(
            tmp_path, "learner", "train_dqn.py", "--replay-server", address, "--policy-dir", tmp_path / "policy",
            "--policy-interval", 50, "--num-iterations", 150, "--initial-collect-frames", 200, "--eval-interval", 150,
            "--eval-episodes", 2, "--batch-size", 32, "--output-dir", tmp_path / "dqn", "--no-progress",
        )  # fmt: skip
        done = launch(
            tmp_path, "done", "collect.py", "--replay-server", address, "--frames", 300, "--seed", 1,
            "--record", tmp_path / "done.rec", "--no-progress",
        )  # fmt: skip
        killed = launch(
            tmp_path, "killed", "collect.py", "--replay-server", address, "--num-envs", 2, "--seed", 2,
            "--record", tmp_path / "killed.rec", "--policy-dir", tmp_path / "policy", "--policy-poll-seconds", 0.5,
            "--no-progress",
        )  # fmt: skip
        processes += [learner, done, killed]

        assert done.wait(timeout=240) == 0, output(tmp_path, "done")
        assert learner.wait(timeout=400) == 0, output(tmp_path, "learner")
        summary = json.loads((tmp_path / "dqn" / "summary.json").read_text())["result"]
        assert summary["train_steps"] == 150 and summary["frames_collected"] == 0
        assert "with tfbuffers Reverb tables at " + address in output(tmp_path, "learner")
        # The killed actor acted with a Q-network the learner published before it was killed.
        wait_for(lambda: "acting with " in output(tmp_path, "killed"), "the actor to load the learner's policy")
        assert killed.poll() is None, output(tmp_path, "killed")

        # Kill it in the middle of an episode: stopped where some recorded item belongs to no finished episode.
        for _ in range(100):
            killed.send_signal(signal.SIGSTOP)
            time.sleep(0.05)
            record = rows(tmp_path / "killed.rec")
            if len(record) % 2 == 0:
                every, committed = windows(record, 2)
                if every - committed and np.sum(record[:, 1] == LAST) >= 3:
                    break
            killed.send_signal(signal.SIGCONT)
            time.sleep(0.05)
        else:
            pytest.fail("the actor was never stopped in the middle of an episode")
        os.kill(killed.pid, signal.SIGKILL)
        assert killed.wait(timeout=30) == -signal.SIGKILL

        assert server.poll() is None  # still serving
        items = every_item(address)
        first_windows, first_committed = windows(rows(tmp_path / "done.rec"), 1)
        second_windows, second_committed = windows(rows(tmp_path / "killed.rec"), 2)
        stored = set(items.values())
        assert len(stored) == len(items)  # no window stored twice
        assert stored <= first_windows | second_windows  # nothing foreign, every item whole
        assert first_windows <= stored  # the actor that finished sent everything, its unfinished episode included
        assert second_committed <= stored  # the killed actor lost no item of an episode that had ended
        assert len(second_committed) >= 3 and second_windows - second_committed  # it was killed mid-episode

        # Stopped after its final checkpoint and started again, the server holds every item.
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0
        assert f"final checkpoint of {len(items)} items" in output(tmp_path, "server")
        server = start_server(tmp_path, "restarted", port)
        processes.append(server)
        assert f"({len(items)} items restored)" in output(tmp_path, "restarted")
        assert every_item(address) == items
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)
