"""The TF buffers inside `tf.function(jit_compile=True)`: adds, blocks, samples and priority updates in XLA programs.

What a compiled program stores equals what a plain graph stores for the same adds; its samples are stored
windows with the plain graph's exact probabilities; what only the running graph can refuse comes back as a
blank result that changes nothing (`tfbuffers._xla`), and the next call works.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from conftest import SPEC, code, frames

import tfbuffers
from tfbuffers import _xla, specs

EPISODE_SPEC = dict(SPEC, step_type=tf.TensorSpec([], tf.int32))
BATCH, LENGTH = 2, 6
KINDS = {
    "uniform": tfbuffers.TFUniformReplayBuffer,
    "prioritized": tfbuffers.TFPrioritizedReplayBuffer,
}
EPISODES = {"windows_anywhere": False, "episode_boundaries": "step_type"}


def _make(kind: str, episodes: str) -> tfbuffers.TFUniformReplayBuffer:
    return KINDS[kind](EPISODE_SPEC, batch_size=BATCH, max_length=LENGTH, episode_boundaries=EPISODES[episodes])


def _block(first: int, count: int) -> dict:
    """Adds `first..first + count - 1` of both segments, `[BATCH, count]`; FIRST at every add 3k, LAST at 3k + 2."""
    adds = np.arange(first, first + count)
    items = frames(code(np.arange(BATCH)[:, None], adds[None, :]))
    items["step_type"] = np.broadcast_to((adds % 3).astype(np.int32), (BATCH, count)).copy()
    return items


def _frame(add: int) -> dict:
    return tf.nest.map_structure(lambda leaf: leaf[:, 0], _block(add, 1))


def _compiled(function):
    return tf.function(function, jit_compile=True)


def _variables(buffer) -> list[np.ndarray]:
    return [variable.numpy() for variable in buffer.variables()]


def _assert_same_variables(buffer, expected: list[np.ndarray]) -> None:
    got = _variables(buffer)
    assert len(got) == len(expected)
    for value, want in zip(got, expected):
        np.testing.assert_array_equal(value, want)


def test_compiled_detects_xla_programs_and_nothing_else():
    seen = {}

    @tf.function
    def inner():
        seen["inner"] = _xla.compiling()
        return tf.constant(0)

    @tf.function(jit_compile=True)
    def compiled():
        seen["compiled"] = _xla.compiling()
        return inner()

    @tf.function
    def plain():
        seen["plain"] = _xla.compiling()
        return tf.constant(0)

    compiled()
    plain()
    assert seen == {"compiled": True, "inner": True, "plain": False}
    assert not _xla.compiling()  # eagerly


@pytest.mark.parametrize("episodes", list(EPISODES))
@pytest.mark.parametrize("kind", list(KINDS))
def test_compiled_adds_and_blocks_store_what_a_plain_graph_stores(kind, episodes):
    compiled, plain = _make(kind, episodes), _make(kind, episodes)
    calls = [
        (wrap(buffer.add_batch), wrap(buffer.extend)) for buffer, wrap in ((compiled, _compiled), (plain, tf.function))
    ]
    added = 0
    for count in (1, 4, 0, 3, 7):  # single adds and blocks, past the ring's end twice
        for add, extend in calls:
            ids = add(_frame(added)) if count == 1 else extend(_block(added, count))
            expected = (added + np.arange(count))[None, :] * BATCH + np.arange(BATCH)[:, None]
            np.testing.assert_array_equal(ids.numpy(), expected[:, 0] if count == 1 else expected)
        added += count
        _assert_same_variables(compiled, _variables(plain))
    assert int(compiled.num_frames()) == BATCH * LENGTH


def _windows(episodes: str, added: int) -> list[int]:
    """The first ids of the stored windows of 2 frames (within one episode with episode boundaries)."""
    oldest = max(0, added - LENGTH)
    starts = [a for a in range(oldest, added - 1) if episodes == "windows_anywhere" or a % 3 != 2]
    return [a * BATCH + segment for a in starts for segment in range(BATCH)]


@pytest.mark.parametrize("episodes", list(EPISODES))
@pytest.mark.parametrize("kind", list(KINDS))
def test_compiled_samples_are_stored_windows_with_the_exact_probabilities(kind, episodes):
    tf.random.set_seed(7)
    buffer = _make(kind, episodes)
    buffer.extend(_block(0, 8))  # adds 2..7 stored
    weights = {}
    if kind == "prioritized":
        ids = np.array(_windows("windows_anywhere", 8), np.int64)
        priorities = (ids % 5 + 1).astype(np.float32)  # 0 for none: every window can be drawn
        buffer.update_priorities(ids, priorities)
        weights = dict(zip(ids.tolist(), (priorities.astype(np.float64) ** buffer.priority_exponent).tolist()))
    windows = _windows(episodes, 8)
    expected = {i: weights.get(i, 1.0) / sum(weights.get(j, 1.0) for j in windows) for i in windows}

    sample = _compiled(lambda: buffer.get_next(sample_batch_size=2000, num_steps=2))
    items, info = sample()
    ids, probabilities = info.ids.numpy(), info.probabilities.numpy()
    np.testing.assert_array_equal(items["step"].numpy(), code(ids % BATCH, ids // BATCH))  # the frames the ids name
    np.testing.assert_array_equal(items["step_type"].numpy(), (ids // BATCH) % 3)
    np.testing.assert_array_equal(ids[:, 1], ids[:, 0] + BATCH)  # consecutive frames of one segment
    assert set(ids[:, 0].tolist()) <= set(windows)
    np.testing.assert_allclose(probabilities, [expected[i] for i in ids[:, 0]], rtol=1e-6)
    _, eager = buffer.get_next(sample_batch_size=200, num_steps=2)  # the plain graph's, for the same windows
    np.testing.assert_allclose(eager.probabilities.numpy(), [expected[i] for i in eager.ids.numpy()[:, 0]], rtol=1e-6)
    # The draws follow the probabilities (chi-square, fixed seed).
    observed = np.array([np.sum(ids[:, 0] == i) for i in windows])
    wanted = np.array([expected[i] for i in windows]) * len(ids)
    statistic = np.sum((observed - wanted) ** 2 / wanted)
    p_value = float(tf.math.igammac((len(windows) - 1) / 2, statistic / 2))  # chi-square's survival function
    assert p_value > 1e-3, (observed, wanted)


def _assert_blank(items, info) -> None:
    assert np.all(info.ids.numpy() == _xla.INVALID_ID)
    assert np.all(info.probabilities.numpy() == 0.0)
    for leaf in tf.nest.flatten(items):
        assert np.all(leaf.numpy() == 0)


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_compiled_sample_the_graph_would_refuse_is_blank_and_the_next_works(kind):
    buffer = _make(kind, "episode_boundaries")
    single = _compiled(lambda: buffer.get_next(sample_batch_size=4))
    windows = _compiled(lambda: buffer.get_next(sample_batch_size=4, num_steps=2))
    _assert_blank(*single())  # empty
    with pytest.raises(tf.errors.InvalidArgumentError, match="is empty"):
        buffer.get_next(sample_batch_size=4)  # what the plain graph says
    buffer.add_batch(_frame(2))  # a LAST
    _assert_blank(*windows())  # one frame per segment: no window of 2
    assert set(single()[1].ids.numpy().tolist()) <= {0, 1}
    buffer.add_batch(_frame(3))  # a FIRST: the only window crosses an episode's end
    _assert_blank(*windows())
    if kind == "prioritized":
        buffer.update_priorities(np.arange(4), np.zeros(4, np.float32))  # every frame at priority 0
        _assert_blank(*single())
        buffer.update_priorities(np.array([2]), np.array([1.0], np.float32))
        items, info = single()
        np.testing.assert_array_equal(info.ids.numpy(), [2] * 4)
        np.testing.assert_array_equal(info.probabilities.numpy(), [1.0] * 4)
        np.testing.assert_array_equal(items["step"].numpy(), [code(0, 3)] * 4)
    else:
        buffer.add_batch(_frame(4))  # FIRST, MID: a window within the episode
        items, info = windows()
        assert set(info.ids.numpy()[:, 0].tolist()) <= {2, 3}
        np.testing.assert_array_equal(info.probabilities.numpy(), [0.5] * 4)
        np.testing.assert_array_equal(items["step"].numpy()[:, 1], code(info.ids.numpy()[:, 1] % BATCH, 4))


def test_compiled_update_priorities_refuses_bad_priorities_unchanged_and_equals_the_graphs():
    compiled, plain = _make("prioritized", "windows_anywhere"), _make("prioritized", "windows_anywhere")
    for buffer in (compiled, plain):
        buffer.extend(_block(0, 4))
    update = _compiled(compiled.update_priorities)
    before = _variables(compiled)
    for ids, priorities in (([0, 1], [1.0, np.nan]), ([0, 1], [-1.0, 2.0]), ([0, 8], [1.0, 2.0]), ([-1], [1.0])):
        refused = update(tf.constant(ids, tf.int64), tf.constant(priorities, tf.float32))
        assert int(refused) == _xla.INVALID_ID, (ids, priorities)
        _assert_same_variables(compiled, before)
    ids, priorities = tf.constant([0, 3, 5, 3], tf.int64), tf.constant([4.0, 2.0, 0.5, 9.0])
    assert int(update(ids, priorities)) == 0
    assert int(plain.update_priorities(ids, priorities)) == 0
    _assert_same_variables(compiled, _variables(plain))


def test_one_compiled_train_step_adds_samples_and_updates_priorities():
    """An add, a sample and the sampled windows' priorities in one XLA program, called in a loop."""
    tf.random.set_seed(3)
    buffer = _make("prioritized", "windows_anywhere")
    buffer.extend(_block(0, 2))

    @tf.function(jit_compile=True)
    def step(frame):
        ids = buffer.add_batch(frame)
        items, info = buffer.get_next(sample_batch_size=8, num_steps=2)
        weights = tfbuffers.importance_weights(info.probabilities, buffer.num_frames(), tf.constant(0.5))
        # A priority each window's code determines, so that the end state is known whatever was drawn.
        skipped = buffer.update_priorities(info.ids[:, 0], tf.cast(items["step"][:, 0] % 7 + 1, tf.float32))
        return ids, info.ids, weights, skipped

    drawn = set()
    for t in range(2, 9):
        ids, sampled, weights, skipped = step(_frame(t))
        np.testing.assert_array_equal(ids.numpy(), [2 * t, 2 * t + 1])
        assert int(skipped) == 0 and np.all(weights.numpy() > 0) and np.max(weights.numpy()) == 1.0
        assert np.all(sampled.numpy()[:, 0] >= 2 * max(0, t + 1 - LENGTH))  # stored when drawn
        drawn.update(sampled.numpy()[:, 0].tolist())
    priorities = buffer.sampler.priorities.values.numpy()  # by storage row: id % (BATCH * LENGTH)
    stored = np.arange(2 * 3, 2 * 9)  # adds 3..8
    for frame_id in stored:
        row = frame_id % (BATCH * LENGTH)
        expected = code(frame_id % BATCH, frame_id // BATCH) % 7 + 1 if frame_id in drawn else None
        if expected is not None:
            assert priorities[row] == expected


@pytest.mark.parametrize("kind", list(KINDS))
def test_bad_batches_are_refused_when_compiled_and_the_buffer_works_after(kind):
    buffer = _make(kind, "windows_anywhere")
    buffer.add_batch(_frame(0))
    add = _compiled(buffer.add_batch)
    before = _variables(buffer)
    wrong_dtype = dict(_frame(1), action=np.zeros([BATCH], np.int64))
    wrong_shape = dict(_frame(1), observation=dict(_frame(1)["observation"], position=np.zeros([BATCH, 3], np.float32)))
    wrong_batch = tf.nest.map_structure(lambda leaf: leaf[:1], _frame(1))
    missing = {key: value for key, value in _frame(1).items() if key != "action"}
    for items, error in ((wrong_dtype, ValueError), (wrong_shape, ValueError), (wrong_batch, ValueError)):
        with pytest.raises(error) as compiled_refusal:
            add(items)
        with pytest.raises(error) as eager_refusal:
            buffer.add_batch(items)
        assert str(eager_refusal.value) in str(compiled_refusal.value)  # the field named, as eagerly
        _assert_same_variables(buffer, before)
    with pytest.raises(TypeError):
        add(missing)
    assert specs.WRONG_DTYPE.format(path="action", expected="int32", received="int64") in str(
        pytest.raises(ValueError, add, wrong_dtype).value
    )
    _assert_same_variables(buffer, before)
    np.testing.assert_array_equal(add(_frame(1)).numpy(), [2, 3])  # the next add, sample, gather_all and clear
    items, info = _compiled(lambda: buffer.get_next(sample_batch_size=3, num_steps=2))()
    np.testing.assert_array_equal(info.ids.numpy()[:, 1] - info.ids.numpy()[:, 0], [BATCH] * 3)
    np.testing.assert_array_equal(buffer.gather_all()["step"].numpy(), code(np.arange(BATCH)[:, None], np.arange(2)))
    buffer.clear()
    assert int(buffer.num_frames()) == 0
    _assert_blank(*_compiled(lambda: buffer.get_next(sample_batch_size=2))())


@pytest.mark.parametrize("kind", ["py_uniform", "py_prioritized"])
def test_a_host_buffer_is_refused_when_a_compiled_function_is_traced_and_works_after(kind):
    from tfbuffers import kinds
    from tfbuffers.execution import host

    buffer = kinds.make(kind, EPISODE_SPEC, batch_size=BATCH, max_length=LENGTH, seed=0)
    buffer.add_batch(_frame(0))
    message = host.HOST_IN_XLA.format(owner=type(buffer).__name__)
    for call in (lambda: buffer.add_batch(_frame(1)), lambda: buffer.get_next(sample_batch_size=2)):
        with pytest.raises(TypeError) as raised:
            _compiled(call)()
        assert message in str(raised.value)
    assert buffer.num_frames() == BATCH  # nothing stored
    np.testing.assert_array_equal(tf.function(buffer.add_batch)(_frame(1)).numpy(), [2, 3])  # a plain graph
    _, info = tf.function(lambda: buffer.get_next(sample_batch_size=2, num_steps=2))()
    np.testing.assert_array_equal(info.ids.numpy()[:, 1] - info.ids.numpy()[:, 0], [BATCH] * 2)
