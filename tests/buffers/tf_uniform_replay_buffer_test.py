"""What only the in-graph buffer does: while_loop adds, graph-time checks, variables, devices."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from conftest import SPEC, assert_whole, batch, fill, to_numpy

import tfbuffers


def tf_batch(batch_size: int, t: tf.Tensor) -> dict:
    """`conftest.batch` built from tensors, for use inside a graph."""
    codes = 1000 * tf.range(batch_size, dtype=tf.int64) + tf.cast(t, tf.int64)
    return {
        "observation": {
            "position": tf.cast(tf.stack([codes, -codes], axis=-1), tf.float32),
            "pixels": tf.broadcast_to(tf.cast(codes % 251, tf.uint8)[:, None, None], [batch_size, 2, 2]),
        },
        "action": tf.cast(codes, tf.int32),
        "step": codes,
    }


def test_adds_inside_while_loop_equal_eager_adds():
    eager = tfbuffers.TFUniformReplayBuffer(SPEC, batch_size=3, max_length=5)
    fill(eager, 12)
    looped = tfbuffers.TFUniformReplayBuffer(SPEC, batch_size=3, max_length=5)

    @tf.function
    def collect(num_adds):
        def body(t):
            looped.add_batch(tf_batch(3, t))
            return (t + 1,)

        return tf.while_loop(lambda t: t < num_adds, body, (tf.constant(0, tf.int64),))

    collect(tf.constant(12, tf.int64))
    assert int(looped.num_frames()) == int(eager.num_frames()) == 15
    for a, b in zip(tf.nest.flatten(to_numpy(looped.gather_all())), tf.nest.flatten(to_numpy(eager.gather_all()))):
        np.testing.assert_array_equal(a, b)
    assert_whole(looped.gather_all())


def test_unknown_batch_size_is_checked_when_the_graph_runs():
    buffer = tfbuffers.TFUniformReplayBuffer(SPEC, batch_size=3, max_length=5)
    fill(buffer, 2)
    signature = tf.nest.map_structure(lambda s: tf.TensorSpec([None, *s.shape], s.dtype), SPEC)
    add = tf.function(buffer.add_batch, input_signature=[signature])
    ids = add(tf.nest.map_structure(tf.constant, batch(3, 2)))
    assert ids.numpy().tolist() == [6, 7, 8]
    before = to_numpy(buffer.gather_all())
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"action: expected leading batch size 3, got shape\] \[2\]"
    ):
        add(tf.nest.map_structure(tf.constant, batch(2, 3)))
    assert int(buffer.num_frames()) == 9
    for a, b in zip(tf.nest.flatten(to_numpy(buffer.gather_all())), tf.nest.flatten(before)):
        np.testing.assert_array_equal(a, b)
    # An inner dimension unknown at trace time is refused too. Grappler may fold the named check
    # (it infers the dimension from the write), so TensorFlow's EnsureShape, named for the field, says it.
    inner = dict(signature, observation=dict(signature["observation"], position=tf.TensorSpec([3, None], tf.float32)))
    wrong = tf.nest.map_structure(tf.constant, batch(3, 3))
    wrong["observation"]["position"] = tf.zeros([3, 5], tf.float32)
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"(?s)(observation/position: expected shape \(3, 2\), got\] \[3 5\]|\[3,5\] is not compatible"
        r" with expected shape \[\?,2\].*check_observation_position)",
    ):
        tf.function(buffer.add_batch, input_signature=[inner])(wrong)
    assert int(buffer.num_frames()) == 9


def test_storage_is_the_payload_and_one_counter():
    buffer = tfbuffers.TFUniformReplayBuffer(SPEC, batch_size=3, max_length=5, scope="rb")
    variables = buffer.variables()
    payload_per_frame = 2 * 4 + 4 * 1 + 4 + 8
    stored = sum(v.shape.num_elements() * v.dtype.size for v in variables)
    assert stored == 15 * payload_per_frame + 8
    assert [v.shape.as_list() for v in variables] == [[15], [15, 2, 2], [15, 2], [15], []]
    assert [v.name for v in variables] == [
        "rb/action:0",
        "rb/observation/pixels:0",
        "rb/observation/position:0",
        "rb/step:0",
        "rb/added:0",
    ]
    assert buffer.trainable_variables == ()


def test_variables_live_on_the_requested_device():
    buffer = tfbuffers.TFUniformReplayBuffer(SPEC, batch_size=2, max_length=3, device="/cpu:0")
    assert buffer.device == "/cpu:0"
    assert all(v.device.endswith("CPU:0") for v in buffer.variables())
    fill(buffer, 1)
    assert int(buffer.num_frames()) == 2


def test_add_batch_is_a_driver_observer():
    """TF-Agents drivers `tf.group` their observers' results, which refuses None."""
    buffer = tfbuffers.TFUniformReplayBuffer(SPEC, batch_size=3, max_length=5)

    @tf.function
    def observe(t):
        tf.group([buffer.add_batch(tf_batch(3, t))])

    observe(tf.constant(4, tf.int64))
    np.testing.assert_array_equal(to_numpy(buffer.gather_all())["step"], [[4], [1004], [2004]])


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"batch_size": 0}, ValueError, "batch_size: expected a positive int, got int 0"),
        ({"batch_size": 2, "max_length": "5"}, TypeError, "max_length: expected a positive int, got str '5'"),
        (
            {"batch_size": 2, "dataset_window_shift": 0},
            ValueError,
            "dataset_window_shift: expected a positive int or None, got int 0",
        ),
        (
            {"batch_size": 2, "dataset_drop_remainder": 1},
            TypeError,
            "dataset_drop_remainder: expected a bool, got int 1",
        ),
    ],
)
def test_bad_constructor_arguments(kwargs, error, message):
    with pytest.raises(error) as raised:
        tfbuffers.TFUniformReplayBuffer(SPEC, **kwargs)
    assert str(raised.value) == message


def test_eager_calls_trace_once_and_then_reuse_the_function():
    buffer = tfbuffers.TFUniformReplayBuffer({"x": tf.TensorSpec([2], tf.float32)}, batch_size=2, max_length=4)
    for step in range(6):
        buffer.add_batch({"x": np.full([2, 2], step, np.float32)})
        buffer.gather_all()
        frames = buffer.num_frames()  # read without a function: one read and one constant
        assert frames.dtype == tf.int64 and int(frames) == 2 * min(step + 1, 4)
        if step:  # windows of 2 need 2 frames per segment
            buffer.get_next(3, 2)
        if step == 1:
            made = buffer._calls.functions
    buffer.get_next(5)  # another sample shape: one more trace of the same function
    functions = buffer._calls.functions
    assert all(functions[name] is function for name, function in made.items())  # made once, kept
    assert {name: f.experimental_get_tracing_count() for name, f in functions.items()} == {
        "_write": 1,
        "_sample_tensors": 2,
        "_gather_all_tensors": 1,
    }
    np.testing.assert_array_equal(buffer.gather_all()["x"][:, :, 0], [[2, 3, 4, 5], [2, 3, 4, 5]])
    buffer.close()
    assert buffer._calls.functions == {}  # dropped with the buffer's variables
