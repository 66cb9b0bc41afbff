"""The array libraries a sampler's formulas run on: `TENSORFLOW`, or `numpy_backend(rng)`.

A `Backend` is what a sampler needs of an array library beyond the ring's ops (`tfbuffers._ring`): draws,
checks, sums and searches, and the sum tree's functions (`tfbuffers.sampling._sum_tree`), so one formula serves the
TF buffers (ops in their graphs) and the py buffers (numpy under their lock).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

import tfbuffers.sampling._sum_tree as _sum_tree
from tfbuffers import _ring, _xla


class Backend(NamedTuple):
    """What a sampler needs of an array library, beyond the ring's `ops`."""

    ops: _ring.Ops
    uniform_integers: Callable[[list[int], Any, Any, list[Any]], Any]
    """`(shape, low, high, after)`: int64 uniform in `[low, high)`, drawn once the `after` checks passed (which
    make sure that `high > low`: in TensorFlow the op fails otherwise)."""
    require: Callable[[Any, Any], Any]
    """`(condition, message)`: raises `InvalidArgumentError(message)` unless `condition`; in TensorFlow it
    returns the check, for `uniform_integers`' `after`."""
    select: Callable[[Any, str, str], Any]
    """`(condition, a, b)`: `a` if `condition` else `b` (a string tensor in TensorFlow)."""
    full_inverse: Callable[[list[int], Any], Any]
    """`(shape, count)`: a float32 array of `1 / count` (computed in float64)."""
    draw_leaves: Callable[[Any, int, list[int], list[Any], Any, Any], Any]
    """`(tree, capacity, shape, after, total, mask)`: sum-tree leaves drawn in proportion to their values, none
    in `mask`, once the `after` checks passed (`total`: the unmasked leaves' sum)."""
    tree: _sum_tree.Ops
    """The sum tree's functions on this backend."""
    float32: Callable[[Any], Any]
    """`(x)`: `x` as float32 (probabilities)."""
    uniform_floats: Callable[[list[int], list[Any]], Any]
    """`(shape, after)`: float64 uniform in `[0, 1)`, drawn once the `after` checks passed."""
    cumsum: Callable[[Any], Any]
    """`(x)`: the running sums along axis 0 (inclusive)."""
    searchsorted: Callable[[Any, Any], Any]
    """`(sorted, values)`: int64 positions of the first entries of the 1-D `sorted` above each value."""
    concat: Callable[[list[Any]], Any]
    """`(arrays)`: concatenated along axis 0."""
    reshape: Callable[[Any, list[int]], Any]
    """`(x, shape)`: `x` reshaped."""
    cast: Callable[[Any, Any], Any]
    """`(x, dtype)`: `x` as the numpy `dtype` (`np.int64`, `np.float64`)."""
    boolean_mask: Callable[[Any, Any], Any]
    """`(x, mask)`: the entries of `x` where `mask` (1-D) is True."""
    sum: Callable[[Any], Any]
    """`(x)`: the sum along axis 0 (0 for none)."""
    size: Callable[[Any], Any]
    """`(x)`: the number of elements (an int, or an int64 scalar in TensorFlow)."""


def _tf_uniform_integers(shape: list[int], low: Any, high: Any, after: list[Any]) -> tf.Tensor:
    with tf.control_dependencies(after):
        return tf.random.uniform(shape, low, high, dtype=tf.int64)


def _tf_uniform_floats(shape: list[int], after: list[Any]) -> tf.Tensor:
    with tf.control_dependencies(after):
        return tf.random.uniform(shape, dtype=tf.float64)


def _tf_require(condition: Any, message: Any) -> Any:
    # A plain Assert with string data needs no tf.cond guard: fewer ops per sample.
    return tf.debugging.Assert(condition, [message])


def _tf_select(condition: Any, a: Any, b: Any) -> Any:
    if isinstance(a, str) and _xla.compiling():
        return a  # a message, for an assertion XLA does not run: XLA has no strings
    return tf.where(condition, a, b)


def _tf_draw_leaves(tree: Any, capacity: int, shape: list[int], after: list[Any], total: Any, mask: Any) -> Any:
    with tf.control_dependencies(after):
        targets = tf.random.uniform(shape, dtype=tf.float64) * total
    if mask is None:
        return _sum_tree.find_wide(tree, capacity, targets)
    return _sum_tree.find(_sum_tree.TENSORFLOW, tree, capacity, targets, mask)


TENSORFLOW = Backend(
    ops=_ring.TENSORFLOW,
    uniform_integers=_tf_uniform_integers,
    require=_tf_require,
    select=_tf_select,
    full_inverse=lambda shape, count: tf.fill(shape, tf.cast(1.0 / tf.cast(count, tf.float64), tf.float32)),
    draw_leaves=_tf_draw_leaves,
    tree=_sum_tree.TENSORFLOW,
    float32=lambda x: tf.cast(x, tf.float32),
    uniform_floats=_tf_uniform_floats,
    cumsum=lambda x: tf.cumsum(x, axis=0),
    searchsorted=lambda sorted_, values: tf.searchsorted(sorted_, values, side="right", out_type=tf.int64),
    concat=lambda arrays: tf.concat(arrays, 0),
    reshape=tf.reshape,
    cast=lambda x, dtype: tf.cast(x, tf.as_dtype(dtype)),
    boolean_mask=tf.boolean_mask,
    sum=lambda x: tf.reduce_sum(x, axis=0),
    size=lambda x: tf.size(x, out_type=tf.int64),
)


def _np_require(condition: Any, message: Any) -> None:
    if not condition:
        raise tf.errors.InvalidArgumentError(None, None, message)


def numpy_backend(rng: np.random.Generator) -> Backend:
    """The numpy backend, drawing from `rng`."""
    return Backend(
        ops=_ring.NUMPY,
        uniform_integers=lambda shape, low, high, after: rng.integers(low, high, size=shape, dtype=np.int64),
        require=_np_require,
        select=lambda condition, a, b: a if condition else b,
        full_inverse=lambda shape, count: np.full(shape, 1.0 / count, np.float32),
        draw_leaves=lambda tree, capacity, shape, after, total, mask: _sum_tree.draw_numpy(
            tree, capacity, rng.random, shape, mask
        ),
        tree=_sum_tree.NUMPY,
        float32=lambda x: np.asarray(x, np.float32),
        uniform_floats=lambda shape, after: np.asarray(rng.random(shape)),
        cumsum=lambda x: np.cumsum(x, axis=0),
        searchsorted=lambda sorted_, values: np.searchsorted(sorted_, values, side="right").astype(np.int64),
        concat=lambda arrays: np.concatenate(arrays, 0),
        reshape=np.reshape,
        cast=lambda x, dtype: np.asarray(x, dtype),
        boolean_mask=lambda x, mask: x[mask],
        sum=lambda x: np.sum(x, axis=0),
        size=np.size,
    )


def choose(backend: Backend, enough: Any, from_draws: Callable[[], Any], in_one_pass: Callable[[], Any]) -> Any:
    """`from_draws()` if `enough`, else `in_one_pass()`; in TensorFlow, only the chosen one runs."""
    if backend is TENSORFLOW:
        return tf.cond(enough, from_draws, in_one_pass)
    return from_draws() if enough else in_one_pass()
