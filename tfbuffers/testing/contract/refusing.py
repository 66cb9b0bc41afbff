"""The contract's cases on what a buffer refuses and offers beyond draws: bad input, graphs, random access, epochs.

Every bad input is refused naming the field, what was expected and what was received, and the buffer works on.
Every case takes the test parameter `kind` (see `tfbuffers.testing.contract.suite`).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tfbuffers
from tfbuffers import _blocks, specs
from tfbuffers.testing.contract import (
    SPEC,
    assert_message,
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


def _bad_blocks():
    def edit(fn):
        items = frames(stored_codes(3, 6, 7))  # two frames per segment
        fn(items)
        return items

    position = "observation/position"
    return [
        (
            edit(lambda d: d["observation"].update(position=d["observation"]["position"][:, :1])),
            ValueError,
            _blocks.BLOCK_LENGTH.format(path=position, expected=2, first="action", received=1, shape="(3, 1, 2)"),
        ),
        (
            edit(lambda d: d.update(step=d["step"].astype(np.int32))),
            ValueError,
            "step: expected dtype int64, got int32",
        ),
        (frames(stored_codes(2, 6, 7)), ValueError, "action: expected leading batch size 3, got 2 (shape (2, 2))"),
        (batch(3, 6), ValueError, "action: expected shape (3, 2), got (3,)"),  # one frame, not a block: T from position
        (edit(lambda d: d.pop("step")), TypeError, "<root>: missing key(s) ['step']"),
    ]


def test_bad_blocks_are_rejected_and_change_nothing(kind):
    buffer = make_buffer(kind)
    fill(buffer, 4)
    buffer.extend(frames(stored_codes(3, 4, 5)))  # a good block first: the bad ones are as long
    before = to_numpy(buffer.gather_all())
    for items, error, message in _bad_blocks():
        with pytest.raises(error) as raised:
            buffer.extend(items)
        assert_message(raised.value, message)
        assert int(buffer.num_frames()) == 15
        for a, b in zip(tf.nest.flatten(to_numpy(buffer.gather_all())), tf.nest.flatten(before)):
            np.testing.assert_array_equal(a, b)
    # The next block, add, sample and clear work.
    assert to_numpy(buffer.extend(frames(stored_codes(3, 6, 7)))).tolist() == [[18, 21], [19, 22], [20, 23]]
    assert to_numpy(buffer.add_batch(batch(3, 8))).tolist() == [24, 25, 26]
    np.testing.assert_array_equal(to_numpy(buffer.gather_all())["step"], stored_codes(3, 4, 8))
    assert_whole(buffer.get_next(sample_batch_size=8, num_steps=2)[0])
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


def test_reads_inside_a_graph_run_when_the_graph_runs(every_window_kind):
    kind = every_window_kind  # the case waits to see every stored window drawn
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
    with pytest.raises(ValueError) as refused:
        underlying(buffer).sample_by_index([0], fields=["nope"])
    assert str(refused.value) == (
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
        seen: list[tuple[int, ...]] = []
        sizes: list[int] = []
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
