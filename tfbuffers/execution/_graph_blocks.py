"""A TF buffer's `extend` in the graph: a block of `T` adds, built inside its writers' lock.

Two ways, one result (`tfbuffers._blocks`: exactly the `T` adds one by one):

* `scattered`: a sampler that keeps no state of its own (uniform, no episode boundaries) needs the rows alone.
  The block's last `min(T, max_length)` frames of every segment are the ones left stored (the earlier ones
  are overwritten by the block itself), written with one scatter per field, then the counter moves by `T`.
* `add_by_add`: a sampler with state (priorities, the record of episode ends) is told of every add in order, as
  `add_batch` tells it: a `tf.while_loop` of `T` adds, each `add_batch`'s writes, one iteration at a time.

In both the counter moves only once the rows it counts are written, so a reader never counts a frame that is
not there yet (`tfbuffers.execution._tf_concurrency`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import tensorflow as tf

from tfbuffers import _ring

_OPS = _ring.TENSORFLOW


class Sizes(NamedTuple):
    """A block's sizes: the buffer's segments and ring, and the block's frames (known when traced)."""

    batch_size: int
    max_length: int
    frames: int


def block_ids(added: tf.Tensor, sizes: Sizes, first: int = 0) -> tf.Tensor:
    """Ids of frames `first..frames - 1` of a block of adds from `added`: `[batch_size, frames - first]`."""
    return _ring.block_ids(_OPS, added, sizes.frames, sizes.batch_size, first)


def scattered(added_variable: tf.Variable, leaves: list[tf.Tensor], sizes: Sizes, table: Any) -> tuple[list[Any], Any]:
    """`(effects, ids)`: the block's stored frames written by one scatter per field, then the counter moved."""
    added = added_variable.read_value()
    first = max(0, sizes.frames - sizes.max_length)  # frames before it are overwritten within the block
    kept = block_ids(added, sizes, first)
    rows = tf.reshape(_ring.rows_of_ids(kept, sizes.max_length, sizes.batch_size), [-1])  # distinct
    values = [tf.reshape(leaf[:, first:], [-1, *leaf.shape[2:]]) for leaf in leaves]
    writes = table.write([rows] * len(leaves), values)
    with tf.control_dependencies(writes):
        moved = added_variable.assign_add(sizes.frames, read_value=False)
    return [moved], block_ids(added, sizes)


def add_by_add(
    added_variable: tf.Variable,
    leaves: list[tf.Tensor],
    sizes: Sizes,
    add_ops: Callable[[tf.Tensor, list[tf.Tensor], list[tf.Tensor], tf.Tensor], list[Any]],
) -> tuple[list[Any], Any]:
    """`(effects, ids)`: `T` adds in a `tf.while_loop`, each `add_ops(added, leaves, rows, block)`, then the counter.

    One iteration at a time (`parallel_iterations=1`), each reading the counter the one before moved.
    """
    ids = block_ids(added_variable.read_value(), sizes)
    segments = _OPS.arange(sizes.batch_size)

    def one_add(t: tf.Tensor) -> tf.Tensor:
        with tf.control_dependencies([t]):  # after the add before it: one iteration at a time
            added = added_variable.read_value()
        block = _ring.rows_of_ids(added * sizes.batch_size + segments, sizes.max_length, sizes.batch_size)
        frame = [tf.gather(leaf, t, axis=1) for leaf in leaves]
        with tf.control_dependencies(add_ops(added, frame, [block] * len(frame), block)):
            moved = added_variable.assign_add(1, read_value=False)
        with tf.control_dependencies([moved]):
            return t + 1

    (done,) = tf.while_loop(lambda t: t < sizes.frames, one_add, (tf.constant(0, tf.int64),), parallel_iterations=1)
    return [done], ids
