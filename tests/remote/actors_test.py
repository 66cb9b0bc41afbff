"""Many processes on loopback: scripts/replay_server.py, two scripts/collect.py actors, scripts/train_dqn.py learning.

One actor stops when done; the other is killed (SIGKILL) in the middle of an
episode. Every item on the server is read back and traced to the frames each
actor recorded (`collect.py --record`): on Reverb (the pinned stack) sampled
until every key was seen; on Ray (both stacks) every segment's frames in order.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

NEEDS_REVERB = pytest.mark.reverb  # conftest skips it where dm-reverb is missing (past Python 3.11)
NEEDS_RAY = pytest.mark.ray

SCRIPTS = pathlib.Path(__file__).resolve().parents[2] / "scripts"
FIRST, LAST = 0, 2
OBSERVATION_SIZE = 4  # CartPole


def launch(tmp_path, name, script, *args):
    """Starts a script with its output in files (a pipe nobody reads could fill and block it).

    It gets the environment a user's shell gives it: no Ray settings this test process may have made.
    """
    out = open(tmp_path / f"{name}.out", "w")  # noqa: SIM115 (the process holds it)
    err = open(tmp_path / f"{name}.err", "w")  # noqa: SIM115
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    return subprocess.Popen([sys.executable, str(SCRIPTS / script), *map(str, args)], stdout=out, stderr=err, env=env)


def output(tmp_path, name):
    return (tmp_path / f"{name}.out").read_text() + (tmp_path / f"{name}.err").read_text()


def wait_for(condition, what, timeout=180):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def start_server(tmp_path, name, port, *flags):
    server = launch(tmp_path, name, "replay_server.py", "--port", port, "--checkpoint-dir", tmp_path / "replay", *flags)
    wait_for(lambda: "serving " in output(tmp_path, name) or server.poll() is not None, "the server")
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


def kill_when(process, record_path, num_envs, condition):
    """Stops `process` (SIGSTOP) until its record of whole steps satisfies `condition`, then kills it (SIGKILL)."""
    for _ in range(100):
        process.send_signal(signal.SIGSTOP)
        time.sleep(0.05)
        record = rows(record_path)
        if len(record) % num_envs == 0 and condition(record):
            break
        process.send_signal(signal.SIGCONT)
        time.sleep(0.05)
    else:
        pytest.fail("the actor was never stopped where asked")
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait(timeout=30) == -signal.SIGKILL


def learner_and_actors(tmp_path, address, backend, label):
    """A learner and two actors on the server at `address`, waited for; returns them, the second actor still running.

    One actor ("done") adds 300 frames and exits; the learner trains 150 steps and exits; the other (two
    environments, "killed"), started first, has by then acted with a Q-network the learner published. On Ray the
    "done" actor starts once the other has claimed its segments, so that the segment it frees on exit is its own.
    """
    learner = launch(
        tmp_path, "learner", "train_dqn.py", "--backend", backend, "--replay-server", address,
        "--policy-dir", tmp_path / "policy", "--policy-interval", 50, "--num-iterations", 150,
        "--initial-collect-frames", 200, "--eval-interval", 150, "--eval-episodes", 2, "--batch-size", 32,
        "--output-dir", tmp_path / "dqn", "--no-progress",
    )  # fmt: skip
    killed = launch(
        tmp_path, "killed", "collect.py", "--backend", backend, "--replay-server", address, "--num-envs", 2,
        "--seed", 2, "--record", tmp_path / "killed.rec", "--policy-dir", tmp_path / "policy",
        "--policy-poll-seconds", 0.5, "--no-progress",
    )  # fmt: skip
    processes = [learner, killed]
    try:
        if backend == "ray":  # its segments claimed first: the actor that finishes frees its own, not one of these
            wait_for(lambda: "adding to segments " in output(tmp_path, "killed"), "the second actor's claim")
        done = launch(
            tmp_path, "done", "collect.py", "--backend", backend, "--replay-server", address, "--frames", 300,
            "--seed", 1, "--record", tmp_path / "done.rec", "--no-progress",
        )  # fmt: skip
        processes.insert(1, done)
        assert done.wait(timeout=240) == 0, output(tmp_path, "done")
        assert learner.wait(timeout=400) == 0, output(tmp_path, "learner")
        summary = json.loads((tmp_path / "dqn" / "summary.json").read_text())["result"]
        assert summary["train_steps"] == 150 and summary["frames_collected"] == 0
        assert f"with {label} at {address}" in output(tmp_path, "learner")
        # The second actor acts with a Q-network the learner published.
        wait_for(lambda: "acting with " in output(tmp_path, "killed"), "the actor to load the learner's policy")
        assert killed.poll() is None, output(tmp_path, "killed")
    except BaseException:
        for process in processes:
            if process.poll() is None:
                process.kill()
        raise
    return processes


@NEEDS_REVERB
def test_two_actors_and_a_learner_share_one_server_and_a_killed_actor_loses_no_committed_item(tmp_path):
    from replay_server_test import free_port

    port = free_port()
    address = f"localhost:{port}"
    server = start_server(tmp_path, "server", port)
    processes = [server]
    try:
        processes += learner_and_actors(tmp_path, address, "reverb", "tfbuffers Reverb tables")

        # Kill it in the middle of an episode: stopped where some recorded item belongs to no finished episode.
        def mid_episode(record):
            every, committed = windows(record, 2)
            return every - committed and np.sum(record[:, 1] == LAST) >= 3

        kill_when(processes[-1], tmp_path / "killed.rec", 2, mid_episode)

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


READ_SEGMENTS = """
import sys, numpy as np
from tfbuffers import RayReplayBuffer
buffer = RayReplayBuffer.connect("tfbuffers", address=sys.argv[1])
arrays = {}
for segment in range(buffer.batch_size):
    frames = buffer.gather_segment(segment)
    arrays[f"observation{segment}"] = np.asarray(frames.observation)
    arrays[f"step_type{segment}"] = np.asarray(frames.step_type)
windows, _ = buffer.get_next(sample_batch_size=2000, num_steps=2)
arrays["windows"] = np.asarray(windows.observation)
arrays["frames"] = np.asarray(int(buffer.num_frames()))
np.savez(sys.argv[2], **arrays)
"""


def ray_segments(tmp_path, address, name):
    """Every segment's frames (observations, step types), 2000 sampled windows and the frame count, read by a driver."""
    path = tmp_path / f"{name}.npz"
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    run = subprocess.run(
        [sys.executable, "-c", READ_SEGMENTS, address, str(path)], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    with np.load(path) as stored:
        return {key: stored[key] for key in stored.files}


def claimed(tmp_path, name):
    """The segments an actor said it adds to ("adding to segments [a, b] ...")."""
    line = next(line for line in output(tmp_path, name).splitlines() if line.startswith("adding to segments "))
    return json.loads(line.split("segments ", 1)[1].split("]", 1)[0] + "]")


@NEEDS_RAY
def test_on_ray_two_actors_and_a_learner_share_one_buffer_and_a_killed_actor_loses_only_unsent_frames(tmp_path):
    from replay_server_test import free_port

    port = free_port()
    address = f"127.0.0.1:{port}"
    ray_flags = ("--backend", "ray", "--segments", 3, "--capacity", 300_000)
    server = start_server(tmp_path, "server", port, *ray_flags)
    processes = [server]
    try:
        assert f"serving RayReplayBuffer 'tfbuffers' on port {port} (0 frames restored)" in output(tmp_path, "server")
        listening = output(tmp_path, "server").split("Listening: ", 1)[1].split(". ", 1)[0]
        assert f"gcs_server *:{port}" in listening and "dashboard" not in listening  # said at start
        processes += learner_and_actors(tmp_path, address, "ray", "tfbuffers RayReplayBuffer")

        def mid_episode(record):  # some environment's last recorded frame is not an episode's last
            last_steps = record[-2:, 1]
            return np.sum(record[:, 1] == LAST) >= 3 and (last_steps != LAST).any()

        kill_when(processes[-1], tmp_path / "killed.rec", 2, mid_episode)
        assert server.poll() is None  # still serving

        stored = ray_segments(tmp_path, address, "stored")
        done_record, killed_record = rows(tmp_path / "done.rec"), rows(tmp_path / "killed.rec")
        [done_segment], killed_segments = claimed(tmp_path, "done"), claimed(tmp_path, "killed")
        assert sorted([done_segment, *killed_segments]) == [0, 1, 2]  # each its own segments
        # The actor that finished: every frame it made, in order.
        np.testing.assert_array_equal(stored[f"observation{done_segment}"], done_record[:, 2:].astype(np.float32))
        np.testing.assert_array_equal(stored[f"step_type{done_segment}"], done_record[:, 1])
        # The killed one: each environment's frames in order up to where it was killed, less at most the adds it
        # had not sent (one call in flight and up to 63 waiting, RayWriter's max_pending=64; the frame being added).
        for env, segment in enumerate(killed_segments):
            made = killed_record[killed_record[:, 0] == env]
            kept = stored[f"observation{segment}"]
            assert 0 <= len(made) - len(kept) <= 2 * 64 + 1 and len(kept) > 0, (len(made), len(kept))
            np.testing.assert_array_equal(kept, made[: len(kept), 2:].astype(np.float32))
            np.testing.assert_array_equal(stored[f"step_type{segment}"], made[: len(kept), 1])
        # Sampled windows: consecutive frames of one environment, within one episode.
        every = windows(done_record, 1)[0] | windows(killed_record, 2)[0]
        assert {pair.astype(np.float32).tobytes() for pair in stored["windows"]} <= every
        frames = int(stored["frames"])
        assert frames == sum(len(stored[f"observation{segment}"]) for segment in range(3))

        # Stopped after its final checkpoint and started again, the server holds every frame, in place.
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0, output(tmp_path, "server")
        assert f"final checkpoint of {frames} frames" in output(tmp_path, "server")
        server = start_server(tmp_path, "restarted", port, *ray_flags)
        processes.append(server)
        assert f"({frames} frames restored)" in output(tmp_path, "restarted")
        restored = ray_segments(tmp_path, address, "restored")
        for key in (f"{field}{segment}" for field in ("observation", "step_type") for segment in range(3)):
            np.testing.assert_array_equal(restored[key], stored[key])
        # A server started with other flags on those checkpoints is refused, naming the flag's value.
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0, output(tmp_path, "restarted")
        other = launch(tmp_path, "other", "replay_server.py", "--port", port, "--checkpoint-dir", tmp_path / "replay",
                       "--backend", "ray", "--segments", 4, "--capacity", 300_000)  # fmt: skip
        assert other.wait(timeout=120) == 2
        assert "batch_size: the checkpoint in" in output(tmp_path, "other") and "made with 3" in output(
            tmp_path, "other"
        )
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)


@NEEDS_RAY
def test_on_ray_a_paced_actor_stopped_while_the_learner_is_gone_exits_and_says_what_the_limiter_holds(tmp_path):
    # Found in the paced distributed DQN run: after the learner finished, SIGTERM did not stop the actors (their
    # adds waited for the rate limiter), and past the handle's 60 s timeout the adds would have failed.
    from replay_server_test import free_port

    port = free_port()
    flags = ("--backend", "ray", "--segments", 1, "--samples-per-insert", 1000, "--min-size-to-sample", 10)
    server = start_server(tmp_path, "server", port, *flags)
    actor = launch(tmp_path, "actor", "collect.py", "--backend", "ray", "--replay-server", f"127.0.0.1:{port}",
                   "--record", tmp_path / "actor.rec", "--no-progress")  # fmt: skip
    try:
        # No learner: the limiter admits 11 inserts (min size 10, and an error buffer of 1,000, 10% of 10 x 1,000,
        # over 1,000 samples per insert); the writer returns at least 65 more adds (64 waiting, max_pending, and
        # those of its call in flight, up to 65 more, which the limiter holds up), then its next add waits, past the
        # handle's timeout (5 s) too. The recorder has that frame too: it records each frame before its add. On a
        # loaded machine the count can still grow after the 77th: it is read once it has stood still for 8 s.
        wait_for(lambda: (tmp_path / "actor.rec").exists() and len(rows(tmp_path / "actor.rec")) >= 77, "77 frames")
        counts = [len(rows(tmp_path / "actor.rec"))]
        while len(counts) < 2 or counts[-1] != counts[-2]:
            assert len(counts) < 15, f"the actor's frames never stopped: {counts}"
            time.sleep(8.0)
            counts.append(len(rows(tmp_path / "actor.rec")))
        made = counts[-1] - 1
        assert 76 <= made <= 11 + 65 + 64 and actor.poll() is None, counts  # still waiting for a learner
        actor.send_signal(signal.SIGTERM)
        assert actor.wait(timeout=60) == 0, output(tmp_path, "actor")
        said = output(tmp_path, "actor")
        assert f"added {made} frames (" in said, said
        held = re.search(r"(\d+) of them were not known to be stored \(the rate limiter held them\): handed to the "
                         r"buffer, which stores them once a learner samples", said)  # fmt: skip
        assert held is not None and 65 <= int(held.group(1)) <= made, said  # the call in flight's, stored or not
        # The buffer holds them past the actor's exit: a learner's samples let them in, in order.
        record = rows(tmp_path / "actor.rec")[:, 2:].astype(np.float32)
        first = ray_segments(tmp_path, f"127.0.0.1:{port}", "first")
        np.testing.assert_array_equal(first["observation0"], record[:11])
        second = ray_segments(tmp_path, f"127.0.0.1:{port}", "second")  # the first's 2,000 samples let 2 more in
        np.testing.assert_array_equal(second["observation0"], record[:13])
        server.send_signal(signal.SIGTERM)  # with adds still waiting in the buffer for the limiter
        assert server.wait(timeout=60) == 0, output(tmp_path, "server")
    finally:
        for process in (actor, server):
            if process.poll() is None:
                process.kill()
