"""Frame stacks stored once each: `FrameBuffer`, the py buffers' `frame_stacks`, and `PyHashedReplayBuffer`."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.specs import array_spec
from tf_agents.trajectories import policy_step, trajectory
from tf_agents.trajectories import time_step as ts

import tfbuffers
from tfbuffers.storage import frame_stacks
from tfbuffers.storage import frames as frames_lib

DEPTH, SIDE = 4, 6


def stacked_adds(rng: np.random.Generator, batch_size: int, num_adds: int, episode: int, axis: int = -1):
    """Atari-style observations per add: each segment's newest `DEPTH` frames, random and distinct.

    Every `episode` adds, the stacks reset to their first frame repeated.
    """
    history = [[] for _ in range(batch_size)]
    for t in range(num_adds):
        stacks = []
        for b in range(batch_size):
            frame = rng.integers(0, 256, [SIDE, SIDE], dtype=np.uint8)
            history[b] = [frame] * DEPTH if t % episode == 0 else history[b][1:] + [frame]
            stacks.append(np.stack(history[b], axis=axis))
        yield {"pixels": np.stack(stacks), "code": 1000 * np.arange(batch_size) + t}


SPEC = {"pixels": tf.TensorSpec([SIDE, SIDE, DEPTH], tf.uint8), "code": tf.TensorSpec([], tf.int64)}


def assert_same(a, b) -> None:
    tf.nest.assert_same_structure(a, b)
    for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("cls", [tfbuffers.PyUniformReplayBuffer, tfbuffers.PyPrioritizedReplayBuffer])
@pytest.mark.parametrize(("stack_axis", "option"), [(-1, "pixels"), (0, {"pixels": 0}), (-1, ["pixels"])])
def test_the_same_samples_as_the_plain_buffer_on_the_same_adds(cls, stack_axis, option):
    spec = dict(SPEC)
    if stack_axis == 0:
        spec["pixels"] = tf.TensorSpec([DEPTH, SIDE, SIDE], tf.uint8)
    plain = cls(spec, batch_size=3, max_length=20, seed=5)
    stacked = cls(spec, batch_size=3, max_length=20, seed=5, frame_stacks=option)
    for items in stacked_adds(np.random.default_rng(0), 3, 47, episode=9, axis=stack_axis):  # wraps twice
        plain.add_batch(items)
        stacked.add_batch(items)
        if int(items["code"][0]) % 10 == 9:  # samples along the way, as a learner takes them
            assert_same(plain.get_next(16, 3), stacked.get_next(16, 3))
    assert_same(plain.gather_all(), stacked.gather_all())
    assert_same(plain.sample_all(), stacked.sample_all())
    assert_same(plain.sample_by_index([-1, 0, 7], ["pixels"]), stacked.sample_by_index([-1, 0, 7], ["pixels"]))
    assert_same(plain.state().arrays, stacked.state().arrays)
    assert_same(next(iter(plain.as_dataset(8, 2))), next(iter(stacked.as_dataset(8, 2))))
    # 60 stacks of 4 frames held: the newest frame of each, the 3 older of the first stack of each segment that
    # is not a shift of its predecessor (its episode's first, or the ring's oldest), and the zero frame.
    pool = stacked.storage.pools[1]
    handles = stacked.storage.handles(1)
    assert len(pool) == len(np.unique(handles))
    assert len(pool) < 60 + 3 * 3 * 3 + 1 + 1


def test_memory_is_about_one_frame_per_stack():
    plain = tfbuffers.PyUniformReplayBuffer(SPEC, batch_size=2, max_length=500)
    stacked = tfbuffers.PyUniformReplayBuffer(SPEC, batch_size=2, max_length=500, frame_stacks="pixels")
    for items in stacked_adds(np.random.default_rng(1), 2, 1200, episode=300):
        plain.add_batch(items)
        stacked.add_batch(items)
    # Adds 700..1199 held: each stack's newest frame, and the 3 older frames of each segment's oldest stack (a
    # reset's stack is one frame repeated); every row written, so the zero frame is gone.
    held = 2 * 500
    pool = stacked.storage.pools[1]
    assert len(pool) == 2 * (500 + DEPTH - 1)
    pixels = SIDE * SIDE * DEPTH
    assert plain._table.nbytes() == held * (pixels + 8)
    # The pool never used more slots than frames held at once (plus one add's), 16 bytes each beside the frame.
    slots = 2 * (500 + DEPTH - 1) + 1 + 2 * DEPTH  # at most one add's frames beyond those held, and the zeros
    assert stacked._table.nbytes() <= slots * (SIDE * SIDE + 16) + held * (8 * DEPTH + 8)
    assert_same(plain.gather_all(), stacked.gather_all())


def test_frame_buffer_matches_bytes_not_hashes(monkeypatch):
    monkeypatch.setattr(frames_lib, "_frame_hash", lambda data: 7)  # every frame collides
    pool = tfbuffers.FrameBuffer()
    a, b = np.zeros([3, 3], np.uint8), np.eye(3, dtype=np.uint8)
    handles = pool.add_frames(np.stack([a, b, a, b, b]))
    assert handles.tolist() == [0, 1, 0, 1, 1] and len(pool) == 2
    np.testing.assert_array_equal(pool.gather(handles), np.stack([a, b, a, b, b]))
    pool.release(np.array([1, 1, 1]))
    assert len(pool) == 1
    assert pool.add_frame(b) == 1  # the freed slot is used again
    np.testing.assert_array_equal(pool.decompress(np.array([0, 1, 0]), split_axis=0), np.concatenate([a, b, a]))


def test_frame_buffer_refuses_unknown_handles_and_changes_nothing():
    pool = tfbuffers.FrameBuffer()
    h = pool.add_frame(np.ones([2, 2], np.float32))
    for bad in ([h, h], [5], [-1]):
        with pytest.raises(ValueError, match="handles: expected handles of frames held, got"):
            pool.on_delete(bad)
        assert len(pool) == 1
    with pytest.raises(ValueError, match=r"frame: expected an array of shape \(2, 2\) and dtype float32 .* got"):
        pool.add_frame(np.ones([2, 3], np.float32))
    pool.on_delete([h])
    assert len(pool) == 0


def test_frame_buffer_serializes_without_pickle():
    pool = tfbuffers.FrameBuffer()
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 9, [6, 4, 4, 1]).astype(np.int32)
    handles = pool.compress(np.concatenate(list(frames[:4]), axis=-1))
    pool.on_delete(handles[:1])
    restored = tfbuffers.FrameBuffer()
    restored.deserialize(pool.serialize())
    assert len(restored) == len(pool) == 3
    np.testing.assert_array_equal(restored.decompress(handles[1:]), pool.decompress(handles[1:]))
    assert restored.add_frame(frames[5][..., 0][..., None]) not in handles[1:].tolist()


def test_files_and_checkpoints_restore_the_frames(tmp_path):
    buffer = tfbuffers.PyUniformReplayBuffer(SPEC, batch_size=2, max_length=10, seed=3, frame_stacks="pixels")
    for items in stacked_adds(np.random.default_rng(2), 2, 14, episode=5):
        buffer.add_batch(items)
    loaded = tfbuffers.load(buffer.save(tmp_path / "stacks.tfb"), seed=3)
    assert loaded._frame_stacks == "pixels" and len(loaded._table.pools[1]) == len(buffer._table.pools[1])
    assert_same(buffer.gather_all(), loaded.gather_all())
    prefix = tf.train.Checkpoint(buffer=buffer).save(str(tmp_path / "ckpt"))
    other = tfbuffers.PyUniformReplayBuffer(SPEC, batch_size=2, max_length=10, seed=3, frame_stacks="pixels")
    tf.train.Checkpoint(buffer=other).restore(prefix).assert_consumed()
    assert_same(buffer.gather_all(), other.gather_all())
    assert_same(buffer.get_next(5, 2), other.get_next(5, 2))


@pytest.mark.parametrize(
    ("option", "error", "message"),
    [
        (3, TypeError, r"frame_stacks: expected None, a field's nest path, .* got int 3"),
        ("frames", ValueError, r"paths among \['code', 'pixels'\]; got path 'frames'"),
        ({"pixels": 3}, ValueError, r"frame_stacks: field pixels: expected an axis of its shape \(6, 6, 4\), got 3"),
        ({"code": -1}, ValueError, r"frame_stacks: field code: expected an axis of its shape \(\), got -1"),
    ],
)
def test_a_bad_frame_stacks_option_names_the_field(option, error, message):
    with pytest.raises(error, match=message):
        tfbuffers.PyUniformReplayBuffer(SPEC, 10, frame_stacks=option)


def hashed_spec():
    observation = array_spec.ArraySpec([SIDE, SIDE, DEPTH], np.int32)
    action = policy_step.PolicyStep(array_spec.BoundedArraySpec([], np.int32, 0, 1))
    return trajectory.from_transition(ts.time_step_spec(observation), action, ts.time_step_spec(observation))


def test_py_hashed_replay_buffer_takes_tf_agents_arguments(caplog):
    buffer = tfbuffers.PyHashedReplayBuffer(data_spec=hashed_spec(), capacity=8, log_interval=4)
    items, info = buffer.get_next(sample_batch_size=2)  # empty: zeros marked by id -1, as TF-Agents returns items
    assert np.asarray(items.observation).shape == (2, SIDE, SIDE, DEPTH) and not np.asarray(items.observation).any()
    assert info.ids.tolist() == [-1, -1] and info.probabilities.tolist() == [0.0, 0.0]
    single = [np.full([SIDE, SIDE, 1], k, np.int32) for k in range(1, 14)]
    with caplog.at_level("INFO", logger="tfbuffers"):
        for k in range(10):
            step = ts.transition(np.concatenate(single[k : k + DEPTH], axis=-1), reward=0.0)
            traj = trajectory.from_transition(step, policy_step.PolicyStep(np.int32(0)), step)
            buffer.add_batch(tf.nest.map_structure(lambda x: np.asarray(x)[None], traj))
    # After 4 adds: frames 1..7 and the unwritten rows' zero frame; after 8: frames 1..11, every row written.
    assert [r.getMessage() for r in caplog.records] == [
        "Effective replay buffer frame count: 8",
        "Effective replay buffer frame count: 11",
    ]
    items, _ = buffer.get_next(sample_batch_size=50)
    observation = np.asarray(items.observation)
    np.testing.assert_array_equal(observation[..., 1:], observation[..., :-1] + 1)  # whole stacks
    assert observation[:, 0, 0, 0].min() == 3  # adds 2..9 are held: stacks start at frames 3..10
    assert len(buffer.frame_buffer) == 11  # frames 3..13: adds 2..9 held, the older frames freed
    with pytest.raises(ValueError, match="data_spec: expected the spec of a tf_agents Trajectory"):
        tfbuffers.PyHashedReplayBuffer(SPEC, 8)


@pytest.mark.parametrize("chunk", [4096, 5], ids=["one chunk", "chunks of 5 rows"])
def test_adds_after_a_clear_or_restore_stay_exact(chunk, monkeypatch):
    # A restore replaces every row's frames (chunk by chunk: RESTORE_CHUNK rows, or the 12 at once), a clear keeps
    # them until overwritten: the adds after either, whose stacks continue the ones held before, must still give
    # the plain buffer's rows.
    monkeypatch.setattr(frame_stacks, "RESTORE_CHUNK", chunk)

    def make(**options):
        return tfbuffers.PyUniformReplayBuffer(SPEC, batch_size=2, max_length=6, seed=9, **options)

    plain, stacked, other = make(), make(frame_stacks="pixels"), make()
    adds = list(stacked_adds(np.random.default_rng(4), 2, 30, episode=50))
    for items in adds[:10]:
        plain.add_batch(items)
        stacked.add_batch(items)
    for items in adds[20:27]:
        other.add_batch(items)
    plain.restore_state(other.state())
    stacked.restore_state(other.state())
    for items in adds[10:14]:  # stacks that continue the ones held before the restore
        plain.add_batch(items)
        stacked.add_batch(items)
    assert_same(plain.gather_all(), stacked.gather_all())
    plain.clear()
    stacked.clear()
    for items in adds[14:20]:
        plain.add_batch(items)
        stacked.add_batch(items)
    assert_same(plain.gather_all(), stacked.gather_all())
    assert_same(plain.get_next(20, 2), stacked.get_next(20, 2))
    pool = stacked.storage.pools[1]
    assert len(pool) == len(np.unique(stacked.storage.handles(1)))  # nothing held that no row holds


def test_nbytes_counts_each_distinct_frame_once():
    spec = {"pixels": tf.TensorSpec([SIDE, SIDE, DEPTH], tf.uint8), "code": tf.TensorSpec([], tf.int64)}
    plain = tfbuffers.PyUniformReplayBuffer(spec, batch_size=2, max_length=50)
    stacked = tfbuffers.PyUniformReplayBuffer(spec, batch_size=2, max_length=50, frame_stacks="pixels")
    frame = SIDE * SIDE
    assert plain.nbytes == 100 * (DEPTH * frame + 8) + 8
    handles_and_codes = 100 * (DEPTH * 8 + 8) + 8  # an int64 handle per stacked frame, the codes, the counter
    assert stacked.nbytes == handles_and_codes + (frame + 16)  # the empty rows' zero frame: its bytes, count, hash
    for items in stacked_adds(np.random.default_rng(0), 2, 40, episode=20):
        plain.add_batch(items)
        stacked.add_batch(items)
    distinct = 2 * 2 * (1 + 19)  # per segment and episode: the first frame, then one new frame per add
    assert stacked.nbytes == handles_and_codes + (1 + distinct) * (frame + 16)
    assert plain.nbytes == 100 * (DEPTH * frame + 8) + 8


def test_py_hashed_replay_buffer_takes_a_tensor_sample_batch_size_inside_a_function():
    buffer = tfbuffers.PyHashedReplayBuffer(data_spec=hashed_spec(), capacity=8)

    @tf.function(input_signature=[tf.TensorSpec([], tf.int32)])
    def sample(size):
        items, info = buffer.get_next(sample_batch_size=size)
        return items.observation, info.ids

    observation, ids = sample(tf.constant(3))  # empty: zeros, ids -1, as TF-Agents' py buffer
    assert observation.shape == (3, SIDE, SIDE, DEPTH) and ids.numpy().tolist() == [-1, -1, -1]
    single = [np.full([SIDE, SIDE, 1], k, np.int32) for k in range(1, 8)]
    for k in range(3):
        step = ts.transition(np.concatenate(single[k : k + DEPTH], axis=-1), reward=0.0)
        traj = trajectory.from_transition(step, policy_step.PolicyStep(np.int32(0)), step)
        buffer.add_batch(tf.nest.map_structure(lambda x: np.asarray(x)[None], traj))
    observation, ids = sample(tf.constant(5))
    assert observation.shape == (5, SIDE, SIDE, DEPTH) and set(ids.numpy().tolist()) <= {0, 1, 2}
    np.testing.assert_array_equal(observation[..., 1:], observation[..., :-1] + 1)  # whole stacks
