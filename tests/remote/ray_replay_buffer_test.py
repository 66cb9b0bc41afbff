"""RayReplayBuffer on a real local Ray cluster, on this machine only.

The API eagerly and in graphs, exact probabilities across segments, writers in other processes, a killed
writer, a killed buffer actor, the rate limiter, and who can reach the cluster.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time

import conftest
import numpy as np
import pytest
import ray
import tensorflow as tf
from conftest import NewestAdds
from traced_frames import TRACED

import tfbuffers
from tfbuffers import PyUniformReplayBuffer, RayReplayBuffer, kinds
from tfbuffers import ray_replay_buffer as ray_lib
from tfbuffers.specs import flatten_spec

SPEC = {"x": tf.TensorSpec([], tf.int64), "obs": tf.TensorSpec([3], tf.float32)}


@pytest.fixture(scope="module", autouse=True)
def cluster():
    """One local cluster for the module, started as a buffer starts it; stopped at the end."""
    started = not ray.is_initialized()
    ray_lib.ensure_ray()
    # The actors and tasks below run in Ray's workers, which cannot import this module by its name: by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.cloudpickle.register_pickle_by_value(conftest)  # its sampler, NewestAdds
    yield ray.get_runtime_context().gcs_address
    if started:
        ray.shutdown()


def batch(values, size):
    values = np.asarray(values, np.int64)
    return {"x": values, "obs": np.repeat(values[:, None].astype(np.float32), 3, axis=1)[:size]}


def traced(writer, envs, step, episode_length=5):
    envs = np.asarray(envs, np.int64)
    types = np.full(len(envs), 1 if step % episode_length not in (0, episode_length - 1) else 0, np.int32)
    if step % episode_length == episode_length - 1:
        types[:] = 2
    steps = np.full(len(envs), step, np.int64)
    obs = (writer * 1_000_000 + envs * 1_000 + steps).astype(np.float32)[:, None] * np.ones(4, np.float32)
    return {"writer": np.full(len(envs), writer, np.int64), "env": envs, "step": steps, "step_type": types, "obs": obs}


def kill(actor):
    """Kills a Ray actor's process (SIGKILL) and waits until Ray says it is dead (`ray.kill` does not wait)."""
    ray.kill(actor)
    for _ in range(600):
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=10)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.05)
    raise AssertionError("the actor outlived ray.kill by 30 s")


def check_windows(items, num_steps, episodes=True):
    """Every window: one writer and environment, consecutive steps, whole frames, within one episode."""
    writer, env, step = (np.asarray(items[key]) for key in ("writer", "env", "step"))
    obs, types = np.asarray(items["obs"]), np.asarray(items["step_type"])
    assert (writer == writer[:, :1]).all() and (env == env[:, :1]).all()
    assert (np.diff(step, axis=1) == 1).all()
    assert (obs == (writer * 1_000_000 + env * 1_000 + step)[..., None].astype(np.float32)).all()
    if episodes and num_steps > 1:
        assert not (types[:, :-1] == 2).any() and not (types[:, 1:] == 0).any()


def test_local_cluster_listens_without_dashboard_and_refuses_drivers_without_its_token(cluster, tmp_path):
    sockets = ray_lib.listening(ray_lib.ray_processes())
    names = {name for name, _, _ in sockets}
    assert "gcs_server" in names and "raylet" in names
    assert not any("dashboard" in name for name in names)
    assert 8265 not in {port for _, _, port in sockets}  # Ray's dashboard port
    assert os.environ["RAY_AUTH_MODE"] == "token"
    token = pathlib.Path.home() / ".ray" / "auth_token"  # Ray's, written 0644: tightened when the cluster started
    assert token.stat().st_mode & 0o777 == 0o600
    token.chmod(0o644)
    assert ray_lib.private_token() == token and token.stat().st_mode & 0o777 == 0o600
    assert ray_lib.private_token() is None  # already private: nothing to do
    assert int(cluster.rsplit(":", 1)[1]) in {port for name, _, port in sockets if name == "gcs_server"}
    script = "import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False); print('CONNECTED')"
    for auth in ("token", "disabled"):  # a driver with no token (another home), and one with authentication off
        env = {**os.environ, "HOME": str(tmp_path), "RAY_AUTH_MODE": auth}
        env.pop("RAY_AUTH_TOKEN", None)
        env.pop("RAY_AUTH_TOKEN_PATH", None)
        run = subprocess.run(
            [sys.executable, "-c", script, cluster], env=env, capture_output=True, text=True, timeout=120
        )
        assert run.returncode != 0 and "CONNECTED" not in run.stdout, (auth, run.stdout, run.stderr[-2000:])
        assert "token" in run.stderr.lower(), run.stderr[-2000:]


def test_api_matches_the_local_buffer_eagerly_and_in_tf_function():
    buffer = RayReplayBuffer(SPEC, batch_size=2, max_length=4, seed=0)
    local = PyUniformReplayBuffer(SPEC, batch_size=2, max_length=4, seed=0)
    for t in range(6):
        for target in (buffer, local):
            ids = target.add_batch(batch([t, 100 + t], 2))
        assert np.asarray(ids).tolist() == [2 * t, 2 * t + 1]
    assert int(buffer.num_frames()) == 8 == len(buffer)
    assert buffer.frames_per_segment() == [4, 4]
    for key in SPEC:
        np.testing.assert_array_equal(buffer.gather_all()[key], local.gather_all()[key])
    items, info = buffer.get_next(sample_batch_size=64, num_steps=2)
    x, ids = np.asarray(items["x"]), np.asarray(info.ids)
    assert set(map(tuple, x.tolist())) == {(t, t + 1) for t in (2, 3, 4)} | {(t, t + 1) for t in (102, 103, 104)}
    assert (ids % 2 == x // 100).all() and (ids // 2 == x % 100).all()  # ids: add number * batch_size + segment
    np.testing.assert_array_equal(info.probabilities, np.full(64, 1 / 6, np.float32))  # as the local buffer's
    _, local_info = local.get_next(sample_batch_size=4, num_steps=2)
    np.testing.assert_array_equal(local_info.probabilities, np.full(4, 1 / 6, np.float32))
    single, single_info = buffer.get_next()
    assert single["obs"].shape == (3,) and np.asarray(single_info.ids).shape == ()

    @tf.function
    def step(t):
        ids = buffer.add_batch({"x": tf.stack([t, 100 + t]), "obs": tf.fill([2, 3], tf.cast(t, tf.float32))})
        items, info = buffer.get_next(sample_batch_size=3, num_steps=2)
        return ids, items["x"], info.probabilities, buffer.num_frames()

    ids, x, probabilities, frames = step(tf.constant(6, tf.int64))
    assert np.asarray(ids).tolist() == [12, 13] and int(frames) == 8
    assert np.asarray(probabilities).tolist() == [np.float32(1 / 6)] * 3 and x.shape == (3, 2)
    gathered = tf.function(buffer.gather_all)()
    assert np.asarray(gathered["x"]).tolist() == [[3, 4, 5, 6], [103, 104, 105, 106]]
    dataset = buffer.as_dataset(sample_batch_size=5, num_steps=3)
    for items, info in dataset.take(20):
        assert items["x"].shape == (5, 3) and (np.diff(np.asarray(items["x"]), axis=1) == 1).all()
        np.testing.assert_array_equal(info.probabilities, np.full(5, 1 / 4, np.float32))
    buffer.clear()
    assert int(buffer.num_frames()) == 0
    with pytest.raises(tf.errors.InvalidArgumentError, match="RayReplayBuffer .* is empty"):
        buffer.get_next(sample_batch_size=2)
    with pytest.raises(ValueError, match="single_deterministic_pass: not supported"):
        buffer.as_dataset(single_deterministic_pass=True)
    buffer.close()
    with pytest.raises(ValueError, match="closed"):
        buffer.num_frames()


def test_a_dataset_fetches_whole_batches_up_to_prefetch_items_and_prefetch_bytes():
    control = flatten_spec({"o": tf.TensorSpec([17], tf.float32), "a": tf.TensorSpec([6], tf.int64)})
    atari = flatten_spec({"pixels": tf.TensorSpec([84, 84, 4], tf.uint8)})
    assert ray_lib.fetch_batches(control, 256, 2, 8192) == 32  # 8192 windows of 2 * 116 bytes: 1.9 MB
    assert ray_lib.fetch_batches(control, 300, None, 8192) == 27  # whole batches only
    assert ray_lib.fetch_batches(control, None, None, 10) == 10
    # 32 windows of 2 * 28,224 bytes: 1.8 MB a batch, so 18 batches in 32 MiB, not 8192 // 32 = 256.
    assert ray_lib.fetch_batches(atari, 32, 2, 8192) == ray_lib.PREFETCH_BYTES // (32 * 2 * 28_224) == 18
    assert ray_lib.fetch_batches(atari, 1024, 4, 8192) == 1  # a batch over the bytes is still fetched, alone
    assert ray_lib.fetch_batches(control, 256, 2, 100) == 1


@pytest.mark.parametrize("in_graph", [False, True])
def test_a_refused_batch_names_the_field_and_changes_nothing(in_graph):
    buffer = RayReplayBuffer(SPEC, batch_size=2, max_length=3, seed=1)
    buffer.add_batch(batch([1, 2], 2))
    add = tf.function(buffer.add_batch) if in_graph else buffer.add_batch
    with pytest.raises(ValueError, match="obs: expected dtype float32, got float64"):
        add({"x": np.array([3, 4]), "obs": np.zeros([2, 3])})
    with pytest.raises(ValueError, match=r"obs: expected leading batch size 2, got 1 \(shape \(1, 3\)\)"):
        add({"x": np.array([3]), "obs": np.zeros([1, 3], np.float32)})
    with pytest.raises(TypeError, match="obs"):
        add({"x": np.array([3, 4])})
    assert int(buffer.num_frames()) == 2
    add(batch([5, 6], 2))  # the next add, sample, gather and clear work
    sample = lambda: buffer.get_next(sample_batch_size=4)  # noqa: E731
    items, _ = (tf.function(sample) if in_graph else sample)()
    assert set(np.asarray(items["x"]).tolist()) <= {1, 2, 5, 6}
    assert np.asarray(buffer.gather_all()["x"]).tolist() == [[1, 5], [2, 6]]
    (tf.function(buffer.clear) if in_graph else buffer.clear)()
    assert int(buffer.num_frames()) == 0
    buffer.close()


def test_bad_arguments_are_refused_before_an_actor_starts():
    with pytest.raises(ValueError, match="episode_boundaries: expected"):
        RayReplayBuffer(SPEC, batch_size=2, max_length=3, episode_boundaries="nope")
    with pytest.raises(ValueError, match="sampler: expected one of"):
        RayReplayBuffer(SPEC, capacity=4, sampler="lifo")
    with pytest.raises(ValueError, match="capacity: expected a multiple of batch_size=3, got 4"):
        RayReplayBuffer(SPEC, capacity=4, batch_size=3)
    with pytest.raises(ValueError, match="error_buffer: expected at least"):
        RayReplayBuffer(SPEC, capacity=4, samples_per_insert=2.0, error_buffer=1.0)
    with pytest.raises(ValueError, match="timeout: expected a number of seconds > 0 or None, got 0"):
        RayReplayBuffer(SPEC, capacity=4, timeout=0)
    with pytest.raises(ValueError, match="no buffer named 'absent'"):
        RayReplayBuffer.connect("absent")


def test_a_sampler_factory_runs_in_the_actor_as_the_local_buffers_run_it(tmp_path):
    """`sampler=` takes what the local buffers take: the factory is pickled to the actor, each segment draws by it."""
    buffer = RayReplayBuffer(SPEC, batch_size=2, max_length=4, sampler=NewestAdds, seed=1, directory=tmp_path / "d")
    local = PyUniformReplayBuffer(SPEC, batch_size=2, max_length=4, sampler=NewestAdds, seed=1)
    assert buffer.sampler is NewestAdds and not buffer.prioritized
    for t in range(6):
        for target in (buffer, local):
            target.add_batch(batch([t, 100 + t], 2))
    items, info = buffer.get_next(sample_batch_size=200)
    assert set(np.asarray(items["x"]).tolist()) == {4, 5, 104, 105}  # each segment's newest 2 adds only
    np.testing.assert_array_equal(info.probabilities, np.full(200, 0.25))
    _, local_info = local.get_next(sample_batch_size=1)
    assert float(local_info.probabilities[0]) == 0.25
    with pytest.raises(
        ValueError, match=r"update_priorities: the buffer's sampler keeps no priorities \(sampler=<class"
    ):
        buffer.update_priorities([0], [1.0])
    # The manifest records the factory by its import path: load and open sample by it again.
    manifest = (tmp_path / "d" / "ray_buffer.json").read_text()
    assert '"sampler": "conftest:NewestAdds"' in manifest
    buffer.save(tmp_path / "saved")
    kill(buffer.actor)
    for again in (RayReplayBuffer.open(tmp_path / "d"), RayReplayBuffer.load(tmp_path / "saved")):
        assert again.sampler is NewestAdds
        items, _ = again.get_next(sample_batch_size=100)
        assert set(np.asarray(items["x"]).tolist()) == {4, 5, 104, 105}
        again.close()
    # A factory importing would not give back cannot be recorded: refused before an actor starts.
    with pytest.raises(ValueError, match="sampler: expected a name of .* importable by its name .* directory="):
        RayReplayBuffer(SPEC, capacity=4, sampler=lambda *args: NewestAdds(*args), directory=tmp_path / "e")
    assert not (tmp_path / "e").exists()
    unrecorded = RayReplayBuffer(SPEC, capacity=4, sampler=lambda *args: NewestAdds(*args))  # no file: pickled
    unrecorded.add_batch(batch([7], 1))
    with pytest.raises(ValueError, match="sampler: expected a name of .* RayReplayBuffer.save"):
        unrecorded.save(tmp_path / "f")
    assert not (tmp_path / "f").exists()
    assert np.asarray(unrecorded.get_next(sample_batch_size=3)[0]["x"]).tolist() == [7, 7, 7]  # unchanged
    unrecorded.close()
    with pytest.raises(ValueError, match="sampler: expected a sampler that draws without priorities"):
        RayReplayBuffer(SPEC, capacity=4, sampler=tfbuffers.sampling.PrioritizedSampler)


@pytest.mark.parametrize("layout", ["elastic", "segments"])
def test_prioritized_probabilities_are_one_buffers_across_segments(layout):
    # Both made by the registry's kinds, alike: the remote kind presets the sampler.
    buffer = kinds.make(
        "ray_prioritized", SPEC, batch_size=2, max_length=4, seed=2, priority_exponent=0.5, layout=layout
    )
    local = kinds.make("py_prioritized", SPEC, batch_size=2, max_length=4, seed=2, priority_exponent=0.5)
    assert type(buffer) is RayReplayBuffer and buffer.sampler == "prioritized" and buffer.prioritized
    for t in range(3):
        for target in (buffer, local):
            target.add_batch(batch([t, 100 + t], 2))
    for target in (buffer, local):
        assert target.update_priorities(np.array([0, 1, 2]), np.array([9.0, 0.0, 4.0])) == 0
        target.add_batch(batch([3, 103], 2))  # both new frames get the largest priority, 9, segment 1's too
    expected = {}
    for _ in range(20):
        _, info = local.get_next(sample_batch_size=64)
        expected.update(zip(np.asarray(info.ids).tolist(), np.asarray(info.probabilities).tolist()))
    seen = {}
    for _ in range(20):
        items, info = buffer.get_next(sample_batch_size=64)
        seen.update(zip(np.asarray(info.ids).tolist(), np.asarray(info.probabilities).tolist()))
        assert 100 not in np.asarray(items["x"]).tolist()  # priority 0: never drawn
    assert set(seen) == set(expected) == {0, 2, 3, 4, 5, 6, 7}
    for key in seen:
        assert seen[key] == pytest.approx(expected[key], rel=1e-6), key
    weights = np.array([9.0, 4.0, 1.0, 1.0, 1.0, 9.0, 9.0]) ** 0.5  # ids 0, 2, 3, 4, 5, 6, 7
    assert seen[0] == pytest.approx(weights[0] / weights.sum(), rel=1e-6)
    with pytest.raises(ValueError, match="ids: expected ids of frames stored .* got 8 at index 1"):
        buffer.update_priorities(np.array([1, 8]), np.array([1.0, 1.0]))
    with pytest.raises(ValueError, match="got -1.0 at index 0"):
        buffer.update_priorities(np.array([1]), np.array([-1.0]))
    _, info = buffer.get_next(sample_batch_size=64)  # unchanged: id 1 still has priority 0
    assert 1 not in np.asarray(info.ids).tolist()
    skipped = tf.function(buffer.update_priorities)(tf.constant([1, 3]), tf.constant([1.0, 2.0], tf.float64))
    assert int(skipped) == 0
    uniform = RayReplayBuffer(SPEC, capacity=2)
    with pytest.raises(ValueError, match="update_priorities: the buffer samples uniformly"):
        uniform.update_priorities([0], [1.0])
    for target in (buffer, uniform):
        target.close()


@pytest.mark.parametrize("layout", ["elastic", "segments"])
def test_windows_stay_within_episodes_with_one_buffers_probabilities(layout):
    buffer = RayReplayBuffer(TRACED, batch_size=2, max_length=8, episode_boundaries=True, seed=3, layout=layout)
    local = PyUniformReplayBuffer(TRACED, batch_size=2, max_length=8, episode_boundaries=True, seed=3)
    for step in range(11):
        for target in (buffer, local):
            target.add_batch(traced(0, [0, 1], step))
    items, info = buffer.get_next(sample_batch_size=200, num_steps=3)
    check_windows(items, 3)
    _, local_info = local.get_next(sample_batch_size=1, num_steps=3)
    np.testing.assert_array_equal(info.probabilities, np.full(200, local_info.probabilities[0]))
    buffer.close()


@ray.remote(num_cpus=0)
class Actor:
    """A process of its own that adds its environments' frames through a writer of the buffer it was handed."""

    def __init__(self, buffer, writer_id, num_envs):
        self.buffer = buffer
        self.writer = buffer.writer(num_envs)
        self.id = writer_id

    def segments(self):
        return self.writer.segments

    def run(self, steps, pause=0.0, first=0):
        envs = np.array(self.writer.segments)
        returned = []
        for step in range(first, first + steps):
            self.writer.add_batch(traced(self.id, envs, step))
            returned.append(step)
            time.sleep(pause)
        self.writer.flush()
        return returned

    def close(self):
        self.writer.close()


def test_actor_processes_add_while_a_learner_samples_and_updates_priorities():
    buffer = RayReplayBuffer(
        TRACED, batch_size=6, max_length=40, sampler="prioritized", episode_boundaries=True, seed=4, timeout=120
    )
    actors = [Actor.remote(buffer, writer, 2) for writer in range(3)]
    segments = ray.get([actor.segments.remote() for actor in actors])
    assert sorted(sum(segments, [])) == list(range(6))
    with pytest.raises(ValueError, match="num_envs: expected at most the 0 free segment"):
        buffer.writer(1)
    assert [len(steps) for steps in ray.get([actor.run.remote(10) for actor in actors])] == [10, 10, 10]
    # Windows within episodes exist now: the learner samples and updates while the next 20 steps are added
    # (at least once, however fast the actors are on a loaded machine).
    runs = [actor.run.remote(20, first=10) for actor in actors]
    sampled = 0
    while not sampled or not all(ray.wait([run], timeout=0)[0] for run in runs):
        items, info = buffer.get_next(sample_batch_size=16, num_steps=2)
        check_windows(items, 2)
        buffer.update_priorities(np.asarray(info.ids)[:, 0], np.asarray(items["obs"])[:, 0, 0] % 7 + 1)
        sampled += 1
    assert [len(steps) for steps in ray.get(runs)] == [20, 20, 20]
    for writer, owned in enumerate(segments):  # every frame traced: none lost, none duplicated, none misplaced
        for env in owned:
            frames = buffer.gather_segment(env)
            assert np.asarray(frames["step"]).tolist() == list(range(30))
            assert set(np.asarray(frames["writer"]).tolist()) == {writer}
            assert set(np.asarray(frames["env"]).tolist()) == {env}
    items, _ = buffer.get_next(sample_batch_size=500, num_steps=3)
    check_windows(items, 3)
    ray.get([actor.close.remote() for actor in actors])
    assert buffer.writer(6).segments == list(range(6))  # released: claimable again
    buffer.close()


def test_a_killed_actor_stops_only_its_own_segments():
    buffer = RayReplayBuffer(TRACED, batch_size=3, max_length=50, episode_boundaries=True, seed=5)
    doomed = Actor.remote(buffer, 1, 2)
    doomed_segments = ray.get(doomed.segments.remote())
    running = doomed.run.remote(10_000, 0.002)  # adds until killed, mid-episode
    while min(buffer.frames_per_segment()[s] for s in doomed_segments) < 12:
        time.sleep(0.05)
    kill(doomed)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(running)
    left = None
    while left != buffer.frames_per_segment():  # an add sent before the kill may still land: then none does
        left = buffer.frames_per_segment()
        time.sleep(0.5)
    with buffer.writer(1) as mine:  # the free segment goes on
        (segment,) = mine.segments
        for step in range(20):
            mine.add_batch(traced(2, [segment], step))
    assert [buffer.frames_per_segment()[s] for s in doomed_segments] == [left[s] for s in doomed_segments]
    assert buffer.frames_per_segment()[segment] == 20
    for _ in range(5):  # whole frames only, windows within one writer's environment and episode
        items, _ = buffer.get_next(sample_batch_size=200, num_steps=4)
        check_windows(items, 4)
    with pytest.raises(ValueError, match="num_envs: expected at most the 1 free segment"):
        buffer.writer(2)  # the dead actor's segments stay claimed until their lease runs out (30 s)
    buffer.close()


def test_rate_limiter_waits_and_says_why():
    limiter = ray_lib.RateLimiter(4, 2.0, 4.0)  # Reverb: min_diff = 4, max_diff = 12
    assert [limiter.can_insert(size, 1) for size in (0, 3)] == [True, True]
    limiter.inserts = 4
    assert not limiter.can_sample(3, 1) and limiter.can_sample(4, 4) and not limiter.can_sample(4, 5)
    assert limiter.can_insert(4, 2) and not limiter.can_insert(4, 3)  # (4 + 3) * 2 - 0 = 14 > 12
    buffer = RayReplayBuffer(SPEC, batch_size=1, max_length=64, min_size_to_sample=4, samples_per_insert=2.0,
                             error_buffer=4.0, timeout=0.5)  # fmt: skip
    for t in range(3):
        buffer.add_batch(batch([t], 1))
    with pytest.raises(TimeoutError, match="sample of 1 window.*holds 3 frame.*fewer than min_size_to_sample"):
        buffer.get_next()
    for t in range(3, 6):
        buffer.add_batch(batch([t], 1))
    with pytest.raises(TimeoutError, match="add of 1 frame.*6 frame.*inserted for 0 window.*sample"):
        buffer.add_batch(batch([6], 1))
    buffer.get_next(sample_batch_size=4)
    buffer.add_batch(batch([6], 1))  # 4 samples made room for 2 frames
    assert int(buffer.num_frames()) == 7
    waited = []
    sampler = threading.Thread(target=lambda: waited.append(buffer.get_next(sample_batch_size=6)))
    buffer.get_next(sample_batch_size=6)  # 10 of 14 - 4 = 10 allowed: the next 6 wait for adds
    sampler.start()
    time.sleep(0.2)
    assert not waited
    buffer.add_batch(batch([7], 1))  # 16 - 10 - 6 = 0 < 4: still waits
    time.sleep(0.1)
    buffer.add_batch(batch([8], 1))  # 18 - 10 - 6 = 2 < 4
    buffer.add_batch(batch([9], 1))  # 20 - 16 = 4 >= 4: it goes
    sampler.join(5)
    assert len(waited) == 1 and waited[0][0]["x"].shape == (6,)
    buffer.clear()  # the limiter counts from nothing again
    with pytest.raises(TimeoutError, match="holds 0 frame"):
        buffer.get_next()
    buffer.close()


def test_a_writers_returned_adds_are_stored_in_order_whatever_the_rate_limiter_holds():
    # Issue 50: an add that returned is stored unless the process dies. Ratio 1 with error_buffer 2: three frames may
    # be added before a sample; the actor keeps the rest waiting (it used to time them out and drop them), and a
    # writer with max_pending adds waiting refuses the next frame, past its timeout, without taking it.
    buffer = RayReplayBuffer(SPEC, batch_size=2, max_length=200, min_size_to_sample=1, samples_per_insert=1.0,
                             error_buffer=2.0, timeout=0.5)  # fmt: skip
    writer = buffer.writer(1)
    ids, accepted = [], 0
    with pytest.raises(TimeoutError) as raised:
        for t in range(200):
            ids.append(writer.add_batch(batch([t], 1)).tolist())  # returns at once: adds are sent behind
            accepted += 1
    assert accepted >= 64 and ids[:3] == [[0], [2], [4]]  # add_number * batch_size + segment 0
    assert str(raised.value).startswith(
        f"RayWriter of RayReplayBuffer {buffer.name!r}: add_batch waited 0.5 s for {writer.pending} earlier add(s) "
        "to be stored (the rate limiter holds them until the learner samples): this frame was not added"
    )
    assert accepted - 3 <= writer.pending <= accepted  # not known to be stored: the call in flight counts whole
    with pytest.raises(TimeoutError, match=rf"flush waited 0.5 s for {writer.pending} add\(s\) to be stored"):
        writer.flush()
    assert buffer.frames_per_segment() == [3, 0]
    # A learner samples in a thread of its own: the limiter lets the kept adds in as it samples, and the writer's
    # flushes (each waiting up to the timeout) return once all of them are stored.
    learning = threading.Event()

    def learner():
        while not learning.is_set():
            with contextlib.suppress(TimeoutError, tf.errors.InvalidArgumentError):
                buffer.get_next(sample_batch_size=1)

    thread = threading.Thread(target=learner)
    thread.start()
    try:
        deadline = time.monotonic() + 60.0  # a bound on correctness (a learner that died), not a speed limit
        while writer.pending:
            assert time.monotonic() < deadline, f"{writer.pending} kept add(s) not stored 60 s into the sampling"
            with contextlib.suppress(TimeoutError):
                writer.flush()
    finally:
        learning.set()
        thread.join()
    writer.close()
    assert np.asarray(buffer.gather_segment(0)["x"]).tolist() == list(range(accepted))  # every one, in order
    with pytest.raises(ValueError, match="RayWriter: the writer is closed"):
        writer.add_batch(batch([9], 1))
    unlimited = RayReplayBuffer(SPEC, batch_size=3, max_length=500)
    with unlimited.writer(2) as fast:
        for t in range(300):
            fast.add_batch({"x": np.array([t, 1000 + t]), "obs": np.zeros([2, 3], np.float32)})
    assert unlimited.frames_per_segment() == [300, 300, 0]
    assert np.asarray(unlimited.gather_segment(1)["x"]).tolist() == list(range(1000, 1300))  # in order
    for target in (buffer, unlimited):
        target.close()


def wait_until(condition, seconds=60.0):
    """Polls `condition()` until it holds; fails after `seconds` (a bound on correctness, not a speed limit)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not within the bound"
        time.sleep(0.05)


@ray.remote(num_cpus=0)
def add_and_drop(buffer, frames):
    """A Ray task whose writer goes out of scope without close(), as a TF-Agents observer's does."""
    writer = buffer.writer(1)
    (segment,) = writer.segments
    for t in range(frames):
        writer.add_batch(batch([t], 1))
    return segment


@ray.remote(num_cpus=0)
def add_and_close(buffer, first, frames):
    """A Ray task that takes a writer of one environment, adds `frames` frames from `first` on, and closes it."""
    with buffer.writer(1) as writer:
        for t in range(first, first + frames):
            writer.add_batch(batch([t], 1))
        return writer.segments[0]


def test_writers_that_join_after_others_closed_take_the_segments_written_longest_ago():
    # Issue 50, finding 1: four writers in turn, each adding 60 frames into a capacity of 400 (4 segments of 100),
    # kept 100 or 160: each took the lowest free segment, the one the writer before had just closed, and its ring
    # overwrote those frames while the other segments stayed empty.
    buffer = RayReplayBuffer(SPEC, capacity=400, batch_size=4, name="writers-in-turn", layout="segments")
    taken = [ray.get(add_and_close.remote(buffer, 1000 * w, 60)) for w in range(4)]
    assert sorted(taken) == [0, 1, 2, 3]
    assert int(buffer.num_frames()) == 240
    for w, segment in enumerate(taken):
        assert np.asarray(buffer.gather_segment(segment)["x"]).tolist() == list(range(1000 * w, 1000 * w + 60))
    # Every segment written: the next writer takes the one written longest ago, so the oldest frames go first.
    assert ray.get(add_and_close.remote(buffer, 4000, 50)) == taken[0]
    kept = np.asarray(buffer.gather_segment(taken[0])["x"]).tolist()
    assert kept == list(range(10, 60)) + list(range(4000, 4050))  # a ring of 100: its 10 oldest frames overwritten
    assert int(buffer.num_frames()) == 240 + 40
    buffer.close()


def test_elastic_writers_share_the_whole_capacity_oldest_frames_out():
    # Issue 50, finding 4: the segments' layout splits the capacity, so one writer of 400 frames keeps its segment's
    # 100. The elastic layout: four writers in turn keep their 240, then one writer alone fills all 400, the oldest
    # frames out; its windows never reach into another writer's frames.
    buffer = RayReplayBuffer(SPEC, capacity=400, batch_size=4, layout="elastic", name="elastic-writers")
    taken = [ray.get(add_and_close.remote(buffer, 1000 * w, 60)) for w in range(4)]
    assert int(buffer.num_frames()) == 240 and sorted(buffer.frames_per_segment()) == [60, 60, 60, 60]
    for w, segment in enumerate(taken):
        assert np.asarray(buffer.gather_segment(segment)["x"]).tolist() == list(range(1000 * w, 1000 * w + 60))
    alone = ray.get(add_and_close.remote(buffer, 5000, 400))
    assert alone == taken[0]  # the segment written longest ago
    assert int(buffer.num_frames()) == 400 and buffer.frames_per_segment()[alone] == 400
    assert np.asarray(buffer.gather_segment(alone)["x"]).tolist() == list(range(5000, 5400))
    # One more writer takes the segment written longest ago, and 10 chunks of 3 frames: the lone writer's oldest.
    assert ray.get(add_and_close.remote(buffer, 9000, 30)) == taken[1]
    assert np.asarray(buffer.gather_segment(taken[1])["x"]).tolist() == list(range(9000, 9030))
    assert np.asarray(buffer.gather_segment(alone)["x"]).tolist() == list(range(5030, 5400))
    items, info = buffer.get_next(sample_batch_size=20_000, num_steps=2)
    x = np.asarray(items["x"])
    assert (np.diff(x, axis=1) == 1).all()  # consecutive frames of one writer: none across the two streams
    assert set(x[:, 0].tolist()) == {*range(5030, 5399), *range(9000, 9029)}
    np.testing.assert_allclose(np.asarray(info.probabilities), 1 / (369 + 29), rtol=1e-6)
    buffer.close()


def test_a_writer_dropped_without_close_stores_every_returned_add_and_frees_its_segments():
    # Issue 50, finding 2: a writer that added 50 frames and went out of scope kept 44, and its segment stayed claimed.
    buffer = RayReplayBuffer(SPEC, batch_size=3, max_length=200, name="dropped-writers")
    writer = buffer.writer(1)
    for t in range(50):
        writer.add_batch(batch([t], 1))
    del writer  # no close(): collected here, in this process
    wait_until(lambda: buffer.writer_report()["dropped"] == 1)
    assert buffer.frames_per_segment() == [50, 0, 0]
    assert np.asarray(buffer.gather_segment(0)["x"]).tolist() == list(range(50))
    # In a Ray worker: the task returns, its writer is collected there.
    segment = ray.get(add_and_drop.remote(buffer, 30))
    wait_until(lambda: buffer.writer_report()["dropped"] == 2)
    assert np.asarray(buffer.gather_segment(segment)["x"]).tolist()[-30:] == list(range(30))  # after any before
    # Another driver that exits without closing its writer: stored before its Ray connection shuts down.
    script = (
        "import sys, numpy as np\n"
        "from tfbuffers import RayReplayBuffer\n"
        "buffer = RayReplayBuffer.connect('dropped-writers', address=sys.argv[1])\n"
        "writer = buffer.writer(1)\n"
        "print(writer.segments[0], flush=True)\n"
        "for t in range(40):\n"
        "    writer.add_batch({'x': np.array([t]), 'obs': np.zeros([1, 3], np.float32)})\n"
    )
    address = ray.get_runtime_context().gcs_address
    done = subprocess.run([sys.executable, "-c", script, address], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    last = int(done.stdout.split()[-1])
    wait_until(lambda: buffer.writer_report()["dropped"] == 3)
    assert np.asarray(buffer.gather_segment(last)["x"]).tolist()[-40:] == list(range(40))
    assert int(buffer.num_frames()) == 50 + 30 + 40
    report = buffer.writer_report()
    assert report == {"claims": {}, "closed": 0, "dropped": 3, "expired": 0, "lost_adds": 0}
    assert buffer.writer(3).segments == [0, 1, 2]  # every claim released
    buffer.close()


def test_a_dropped_writers_adoption_and_its_call_in_flight_store_each_frame_once_in_either_order():
    # The actor runs a writer's calls in the writers' threads: a dropped writer's adopt (its call in flight and
    # the adds after it) may run before, beside or after that call. Either way each frame is stored once, in order,
    # and a late twin after the release takes no segment back.
    buffer = RayReplayBuffer(SPEC, batch_size=2, max_length=100, name="adoption-twins")
    writer = buffer.writer(1)
    token, segments = writer._claim.token, writer.segments
    leaves = [[np.full([1, 3], t, np.float32), np.array([t])] for t in range(6)]  # the fields in order: obs, x
    first = np.array([0])
    actor = buffer.actor
    # The call in flight (adds 0-2) runs first; adopt resends it with the adds after it (0-5).
    assert ray.get(actor.add_many.remote(segments, leaves[:3], None, token, first)).ravel().tolist() == [0, 2, 4]
    assert ray.get(actor.adopt.remote(token, segments, leaves, first)) == 6
    # The call in flight runs last, after the adoption released the segment: skipped, nothing taken back.
    assert ray.get(actor.add_many.remote(segments, leaves[:3], None, token, first)).ravel().tolist() == [0, 2, 4]
    assert np.asarray(buffer.gather_segment(segments[0])["x"]).tolist() == list(range(6))
    assert buffer.writer_report()["claims"] == {}
    writer._finalizer.detach()  # handed over above, by hand
    buffer.close()


def test_a_writer_whose_process_died_gives_its_segments_up_within_its_lease():
    # Issue 50, finding 3: a dead writer's segments stayed claimed for the life of the buffer.
    lease = 2.0
    buffer = RayReplayBuffer(TRACED, batch_size=3, max_length=50, episode_boundaries=True, writer_lease=lease)
    doomed = Actor.remote(buffer, 1, 2)
    doomed_segments = ray.get(doomed.segments.remote())
    running = doomed.run.remote(10_000, 0.002)
    wait_until(lambda: min(buffer.frames_per_segment()[s] for s in doomed_segments) >= 5)
    kill(doomed)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(running)
    # A live writer that adds nothing keeps its claim past the lease: its process renews it.
    with buffer.writer(1) as idle:
        time.sleep(3 * lease)
        wait_until(lambda: buffer.writer_report()["expired"] == 1, seconds=20 * lease)
        assert list(buffer.writer_report()["claims"]) == idle.segments
        idle.add_batch(traced(2, idle.segments, 0))
        idle.flush()
    # The dead writer's segments are free: a restarted actor claims them again.
    restarted = Actor.remote(buffer, 3, 2)
    assert sorted(ray.get(restarted.segments.remote())) == sorted(doomed_segments)
    ray.get(restarted.run.remote(5))
    ray.get(restarted.close.remote())
    report = buffer.writer_report()
    assert report == {"claims": {}, "closed": 2, "dropped": 0, "expired": 1, "lost_adds": 0}
    for _ in range(3):  # windows never cross from the dead writer's frames into the new writer's
        items, _ = buffer.get_next(sample_batch_size=100, num_steps=2)
        check_windows(items, 2)
    buffer.close()


def test_a_buffer_whose_actor_dies_is_restarted_by_ray_and_its_writers_and_datasets_go_on(tmp_path):
    # Issue 50, finding 5: when the buffer's actor died, samplers and writers failed until someone reloaded it.
    buffer = RayReplayBuffer(
        TRACED, batch_size=3, max_length=1000, directory=tmp_path / "buffer", max_restarts=-1,
        episode_boundaries=True, seed=11,
    )  # fmt: skip
    assert buffer.max_restarts == -1
    writer = Actor.remote(buffer, 1, 2)
    segments = ray.get(writer.segments.remote())
    running = writer.run.remote(300, 0.01)
    dataset = iter(buffer.as_dataset(sample_batch_size=16, num_steps=2))
    wait_until(lambda: min(buffer.frames_per_segment()[s] for s in segments) >= 30)
    check_windows(next(dataset)[0], 2)
    first_pid = ray.get(buffer.actor.ping.remote())
    os.kill(first_pid, signal.SIGKILL)  # the buffer's actor process dies mid-run
    batches = 0
    while not ray.wait([running], timeout=0)[0]:  # the learner reads on through the restart
        check_windows(next(dataset)[0], 2)
        batches += 1
    assert ray.get(running) == list(range(300))  # the writer never saw an error
    assert batches > 0 and ray.get(buffer.actor.ping.remote()) != first_pid
    for segment in segments:  # every returned add stored once, in order: none lost, none stored twice
        assert np.asarray(buffer.gather_segment(segment)["step"]).tolist() == list(range(300))
    assert buffer.frames_per_segment()[3 - sum(segments)] == 0
    ray.get(writer.close.remote())
    buffer.close()


def test_the_rate_limiters_counts_come_back_with_a_restarted_actor(tmp_path):
    buffer = RayReplayBuffer(SPEC, batch_size=1, max_length=64, directory=tmp_path / "buffer", max_restarts=1,
                             min_size_to_sample=4, samples_per_insert=2.0, error_buffer=4.0, timeout=0.5)  # fmt: skip
    for t in range(6):
        buffer.add_batch(batch([t], 1))
    buffer.get_next(sample_batch_size=4)
    buffer.get_next(sample_batch_size=4)
    before = buffer.rate_limiter_counts()
    assert (before["inserts"], before["samples"], before["frames"]) == (6, 8, 6)
    os.kill(ray.get(buffer.actor.ping.remote()), signal.SIGKILL)
    assert buffer.rate_limiter_counts() == before  # waits for the restart, then reads the counts kept on disk
    with pytest.raises(TimeoutError, match=r"sample of 1 window.*8 window\(s\) sampled for 6 frame\(s\) inserted"):
        buffer.get_next()  # 6 * 2 - 8 - 1 = 3 < min_diff 4: the limiter holds, as before the restart
    buffer.close()
    with pytest.raises(ValueError, match=r"^max_restarts: expected 0 without directory="):
        RayReplayBuffer(SPEC, batch_size=1, max_length=4, max_restarts=2)


@pytest.mark.parametrize("layout", ["segments", "elastic"])
def test_a_buffer_in_ram_restarts_from_its_last_checkpoint_and_counts_the_frames_it_lost(tmp_path, layout):
    # Issue 50, finding 5, in RAM: without directory=, a dead actor's buffer was gone until someone loaded a save.
    root = tmp_path / "checkpoints"
    buffer = RayReplayBuffer(SPEC, batch_size=2, max_length=100, checkpoint_dir=root, checkpoint_frames=10,
                             max_restarts=1, samples_per_insert=1.0, error_buffer=100.0, layout=layout)  # fmt: skip
    assert buffer.checkpoint_report()["checkpoints"] == 0
    writer = buffer.writer(1)
    assert writer.segments == [0]
    for t in range(25):
        writer.add_batch(batch([t], 1))
        if t == 14:
            writer.flush()
            buffer.get_next(sample_batch_size=4)
    writer.flush()
    report = buffer.checkpoint_report()
    assert report == {"latest": str(root / "checkpoint-00000002"), "checkpoints": 2, "frames_since": 5,
                      "restored_from": None, "lost_frames": 0, "error": None}  # fmt: skip
    assert sorted(path.name for path in root.iterdir()) == ["LATEST", "checkpoint-00000002"]  # the first deleted
    os.kill(ray.get(buffer.actor.ping.remote()), signal.SIGKILL)
    assert int(buffer.num_frames()) == 20  # waits for the restart: the frames of the second checkpoint
    counts = buffer.rate_limiter_counts()
    assert (counts["inserts"], counts["samples"], counts["frames"]) == (20, 4, 20)
    for t in range(25, 30):  # the writer goes on; its first add tells the actor it had stored 25
        writer.add_batch(batch([t], 1))
    writer.flush()
    assert writer.add_batch(batch([30], 1)).tolist() == [25 * 2]  # numbered on from the actor's count
    writer.close()
    assert np.asarray(buffer.gather_segment(0)["x"]).tolist() == list(range(20)) + list(range(25, 31))
    report = buffer.checkpoint_report()
    assert report["restored_from"] == str(root / "checkpoint-00000002") and report["lost_frames"] == 5
    assert report["checkpoints"] == 2 and report["frames_since"] == 6
    # A checkpoint that cannot be written (its directory gone, a file in its place) fails no add: the frames are
    # stored, the failure reported, and the next checkpoint written once the directory is back.
    root.rename(tmp_path / "aside")
    root.write_text("not a directory")
    for t in range(31, 36):
        buffer.add_batch(batch([t, 1000 + t], 2))  # 6 + 4 frames: due at the second add, which fails; 6 more
    assert int(buffer.num_frames()) == 26 + 10
    report = buffer.checkpoint_report()
    assert report["error"].startswith(("NotADirectoryError", "FileExistsError")) and str(root) in report["error"]
    assert report["checkpoints"] == 2 and report["latest"] == str(root / "checkpoint-00000002")
    root.unlink()
    (tmp_path / "aside").rename(root)
    for t in range(36, 41):
        buffer.add_batch(batch([t, 1000 + t], 2))  # 6 + 4 frames since the failure: written at the second add
    report = buffer.checkpoint_report()
    assert report["error"] is None and report["checkpoints"] == 3 and report["frames_since"] == 6
    assert sorted(path.name for path in root.iterdir()) == ["LATEST", "checkpoint-00000003"]
    buffer.close()


def test_checkpoints_every_few_seconds_only_when_something_changed_and_load_the_last(tmp_path):
    root = tmp_path / "checkpoints"
    buffer = RayReplayBuffer(SPEC, batch_size=2, max_length=10, sampler="prioritized", checkpoint_dir=root,
                             checkpoint_seconds=0.2, seed=3)  # fmt: skip
    for t in range(3):
        buffer.add_batch(batch([t, 100 + t], 2))
    buffer.update_priorities(np.array([0, 1]), np.array([4.0, 0.5]))
    wait_until(lambda: buffer.checkpoint_report()["frames_since"] == 0)
    written = buffer.checkpoint_report()["checkpoints"]
    time.sleep(1.0)  # five ticks: nothing changed, nothing written
    assert buffer.checkpoint_report()["checkpoints"] == written
    assert buffer.checkpoint() == root / f"checkpoint-{written + 1:08d}"
    before = {key: np.asarray(value) for key, value in buffer.gather_all().items()}
    _, info = buffer.get_next(sample_batch_size=64)
    probabilities = dict(zip(np.asarray(info.ids).tolist(), np.asarray(info.probabilities).tolist()))
    buffer.close()
    loaded = RayReplayBuffer.load(root)  # a checkpoint_dir: its last checkpoint
    after = loaded.gather_all()
    for key, value in before.items():
        np.testing.assert_array_equal(np.asarray(after[key]), value)
    _, info = loaded.get_next(sample_batch_size=64)
    for i, p in zip(np.asarray(info.ids).tolist(), np.asarray(info.probabilities).tolist()):
        assert p == probabilities.get(i, p)  # the priorities came back
    assert len(set(probabilities) & set(np.asarray(info.ids).tolist())) >= 2
    loaded.close()
    again = RayReplayBuffer.load(root, checkpoint_dir=tmp_path / "next", max_restarts=1)  # into RAM, checkpointed on
    assert again.checkpoint() == tmp_path / "next" / "checkpoint-00000001"
    assert int(again.num_frames()) == 6
    again.close()
    with pytest.raises(ValueError, match=r"^max_restarts: expected 0 without directory= or checkpoint_dir="):
        RayReplayBuffer.load(root, max_restarts=1)  # a restart would load the save again: later adds lost, unsaid
    with pytest.raises(ValueError, match=r"^checkpoint_dir: expected a new or empty directory, got '.*checkpoints'"):
        RayReplayBuffer(SPEC, batch_size=2, max_length=4, checkpoint_dir=root)
    with pytest.raises(ValueError, match=r"^checkpoint_dir: expected None with directory="):
        RayReplayBuffer(SPEC, batch_size=2, max_length=4, checkpoint_dir=tmp_path / "a", directory=tmp_path / "b")
    with pytest.raises(ValueError, match=r"^checkpoint_dir: expected a directory with checkpoint_frames=5"):
        RayReplayBuffer(SPEC, batch_size=2, max_length=4, checkpoint_frames=5)
    with pytest.raises(ValueError, match=r"^checkpoint_seconds: expected a number of seconds > 0 or None, got 0"):
        RayReplayBuffer(SPEC, batch_size=2, max_length=4, checkpoint_dir=tmp_path / "c", checkpoint_seconds=0)
    with pytest.raises(ValueError, match=r"checkpoint: expected a buffer made with checkpoint_dir=, got one without"):
        RayReplayBuffer(SPEC, batch_size=2, max_length=4).checkpoint()


def test_save_load_after_the_actor_is_killed(tmp_path):
    # The segments' layout: its save loads into memory-mapped segments too (the elastic layout's, into RAM only).
    buffer = RayReplayBuffer(SPEC, batch_size=2, max_length=5, sampler="prioritized", seed=6, layout="segments")
    for t in range(7):
        buffer.add_batch(batch([t, 100 + t], 2))
    buffer.update_priorities(np.array([8, 9]), np.array([5.0, 0.0]))
    before = {key: np.asarray(value) for key, value in buffer.gather_all().items()}
    buffer.save(tmp_path / "saved")
    buffer.add_batch(batch([50, 150], 2))  # after the save: not in it
    kill(buffer.actor)
    with pytest.raises(ray.exceptions.RayActorError):
        buffer.num_frames()
    loaded = RayReplayBuffer.load(tmp_path / "saved", seed=6)
    assert loaded.sampler == "prioritized" and loaded.batch_size == 2 and loaded.max_length == 5
    for key in SPEC:
        np.testing.assert_array_equal(loaded.gather_all()[key], before[key])
    _, info = loaded.get_next(sample_batch_size=200)
    assert 9 not in np.asarray(info.ids).tolist()  # priority 0 kept
    loaded.close()
    mapped = RayReplayBuffer.load(tmp_path / "saved", directory=tmp_path / "mapped")  # streamed into memmap segments
    kill(mapped.actor)
    reopened = RayReplayBuffer.open(tmp_path / "mapped")
    for key in SPEC:
        np.testing.assert_array_equal(reopened.gather_all()[key], before[key])
    reopened.close()
    with pytest.raises(FileNotFoundError, match="no RayReplayBuffer here"):
        RayReplayBuffer.load(tmp_path / "absent")


@pytest.mark.parametrize("layout", ["segments", "elastic"])
def test_memory_mapped_segments_keep_every_returned_add_when_the_actor_is_killed(tmp_path, layout):
    # Issue 50, finding 4, with directory=: the segments' layout keeps a segment's share (6 of the writer's 9
    # frames, capacity 12); the elastic layout, the default since it takes directory=, keeps all 9.
    directory = tmp_path / "buffer"
    buffer = RayReplayBuffer(SPEC, batch_size=2, max_length=6, directory=directory, seed=7, layout=layout)
    names = sorted(path.name for path in directory.iterdir())
    stores = ["segment-0000", "segment-0001"] if layout == "segments" else ["elastic"]
    assert names == sorted(["rate_limiter.npy", "ray_buffer.json", *stores])
    with buffer.writer(1) as writer:
        for t in range(9):
            writer.add_batch(batch([t], 1))
    buffer.add_batch(batch([40, 140], 2))
    kill(buffer.actor)  # no flush, no close
    reopened = RayReplayBuffer.open(directory)
    assert reopened.directory == directory.absolute() and reopened.layout == layout
    kept = list(range(4, 9)) if layout == "segments" else list(range(9))
    assert reopened.frames_per_segment() == [len(kept) + 1, 1]
    assert np.asarray(reopened.gather_segment(0)["x"]).tolist() == [*kept, 40]
    assert np.asarray(reopened.gather_segment(1)["x"]).tolist() == [140]
    with pytest.raises(ValueError, match="gather_all: the segments hold different numbers of frames"):
        reopened.gather_all()
    with pytest.raises(ValueError, match="directory: expected a new or empty directory"):
        RayReplayBuffer(SPEC, batch_size=2, max_length=6, directory=directory)
    reopened.close()


@ray.remote(num_cpus=0)
def add_through_a_task(buffer):
    with buffer.writer(1) as writer:
        writer.add_batch(batch([77], 1))
    return int(buffer.num_frames())


def test_handles_pickle_into_tasks_and_connect_from_another_driver(cluster):
    buffer = RayReplayBuffer(SPEC, batch_size=2, max_length=4, name="shared-by-name")
    assert ray.get(add_through_a_task.remote(buffer)) == 1
    assert not buffer.closed
    script = (
        "import sys, numpy as np\n"
        "from tfbuffers import RayReplayBuffer\n"
        "buffer = RayReplayBuffer.connect('shared-by-name', address=sys.argv[1])\n"
        "with buffer.writer(1) as writer:\n"
        "    writer.add_batch({'x': np.array([88]), 'obs': np.zeros([1, 3], np.float32)})\n"
        "print('FRAMES', int(buffer.num_frames()))\n"
        "buffer.close()\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script, cluster], capture_output=True, text=True, timeout=300, env=dict(os.environ)
    )
    assert "FRAMES 2" in run.stdout, run.stderr[-3000:]
    # The task's writer released segment 0; the other driver's took segment 1, never written; its close kept the
    # buffer.
    assert np.asarray(buffer.gather_segment(0)["x"]).tolist() == [77]
    assert np.asarray(buffer.gather_segment(1)["x"]).tolist() == [88]
    buffer.close()
    with pytest.raises(ValueError, match="no buffer named 'shared-by-name'"):
        for _ in range(50):  # the actor's name is freed once Ray has ended it
            RayReplayBuffer.connect("shared-by-name")
            time.sleep(0.1)


def test_connect_with_a_data_spec_refuses_a_buffer_of_other_frames_naming_each_field():
    buffer = RayReplayBuffer(SPEC, batch_size=2, max_length=4, name="spec-checked")
    buffer.add_batch(batch([1, 2], 2))
    other = {"x": tf.TensorSpec([], tf.int32), "obs": tf.TensorSpec([3], tf.float32), "extra": tf.TensorSpec([1])}
    message = (
        "data_spec: expected RayReplayBuffer 'spec-checked' to hold frames of the data_spec given, got a buffer "
        "whose extra is missing; x holds int64[], the data_spec given int32[]"
    )
    with pytest.raises(ValueError, match=re.escape(message) + "$"):
        RayReplayBuffer.connect("spec-checked", data_spec=other)
    with pytest.raises(ValueError, match=re.escape("obs is not in the data_spec given")):
        RayReplayBuffer.connect("spec-checked", data_spec={"x": tf.TensorSpec([], tf.int64)})
    with pytest.raises(TypeError, match="y: expected a TensorSpec or ArraySpec, got"):  # refused before connecting
        RayReplayBuffer.connect("no-such-buffer", data_spec={"y": 3})
    # Same paths, dtypes and shapes (TF-Agents' ArraySpecs included): connected, sharing the frames.
    from tf_agents.specs import array_spec

    same = {"x": array_spec.ArraySpec([], np.int64), "obs": tf.TensorSpec([3], tf.float32, name="o")}
    handle = RayReplayBuffer.connect("spec-checked", data_spec=same)
    assert np.asarray(handle.gather_all()["x"]).tolist() == [[1], [2]]
    handle.add_batch(batch([3, 4], 2))  # the refusals changed nothing: the buffer goes on
    assert np.asarray(buffer.gather_all()["x"]).tolist() == [[1, 3], [2, 4]]
    handle.close()
    buffer.close()


def test_a_py_observer_adds_a_drivers_frames_through_a_writer_of_its_own_segments():
    from tf_agents.drivers import py_driver
    from tf_agents.policies import random_py_policy

    from tfbuffers.envs import load_gymnasium
    from tfbuffers.observers import PyObserver

    one, two = load_gymnasium("CartPole-v1", seed=3), load_gymnasium("CartPole-v1", num_envs=2, seed=4)
    policy = random_py_policy.RandomPyPolicy(one.time_step_spec(), one.action_spec(), seed=3)
    policies = random_py_policy.RandomPyPolicy(two.time_step_spec(), two.action_spec(), seed=4, outer_dims=(2,))
    buffer = RayReplayBuffer(policy.trajectory_spec, batch_size=4, max_length=100)
    seen_one, seen_two = [], []
    with buffer.writer(1) as first, buffer.writer(2) as second:
        assert (first.segments, second.segments, first.batch_size, second.batch_size) == ([0], [1, 2], 1, 2)
        # An environment's frames, unbatched, through the writer of one segment: the observer adds the batch axis.
        py_driver.PyDriver(one, policy, [PyObserver(first), seen_one.append], max_steps=30).run(one.reset())
        observer = PyObserver(second)
        with pytest.raises(ValueError) as raised:  # one environment's frames for a writer of two: refused
            observer(seen_one[0])
        assert str(raised.value) == (
            "PyObserver: the driver's trajectories have batch size 1 but the writer adds to 2 segments (one per "
            "environment): claim them with buffer.writer(env.batch_size)"
        )
        py_driver.PyDriver(two, policies, [observer, seen_two.append], max_steps=20).run(two.reset())
    # The first environment's frames again, as a block of steps ([1, T, ...]) to the segment written longest ago.
    rollout = tf.nest.map_structure(lambda *steps: np.stack(steps)[None], *seen_one)
    half = len(seen_one) // 2
    with buffer.writer(1) as third:
        assert third.segments == [3]
        PyObserver(third)(tf.nest.map_structure(lambda leaf: leaf[:, :half], rollout))  # one extend
        wrong = tf.nest.map_structure(lambda leaf: leaf[:, half:], rollout)
        wrong = wrong._replace(reward=wrong.reward[:, 1:])
        pending = third.pending
        with pytest.raises(ValueError) as raised:
            third.extend(wrong)
        assert str(raised.value).startswith(f"reward: expected {len(seen_one) - half} frames along axis 1")
        assert third.pending == pending  # nothing taken: the writer goes on
        ids = third.extend(tf.nest.map_structure(lambda leaf: leaf[:, half:], rollout))
        np.testing.assert_array_equal(ids, np.arange(half, len(seen_one))[None, :] * 4 + 3)
    counts = [len(seen_one), len(seen_two), len(seen_two), len(seen_one)]
    assert buffer.frames_per_segment() == counts and len(seen_two) >= 10
    expected = [
        tf.nest.map_structure(lambda *steps: np.stack(steps), *seen_one),
        *(tf.nest.map_structure(lambda *steps, e=e: np.stack(steps)[:, e], *seen_two) for e in range(2)),
        tf.nest.map_structure(lambda *steps: np.stack(steps), *seen_one),
    ]
    for segment, frames in enumerate(expected):
        for stored, made in zip(tf.nest.flatten(buffer.gather_segment(segment)), tf.nest.flatten(frames)):
            np.testing.assert_array_equal(np.asarray(stored), made)
    buffer.close()


def test_a_sharded_dataset_mixes_ray_buffers_with_exact_probabilities():
    shards = [RayReplayBuffer(SPEC, batch_size=1, max_length=8, seed=seed) for seed in (8, 9)]
    for offset, shard, frames in ((0, shards[0], 2), (100, shards[1], 4)):
        for t in range(frames):
            shard.add_batch(batch([offset + t], 1))
    dataset = tfbuffers.sharded_dataset(shards, sample_batch_size=400, weights=[1, 3], seed=0)
    items, info = next(iter(dataset))
    x, probabilities = np.asarray(items["x"]), np.asarray(info.probabilities)
    np.testing.assert_array_equal(probabilities, np.where(x < 100, 0.25 / 2, 0.75 / 4).astype(np.float32))
    assert 60 < (x < 100).sum() < 140  # a quarter of 400 draws from the first shard, within 4.6 standard deviations
    # One shard: its own batched dataset (the windows fetched in batches), the same probabilities.
    alone = tfbuffers.sharded_dataset(shards[1:], sample_batch_size=6, num_steps=2, seed=0)
    assert alone.element_spec == shards[1].as_dataset(6, 2).element_spec
    for items, info in alone.take(3):
        x = np.asarray(items["x"])
        assert x.shape == (6, 2) and set(x[:, 0].tolist()) <= {100, 101, 102} and (x[:, 1] - x[:, 0] == 1).all()
        np.testing.assert_array_equal(info.probabilities, np.full(6, 1 / 3, np.float32))
    with pytest.raises(ValueError, match="expected one or more ReverbReplayBuffer or RayReplayBuffer"):
        tfbuffers.sharded_dataset([PyUniformReplayBuffer(SPEC, capacity=2)], sample_batch_size=2)
    for shard in shards:
        shard.close()


def test_one_module_alone_imports_ray():
    package = pathlib.Path(tfbuffers.__file__).parent
    importers = sorted(
        str(path.relative_to(package)) for path in package.rglob("*.py") if "import ray" in path.read_text()
    )
    assert importers == ["remote/ray/cluster.py"]  # import_ray(), called when a buffer is made or connected


def test_offline_datasets_fill_a_ray_buffer_and_are_written_from_one(tmp_path, monkeypatch):
    from tf_agents.trajectories import trajectory

    from tfbuffers import offline

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    scalar = tf.TensorSpec([], tf.float32)
    spec = trajectory.Trajectory(
        tf.TensorSpec([], tf.int32), tf.TensorSpec([2], tf.float32), tf.TensorSpec([], tf.int64), (),
        tf.TensorSpec([], tf.int32), scalar, scalar,
    )  # fmt: skip
    step_types, discounts = [0, 1, 2, 0, 2, 0], [1, 0, 1, 1, 1, 1]  # terminated, truncated, running
    local = PyUniformReplayBuffer(spec, batch_size=1, max_length=10)
    for t, (step_type, discount) in enumerate(zip(step_types, discounts)):
        next_type = (step_types + [1])[t + 1]
        local.add_batch(
            trajectory.Trajectory(
                np.int32([step_type]), np.float32([[t, -t]]), np.int64([t]), (), np.int32([next_type]),
                np.float32([t / 2]), np.float32([discount]),
            )
        )  # fmt: skip
    offline.to_rlds(local, tmp_path / "rlds")
    buffer = RayReplayBuffer(spec, batch_size=1, max_length=10, name="offline")
    assert offline.from_rlds(buffer, tmp_path / "rlds") == offline.Converted(2, 5, 0)
    expected = tf.nest.map_structure(lambda leaf: np.asarray(leaf)[0, :5], local.gather_all())
    received = buffer.gather_segment(0)
    for got, want in zip(tf.nest.flatten(received), tf.nest.flatten(expected)):
        np.testing.assert_array_equal(got, want)
    # And out of the Ray buffer: the same two episodes, through Minari into a local buffer.
    assert offline.to_minari(buffer, "ray/offline-v0", description="from a Ray buffer") == offline.Converted(2, 5, 0)
    target = PyUniformReplayBuffer(spec, batch_size=1, max_length=10)
    offline.from_minari(target, "ray/offline-v0")
    for got, want in zip(tf.nest.flatten(target.gather_all()), tf.nest.flatten(local.gather_all())):
        np.testing.assert_array_equal(np.asarray(got)[0], np.asarray(want)[0, :5])
    buffer.close()
