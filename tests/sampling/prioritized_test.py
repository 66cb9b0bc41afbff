"""Prioritized buffers: exact probabilities, update_priorities and its refusals, frequencies, weights.

Every prioritized kind of `conftest.BUFFER_KINDS` runs these, eagerly and with
every call inside `tf.function`; the contract suite covers what they share with
the uniform buffers.
"""

from __future__ import annotations

import conftest
import numpy as np
import pytest
import tensorflow as tf
from conftest import SPEC, fill

import tfbuffers
from tfbuffers import prioritized

NAMES = [name for name, kind in conftest.BUFFER_KINDS.items() if not kind.uniform]
MODES = ["eager", "function"]
BATCH_SIZE, MAX_LENGTH = 2, 4


def make(name, mode="eager", priority_exponent=0.5, **options):
    buffer = conftest.make(name, SPEC, BATCH_SIZE, MAX_LENGTH, priority_exponent=priority_exponent, **options)
    return Wrapped(buffer) if mode == "function" else buffer


class Wrapped(conftest.FunctionWrapped):
    """Also calls `update_priorities` through `tf.function`."""

    def __init__(self, buffer):
        super().__init__(buffer)
        self._update = tf.function(buffer.update_priorities)

    def update_priorities(self, ids, priorities):
        return self._update(tf.constant(ids), tf.constant(priorities, tf.float64))


def ids_of(add, segment):
    return np.asarray(add) * BATCH_SIZE + np.asarray(segment)


def priorities_of(buffer, ids):
    """The stored priorities of frames `ids`, read from the buffer's state."""
    rows = ((np.asarray(ids) // BATCH_SIZE) % MAX_LENGTH) * BATCH_SIZE + np.asarray(ids) % BATCH_SIZE
    return conftest.underlying(buffer).state().extras[prioritized.PRIORITY][rows]


def codes_of(items):
    return np.asarray(items["step"])


# Adds 2..5 stored (6 adds, 4 per segment). Priorities by (segment, add), then weights with alpha 0.5.
PRIORITIES = np.array([[1.0, 4.0, 9.0, 16.0], [0.0, 1.0, 4.0, 0.0]])
WEIGHTS = np.sqrt(PRIORITIES)


def prioritized_buffer(name, mode="eager"):
    buffer = make(name, mode)
    fill(buffer, 6)
    adds, segments = np.meshgrid(np.arange(2, 6), np.arange(BATCH_SIZE))
    skipped = buffer.update_priorities(ids_of(adds, segments).ravel(), PRIORITIES.ravel())
    assert int(skipped) == 0
    return buffer


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    ("num_steps", "starts"),
    [(None, 4), (1, 4), (2, 3), (3, 2)],  # windows start among the oldest `starts` adds of a segment
)
def test_probabilities_are_exact_over_the_windows_that_can_be_drawn(name, mode, num_steps, starts):
    buffer = prioritized_buffer(name, mode)
    items, info = buffer.get_next(sample_batch_size=400, num_steps=num_steps)
    codes = codes_of(items)
    first = codes if num_steps is None else codes[:, 0]
    segment, add = first // 1000, first % 1000
    allowed = WEIGHTS[:, :starts]
    assert (add - 2 < starts).all() and (WEIGHTS[segment, add - 2] > 0).all()
    expected = (WEIGHTS[segment, add - 2] / allowed.sum()).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(info.probabilities), expected)
    if num_steps is not None:  # consecutive frames of one segment
        np.testing.assert_array_equal(codes, first[:, None] + np.arange(num_steps))
    np.testing.assert_array_equal(np.asarray(info.ids)[..., 0] if num_steps else info.ids, ids_of(add, segment))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("newest_priority", [25.0, 1e6], ids=["half the weight there", "nearly all of it"])
def test_probabilities_stay_exact_whatever_weight_the_newest_frames_hold(name, mode, newest_priority):
    # The TF sampler draws windows of 2 over the whole tree; those starting at the newest add (53% or 99.5%
    # of the weight here) are drawn again, and those landing there again by a descent that leaves the newest
    # add out. Either way: exact probabilities, the newest add never drawn.
    buffer = prioritized_buffer(name, mode)
    buffer.update_priorities(ids_of(np.array([5, 5]), np.arange(BATCH_SIZE)), np.full(2, newest_priority))
    items, info = buffer.get_next(sample_batch_size=400, num_steps=2)
    first = codes_of(items)[:, 0]
    segment, add = first // 1000, first % 1000
    assert (add - 2 < 3).all() and (WEIGHTS[segment, add - 2] > 0).all()
    expected = (WEIGHTS[segment, add - 2] / WEIGHTS[:, :3].sum()).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(info.probabilities), expected)
    assert len(set(first.tolist())) == 5  # every window of weight above 0 drawn in 400 draws


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", NAMES)
def test_new_frames_get_the_largest_priority_given_so_far_and_clear_resets_it(name, mode):
    buffer = make(name, mode)
    fill(buffer, 1)
    np.testing.assert_array_equal(priorities_of(buffer, [0, 1]), [1.0, 1.0])
    buffer.update_priorities(np.array([0, 1]), np.array([7.5, 0.25]))
    fill(buffer, 1, start=1)
    np.testing.assert_array_equal(priorities_of(buffer, [0, 1, 2, 3]), [7.5, 0.25, 7.5, 7.5])
    buffer.update_priorities(np.array([2]), np.array([2.0]))  # lower than 7.5: the largest stays
    fill(buffer, 1, start=2)
    np.testing.assert_array_equal(priorities_of(buffer, [4, 5]), [7.5, 7.5])
    buffer.clear()
    fill(buffer, 1)
    np.testing.assert_array_equal(priorities_of(buffer, [0, 1]), [1.0, 1.0])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", NAMES)
def test_overwritten_frames_are_skipped_and_counted_repeated_ids_take_the_last(name, mode):
    buffer = make(name, mode)
    fill(buffer, 6)  # adds 0 and 1 (ids 0..3) were overwritten by adds 4 and 5 (ids 8..11)
    skipped = buffer.update_priorities(np.array([0, 9, 3, 10, 10]), np.array([5.0, 6.0, 5.0, 1.0, 2.0]))
    assert int(skipped) == 2
    np.testing.assert_array_equal(priorities_of(buffer, [8, 9, 10, 11]), [1.0, 6.0, 2.0, 1.0])


@pytest.mark.parametrize("name", NAMES)
def test_priority_zero_is_never_drawn_for_any_exponent_and_all_zero_refuses_to_sample(name):
    for exponent in (0.0, 1.0):
        buffer = make(name, priority_exponent=exponent)
        fill(buffer, 2)
        buffer.update_priorities(np.array([0, 1, 2, 3]), np.array([0.0, 5.0, 1.0, 0.0]))
        items, info = buffer.get_next(sample_batch_size=200)
        assert set(codes_of(items).tolist()) == {1000, 1}  # (segment 1, add 0) and (segment 0, add 1)
        expected = {0.0: [0.5, 0.5], 1.0: [5 / 6, 1 / 6]}[exponent]
        assert sorted(set(np.asarray(info.probabilities).tolist())) == sorted(set(np.float32(expected).tolist()))
    buffer.update_priorities(np.array([1, 2]), np.array([0.0, 0.0]))
    message = (
        f"{type(buffer).__name__}: every window that can be drawn has priority 0. A priority of 0 means never "
        "drawn: give some stored frame a priority above 0 with update_priorities, or add frames."
    )
    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        buffer.get_next(sample_batch_size=2)
    assert message in raised.value.message
    fill(buffer, 1, start=2)  # new frames get the largest priority given: 5
    items, info = buffer.get_next(sample_batch_size=10)
    assert set(codes_of(items).tolist()) == {2, 1002}


@pytest.mark.parametrize("num_steps", [None, 2])
@pytest.mark.parametrize("name", NAMES)
def test_a_large_buffer_whose_priorities_are_all_0_refuses_to_sample_with_the_message(name, num_steps):
    # 4096 rows: the TF descent's steps below its first 1024 nodes run, on a tree whose sums are all 0.
    buffer = conftest.make(name, SPEC, BATCH_SIZE, 2048)
    fill(buffer, 3)
    buffer.update_priorities(np.arange(6), np.zeros(6))
    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        buffer.get_next(sample_batch_size=4, num_steps=num_steps)
    assert f"{type(buffer).__name__}: every window that can be drawn has priority 0" in raised.value.message
    fill(buffer, 1, start=3)  # priority 1: the newest frames
    items, info = buffer.get_next(sample_batch_size=10)
    assert set(codes_of(items).tolist()) == {3, 1003}


NOT_A_PRIORITY = "priorities: expected finite values >= 0, got "
NEVER_STORED = "ids: expected ids of frames stored since the last clear "
# Inside a graph the TF buffer's checks are TensorFlow assertions: the same words, the values as TF prints them.
GRAPH_NOT_A_PRIORITY = "priorities: expected finite values >= 0, got (value, index):] "
GRAPH_NEVER_STORED = "ids: expected ids of frames stored since the last clear (0 <= id < next id), got (id, next id):] "


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    ("ids", "priorities", "error", "message", "graph_message"),
    [
        ([4, 5], [1.0, -1.0], ValueError, NOT_A_PRIORITY + "-1.0 at index 1", GRAPH_NOT_A_PRIORITY + "[-1] [1]"),
        ([4, 5], [np.nan, 1.0], ValueError, NOT_A_PRIORITY + "nan at index 0", GRAPH_NOT_A_PRIORITY + "[nan] [0]"),
        ([4, 5], [1.0, np.inf], ValueError, NOT_A_PRIORITY + "inf at index 1", GRAPH_NOT_A_PRIORITY + "[inf] [1]"),
        (
            [4, 12],
            [1.0, 1.0],
            ValueError,
            NEVER_STORED + "(0 <= id < 12), got 12 at index 1",
            GRAPH_NEVER_STORED + "[12] [12]",
        ),
        (
            [-1, 4],
            [1.0, 1.0],
            ValueError,
            NEVER_STORED + "(0 <= id < 12), got -1 at index 0",
            GRAPH_NEVER_STORED + "[-1] [12]",
        ),
        ([4, 5, 6], [1.0, 1.0], ValueError, "priorities: expected the shape of ids, [3], got [2]", None),
    ],
)
def test_bad_updates_are_refused_whole_and_the_buffer_keeps_working(
    name, mode, ids, priorities, error, message, graph_message
):
    buffer = make(name, mode)
    fill(buffer, 6)
    buffer.update_priorities(np.array([4, 6]), np.array([3.0, 2.0]))
    before = conftest.underlying(buffer).state()
    if mode == "eager":
        with pytest.raises(error) as raised:
            buffer.update_priorities(np.array(ids), np.array(priorities))
        assert str(raised.value).startswith(message)
    else:
        with pytest.raises((tf.errors.InvalidArgumentError, ValueError)) as raised:
            buffer.update_priorities(np.array(ids), np.array(priorities))
        in_graph = name.startswith("tf") and graph_message is not None  # static shapes are refused when traced
        assert (graph_message if in_graph else message) in str(raised.value)
    after = conftest.underlying(buffer).state()
    np.testing.assert_array_equal(after.extras[prioritized.PRIORITY], before.extras[prioritized.PRIORITY])
    assert after.extras[prioritized.MAX_PRIORITY] == 3.0
    # The next update, add, sample, gather_all and clear work.
    assert int(buffer.update_priorities(np.array([8]), np.array([4.0]))) == 0
    fill(buffer, 1, start=6)
    np.testing.assert_array_equal(priorities_of(buffer, [12, 13]), [4.0, 4.0])
    items, _ = buffer.get_next(sample_batch_size=4, num_steps=2)
    conftest.assert_whole(items)
    assert codes_of(buffer.gather_all()).tolist() == [[3, 4, 5, 6], [1003, 1004, 1005, 1006]]
    buffer.clear()
    assert int(buffer.num_frames()) == 0


@pytest.mark.parametrize("name", NAMES)
def test_ids_that_are_not_integers_are_refused(name):
    buffer = make(name)
    fill(buffer, 1)
    with pytest.raises(TypeError) as raised:
        buffer.update_priorities(np.array([0.0]), np.array([1.0]))
    assert str(raised.value) == "ids: expected integer frame ids, got dtype float64"


@pytest.mark.parametrize("name", NAMES)
def test_updates_inside_a_function_run_each_call(name):
    buffer = make(name)
    fill(buffer, 2)
    update = tf.function(lambda ids, priorities: buffer.update_priorities(ids, priorities))
    for priority in (2.0, 3.0):
        assert int(update(tf.constant([0, 1], tf.int64), tf.constant([priority, priority], tf.float64))) == 0
        np.testing.assert_array_equal(priorities_of(buffer, [0, 1]), [priority, priority])


@pytest.mark.parametrize("name", NAMES)
def test_priorities_survive_checkpoints_and_files_exactly(name, tmp_path):
    from tfbuffers import files

    buffer = prioritized_buffer(name)
    buffer.update_priorities(np.array([ids_of(2, 0)]), np.array([np.pi]))
    weights = WEIGHTS.copy()
    weights[0, 0] = np.sqrt(np.pi)
    saved = buffer.state()
    path = tf.train.Checkpoint(buffer=buffer).save(str(tmp_path / "ckpt"))
    file = files.save(buffer, tmp_path / "buffer.safetensors")
    for restore in (
        lambda b: tf.train.Checkpoint(buffer=b).restore(path).assert_consumed(),
        lambda b: files.load(file, b),
    ):
        restored = make(name)
        restore(restored)
        state = restored.state()
        np.testing.assert_array_equal(state.extras[prioritized.PRIORITY], saved.extras[prioritized.PRIORITY])
        assert state.extras[prioritized.MAX_PRIORITY] == saved.extras[prioritized.MAX_PRIORITY] == 16.0
        items, info = restored.get_next(sample_batch_size=200, num_steps=2)
        first = codes_of(items)[:, 0]
        segment, add = first // 1000, first % 1000
        expected = (weights[segment, add - 2] / weights[:, :3].sum()).astype(np.float32)
        np.testing.assert_array_equal(np.asarray(info.probabilities), expected)


@pytest.mark.parametrize("name", NAMES)
def test_restored_priorities_are_checked(name):
    buffer = prioritized_buffer(name)
    state = buffer.state()
    bad = dict(state.extras, **{prioritized.PRIORITY: np.where(state.extras[prioritized.PRIORITY] > 3, -1.0, 1.0)})
    with pytest.raises(ValueError) as raised:
        buffer.restore_state(tfbuffers.BufferState(**{**state.__dict__, "extras": bad}))
    first_bad = int(np.flatnonzero(bad[prioritized.PRIORITY] < 0)[0])
    assert str(raised.value) == f"state: priority: expected finite values >= 0, got -1.0 at index {first_bad}"
    low = dict(state.extras, **{prioritized.MAX_PRIORITY: np.array(2.0)})
    with pytest.raises(ValueError) as raised:
        buffer.restore_state(tfbuffers.BufferState(**{**state.__dict__, "extras": low}))
    assert str(raised.value) == "state: max_priority: expected a finite value >= every priority, got 2.0"
    np.testing.assert_array_equal(buffer.state().extras[prioritized.PRIORITY], state.extras[prioritized.PRIORITY])


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("exponent", [-0.5, float("nan"), float("inf")])
def test_a_bad_exponent_is_refused(name, exponent):
    with pytest.raises(ValueError) as raised:
        make(name, priority_exponent=exponent)
    assert str(raised.value) == f"priority_exponent: expected a finite number >= 0, got {exponent}"


def test_importance_weights_follow_the_paper_normalised_by_the_batch_maximum():
    probabilities = np.array([0.5, 0.25, 0.125, 0.125], np.float32)
    # (N * P)^-beta with N = 4: 2^-b, 1, 2^b, 2^b; divided by the largest, 2^b.
    np.testing.assert_allclose(
        tfbuffers.importance_weights(probabilities, 4, beta=0.5), [0.5, 2**-0.5, 1.0, 1.0], rtol=1e-6
    )
    tensor = tfbuffers.importance_weights(tf.constant(probabilities), tf.constant(4, tf.int64), beta=1.0)
    assert tensor.dtype == tf.float32
    np.testing.assert_allclose(tensor.numpy(), [0.25, 0.5, 1.0, 1.0], rtol=1e-6)
    np.testing.assert_array_equal(tfbuffers.importance_weights(probabilities, 4, beta=0.0), [1.0] * 4)
    for beta in (-0.1, 1.5, "1"):
        with pytest.raises(ValueError) as raised:
            tfbuffers.importance_weights(probabilities, 4, beta=beta)
        assert str(raised.value) == f"beta: expected a number in [0, 1], got {beta}"
    # A scalar tensor beta, annealed as a train step's argument: one trace, its range checked when it runs.
    weigh = tf.function(lambda beta: tfbuffers.importance_weights(tf.constant(probabilities), 4, beta))
    np.testing.assert_allclose(weigh(tf.constant(0.5)).numpy(), [0.5, 2**-0.5, 1.0, 1.0], rtol=1e-6)
    np.testing.assert_allclose(weigh(tf.constant(1.0)).numpy(), [0.25, 0.5, 1.0, 1.0], rtol=1e-6)
    assert weigh.experimental_get_tracing_count() == 1
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"beta: expected a number in \[0, 1\]"):
        weigh(tf.constant(1.5))
    with pytest.raises(ValueError) as raised:  # eagerly: at once, as a number
        tfbuffers.importance_weights(tf.constant(probabilities), 4, beta=tf.constant(-0.5))
    assert str(raised.value) == "beta: expected a number in [0, 1], got -0.5"


def test_a_prioritized_samplers_max_priority_is_read_and_only_ever_raised():
    # What RayReplayBuffer's segments share: new frames get the largest priority of any segment.
    spec = {"x": tf.TensorSpec([], tf.int64)}
    buffer = tfbuffers.PyPrioritizedReplayBuffer(spec, batch_size=1, max_length=4, priority_exponent=1.0, seed=0)
    sampler = buffer.sampler
    assert sampler.max_priority == 1.0
    buffer.add_batch({"x": np.array([0])})
    sampler.raise_max_priority(3.0)
    sampler.raise_max_priority(2.0)  # lower: no change
    assert sampler.max_priority == 3.0 == float(buffer.state().extras["max_priority"])
    buffer.add_batch({"x": np.array([1])})
    _, info = buffer.get_next(sample_batch_size=64)
    assert dict(zip(np.asarray(info.ids).tolist(), np.asarray(info.probabilities).tolist())) == {0: 0.25, 1: 0.75}
    buffer.clear()
    assert sampler.max_priority == 1.0
    assert not hasattr(tfbuffers.PyUniformReplayBuffer(spec, capacity=2).sampler, "max_priority")  # keeps none


def _draws_and_updates(directory, storage, mode, batch_size, max_length, num_steps, sample_batch_size):
    """Every `get_next` and `update_priorities` result of a seeded py prioritized run, and its state at the end.

    Adds go past the ring's end (overwrites, updates of overwritten frames skipped), updates repeat ids and set
    priorities of 0, and with a short ring the newest rows (left out of windows of `num_steps`) hold much of the
    weight, so that draws land there and are drawn again.
    """
    spec = {"x": tf.TensorSpec([], tf.int64)}
    options = {"directory": directory} if storage == "memmap" else {}
    buffer = tfbuffers.PyPrioritizedReplayBuffer(
        spec, batch_size=batch_size, max_length=max_length, seed=3, priority_exponent=0.7, **options
    )
    get_next, update = buffer.get_next, buffer.update_priorities
    if mode == "function":
        get_next = tf.function(lambda: buffer.get_next(sample_batch_size, num_steps))
        update = tf.function(buffer.update_priorities)
    rng = np.random.default_rng(1)
    results = []
    for add in range(3 * max_length):
        buffer.add_batch({"x": np.arange(batch_size, dtype=np.int64) + 100 * add})
        if add % 5 != 4:
            continue
        items, info = get_next() if mode == "function" else get_next(sample_batch_size, num_steps)
        results.append([np.asarray(items["x"]), np.asarray(info.ids), np.asarray(info.probabilities)])
        firsts = np.asarray(info.ids)[:, 0] if num_steps else np.asarray(info.ids)
        ids = np.concatenate([firsts, rng.integers(0, (add + 1) * batch_size, 12), firsts[:3]])
        priorities = rng.uniform(0.0, 3.0, ids.size)
        priorities[rng.random(ids.size) < 0.2] = 0.0
        priorities[-1] = 40.0 if add % 10 == 4 else priorities[-1]  # the newest rows' weight, raised for later adds
        results.append(
            int(update(tf.constant(ids), tf.constant(priorities)) if mode == "function" else update(ids, priorities))
        )
        results.append(buffer.sampler.max_priority)
    state = buffer.state()
    results.append([state.extras["priority"], buffer.sampler._tree().copy()])
    buffer.close()
    return results


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("storage", ["ram", "memmap"])
@pytest.mark.parametrize(
    ("batch_size", "max_length", "num_steps", "sample_batch_size"),
    [(1, 8, 2, 5), (3, 10, 3, 16), (2, 16, None, 7), (4, 50, 2, 64)],
)
def test_the_compiled_host_draws_and_updates_are_the_numpy_steps_exactly(
    monkeypatch, tmp_path, mode, storage, batch_size, max_length, num_steps, sample_batch_size
):
    # The py prioritized buffer's get_next and update_priorities run in one compiled call each where numba imports
    # (tfbuffers.sampling._tree_kernels: draw_windows, update_stored); without it, in numpy steps. The same seed
    # gives the same windows, ids, probabilities, skipped counts, largest priority, priorities and tree.
    from tfbuffers.sampling import _sum_tree, _tree_kernels

    sizes = (batch_size, max_length, num_steps, sample_batch_size)
    assert _tree_kernels.KERNELS is not None
    monkeypatch.setattr(_sum_tree, "_COMPILED", [_tree_kernels.KERNELS])
    redraws = []
    redraw_masked = _sum_tree.redraw_masked
    monkeypatch.setattr(_sum_tree, "redraw_masked", lambda *args: redraws.append(1) or redraw_masked(*args))
    compiled = _draws_and_updates(tmp_path / "compiled", storage, mode, *sizes)
    assert (len(redraws) > 0) == (num_steps is not None)  # draws landed in the newest rows, and were drawn again
    monkeypatch.setattr(_sum_tree, "_COMPILED", [None])
    steps = _draws_and_updates(tmp_path / "steps", storage, mode, *sizes)
    assert len(compiled) == len(steps) == 3 * len(range(4, 3 * max_length, 5)) + 1
    for got, expected in zip(compiled, steps):
        if isinstance(expected, list):
            for a, b in zip(got, expected):
                np.testing.assert_array_equal(a, b)
        else:
            assert got == expected
    assert sum(compiled[1:-1:3]) > 0  # updates of overwritten frames were made, and skipped
