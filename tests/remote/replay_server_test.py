"""scripts/replay_server.py as a real process on loopback: serves, checkpoints on SIGTERM, restores on restart."""

from __future__ import annotations

import pathlib
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

pytestmark = pytest.mark.reverb  # conftest skips it where dm-reverb is missing (past Python 3.11)

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "replay_server.py"


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start(port, checkpoint_dir, *flags):
    process = subprocess.Popen(
        [
            sys.executable,
            str(SCRIPT),
            "--port",
            str(port),
            "--capacity",
            "1000",
            "--checkpoint-dir",
            str(checkpoint_dir),
            *map(str, flags),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = process.stdout.readline()  # printed once the server serves
    assert line.startswith(f"serving table 'tfbuffers' on port {port}"), (line, process.stderr.read())
    return process, line


def stop(process):
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    return out, err


def transitions(count):
    from tf_agents.trajectories import trajectory

    for t in range(count):
        step_type = 0 if t == 0 else 1
        yield trajectory.Trajectory(
            step_type=np.array([step_type], np.int32),
            observation=np.full([1, 4], t, np.float32),
            action=np.array([t % 2], np.int64),
            policy_info=(),
            next_step_type=np.array([1], np.int32),
            reward=np.array([1.0], np.float32),
            discount=np.array([1.0], np.float32),
        )


def test_the_server_serves_checkpoints_when_stopped_and_restores_every_item_on_restart(tmp_path):
    from scripts_test_helpers import cartpole_trajectory_spec

    import tfbuffers

    port = free_port()
    server, line = start(port, tmp_path / "replay")
    assert "(0 items restored)" in line
    try:
        spec = cartpole_trajectory_spec()
        with tfbuffers.ReverbReplayBuffer(spec, 2, address=f"localhost:{port}") as actor:
            for frame in transitions(12):
                actor.add_batch(frame)
            actor.flush()
            assert int(actor.num_frames()) == 11
    finally:
        out, err = stop(server)
    assert "final checkpoint of 11 items" in out and "stopped" in out
    assert "NO AUTHENTICATION" in err
    server, line = start(port, tmp_path / "replay")
    try:
        assert "(11 items restored)" in line
        with tfbuffers.ReverbReplayBuffer(spec, 2, address=f"localhost:{port}") as learner:
            items, _ = learner.get_next(sample_batch_size=200, num_steps=2)
            starts = set(items.observation[:, 0, 0].astype(int).tolist())
            assert starts == set(range(11))
    finally:
        stop(server)


def test_a_server_started_from_a_spec_file_serves_buffers_of_that_spec(tmp_path):
    from scripts_test_helpers import cartpole_trajectory_spec
    from tf_agents.specs import tensor_spec

    import tfbuffers

    spec = cartpole_trajectory_spec()
    tensor_spec.to_pbtxt_file(str(tmp_path / "spec.pbtxt"), spec)
    port = free_port()
    server, _ = start(port, tmp_path / "replay", "--spec-file", tmp_path / "spec.pbtxt", "--sequence-length", "3")
    try:
        with tfbuffers.ReverbReplayBuffer(spec, 3, address=f"localhost:{port}") as actor:
            for frame in transitions(4):
                actor.add_batch(frame)
            actor.flush()
            items, _ = actor.get_next(sample_batch_size=50, num_steps=3)
            assert set(items.observation[:, 0, 0].astype(int).tolist()) == {0, 1}
        with pytest.raises(ValueError, match="this buffer's items, windows of 2 frames"):
            tfbuffers.ReverbReplayBuffer(spec, 2, address=f"localhost:{port}")
    finally:
        stop(server)


def test_the_server_paces_actors_and_learners_when_asked(tmp_path):
    import reverb

    port = free_port()
    server, _ = start(port, tmp_path / "replay", "--min-size-to-sample", 10, "--samples-per-insert", 2.5)
    actor = None
    try:
        limiter = reverb.Client(f"localhost:{port}").server_info()["tfbuffers"].rate_limiter_info
        assert (limiter.samples_per_insert, limiter.min_size_to_sample) == (2.5, 10)
        assert (limiter.min_diff, limiter.max_diff) == (25.0 - 2.5, 25.0 + 2.5)  # error_buffer: max(10% of 25, 2.5)

        # An actor and no learner: the limiter admits 11 items, then its add waits. Stopped (SIGTERM) while it
        # waits, it exits, counting every frame it took (each recorded before its add), and warns of the unsent.
        record = tmp_path / "actor.rec"
        out, err = tmp_path / "actor.out", tmp_path / "actor.err"
        with open(out, "w") as stdout, open(err, "w") as stderr:
            actor = subprocess.Popen(
                [sys.executable, str(SCRIPT.parent / "collect.py"), "--replay-server", f"localhost:{port}",
                 "--record", str(record), "--no-progress"],
                stdout=stdout, stderr=stderr,
            )  # fmt: skip
        counts = [-1]
        while counts[-1] < 12 or counts[-1] != counts[-2]:  # held: the count stands still for 5 s
            assert len(counts) < 40 and actor.poll() is None, (counts, err.read_text()[-3000:])
            time.sleep(5.0)
            counts.append(record.stat().st_size // (8 * 6) if record.exists() else -1)  # rows of 2 + 4 float64
        assert reverb.Client(f"localhost:{port}").server_info()["tfbuffers"].current_size == 11
        actor.send_signal(signal.SIGTERM)
        assert actor.wait(timeout=60) == 0, err.read_text()[-3000:]
        assert f"added {counts[-1]} frames (" in out.read_text(), out.read_text()
        assert "items written since the last flush could not be sent to localhost" in err.read_text()
    finally:
        if actor is not None and actor.poll() is None:
            actor.kill()
        stop(server)
    server, _ = start(port, tmp_path / "default")
    try:  # without the flags: Reverb's MinSize(1), no pacing
        limiter = reverb.Client(f"localhost:{port}").server_info()["tfbuffers"].rate_limiter_info
        assert (limiter.samples_per_insert, limiter.min_size_to_sample) == (1.0, 1)
        assert limiter.max_diff == np.finfo(np.float64).max
    finally:
        stop(server)
