"""Index arithmetic of a segmented ring, written once for numpy and TensorFlow.

Storage is time-major: `batch_size` segments (one per parallel environment), each
a ring of `max_length` positions, interleaved so that one `add_batch` writes one
contiguous block of `batch_size` rows::

                    segment 0   segment 1   ...  segment B-1
    position 0      row 0       row 1            row B-1
    position 1      row B       row B+1          row 2B-1
    ...
    position L-1    row (L-1)B  ...              row LB-1

`added` counts the `add_batch` calls since the last `clear`; add number `a`
lives at position `a % L` of every segment. Each stored frame has a unique,
ever-increasing id `a * B + b` (b the segment), from which its row follows.
A segment holds the adds `[added - min(added, L), added)`, oldest first.

The functions take an `ops` namespace (`NUMPY` or `TENSORFLOW`) so that both
buffers share one definition of every formula; they use only arithmetic
operators and the few functions the namespace provides.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf


class Ops(NamedTuple):
    """The array functions the formulas need, for one backend."""

    arange: Any
    minimum: Any
    maximum: Any
    all: Any


NUMPY = Ops(
    arange=lambda n: np.arange(n, dtype=np.int64),
    minimum=np.minimum,
    maximum=np.maximum,
    all=lambda x: bool(np.all(x)),
)


def _int64(value: Any) -> tf.Tensor:
    # Python ints become constants, not Const+Cast pairs: every op counts in a
    # tf.data map function that runs once per sampled batch.
    if tf.is_tensor(value):
        return value if value.dtype == tf.int64 else tf.cast(value, tf.int64)
    return tf.constant(value, tf.int64)


def _arange(n: Any) -> tf.Tensor:
    if tf.is_tensor(n):
        return tf.range(_int64(n), dtype=tf.int64)
    return tf.constant(np.arange(n, dtype=np.int64))


TENSORFLOW = Ops(
    arange=_arange,
    minimum=lambda a, b: tf.minimum(_int64(a), _int64(b)),
    maximum=lambda a, b: tf.maximum(_int64(a), _int64(b)),
    all=tf.reduce_all,
)


def frames_per_segment(ops: Ops, added: Any, max_length: int) -> Any:
    """How many frames each segment holds."""
    return ops.minimum(added, max_length)


def oldest_add(ops: Ops, added: Any, max_length: int) -> Any:
    """The add number of the oldest frame still stored."""
    return added - ops.minimum(added, max_length)


def windows_per_segment(ops: Ops, added: Any, max_length: int, num_steps: int) -> Any:
    """How many windows of `num_steps` consecutive frames each segment holds."""
    return ops.maximum(ops.minimum(added, max_length) - num_steps + 1, 0)


def window_ids_and_rows(
    ops: Ops, draws: Any, added: Any, max_length: int, batch_size: int, num_steps: int
) -> tuple[Any, Any]:
    """Frame ids and storage rows of the windows picked by `draws`.

    Args:
      ops: The backend.
      draws: Integers in `[0, windows_per_segment * batch_size)`, any shape S.
      added: The add counter.
      max_length: Ring length L.
      batch_size: Number of segments B.
      num_steps: Window length T.

    Returns:
      Ids and rows, each of shape `S + [T]`: draw `k` picks segment `k % B`
      and the window starting `k // B` frames after the oldest stored one.
    """
    segment = (draws % batch_size)[..., None]
    adds = (oldest_add(ops, added, max_length) + draws // batch_size)[..., None] + ops.arange(num_steps)
    return adds * batch_size + segment, (adds % max_length) * batch_size + segment


def are_stored(ops: Ops, ids: Any, added: Any, max_length: int, batch_size: int) -> Any:
    """Whether every frame of `ids` is still stored (a scalar bool)."""
    adds = ids // batch_size
    return ops.all((adds >= oldest_add(ops, added, max_length)) & (adds < added))


def block_start(added: Any, max_length: int, batch_size: int) -> Any:
    """The first row of the block that add number `added` writes (its `batch_size` rows follow)."""
    return (added % max_length) * batch_size


def rows_of_ids(ids: Any, max_length: int, batch_size: int) -> Any:
    """Storage rows of frame ids (see the module docstring)."""
    return ((ids // batch_size) % max_length) * batch_size + ids % batch_size


def ids_of_rows(ops: Ops, rows: Any, added: Any, max_length: int, batch_size: int) -> Any:
    """Ids of the frames stored at `rows` (the inverse of `rows_of_ids` over stored frames)."""
    first = oldest_add(ops, added, max_length)
    adds = first + (rows // batch_size - first % max_length) % max_length
    return adds * batch_size + rows % batch_size


def chronological_ids(ops: Ops, added: Any, max_length: int, batch_size: int) -> Any:
    """Ids of every stored frame, `[batch_size, frames_per_segment]`, oldest first."""
    adds = oldest_add(ops, added, max_length) + ops.arange(frames_per_segment(ops, added, max_length))
    return adds[None, :] * batch_size + ops.arange(batch_size)[:, None]
