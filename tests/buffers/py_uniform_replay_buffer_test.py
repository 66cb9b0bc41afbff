"""What only the numpy buffer does: its constructor forms, ArraySpecs, eager values only."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from conftest import SPEC, assert_whole, batch, fill, fresh_spec, to_numpy
from tf_agents.specs import array_spec, tensor_spec

import tfbuffers
from tfbuffers import py_uniform_replay_buffer as pyrb


def test_capacity_alone_means_one_segment():
    buffer = tfbuffers.PyUniformReplayBuffer(SPEC, capacity=4)
    assert (buffer.batch_size, buffer.max_length, buffer.capacity) == (1, 4, 4)
    fill(buffer, 6)
    np.testing.assert_array_equal(to_numpy(buffer.gather_all())["step"], [[2, 3, 4, 5]])


def test_capacity_with_batch_size_splits_into_segments():
    buffer = tfbuffers.PyUniformReplayBuffer(SPEC, 12, batch_size=3)
    assert (buffer.batch_size, buffer.max_length, buffer.capacity) == (3, 4, 12)
    same = tfbuffers.PyUniformReplayBuffer(SPEC, 12, batch_size=3, max_length=4)
    assert same.max_length == 4


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        ((), {}, TypeError, pyrb.NO_SIZE),
        ((10,), {"batch_size": 3}, ValueError, "capacity: expected a multiple of batch_size=3, got 10"),
        (
            (10,),
            {"batch_size": 2, "max_length": 4},
            ValueError,
            "capacity: expected batch_size * max_length = 8, got 10",
        ),
        ((0,), {}, ValueError, "capacity: expected a positive int or None, got int 0"),
    ],
)
def test_bad_sizes(args, kwargs, error, message):
    with pytest.raises(error) as raised:
        tfbuffers.PyUniformReplayBuffer(SPEC, *args, **kwargs)
    assert str(raised.value) == message


def test_array_specs_are_accepted_and_returned_as_given():
    # A spec of its own: on the current TensorFlow, TF-Agents' buffers given the shared SPEC (in
    # tf_agents_comparison_test) leave a tf.Module tracking wrapper inside it, which this buffer unwraps.
    spec = tensor_spec.to_nest_array_spec(fresh_spec())
    spec["action"] = array_spec.BoundedArraySpec([], np.int32, minimum=0, maximum=10**6, name="action")
    buffer = tfbuffers.PyUniformReplayBuffer(spec, batch_size=2, max_length=3)
    assert buffer.data_spec is spec
    fill(buffer, 4)
    assert_whole(buffer.gather_all())
    items, _ = next(iter(buffer.as_dataset(sample_batch_size=2)))
    assert items["observation"]["pixels"].dtype == tf.uint8
    assert_whole(items)


def test_eager_tensors_are_accepted():
    buffer = tfbuffers.PyUniformReplayBuffer(SPEC, batch_size=2, max_length=3)
    buffer.add_batch(tf.nest.map_structure(tf.constant, batch(2, 7)))
    np.testing.assert_array_equal(to_numpy(buffer.gather_all())["step"], [[7], [1007]])


def test_adds_inside_a_graph_store_when_the_graph_runs():
    buffer = tfbuffers.PyUniformReplayBuffer(SPEC, batch_size=2, max_length=3)
    add = tf.function(buffer.add_batch)
    assert int(buffer.num_frames()) == 0  # nothing stored while tracing
    for t in range(2):
        ids = add(tf.nest.map_structure(tf.constant, batch(2, t)))
        assert ids.shape == (2,) and ids.numpy().tolist() == [2 * t, 2 * t + 1]
    np.testing.assert_array_equal(buffer.gather_all()["step"], [[0, 1], [1000, 1001]])
    # The values are checked again when the graph runs: a shape unknown at trace time too.
    signature = tf.nest.map_structure(lambda s: tf.TensorSpec([None, *s.shape], s.dtype), SPEC)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"action: expected leading batch size 2, got 3"):
        tf.function(buffer.add_batch, input_signature=[signature])(tf.nest.map_structure(tf.constant, batch(3, 2)))
    np.testing.assert_array_equal(buffer.gather_all()["step"], [[0, 1], [1000, 1001]])


def test_returns_numpy():
    buffer = tfbuffers.PyUniformReplayBuffer(SPEC, batch_size=2, max_length=3)
    ids = buffer.add_batch(batch(2, 0))
    assert isinstance(ids, np.ndarray) and ids.tolist() == [0, 1]
    items, info = buffer.get_next(sample_batch_size=2)
    assert isinstance(items["step"], np.ndarray)
    assert isinstance(info.ids, np.ndarray) and isinstance(info.probabilities, np.ndarray)
    assert isinstance(buffer.num_frames(), np.int64)


def test_seed_makes_sampling_reproducible():
    def samples(seed):
        buffer = tfbuffers.PyUniformReplayBuffer(SPEC, batch_size=3, max_length=5, seed=seed)
        fill(buffer, 7)
        return buffer.get_next(sample_batch_size=20, num_steps=2)[1].ids.tolist()

    assert samples(5) == samples(5)
    assert samples(5) != samples(6)


@pytest.mark.parametrize("cls", [tfbuffers.PyUniformReplayBuffer, tfbuffers.PyPrioritizedReplayBuffer])
def test_sample_arrays_is_get_next_unpacked(cls):
    def buffer():
        made = cls(SPEC, batch_size=3, max_length=5, seed=4)
        fill(made, 7)
        return made

    leaves, ids, probabilities = buffer().sample_arrays(6, 2)
    items, info = buffer().get_next(sample_batch_size=6, num_steps=2)
    assert len(leaves) == len(tf.nest.flatten(SPEC))
    for leaf, expected in zip(leaves, tf.nest.flatten(items)):
        np.testing.assert_array_equal(leaf, expected)
    np.testing.assert_array_equal(ids, info.ids)
    np.testing.assert_array_equal(probabilities, info.probabilities)
    assert assert_whole(tf.nest.pack_sequence_as(SPEC, leaves)).shape == (6, 2)


def test_checkpoint_into_another_shape_is_refused(tmp_path):
    buffer = tfbuffers.PyUniformReplayBuffer(SPEC, batch_size=2, max_length=3)
    path = tf.train.Checkpoint(buffer=buffer).save(str(tmp_path / "ckpt"))
    other = tfbuffers.PyUniformReplayBuffer(SPEC, batch_size=2, max_length=4)
    with pytest.raises(ValueError, match=r"^checkpoint: max_length: holds 3, this PyUniformReplayBuffer expects 4$"):
        tf.train.Checkpoint(buffer=other).restore(path)
    assert int(other.num_frames()) == 0
