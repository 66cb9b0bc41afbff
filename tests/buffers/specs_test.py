"""The spec checks and their messages, to the letter."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.specs import array_spec

from tfbuffers import specs

Pair = collections.namedtuple("Pair", ["first", "second"])
Other = collections.namedtuple("Other", ["first", "other"])


def check(items, spec, outer=(2,)):
    return specs.check_batch(items, spec, specs.flatten_spec(spec), outer)


def test_flatten_order_and_paths_follow_tf_nest():
    spec = {"b": Pair(tf.TensorSpec([], tf.int32), [tf.TensorSpec([2], tf.float32)]), "a": tf.TensorSpec([], tf.bool)}
    fields = specs.flatten_spec(spec)
    assert [f.path for f in fields] == ["a", "b/first", "b/second/0"]
    assert [f.spec for f in fields] == tf.nest.flatten(spec)


def test_array_specs_become_tensor_specs():
    spec = {"x": array_spec.BoundedArraySpec([3], np.uint8, 0, 9, name="x")}
    assert specs.to_tensor_spec(spec) == {"x": tf.TensorSpec([3], tf.uint8, "x")}


@pytest.mark.parametrize(
    ("spec", "error", "message"),
    [
        ({"x": 3}, TypeError, "x: expected a TensorSpec or ArraySpec, got int"),
        ((tf.TensorSpec([None], tf.float32),), ValueError, "0: expected a fully defined shape, got (None,)"),
        (tf.TensorSpec([], tf.string), ValueError, "<root>: expected a numeric or bool dtype, got string"),
    ],
)
def test_bad_specs(spec, error, message):
    with pytest.raises(error) as raised:
        specs.flatten_spec(spec)
    assert str(raised.value) == message


def test_namedtuples_must_match_fields():
    spec = Pair(tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.int32))
    leaves, deferred = check(Pair(np.zeros(2, np.int32), np.ones(2, np.int32)), spec)
    assert [leaf.tolist() for leaf in leaves] == [[0, 0], [1, 1]] and deferred == []
    with pytest.raises(TypeError) as raised:
        check(Other(np.zeros(2, np.int32), np.zeros(2, np.int32)), spec)
    assert str(raised.value) == "<root>: expected fields ['first', 'second'], got ['first', 'other']"
    with pytest.raises(TypeError) as raised:
        check((np.zeros(2, np.int32), np.zeros(2, np.int32)), spec)
    assert str(raised.value) == "<root>: expected namedtuple Pair, got tuple"


def test_lists_and_tuples_are_interchangeable_but_lengths_are_checked():
    spec = [tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.int32)]
    check((np.zeros(2, np.int32), np.zeros(2, np.int32)), spec)
    with pytest.raises(TypeError) as raised:
        check([np.zeros(2, np.int32)], spec)
    assert str(raised.value) == "<root>: expected 2 elements, got 1"


def test_nothing_is_cast():
    spec = tf.TensorSpec([], tf.float32)
    with pytest.raises(ValueError) as raised:
        check(tf.constant([1.0, 2.0], tf.float64), spec)
    assert str(raised.value) == "<root>: expected dtype float32, got float64"
    with pytest.raises(ValueError) as raised:
        check(np.array([1, 2]), spec)
    assert str(raised.value) == "<root>: expected dtype float32, got int64"
    with pytest.raises(ValueError) as raised:
        check([True, False], tf.TensorSpec([], tf.int32))
    assert str(raised.value) == "<root>: expected values representable as int32, got bool [True, False]"
    with pytest.raises(ValueError) as raised:
        check([16_777_217, 0], spec)
    assert str(raised.value) == "<root>: expected values representable as float32, got int64 [16777217, 0]"
    leaves, _ = check([1, 2], spec)
    assert leaves[0].dtype == np.float32 and leaves[0].tolist() == [1.0, 2.0]


def test_python_floats_round_like_tf_constant_but_do_not_overflow():
    spec = tf.TensorSpec([], tf.float32)
    leaves, _ = check([0.1, -2.5], spec)
    assert leaves[0].dtype == np.float32
    np.testing.assert_array_equal(leaves[0], tf.constant([0.1, -2.5]).numpy())
    leaves, _ = check([float("inf"), 1.0], spec)
    assert leaves[0].tolist() == [float("inf"), 1.0]
    with pytest.raises(ValueError) as raised:
        check([1e40, 0.0], spec)
    assert str(raised.value) == "<root>: expected values representable as float32, got float64 [1e+40, 0.0]"
    with pytest.raises(ValueError) as raised:
        check([1.0, 2.0], tf.TensorSpec([], tf.int64))
    assert str(raised.value) == "<root>: expected values representable as int64, got float64 [1.0, 2.0]"


def test_unknown_dimensions_are_deferred_to_the_graph():
    spec = {"x": tf.TensorSpec([3], tf.float32)}
    seen = {}

    @tf.function(input_signature=[{"x": tf.TensorSpec([None, None], tf.float32)}])
    def run(items):
        _, deferred = check(items, spec)
        seen["paths"] = [(d.path, d.expected) for d in deferred]
        with tf.control_dependencies(specs.graph_shape_assertions(deferred)):
            return tf.identity(items["x"])

    run({"x": tf.zeros([2, 3])})
    assert seen["paths"] == [("x", (2, 3))]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"x: expected shape \(2, 3\), got"):
        run({"x": tf.zeros([2, 4])})


def test_ragged_lists_and_strings_are_refused():
    spec = tf.TensorSpec([2], tf.int32)
    with pytest.raises(ValueError) as raised:
        check([[1, 2], [3]], spec)
    assert str(raised.value) == "<root>: expected a rectangular array, got ragged nested lists"
    with pytest.raises(TypeError) as raised:
        check(["a", "b"], tf.TensorSpec([], tf.int32))
    assert str(raised.value) == "<root>: expected an array, tensor or number, got list"


def test_the_numpy_fast_path_takes_only_what_check_batch_passes_unchanged():
    spec = {"a": tf.TensorSpec([2], tf.float32), "b": Pair(tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.uint8))}
    fields = specs.flatten_spec(spec)
    fast = specs.NumpyFastPath(spec, fields, (3,))
    good = {"a": np.zeros([3, 2], np.float32), "b": Pair(np.arange(3, dtype=np.int32), np.ones(3, np.uint8))}
    leaves = fast.leaves(good)
    checked = specs.check_batch(good, spec, fields, (3,))[0]
    assert leaves is not None and len(leaves) == len(checked) == 3
    assert all(x is y for x, y in zip(leaves, checked))
    others = [
        {"a": [[0.0, 0.0]] * 3, "b": good["b"]},  # Python values: converted by check_batch
        {"a": tf.zeros([3, 2]), "b": good["b"]},  # a tensor
        {"a": np.zeros([3, 2], np.float64), "b": good["b"]},  # wrong dtype
        {"a": np.zeros([2, 2], np.float32), "b": good["b"]},  # wrong batch size
        {"a": good["a"], "c": good["b"]},  # wrong key
        {"a": good["a"], "b": Other(*good["b"])},  # another namedtuple
        {"a": good["a"], "b": tuple(good["b"])},  # a plain tuple
    ]
    for items in others:
        assert fast.leaves(items) is None


_Pair = collections.namedtuple("_Pair", "second first")


@pytest.mark.parametrize(
    "structure",
    [
        tf.TensorSpec([2]),
        {
            "z": tf.TensorSpec([2]),
            "a": [tf.TensorSpec([]), _Pair(tf.TensorSpec([]), {"y": tf.TensorSpec([]), "x": ()})],
        },
        (tf.TensorSpec([]), [], {}, (tf.TensorSpec([1]),)),
        collections.OrderedDict(b=tf.TensorSpec([]), a=tf.TensorSpec([])),  # packed by tf.nest itself
        {"outer": collections.OrderedDict(b=tf.TensorSpec([]), a=tf.TensorSpec([]))},
    ],
)
def test_a_planned_packer_builds_what_tf_nest_builds(structure):
    leaves = [np.full([1], i) for i in range(len(tf.nest.flatten(structure)))]
    packed, expected = specs.packer(structure)(leaves), tf.nest.pack_sequence_as(structure, leaves)
    tf.nest.assert_same_structure(packed, expected)
    assert type(packed) is type(expected)
    assert repr(packed) == repr(expected)  # the same containers, keys in the same order, the same leaves
    with pytest.raises(ValueError) as expected_error:
        tf.nest.pack_sequence_as(structure, leaves + [np.zeros(1)])
    with pytest.raises(ValueError) as error:
        specs.packer(structure)(leaves + [np.zeros(1)])  # one leaf too many: tf.nest's own error
    assert str(error.value) == str(expected_error.value)
