"""The contract's cases on what a buffer holds and draws: adds that wrap, windows, probabilities, datasets.

Every case takes the test parameter `kind` (a registered kind, eagerly or under `tf.function`; see
`tfbuffers.testing.contract.suite`), `uniform_kind` where it asserts uniform probabilities, or
`every_window_kind` where it waits to see every stored window drawn.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import tensorflow as tf

import tfbuffers
from tfbuffers import sampling
from tfbuffers.testing.contract import (
    assert_whole,
    batch,
    code,
    fill,
    frames,
    make_buffer,
    stored_codes,
    to_numpy,
    underlying,
)


def test_is_a_replay_buffer(kind):
    buffer = underlying(make_buffer(kind))
    assert isinstance(buffer, tfbuffers.ReplayBuffer)
    assert isinstance(buffer, tf.Module)
    assert buffer.capacity == 15
    assert buffer.batch_size == 3
    assert buffer.max_length == 5


def test_adds_before_wrap(kind):
    buffer = make_buffer(kind)
    ids = [to_numpy(buffer.add_batch(batch(3, t))).tolist() for t in range(3)]
    assert ids == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert int(buffer.num_frames()) == 9
    gathered = to_numpy(buffer.gather_all())
    np.testing.assert_array_equal(gathered["step"], stored_codes(3, 0, 2))
    assert_whole(gathered)


def test_adds_wrap_around(kind):
    buffer = make_buffer(kind)
    fill(buffer, 8)
    assert int(buffer.num_frames()) == 15
    gathered = to_numpy(buffer.gather_all())
    np.testing.assert_array_equal(gathered["step"], stored_codes(3, 3, 7))
    assert gathered["observation"]["pixels"].shape == (3, 5, 2, 2)
    assert_whole(gathered)
    assert to_numpy(buffer.add_batch(batch(3, 8))).tolist() == [24, 25, 26]


def test_extend_is_the_adds_one_by_one(kind):
    buffer = make_buffer(kind)
    assert to_numpy(buffer.extend(frames(stored_codes(3, 0, 1)))).tolist() == [[0, 3], [1, 4], [2, 5]]
    assert int(buffer.num_frames()) == 6
    np.testing.assert_array_equal(to_numpy(buffer.gather_all())["step"], stored_codes(3, 0, 1))
    # Seven more frames per segment: past the ring's end and longer than it; the last five are stored.
    ids = to_numpy(buffer.extend(frames(stored_codes(3, 2, 8))))
    np.testing.assert_array_equal(ids, np.arange(2, 9)[None, :] * 3 + np.arange(3)[:, None])
    assert int(buffer.num_frames()) == 15
    gathered = to_numpy(buffer.gather_all())
    np.testing.assert_array_equal(gathered["step"], stored_codes(3, 4, 8))
    assert_whole(gathered)
    assert to_numpy(buffer.extend(frames(stored_codes(3, 9, 8)))).shape == (3, 0)  # no frames: nothing changes
    assert int(buffer.num_frames()) == 15
    assert to_numpy(buffer.add_batch(batch(3, 9))).tolist() == [27, 28, 29]
    windows = assert_whole(buffer.get_next(sample_batch_size=32, num_steps=3)[0])
    assert {tuple(window) for window in windows.tolist()} <= {
        tuple(code(segment, range(first, first + 3))) for segment in range(3) for first in range(5, 8)
    }


def test_single_frames_come_from_the_stored_frames(every_window_kind):
    kind = every_window_kind  # the case waits to see every stored window drawn
    buffer = make_buffer(kind)
    fill(buffer, 7)  # segments hold adds 2..6
    items, info = buffer.get_next(sample_batch_size=600)
    codes = assert_whole(items)
    ids = to_numpy(info.ids)
    assert ids.shape == (600,)
    np.testing.assert_array_equal(ids, (codes % 1000) * 3 + codes // 1000)
    assert set(codes.tolist()) == set(stored_codes(3, 2, 6).ravel().tolist())
    assert to_numpy(info.probabilities).shape == (600,)


def test_probabilities_are_uniform_over_stored_windows(uniform_kind):
    buffer = make_buffer(uniform_kind)
    fill(buffer, 7)  # 5 frames per segment: 15 frames, 9 windows of 3
    _, info = buffer.get_next(sample_batch_size=600)
    np.testing.assert_array_equal(to_numpy(info.probabilities), np.full([600], np.float32(1 / 15)))
    _, info = buffer.get_next(sample_batch_size=500, num_steps=3)
    np.testing.assert_array_equal(to_numpy(info.probabilities), np.full([500], np.float32(1 / 9)))
    _, info = buffer.get_next()
    assert to_numpy(info.probabilities) == np.float32(1 / 15)
    _, info = next(iter(underlying(buffer).as_dataset(sample_batch_size=4, num_steps=2)))
    np.testing.assert_array_equal(info.probabilities.numpy(), np.full([4], np.float32(1 / 12)))


def test_windows_stay_in_one_segment_and_in_time(every_window_kind):
    kind = every_window_kind  # the case waits to see every stored window drawn
    buffer = make_buffer(kind)
    fill(buffer, 7)  # segments hold adds 2..6: windows of 3 start at 2, 3, 4
    items, info = buffer.get_next(sample_batch_size=500, num_steps=3)
    codes = assert_whole(items)
    assert codes.shape == (500, 3)
    np.testing.assert_array_equal(np.diff(codes, axis=1), np.ones([500, 2]))
    expected_windows = {(c, c + 1, c + 2) for c in code(np.arange(3)[:, None], np.arange(2, 5)[None, :]).ravel()}
    assert {tuple(w) for w in codes.tolist()} == expected_windows
    np.testing.assert_array_equal(to_numpy(info.ids), (codes % 1000) * 3 + codes // 1000)


def test_window_of_max_length_is_the_whole_segment(kind):
    buffer = make_buffer(kind)
    fill(buffer, 9)
    items, _ = buffer.get_next(sample_batch_size=50, num_steps=5)
    codes = assert_whole(items)
    assert {tuple(w) for w in codes.tolist()} == {tuple(row) for row in stored_codes(3, 4, 8).tolist()}


def test_unbatched_and_unstacked_samples(kind):
    buffer = make_buffer(kind)
    fill(buffer, 4)
    item, info = buffer.get_next()
    assert to_numpy(item)["observation"]["pixels"].shape == (2, 2)
    assert to_numpy(info.ids).shape == () and to_numpy(info.probabilities).shape == ()
    window, info = buffer.get_next(num_steps=2)
    codes = assert_whole(window)
    assert codes.shape == (2,) and codes[1] == codes[0] + 1
    steps, info = buffer.get_next(sample_batch_size=4, num_steps=3, time_stacked=False)
    assert isinstance(steps, tuple) and len(steps) == 3
    assert isinstance(info.ids, tuple) and len(info.ids) == 3
    codes = np.stack([assert_whole(step) for step in steps], axis=1)
    np.testing.assert_array_equal(np.diff(codes, axis=1), np.ones([4, 2]))
    np.testing.assert_array_equal(np.stack(to_numpy(list(info.ids)), axis=1), (codes % 1000) * 3 + codes // 1000)


@pytest.mark.parametrize(("num_adds", "num_steps"), [(0, None), (0, 2), (2, 3)])
def test_sampling_too_few_frames_raises(kind, num_adds, num_steps):
    buffer = make_buffer(kind)
    fill(buffer, num_adds)
    name = type(underlying(buffer)).__name__
    if num_adds == 0:  # TF-Agents' words
        message = f"{name} is empty. Make sure to add items before sampling the buffer."
    else:
        message = sampling.NOT_ENOUGH_FRAMES.format(buffer=name, num_steps=num_steps)
        assert message.startswith("num_steps: expected at most the frames one segment holds, got 3: ")
    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(message)):
        buffer.get_next(sample_batch_size=2, num_steps=num_steps)
    with pytest.raises(tf.errors.InvalidArgumentError):
        next(iter(underlying(buffer).as_dataset(2, num_steps)))


def test_random_dataset_has_static_specs_and_sees_new_data(every_window_kind):
    kind = every_window_kind  # the case waits to see every stored window drawn
    buffer = make_buffer(kind)
    fill(buffer, 2)
    dataset = underlying(buffer).as_dataset(sample_batch_size=4, num_steps=2)
    # Elements tf.data already prefetched were made before the adds below; with
    # no prefetching every element reflects the buffer as it is when asked for.
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    dataset = dataset.with_options(options)
    items_spec, info_spec = dataset.element_spec
    assert items_spec["observation"]["pixels"] == tf.TensorSpec([4, 2, 2, 2], tf.uint8)
    assert items_spec["step"] == tf.TensorSpec([4, 2], tf.int64)
    assert info_spec.ids == tf.TensorSpec([4, 2], tf.int64)
    assert info_spec.probabilities == tf.TensorSpec([4], tf.float32)
    iterator = iter(dataset)
    for _ in range(5):
        items, info = next(iterator)
        codes = assert_whole(items)
        assert set((codes % 1000).ravel().tolist()) <= {0, 1}
    fill(buffer, 5, start=2)  # adds 0 and 1 are overwritten now
    seen = set()
    for _ in range(40):
        items, _ = next(iterator)
        codes = assert_whole(items)
        np.testing.assert_array_equal(np.diff(codes, axis=1), np.ones([4, 1]))
        seen |= set((codes % 1000).ravel().tolist())
    assert seen == {2, 3, 4, 5, 6}


def test_parallel_random_dataset(every_window_kind):
    kind = every_window_kind  # the case waits to see every stored window drawn
    buffer = make_buffer(kind)
    fill(buffer, 9)
    dataset = underlying(buffer).as_dataset(sample_batch_size=8, num_steps=3, num_parallel_calls=2).prefetch(2)
    seen = set()
    for items, _ in dataset.take(40):
        codes = assert_whole(items)
        np.testing.assert_array_equal(np.diff(codes, axis=1), np.ones([8, 2]))
        seen |= {tuple(w) for w in codes.tolist()}
    assert seen == {(c, c + 1, c + 2) for c in code(np.arange(3)[:, None], np.arange(4, 7)[None, :]).ravel()}


def deterministic_ids(buffer, **kwargs):
    return [
        to_numpy(info.ids).tolist()
        for _, info in underlying(buffer).as_dataset(single_deterministic_pass=True, **kwargs)
    ]


def test_deterministic_pass_after_wrap_visits_every_frame_once(kind):
    buffer = make_buffer(kind, batch_size=3, max_length=4)
    fill(buffer, 6)  # adds 2..5 per segment
    elements = list(underlying(buffer).as_dataset(single_deterministic_pass=True))
    codes = [int(assert_whole(items)) for items, _ in elements]
    assert codes == stored_codes(3, 2, 5).ravel().tolist()
    assert [int(info.ids) for _, info in elements] == [t * 3 + b for b in range(3) for t in range(2, 6)]
    assert all(info.probabilities == () for _, info in elements)


def test_deterministic_windows_never_mix_segments(kind):
    buffer = make_buffer(kind, batch_size=3, max_length=4)
    fill(buffer, 6)
    windows = [
        assert_whole(items).tolist()
        for items, _ in underlying(buffer).as_dataset(num_steps=3, single_deterministic_pass=True)
    ]
    assert windows == [[2, 3, 4], [5], [1002, 1003, 1004], [1005], [2002, 2003, 2004], [2005]]


def test_deterministic_windows_with_shift_one(kind):
    buffer = make_buffer(kind, batch_size=2, max_length=4, dataset_window_shift=1)
    fill(buffer, 5)  # adds 1..4
    ids = deterministic_ids(buffer, num_steps=2)
    to_codes = [[(i % 2) * 1000 + i // 2 for i in window] for window in ids]
    assert to_codes == [[1, 2], [2, 3], [3, 4], [4], [1001, 1002], [1002, 1003], [1003, 1004], [1004]]


def test_deterministic_batched_pass(kind):
    buffer = make_buffer(kind, batch_size=3, max_length=4)
    fill(buffer, 6)
    elements = list(underlying(buffer).as_dataset(sample_batch_size=2, num_steps=3, single_deterministic_pass=True))
    codes = [assert_whole(items).tolist() for items, _ in elements]
    assert codes == [
        [[2, 3, 4], [1002, 1003, 1004]],
        [[5], [1005]],
        [[2002, 2003, 2004]],
        [[2005]],
    ]
    frames_only = [
        assert_whole(items).tolist()
        for items, _ in underlying(buffer).as_dataset(sample_batch_size=2, single_deterministic_pass=True)
    ]
    assert frames_only == [[2, 1002], [3, 1003], [4, 1004], [5, 1005], [2002], [2003], [2004], [2005]]


def test_deterministic_pass_drop_remainder(kind):
    buffer = make_buffer(kind, batch_size=3, max_length=4, dataset_drop_remainder=True)
    fill(buffer, 6)
    dataset = underlying(buffer).as_dataset(sample_batch_size=2, num_steps=3, single_deterministic_pass=True)
    assert dataset.element_spec[0]["step"] == tf.TensorSpec([2, 3], tf.int64)
    assert [assert_whole(items).tolist() for items, _ in dataset] == [[[2, 3, 4], [1002, 1003, 1004]]]
    with pytest.raises(ValueError, match="sample_batch_size: expected at most batch_size=3 .*ALL data will be dropped"):
        underlying(buffer).as_dataset(sample_batch_size=4, single_deterministic_pass=True)


def test_deterministic_pass_reads_the_buffer_when_iterated(kind):
    buffer = make_buffer(kind, batch_size=2, max_length=3)
    dataset = underlying(buffer).as_dataset(single_deterministic_pass=True)
    assert list(dataset) == []
    fill(buffer, 2)
    assert [int(info.ids) for _, info in dataset] == [0, 2, 1, 3]


def test_sequence_preprocess_fn_is_applied(kind):
    buffer = make_buffer(kind)
    fill(buffer, 3)

    def only_steps(items):
        return items["step"] * 2

    dataset = underlying(buffer).as_dataset(sample_batch_size=4, num_steps=2, sequence_preprocess_fn=only_steps)
    doubled, _ = next(iter(dataset))
    assert doubled.shape == (4, 2)
    assert np.all(doubled.numpy() % 2 == 0)
    np.testing.assert_array_equal(np.diff(doubled.numpy(), axis=1), np.full([4, 1], 2))


def test_clear(kind):
    buffer = make_buffer(kind)
    fill(buffer, 7)
    buffer.clear()
    assert int(buffer.num_frames()) == 0
    assert to_numpy(buffer.gather_all())["step"].shape == (3, 0)
    with pytest.raises(tf.errors.InvalidArgumentError):
        buffer.get_next(sample_batch_size=1)
    assert to_numpy(buffer.add_batch(batch(3, 50))).tolist() == [0, 1, 2]
    np.testing.assert_array_equal(to_numpy(buffer.gather_all())["step"], [[50], [1050], [2050]])


def test_checkpoint_round_trip(kind, tmp_path):
    buffer = make_buffer(kind)
    fill(buffer, 7)
    path = tf.train.Checkpoint(buffer=underlying(buffer)).save(str(tmp_path / "ckpt"))
    restored = make_buffer(kind)
    fill(restored, 1, start=900)  # something to overwrite
    tf.train.Checkpoint(buffer=underlying(restored)).restore(path).assert_consumed()
    assert int(restored.num_frames()) == 15
    np.testing.assert_array_equal(to_numpy(restored.gather_all())["step"], stored_codes(3, 2, 6))
    assert to_numpy(restored.add_batch(batch(3, 7))).tolist() == [21, 22, 23]
    buffer.add_batch(batch(3, 7))
    expected = to_numpy(buffer.gather_all())
    actual = to_numpy(restored.gather_all())
    for a, e in zip(tf.nest.flatten(actual), tf.nest.flatten(expected)):
        np.testing.assert_array_equal(a, e)
