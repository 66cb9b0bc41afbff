"""Errors users meet: one line eagerly, the same type and message from the TF and the py buffers (issue 29)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tfbuffers
from tfbuffers.execution import _graph_calls

SPEC = {"x": tf.TensorSpec([], tf.int64)}
PAIRS = [
    (tfbuffers.TFUniformReplayBuffer, tfbuffers.PyUniformReplayBuffer),
    (tfbuffers.TFPrioritizedReplayBuffer, tfbuffers.PyPrioritizedReplayBuffer),
]


def error_of(call):
    with pytest.raises(Exception) as raised:
        call()
    return raised.value


def calls_that_fail(buffer):
    """Each refused call of a fresh buffer holding one add, named."""
    return {
        "empty": lambda: buffer.get_next(sample_batch_size=2),
        "windows longer than stored": lambda: (buffer.add_batch({"x": np.array([1, 2])}), buffer.get_next(2, 2)),
        "windows of 3, one frame per segment stored": lambda: buffer.get_next(2, 3),
    }


@pytest.mark.parametrize(("tf_kind", "py_kind"), PAIRS, ids=["uniform", "prioritized"])
def test_eager_errors_of_the_tf_buffers_are_the_py_buffers_one_line_errors(tf_kind, py_kind):
    tf_buffer, py_buffer = tf_kind(SPEC, batch_size=2, max_length=3), py_kind(SPEC, batch_size=2, max_length=3)
    tf_calls, py_calls = calls_that_fail(tf_buffer), calls_that_fail(py_buffer)
    for name in tf_calls:
        tf_error, py_error = error_of(tf_calls[name]), error_of(py_calls[name])
        assert type(tf_error) is type(py_error) is tf.errors.InvalidArgumentError, name
        assert str(tf_error) == str(py_error).replace(py_kind.__name__, tf_kind.__name__), name
        assert "\n" not in str(tf_error) and "Graph execution" not in str(tf_error), name
    assert str(error_of(calls_that_fail(tf_kind(SPEC, batch_size=2, max_length=3))["empty"])) == (
        f"{tf_kind.__name__} is empty. Make sure to add items before sampling the buffer."
    )
    # The buffer works after each refusal.
    tf_buffer.add_batch({"x": np.array([3, 4])})
    items, _ = tf_buffer.get_next(sample_batch_size=4, num_steps=2)
    assert {tuple(window) for window in items["x"].numpy().tolist()} <= {(1, 3), (2, 4)}
    assert tf_buffer.gather_all()["x"].numpy().tolist() == [[1, 3], [2, 4]]


@pytest.mark.parametrize("kind", [tfbuffers.TFUniformReplayBuffer, tfbuffers.TFPrioritizedReplayBuffer])
def test_inside_a_function_and_a_dataset_the_message_is_in_the_error(kind):
    buffer = kind(SPEC, batch_size=2, max_length=3)
    message = f"{kind.__name__} is empty. Make sure to add items before sampling the buffer."
    in_graph = error_of(tf.function(lambda: buffer.get_next(sample_batch_size=2)))
    assert isinstance(in_graph, tf.errors.InvalidArgumentError) and message in str(in_graph)
    from_dataset = error_of(lambda: next(iter(buffer.as_dataset(sample_batch_size=2))))
    assert isinstance(from_dataset, tf.errors.InvalidArgumentError)
    assert message in str(from_dataset).splitlines()[0]  # the first line users see
    buffer.add_batch({"x": np.array([1, 2])})
    drawn = next(iter(buffer.as_dataset(sample_batch_size=4)))[0]["x"].numpy()
    assert drawn.shape == (4,) and set(drawn.tolist()) <= {1, 2}


def test_assertion_messages_lose_only_tensorflow_s_wrapping():
    def message(text):
        return _graph_calls.assertion_message(tf.errors.InvalidArgumentError(None, None, text))

    framed = "Graph execution error:\n\nDetected at node A\n\nassertion failed: [{}]\n\t [[{{{{node A}}}}]] [Op:f]"
    assert message(framed.format("the buffer [2, 3] is empty")) == "the buffer [2, 3] is empty"
    assert message(framed.format("batch: expected 2, got] [3 4")) == "batch: expected 2, got [3 4]"
    assert message("Input is not invertible.") is None
