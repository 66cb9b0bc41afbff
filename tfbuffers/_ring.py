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
ever-increasing id `a * B + b` (b the segment), and its row is that id modulo
the capacity `L * B`: one op. A segment holds the adds
`[added - min(added, L), added)`, oldest first, so the stored frames are the ids
`[oldest_add * B, added * B)`, consecutive.

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
    """`(n, step=1)`: int64 `0, step, ..., (n - 1) * step`; a constant in TensorFlow for a Python `n`."""
    minimum: Any
    maximum: Any
    all: Any


NUMPY = Ops(
    arange=lambda n, step=1: np.arange(n, dtype=np.int64) * step,
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


def _arange(n: Any, step: int = 1) -> tf.Tensor:
    if tf.is_tensor(n):
        return tf.range(_int64(n), dtype=tf.int64) * step
    return tf.constant(np.arange(n, dtype=np.int64) * step)


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


def ids_stored(ops: Ops, ids: Any, added: Any, max_length: int, batch_size: int) -> Any:
    """Whether each frame id of `ids` (each below `added * batch_size`) is still stored, not overwritten since."""
    adds = ids // batch_size
    return (adds >= oldest_add(ops, added, max_length)) & (adds < added)


def windows_per_segment(ops: Ops, added: Any, max_length: int, num_steps: int) -> Any:
    """How many windows of `num_steps` consecutive frames each segment holds."""
    return _windows_in(ops, frames_per_segment(ops, added, max_length), num_steps)


def _windows_in(ops: Ops, frames: Any, num_steps: int) -> Any:
    return frames if num_steps == 1 else ops.maximum(frames - (num_steps - 1), 0)


def stored_windows(ops: Ops, added: Any, max_length: int, batch_size: int, num_steps: int) -> tuple[Any, Any]:
    """`(first, count)`: the first frames' ids of the stored windows of `num_steps` are `[first, first + count)`.

    Every segment's windows from the oldest frame on: their ids are consecutive.
    """
    frames = frames_per_segment(ops, added, max_length)
    return (added - frames) * batch_size, _windows_in(ops, frames, num_steps) * batch_size


def window_ids_and_rows(ops: Ops, first_ids: Any, max_length: int, batch_size: int, num_steps: int) -> tuple[Any, Any]:
    """Frame ids and storage rows, each `S + [num_steps]`, of the windows whose first frames are `first_ids` (`S`).

    A window's frames are consecutive adds of one segment: `batch_size` ids apart.
    """
    ids = first_ids[..., None] + ops.arange(num_steps, batch_size)  # a constant for a Python num_steps
    return ids, rows_of_ids(ids, max_length, batch_size)


def are_stored(ops: Ops, ids: Any, added: Any, max_length: int, batch_size: int) -> Any:
    """Whether every frame of `ids` is still stored (a scalar bool)."""
    return ops.all(ids_stored(ops, ids, added, max_length, batch_size))


def block_start(added: Any, max_length: int, batch_size: int) -> Any:
    """The first row of the block that add number `added` writes (its `batch_size` rows follow)."""
    return (added % max_length) * batch_size


def block_ids(ops: Ops, added: Any, frames: int, batch_size: int, first: int = 0) -> Any:
    """Ids of adds `added + first .. added + frames - 1` of every segment: `[batch_size, frames - first]`."""
    adds = added + first + ops.arange(frames - first)
    return adds[None, :] * batch_size + ops.arange(batch_size)[:, None]


def rows_of_ids(ids: Any, max_length: int, batch_size: int) -> Any:
    """Storage rows of frame ids (see the module docstring): `((id // B) % L) * B + id % B`, i.e. `id % (L * B)`."""
    return ids % (max_length * batch_size)


def ids_of_rows(ops: Ops, rows: Any, added: Any, max_length: int, batch_size: int) -> Any:
    """Ids of the frames stored at `rows` (the inverse of `rows_of_ids` over stored frames)."""
    first = oldest_add(ops, added, max_length)
    adds = first + (rows // batch_size - first % max_length) % max_length
    return adds * batch_size + rows % batch_size


def chronological_ids(ops: Ops, added: Any, max_length: int, batch_size: int) -> Any:
    """Ids of every stored frame, `[batch_size, frames_per_segment]`, oldest first."""
    adds = oldest_add(ops, added, max_length) + ops.arange(frames_per_segment(ops, added, max_length))
    return adds[None, :] * batch_size + ops.arange(batch_size)[:, None]
