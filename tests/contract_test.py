"""The contract every buffer passes: exact contents, windows, datasets, errors.

Parametrized over every buffer kind (`conftest.BUFFER_KINDS`, and the Reverb buffer where dm-reverb
imports), each both eagerly and with every call inside `tf.function` (`kind`). The cases the Reverb
buffer does not support (it stores items in a table, not frames in rings) are skipped with the reason
(`conftest.REVERB_SKIPS`). Cases that assert uniform
probabilities take `uniform_kind` instead: a prioritized buffer passes all the others.
"""

from __future__ import annotations

import re

import conftest
import numpy as np
import pytest
import tensorflow as tf
from conftest import SPEC, assert_whole, batch, code, fill, frames, make, make_buffer, to_numpy, underlying

import tfbuffers
from tfbuffers import sampling, specs


@pytest.fixture(params=conftest.CONTRACT_KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    """Every local kind and Reverb's (where it imports), eagerly and under `tf.function`."""
    return conftest.contract_kind(request)


@pytest.fixture(params=[k for k in conftest.CONTRACT_KINDS if k in conftest.UNIFORM_KINDS or k.startswith("reverb")])
def uniform_kind(request: pytest.FixtureRequest) -> str:
    """The kinds whose sampling is uniform (Reverb's default sampler is)."""
    return conftest.contract_kind(request)


def test_each_case_reverb_skips_is_a_case_of_the_contract():
    cases = {name for name, value in globals().items() if name.startswith("test_") and callable(value)}
    assert set(conftest.REVERB_SKIPS) <= cases
    assert cases - set(conftest.REVERB_SKIPS) >= {"test_bad_dataset_arguments"}  # Reverb runs the rest


def stored_codes(batch_size: int, first: int, last: int) -> np.ndarray:
    """Codes of adds first..last (inclusive) for every segment, `[B, T]`."""
    return code(np.arange(batch_size)[:, None], np.arange(first, last + 1)[None, :])


def assert_message(error, message):
    """Messages start with the contract's text, under tf.function too (no autograph traceback)."""
    assert str(error).startswith(message)


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


def test_single_frames_come_from_the_stored_frames(kind):
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


def test_windows_stay_in_one_segment_and_in_time(kind):
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


def test_random_dataset_has_static_specs_and_sees_new_data(kind):
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


def test_parallel_random_dataset(kind):
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


def _bad_batches():
    good = batch(3, 0)

    def edit(fn):
        items = batch(3, 0)
        fn(items)
        return items

    return [
        (
            "missing key",
            edit(lambda d: d.pop("action")),
            TypeError,
            specs.MISSING_KEYS.format(path="<root>", missing=["action"], expected=["action", "observation", "step"]),
        ),
        (
            "unexpected key",
            edit(lambda d: d["observation"].update(depth=np.zeros([3]))),
            TypeError,
            specs.UNEXPECTED_KEYS.format(path="observation", unexpected=["depth"], expected=["pixels", "position"]),
        ),
        (
            "not a mapping",
            edit(lambda d: d.update(observation=(1, 2))),
            TypeError,
            "observation: expected a mapping, got tuple",
        ),
        (
            "wrong dtype",
            edit(lambda d: d["observation"].update(pixels=d["observation"]["pixels"].astype(np.float32))),
            ValueError,
            "observation/pixels: expected dtype uint8, got float32",
        ),
        (
            "wrong inner shape",
            edit(lambda d: d["observation"].update(position=np.zeros([3, 3], np.float32))),
            ValueError,
            "observation/position: expected shape (3, 2), got (3, 3)",
        ),
        (
            "wrong rank",
            edit(lambda d: d.update(step=np.zeros([3, 1], np.int64))),
            ValueError,
            "step: expected shape (3,), got (3, 1)",
        ),
        (
            "wrong batch size",
            edit(lambda d: d.update(action=good["action"][:2])),
            ValueError,
            "action: expected leading batch size 3, got 2 (shape (2,))",
        ),
        (
            "lossy python value",
            edit(lambda d: d.update(action=[1.5, 2.0, 3.0])),
            ValueError,
            "action: expected values representable as int32, got float64 [1.5, 2.0, 3.0]",
        ),
        (
            "python int out of range",
            edit(lambda d: d["observation"].update(pixels=[[[300, 0], [0, 0]]] * 3)),
            ValueError,
            "observation/pixels: expected values representable as uint8",
        ),
        (
            "none leaf",
            edit(lambda d: d.update(step=None)),
            TypeError,
            "step: expected an array, tensor or number, got NoneType",
        ),
        ("not a nest", [0, 1, 2], TypeError, "<root>: expected a mapping, got list"),
    ]


@pytest.mark.parametrize(("name", "items", "error", "message"), _bad_batches(), ids=[c[0] for c in _bad_batches()])
def test_bad_batches_are_rejected_and_change_nothing(kind, name, items, error, message):
    buffer = make_buffer(kind)
    fill(buffer, 6)
    before = to_numpy(buffer.gather_all())
    with pytest.raises(error) as raised:
        buffer.add_batch(items)
    assert_message(raised.value, message)
    assert int(buffer.num_frames()) == 15
    after = to_numpy(buffer.gather_all())
    for a, b in zip(tf.nest.flatten(after), tf.nest.flatten(before)):
        np.testing.assert_array_equal(a, b)
    assert to_numpy(buffer.add_batch(batch(3, 6))).tolist() == [18, 19, 20]


@pytest.mark.parametrize(("name", "items", "error", "message"), _bad_batches(), ids=[c[0] for c in _bad_batches()])
def test_a_refused_batch_leaves_the_buffer_adding_sampling_and_clearing(kind, name, items, error, message):
    # What every kind, Reverb's included, does after a refused batch (the case above also compares gather_all).
    buffer = make_buffer(kind, max_length=2)
    fill(buffer, 1)
    stored = int(buffer.num_frames())
    with pytest.raises(error) as raised:
        buffer.add_batch(items)
    assert_message(raised.value, message)
    assert int(buffer.num_frames()) == stored
    buffer.add_batch(batch(3, 1))
    assert int(buffer.num_frames()) == stored + 3  # frames, or Reverb's windows of two frames: one per segment
    codes = assert_whole(buffer.get_next(sample_batch_size=12, num_steps=2)[0])
    assert {tuple(window) for window in codes.tolist()} <= {(0, 1), (1000, 1001), (2000, 2001)}
    buffer.clear()
    assert int(buffer.num_frames()) == 0


def test_exact_python_values_are_accepted(kind):
    buffer = make_buffer(kind, batch_size=2)
    items = frames(code(np.arange(2), 0))
    items["action"] = [0, 1000]
    items["observation"]["position"] = [[0, 0], [1000, -1000]]
    buffer.add_batch(items)
    np.testing.assert_array_equal(
        to_numpy(buffer.gather_all())["observation"]["position"][:, 0], [[0, 0], [1000, -1000]]
    )


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"sample_batch_size": 0}, ValueError, "sample_batch_size: expected a positive int or None, got int 0"),
        ({"sample_batch_size": -2}, ValueError, "sample_batch_size: expected a positive int or None, got int -2"),
        ({"sample_batch_size": 2.0}, TypeError, "sample_batch_size: expected a positive int or None, got float 2.0"),
        ({"sample_batch_size": True}, TypeError, "sample_batch_size: expected a positive int or None, got bool True"),
        ({"num_steps": 0}, ValueError, "num_steps: expected a positive int or None, got int 0"),
        ({"num_steps": 6}, ValueError, "num_steps: expected at most max_length=5, got 6"),
    ],
)
def test_bad_sampling_arguments(kind, kwargs, error, message):
    buffer = make_buffer(kind)
    fill(buffer, 6)
    with pytest.raises(error) as raised:
        buffer.get_next(**kwargs)
    assert_message(raised.value, message)
    with pytest.raises(error) as raised:
        underlying(buffer).as_dataset(**kwargs)
    assert str(raised.value) == message
    assert int(buffer.num_frames()) == 15


def test_bad_dataset_arguments(kind):
    buffer = underlying(make_buffer(kind))
    with pytest.raises(ValueError, match="num_parallel_calls: expected a positive int, got int 0"):
        buffer.as_dataset(num_parallel_calls=0)
    with pytest.raises(TypeError, match="sequence_preprocess_fn: expected a callable or None, got int 3"):
        buffer.as_dataset(sequence_preprocess_fn=3)


def test_list_specs_come_back_as_tuples_from_datasets(kind):
    spec = [tf.TensorSpec([], tf.int64), tf.TensorSpec([2], tf.int32)]
    buffer = make_buffer(kind, batch_size=2, max_length=3, spec=spec)
    buffer.add_batch([np.array([1, 2]), np.array([[1, 1], [2, 2]], np.int32)])
    item, _ = buffer.get_next()
    assert isinstance(item, list)
    element, _ = next(iter(underlying(buffer).as_dataset(sample_batch_size=3)))
    assert isinstance(element, tuple)
    np.testing.assert_array_equal(element[1].numpy()[:, 0], element[0].numpy())


def test_a_refused_add_inside_a_graph_leaves_the_buffer_working(kind):
    # Issue 11, bug 1: a batch refused when the graph runs used to keep the writers' lock.
    buffer = make_buffer(kind, batch_size=2, max_length=3)
    signature = tf.nest.map_structure(lambda s: tf.TensorSpec([None, *s.shape], s.dtype), SPEC)
    add = tf.function(underlying(buffer).add_batch, input_signature=[signature])
    fill(buffer, 3)  # full: gather_all reads the oldest rows, where the next add writes
    before = to_numpy(buffer.gather_all())
    for _ in range(2):
        with pytest.raises(tf.errors.InvalidArgumentError, match="expected leading batch size 2"):
            add(tf.nest.map_structure(tf.constant, batch(3, 9)))
    np.testing.assert_array_equal(to_numpy(buffer.gather_all())["step"], before["step"])
    assert int(buffer.num_frames()) == 6
    # The next add, in the same graph and through the buffer's own path, the next read and clear all work.
    assert to_numpy(add(tf.nest.map_structure(tf.constant, batch(2, 3)))).tolist() == [6, 7]
    buffer.add_batch(batch(2, 4))
    np.testing.assert_array_equal(to_numpy(buffer.gather_all())["step"], stored_codes(2, 2, 4))
    assert_whole(buffer.get_next(sample_batch_size=8, num_steps=2)[0])
    buffer.clear()
    assert int(buffer.num_frames()) == 0


def test_reads_inside_a_graph_run_when_the_graph_runs(kind):
    # Issue 11, bug 2: the py buffer's reads in a tf.function were frozen at trace time.
    buffer = underlying(make_buffer(kind, batch_size=2, max_length=3))
    sample = tf.function(lambda: buffer.get_next(sample_batch_size=64)[0]["step"])
    newest = tf.function(lambda: buffer.sample_by_index([-1], fields=["step"])["step"])
    everything = tf.function(lambda: buffer.sample_all()["step"])
    num_frames = tf.function(buffer.num_frames)
    gather_all = tf.function(lambda: buffer.gather_all()["step"])
    fill(buffer, 1)
    assert set(to_numpy(sample()).tolist()) == {0, 1000}
    assert to_numpy(newest()).tolist() == [1000]
    assert to_numpy(everything()).tolist() == [0, 1000]
    assert int(num_frames()) == 2
    fill(buffer, 2, start=5)
    assert set(to_numpy(sample()).tolist()) == {0, 5, 6, 1000, 1005, 1006}  # 64 draws of 6 frames
    assert to_numpy(newest()).tolist() == [1006]
    assert to_numpy(everything()).tolist() == [0, 1000, 5, 1005, 6, 1006]
    assert int(num_frames()) == 6
    np.testing.assert_array_equal(to_numpy(gather_all()), [[0, 5, 6], [1000, 1005, 1006]])
    tf.function(buffer.clear)()
    assert int(num_frames()) == 0
    assert to_numpy(gather_all()).shape == (2, 0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="is empty. Make sure to add items"):
        sample()


def test_stateful_dataset_is_accepted_and_changes_nothing(kind):
    buffer = underlying(make_buffer(kind, stateful_dataset=True))
    assert buffer.stateful_dataset is True
    fill(buffer, 2)
    plain = underlying(make_buffer(kind))
    dataset = buffer.as_dataset(sample_batch_size=2)
    assert dataset.element_spec == plain.as_dataset(sample_batch_size=2).element_spec
    assert_whole(next(iter(dataset))[0])


def test_size_and_len_count_stored_frames(kind):
    buffer = make_buffer(kind)
    assert underlying(buffer).size == len(underlying(buffer)) == 0
    fill(buffer, 7)
    assert underlying(buffer).size == len(underlying(buffer)) == 15


# Conveniences (issue 15): sizes, random access by index, shuffled epochs, construction from a config.


def test_len_size_and_full(kind):
    buffer = make_buffer(kind)
    assert (len(buffer), buffer.size, buffer.full) == (0, 0, False)
    fill(buffer, 4)
    assert (len(buffer), buffer.size, buffer.full) == (12, 12, False)
    fill(buffer, 1, start=4)
    assert (len(buffer), buffer.size, buffer.full) == (15, 15, True)
    fill(buffer, 3, start=5)  # wrapped
    assert (len(buffer), buffer.size, buffer.full) == (15, 15, True)


def test_sample_all_and_indices_are_oldest_first_by_id(kind):
    buffer = make_buffer(kind)
    fill(buffer, 7)  # wrapped: adds 2..6 of 3 segments
    expected = stored_codes(3, 2, 6).T.ravel()  # add-major: add 2 of segments 0, 1, 2, then add 3, ...
    everything = to_numpy(buffer.sample_all())
    np.testing.assert_array_equal(assert_whole(everything), expected)
    assert everything["observation"]["pixels"].shape == (15, 2, 2)
    assert to_numpy(buffer.get_item(0))["step"] == expected[0]
    assert to_numpy(buffer.get_item(-1))["step"] == expected[-1]
    assert to_numpy(buffer.get_item(4))["observation"]["pixels"].shape == (2, 2)
    picked = to_numpy(buffer.sample_by_index([[0, 14], [-15, 7]]))
    np.testing.assert_array_equal(assert_whole(picked), [[expected[0], expected[14]], [expected[0], expected[7]]])
    some = to_numpy(buffer.sample_by_index([3, 1], fields=["step", "observation/pixels"]))
    assert list(some) == ["step", "observation/pixels"]
    np.testing.assert_array_equal(some["step"], expected[[3, 1]])
    np.testing.assert_array_equal(some["observation/pixels"], frames(expected[[3, 1]])["observation"]["pixels"])


def test_an_index_out_of_range_is_refused_and_the_buffer_works_on(kind):
    buffer = make_buffer(kind, batch_size=2, max_length=3)
    fill(buffer, 2)
    eager = kind.endswith("eager")
    for indices, value, position in (([0, 4], 4, 1), ([-5], -5, 0)):
        if eager:
            with pytest.raises(IndexError) as raised:
                buffer.sample_by_index(indices)
            assert str(raised.value) == (
                f"indices: expected values in [-4, 4) (4 frames stored), got {value} at position {position}"
            )
        else:
            with pytest.raises(tf.errors.InvalidArgumentError, match=r"indices: expected values in \[-"):
                buffer.sample_by_index(indices)
    with pytest.raises(ValueError) as raised:
        underlying(buffer).sample_by_index([0], fields=["nope"])
    assert str(raised.value) == (
        "fields: expected paths among ['action', 'observation/pixels', 'observation/position', 'step'], got ['nope']"
    )
    with pytest.raises(TypeError, match="indices: expected integers, got dtype float"):
        underlying(buffer).sample_by_index([0.5])
    # Nothing changed; the next add, sample, gather_all and clear work.
    np.testing.assert_array_equal(to_numpy(buffer.gather_all())["step"], stored_codes(2, 0, 1))
    buffer.add_batch(batch(2, 2))
    assert_whole(buffer.get_next(sample_batch_size=4, num_steps=2)[0])
    np.testing.assert_array_equal(to_numpy(buffer.sample_all())["step"], stored_codes(2, 0, 2).T.ravel())
    buffer.clear()
    assert int(buffer.num_frames()) == 0
    with pytest.raises(IndexError if eager else tf.errors.InvalidArgumentError):
        buffer.get_item(0)


@pytest.mark.parametrize(("num_steps", "sample_batch_size"), [(None, 4), (2, 3), (4, 2)])
def test_an_epoch_visits_every_window_once_in_random_order(kind, num_steps, sample_batch_size):
    buffer = underlying(make_buffer(kind))
    fill(buffer, 8)  # wrapped: adds 3..7 in 3 segments
    steps = num_steps or 1
    windows = sorted(
        tuple(code(segment, start + np.arange(steps))) for segment in range(3) for start in range(3, 8 - steps + 1)
    )
    orders = []
    for seed in (5, 5, None, None):  # four iterations: four epochs
        seen, sizes = [], []
        for items, info in buffer.epoch_dataset(sample_batch_size, num_steps, seed=seed):
            codes = assert_whole(items)
            codes = codes if num_steps else codes[:, None]
            assert codes.shape[1:] == (steps,) and info.probabilities == ()
            np.testing.assert_array_equal(
                to_numpy(info.ids).reshape(codes.shape) % 3, codes // 1000
            )  # ids name the frames: segment = id % batch_size
            seen.extend(tuple(window) for window in codes)
            sizes.append(len(codes))
        assert sorted(seen) == windows
        full, remainder = divmod(len(windows), sample_batch_size)
        assert sizes == [sample_batch_size] * full + ([remainder] if remainder else [])
        assert buffer.full_batches_per_epoch(sample_batch_size, num_steps) == full
        orders.append(seen)
    assert orders[0] == orders[1] != windows  # a seed repeats its order, shuffled
    assert orders[2] != orders[3]  # without one, each epoch draws a new order
    dropped = list(buffer.epoch_dataset(sample_batch_size, num_steps, drop_remainder=True))
    assert [len(to_numpy(info.ids)) for _, info in dropped] == [sample_batch_size] * full


def test_an_epoch_of_an_empty_buffer_is_empty_and_arguments_are_checked(kind):
    buffer = underlying(make_buffer(kind))
    assert list(buffer.epoch_dataset(4)) == []
    assert buffer.full_batches_per_epoch(4) == 0
    with pytest.raises(ValueError, match="num_steps: expected at most max_length=5, got 6"):
        buffer.epoch_dataset(4, 6)
    with pytest.raises(ValueError, match="sample_batch_size: expected a positive int, got int 0"):
        buffer.full_batches_per_epoch(0)
    with pytest.raises(TypeError, match="drop_remainder: expected a bool, got int 1"):
        buffer.epoch_dataset(4, drop_remainder=1)


def test_construction_from_a_config(kind):
    cls = type(underlying(make_buffer(kind)))
    config = {
        "capacity": 12,
        "batch_size": 3,
        "names": ["obs", "action"],
        "shapes": [[4], []],
        "dtypes": ["float32", "int64"],
    }
    buffer = cls.from_config(config)
    assert (buffer.batch_size, buffer.max_length, buffer.capacity) == (3, 4, 12)
    assert buffer.data_spec == {
        "obs": tf.TensorSpec([4], tf.float32, "obs"),
        "action": tf.TensorSpec([], tf.int64, "action"),
    }
    buffer.add_batch({"obs": np.ones([3, 4], np.float32), "action": np.arange(3)})
    assert to_numpy(buffer.sample_all())["action"].tolist() == [0, 1, 2]
    same = tfbuffers.from_config(dict(config, buffer=cls.__name__, max_length=4))
    assert type(same) is cls and same.capacity == 12
    for bad, error, message in (
        (dict(config, capacity=10), ValueError, "config: expected capacity (a multiple of batch_size=3) or max_length"),
        (
            dict(config, dtypes=["float32", "string"]),
            ValueError,
            "action: expected a numeric or bool dtype, got string",
        ),
        (
            dict(config, shapes=[[4]]),
            ValueError,
            "config: names/shapes/dtypes: expected lists of one length, got 2 names, 1 shapes",
        ),
        (dict(config, names=["a", "a"]), ValueError, "config: names: expected distinct non-empty strings without '/'"),
        (
            dict(config, dtypes=["float32", "nope"]),
            ValueError,
            "config: dtypes (action): expected a dtype name, got 'nope'",
        ),
        (dict(config, colour="red"), TypeError, "config: unexpected key(s) ['colour']; " + cls.__name__ + " takes"),
        (
            {k: v for k, v in config.items() if k != "names"},
            TypeError,
            "config: names: expected a non-empty list, got None",
        ),
    ):
        with pytest.raises(error) as raised:
            cls.from_config(bad)
        assert str(raised.value).startswith(message), str(raised.value)
    with pytest.raises(
        ValueError, match=r"config: buffer: expected one of \['PyHashedReplayBuffer', 'PyPrioritizedReplayBuffer'"
    ):
        tfbuffers.from_config(config)


# Bytes per frame of SPEC: position f32[2] 8, pixels u8[2, 2] 4, action i32 4, step i64 8.
FRAME_BYTES = 24


@pytest.mark.parametrize("episodes", [False, True], ids=["plain", "episodes"])
@pytest.mark.parametrize("name", ["tf", "py", "tf_prioritized", "py_prioritized"])
def test_nbytes_counts_the_storage(name, episodes):
    buffer = make(name, batch_size=3, max_length=5, **({"episode_boundaries": "step"} if episodes else {}))
    expected = 15 * FRAME_BYTES + 8  # the rows and the int64 add counter
    if episodes:  # an int8 distance per row (and one spare), 17 x 3 float64 sums, an int64 newest end per segment
        expected += 16 + 17 * 3 * 8 + 3 * 8
    if name.endswith("prioritized"):  # float64 priorities, the largest, the sum tree: 2 x 16 nodes of 2 float64
        expected += 15 * 8 + 8 + 2 * 16 * 2 * 8
    assert buffer.nbytes == expected
    fill(buffer, 7)  # allocated at construction: the frames held do not change it
    assert buffer.nbytes == expected
    buffer.close()
    assert buffer.nbytes == 0


# A sample_batch_size known only when the graph runs (issue 29): TF-Agents accepts one inside `tf.function`.

# The episode-aware variant stores step types beside the integer codes (`assert_whole` checks the codes).
EPISODES_SPEC = {**SPEC, "step_type": tf.TensorSpec([], tf.int32)}


def fill_episodes(buffer, num_adds):
    for t in range(num_adds):
        buffer.add_batch({**batch(3, t), "step_type": np.full([3], 1, np.int32)})  # MID: one long episode


DYNAMIC_KINDS = [(name, episodes) for name in conftest.BUFFER_KINDS for episodes in (False, True)]


@pytest.mark.parametrize(("name", "episodes"), DYNAMIC_KINDS, ids=[f"{n}-episodes_{e}" for n, e in DYNAMIC_KINDS])
@pytest.mark.parametrize("dtype", [tf.int32, tf.int64])
def test_a_tensor_sample_batch_size_inside_a_function(name, episodes, dtype):
    if episodes:
        buffer = make(name, spec=EPISODES_SPEC, batch_size=3, max_length=5, episode_boundaries=True)
        fill_episodes(buffer, 4)
    else:
        buffer = make(name, batch_size=3, max_length=5)
        fill(buffer, 4)

    @tf.function(input_signature=[tf.TensorSpec([], dtype)])
    def sample(size):
        windows, info = buffer.get_next(sample_batch_size=size, num_steps=2)
        single, _ = buffer.get_next(sample_batch_size=size)
        return windows, info, single

    for size in (1, 7):
        windows, info, single = sample(tf.constant(size, dtype))
        codes = assert_whole(windows)
        assert codes.shape == (size, 2) and np.all(codes[:, 1] - codes[:, 0] == 1)  # one segment, in order
        assert info.ids.shape == (size, 2) and info.probabilities.shape == (size,)
        assert np.all(info.probabilities.numpy() > 0)
        assert assert_whole(single).shape == (size,)
    graph = sample.get_concrete_function().structured_outputs[0]["step"]
    assert graph.shape.as_list() == [None, 2]  # the batch dimension, unknown until the graph runs
    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape("sample_batch_size: expected a positive int")):
        sample(tf.constant(0, dtype))
    # Refused, the buffer works on.
    buffer.add_batch({**batch(3, 4), "step_type": np.full([3], 1, np.int32)} if episodes else batch(3, 4))
    assert assert_whole(sample(tf.constant(2, dtype))[0]).shape == (2, 2)
    assert int(buffer.num_frames()) == 15


@pytest.mark.parametrize("name", list(conftest.BUFFER_KINDS))
def test_a_tensor_sample_batch_size_of_another_kind_is_refused_when_traced(name):
    buffer = make(name)
    fill(buffer, 2)
    message = "sample_batch_size: expected a positive int or None, got "
    for signature in (tf.TensorSpec([], tf.float32), tf.TensorSpec([2], tf.int64)):
        with pytest.raises(TypeError, match=re.escape(message)):
            tf.function(lambda size: buffer.get_next(sample_batch_size=size), input_signature=[signature])
            tf.function(lambda size: buffer.get_next(sample_batch_size=size)).get_concrete_function(signature)
    assert assert_whole(buffer.get_next(sample_batch_size=2)[0]).shape == (2,)
