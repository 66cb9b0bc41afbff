"""Where TF-Agents 0.19 is wrong and tfbuffers is right, shown on the same adds."""

from __future__ import annotations

import pathlib
import tempfile

import numpy as np
import pytest
import tensorflow as tf
from conftest import SPEC, batch, fill, fresh_spec, to_numpy
from tf_agents.replay_buffers import py_uniform_replay_buffer, tf_uniform_replay_buffer
from tf_agents.specs import tensor_spec

import tfbuffers


def test_deterministic_pass_after_wrap_mixes_segments_in_tf_agents_not_here():
    ours = tfbuffers.TFUniformReplayBuffer(SPEC, batch_size=2, max_length=4)
    theirs = tf_uniform_replay_buffer.TFUniformReplayBuffer(SPEC, batch_size=2, max_length=4)
    for t in range(6):
        ours.add_batch(batch(2, t))
        theirs.add_batch(tf.nest.map_structure(tf.constant, batch(2, t)))

    def steps(buffer):
        return [int(items["step"]) for items, _ in buffer.as_dataset(single_deterministic_pass=True)]

    assert steps(ours) == [2, 3, 4, 5, 1002, 1003, 1004, 1005]
    # TF-Agents reads row `segment * max_length + id`, which after wrap-around
    # lands in the next segment (and, for the last one, wraps to the first).
    assert steps(theirs) == [2, 3, 1004, 1005, 1002, 1003, 4, 5]


def test_wrong_batch_size_is_caught_up_front_here():
    ours = tfbuffers.TFUniformReplayBuffer(SPEC, batch_size=3, max_length=4)
    fill(ours, 1)
    with pytest.raises(ValueError, match=r"^action: expected leading batch size 3, got 2 \(shape \(2,\)\)$"):
        ours.add_batch(batch(3, 1) | {"action": np.array([1, 2], np.int32)})
    assert int(ours.num_frames()) == 3
    np.testing.assert_array_equal(to_numpy(ours.gather_all())["step"], [[0], [1000], [2000]])


def test_add_batch_wrapped_in_tf_function_fails_in_tf_agents_not_here():
    ours = tfbuffers.TFUniformReplayBuffer(SPEC, batch_size=2, max_length=4)
    theirs = tf_uniform_replay_buffer.TFUniformReplayBuffer(SPEC, batch_size=2, max_length=4)
    items = tf.nest.map_structure(tf.constant, batch(2, 0))
    with pytest.raises(TypeError, match="found return value of type Operation"):
        tf.function(theirs.add_batch)(items)
    assert tf.function(ours.add_batch)(items).numpy().tolist() == [0, 1]
    np.testing.assert_array_equal(to_numpy(ours.gather_all())["step"], [[0], [1000]])


def test_py_buffer_does_what_tf_agents_py_buffer_refuses():
    array_spec = tensor_spec.to_nest_array_spec(SPEC)
    ours = tfbuffers.PyUniformReplayBuffer(array_spec, capacity=8, batch_size=2)
    theirs = py_uniform_replay_buffer.PyUniformReplayBuffer(array_spec, capacity=8)
    with pytest.raises(NotImplementedError, match="only supports a batch size of 1"):
        theirs.add_batch(batch(2, 0))
    with pytest.raises(NotImplementedError):
        theirs.num_frames()
    empty_item = theirs.get_next()  # no error: uninitialised memory
    assert set(empty_item) == {"observation", "action", "step"}
    ours.add_batch(batch(2, 0))
    assert int(ours.num_frames()) == 2
    items, info = ours.get_next(sample_batch_size=3)
    assert set(np.asarray(items["step"]).tolist()) <= {0, 1000}
    assert info.probabilities.tolist() == [0.5, 0.5, 0.5]


def test_the_callers_spec_is_left_as_given_here_tf_agents_wraps_its_dicts():
    theirs, ours = fresh_spec(), fresh_spec()
    tf_uniform_replay_buffer.TFUniformReplayBuffer(theirs, batch_size=3, max_length=5)
    buffer = tfbuffers.TFUniformReplayBuffer(ours, batch_size=3, max_length=5)
    fill(buffer, 6)
    buffer.get_next(sample_batch_size=2, num_steps=2)
    tf.train.Checkpoint(buffer=buffer).write(str(pathlib.Path(tempfile.mkdtemp()) / "ckpt"))
    # TF-Agents' buffer is a tf.Module holding the spec: TensorFlow's tracking replaces its nested dicts in place.
    assert type(theirs["observation"]) is not dict
    assert type(theirs["observation"]).__name__ == "_DictWrapper"
    assert type(ours["observation"]) is dict and buffer.data_spec is ours


def test_a_stateless_map_after_as_dataset_reads_ahead_in_tf_agents_not_here():
    # tf.data's default optimizations run a stateless map in parallel and prefetch after it, so a pipeline
    # reads elements before `next` asks for them. tfbuffers' TF datasets turn both off: an element holds the
    # frames stored when `next` was called.
    ours = tfbuffers.TFUniformReplayBuffer(SPEC, batch_size=1, max_length=4)
    theirs = tf_uniform_replay_buffer.TFUniformReplayBuffer(SPEC, batch_size=1, max_length=4)

    def steps(items, info):
        return items["step"]

    datasets = {}
    for name, buffer in (("ours", ours), ("theirs", theirs)):
        for t in range(2):
            buffer.add_batch(tf.nest.map_structure(tf.constant, batch(1, t)))
        datasets[name] = buffer.as_dataset(sample_batch_size=8).map(steps)
    assert datasets["ours"].options().experimental_optimization.map_parallelization is False
    assert datasets["theirs"].options().experimental_optimization.map_parallelization is None  # tf.data's default: on
    iterator = iter(datasets["ours"])
    assert set(next(iterator).numpy().tolist()) <= {0, 1}
    fill(ours, 4, start=2)  # adds 2..5: the first two frames overwritten
    for _ in range(20):
        assert set(next(iterator).numpy().tolist()) <= {2, 3, 4, 5}


def test_the_bandit_trainer_s_reads_return_what_tf_agents_bandit_buffer_returns():
    # TF-Agents' BanditReplayBuffer is an alias of its TFUniformReplayBuffer; its trainer adds a loop of steps
    # per environment, reads them with one deterministic pass of batch_size windows of `steps`, then clears.
    from tf_agents.bandits.replay_buffers import bandit_replay_buffer

    spec = {"reward": tf.TensorSpec([], tf.float32), "arm": tf.TensorSpec([], tf.int64)}
    batch_size, steps = 3, 4
    buffers = [
        bandit_replay_buffer.BanditReplayBuffer(spec, batch_size=batch_size, max_length=steps),
        tfbuffers.TFUniformReplayBuffer(spec, batch_size=batch_size, max_length=steps),
    ]
    read = []
    for buffer in buffers:
        loops = []
        for loop in range(2):
            for t in range(steps):
                arms = tf.constant([100 * loop + 10 * b + t for b in range(batch_size)], tf.int64)
                buffer.add_batch({"reward": tf.cast(arms, tf.float32) / 10, "arm": arms})
            dataset = buffer.as_dataset(sample_batch_size=batch_size, num_steps=steps, single_deterministic_pass=True)
            loops.append([items["arm"].numpy().tolist() for items, _ in dataset])
            buffer.clear()
        read.append(loops)
    assert (
        read[0]
        == read[1]
        == [
            [[[10 * b + t for t in range(steps)] for b in range(batch_size)]],
            [[[100 + 10 * b + t for t in range(steps)] for b in range(batch_size)]],
        ]
    )
