"""The host bridge: a host-side object's methods called from graphs and datasets, held weakly."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from tfbuffers.execution import host
from tfbuffers.specs import flatten_spec

FIELDS = flatten_spec({"n": tf.TensorSpec([], tf.int64), "x": tf.TensorSpec([2], tf.float32)})  # in this order


class Ring:
    """A host-side store of `x = [t, -t]`, `n = t` frames: what a buffer in another process would answer."""

    def __init__(self) -> None:
        self.added = 0
        self.calls = 0

    def add(self, count: np.ndarray) -> np.int64:
        self.calls += 1
        self.added += int(count)
        return np.int64(self.added)

    def newest(self) -> list[Any]:
        t = self.added - 1
        return [np.int64(t), np.array([t, -t], np.float32)]

    def sample_items(self, sample_batch_size: int | None, num_steps: int | None) -> Any:
        """Windows with an id each (its first frame's), as Reverb's items have keys."""
        leaves, ids, probabilities = self.sample(sample_batch_size, num_steps)
        return leaves, ids[..., 0], probabilities

    def sample(self, sample_batch_size: int | None, num_steps: int | None) -> tuple[list[np.ndarray], Any, Any]:
        if self.added == 0:
            raise tf.errors.InvalidArgumentError(None, None, "Ring is empty: add frames first")
        size, steps = sample_batch_size or 1, num_steps or 1
        ids = (np.arange(size)[:, None] + np.arange(steps)) % self.added
        x = np.stack([ids, -ids], axis=-1).astype(np.float32)
        leaves, probabilities = [ids, x], np.full(size, 1.0 / self.added, np.float32)
        if num_steps is None:
            leaves, ids = [leaf[:, 0] for leaf in leaves], ids[:, 0]
        if sample_batch_size is None:
            return [leaf[0] for leaf in leaves], ids[0], probabilities[0]
        return leaves, ids, probabilities


def test_a_call_runs_when_the_graph_runs_not_when_it_is_traced():
    ring = Ring()
    add = tf.function(lambda count: host.call(ring.add, [count], tf.int64, []))
    traced = add.get_concrete_function(tf.TensorSpec([], tf.int64))
    assert ring.calls == 0 and traced.structured_outputs.shape == []
    assert [int(add(tf.constant(n, tf.int64))) for n in (2, 3)] == [2, 5]
    assert ring.calls == 2


def test_several_outputs_get_their_static_shapes_and_only_bound_methods_are_taken():
    ring = Ring()
    ring.added = 4
    newest = tf.function(lambda: host.call(ring.newest, [], [tf.int64, tf.float32], [[], [2]]))
    concrete = newest.get_concrete_function().structured_outputs
    assert [output.shape.as_list() for output in concrete] == [[], [2]]
    n, x = newest()
    np.testing.assert_array_equal(x.numpy(), [3.0, -3.0])
    assert int(n) == 3
    with pytest.raises(TypeError):  # a function has no object to hold weakly
        host.call(lambda: np.int64(0), [], tf.int64, [])


def as_tuples(sample: Any) -> Any:
    leaves, ids, probabilities = sample
    return tuple(leaves), ids, probabilities  # tf.data takes tuples, not lists


def test_a_buffer_dropped_while_its_graph_lives_is_freed_and_the_graph_says_so():
    ring = Ring()
    graph = tf.Graph()
    with graph.as_default():
        count = tf.compat.v1.placeholder(tf.int64, [])
        added = host.call(ring.add, [count], tf.int64, [])
    with tf.compat.v1.Session(graph=graph) as session:
        assert session.run(added, {count: 2}) == 2
        ring_ref = weakref.ref(ring)
        del ring
        gc.collect()
        assert ring_ref() is None  # neither the graph nor numpy_function's registry kept it
        with pytest.raises(tf.errors.InvalidArgumentError, match="Ring: the buffer was garbage-collected"):
            session.run(added, {count: 1})


@pytest.mark.parametrize("num_steps", [None, 3])
def test_a_sample_with_a_tensor_size_in_a_graph(num_steps):
    ring = Ring()
    ring.added = 10

    @tf.function
    def draw(size):
        return host.sample(ring.sample, FIELDS, size, num_steps)

    (n, x), ids, probabilities = draw(tf.constant(4))
    steps = [] if num_steps is None else [num_steps]
    concrete = draw.get_concrete_function(tf.TensorSpec([], tf.int32)).structured_outputs
    assert [t.shape.as_list() for t in (*concrete[0], concrete[1], concrete[2])] == [
        [None, *steps],
        [None, *steps, 2],
        [None, *steps],
        [None],
    ]
    expected = (np.arange(4)[:, None] + np.arange(num_steps or 1)) % 10
    expected = expected[:, 0] if num_steps is None else expected
    np.testing.assert_array_equal(n.numpy(), expected)
    np.testing.assert_array_equal(ids.numpy(), expected)
    np.testing.assert_array_equal(x.numpy(), np.stack([expected, -expected], -1).astype(np.float32))
    np.testing.assert_array_equal(probabilities.numpy(), np.full(4, 0.1, np.float32))


def test_an_id_per_window_and_no_batch():
    ring = Ring()
    ring.added = 5
    (n, x), key, probability = tf.function(
        lambda: host.sample(ring.sample_items, FIELDS, None, 2, ids_per_step=False)
    )()
    assert (n.shape, x.shape, key.shape, probability.shape) == ([2], [2, 2], [], [])
    np.testing.assert_array_equal(n.numpy(), [0, 1])
    assert (int(key), float(probability)) == (0, np.float32(0.2))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"Shape of tensor .* \[2\] is not compatible with"):
        tf.function(lambda: host.sample(ring.sample, FIELDS, None, 2, ids_per_step=False))()  # ids per step


def test_a_refusal_on_the_host_is_the_first_line_of_the_graphs_error_and_the_next_call_works():
    ring = Ring()
    dataset = tf.data.Dataset.range(2).map(lambda _: as_tuples(host.sample(ring.sample, FIELDS, 2, None)))
    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        next(iter(dataset))
    assert str(raised.value.message).splitlines()[0].endswith("Ring is empty: add frames first")
    ring.added = 3
    (n, x), ids, probabilities = next(iter(dataset))
    np.testing.assert_array_equal(ids.numpy(), [0, 1])
