"""Blocks of frames: what `ReplayBuffer.extend` takes, checked once, and how a segmented buffer writes it.

A block holds `T` consecutive frames of every segment, each leaf `[batch_size, T, *shape]` (batch-major, as
TF-Agents' trajectories of a driver's or a dataset's time steps are); `extend(block)` is exactly the `T` calls
`add_batch(block[:, t])`, `t = 0, ..., T - 1`, in one check and, in a segmented buffer, one write per field per
contiguous run of rows. Add number `a` of a segmented ring writes position `a % max_length` of every segment
(`tfbuffers._ring`), so `T` adds from `added` cover positions that wrap at most once per `max_length`
frames: `pieces` cuts a block where the ring wraps (and where a storage says one commit ends, `Storage.block_rows`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tfbuffers import _ring, specs

BLOCK_LENGTH = (
    "{path}: expected {expected} frames along axis 1 (the time axis, as {first} has), got {received} (shape {shape})"
)
NO_TIME_AXIS = "{path}: expected a block [batch_size, T, ...] with T known, got shape {shape}"


def _dims(value: Any) -> list[int | None] | None:
    """A leaf's dimensions as far as they are known without converting it (None: unknown rank)."""
    if isinstance(value, np.ndarray):  # first: `tf.is_tensor` is a slow protocol check
        return list(value.shape)
    if tf.is_tensor(value):
        return value.shape.as_list() if value.shape.rank is not None else None
    return list(np.shape(value))


def _shape(dims: list[int | None] | None) -> str:
    return (
        "<unknown rank>"
        if dims is None
        else "(" + ", ".join(str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"
    )


def check_block(
    items: Any, data_spec: Any, fields: Sequence[specs.Field], outer_dims: tuple[int, ...]
) -> tuple[list[Any], list[specs.DeferredShapeCheck], int]:
    """`check_batch` of a block: every leaf `[*outer_dims, T, *shape]`, one `T` for all. Returns `T` too.

    Raises:
      TypeError: If the structure differs from `data_spec`'s, or a leaf is not array-like (`check_batch`).
      ValueError: Naming the field, if a leaf's number of frames differs from the first leaf's, its time axis is
        unknown (inside a graph, for every leaf), or its dtype, batch size or inner shape is not the spec's.
    """
    raw = specs.flatten_like(items, data_spec)
    axis = len(outer_dims)
    frames, first = None, None
    for (path, _), value in zip(fields, raw):
        dims = _dims(value)
        if dims is None or len(dims) <= axis or dims[axis] is None:
            continue
        if frames is None:
            frames, first = dims[axis], path
        elif dims[axis] != frames:
            received = dims[axis]
            raise ValueError(
                BLOCK_LENGTH.format(path=path, expected=frames, first=first, received=received, shape=_shape(dims))
            )
    if frames is None:
        if raw:  # no leaf's time axis known (unknown ranks or lengths, or too few dimensions): named at the first
            raise ValueError(NO_TIME_AXIS.format(path=fields[0].path, shape=_shape(_dims(raw[0]))))
        frames = 0
    leaves, deferred = specs.check_batch(items, data_spec, fields, (*outer_dims, frames))
    return leaves, deferred, frames


class BlockCheck:
    """A buffer's `check_block`, and the compiled fast path of the last block's length: all numpy, accepted at once."""

    def __init__(self, data_spec: Any, fields: Sequence[specs.Field], outer_dims: tuple[int, ...]) -> None:
        self._data_spec, self._fields, self._outer_dims = data_spec, fields, outer_dims
        self._frames = 0
        self._fast_path: specs.NumpyFastPath | None = None

    def __call__(self, items: Any) -> tuple[list[Any], list[specs.DeferredShapeCheck], int]:
        """`(leaves, deferred, frames)` of a block, checked (see `check_block`, which raises as it says)."""
        if self._fast_path is not None:
            leaves = self._fast_path.leaves(items)
            if leaves is not None:
                return leaves, [], self._frames
        leaves, deferred, frames = check_block(items, self._data_spec, self._fields, self._outer_dims)
        if frames != self._frames or self._fast_path is None:
            self._fast_path = specs.NumpyFastPath(self._data_spec, self._fields, (*self._outer_dims, frames))
            self._frames = frames
        return leaves, deferred, frames


def pieces(added: int, frames: int, max_length: int, most: int) -> Iterator[tuple[int, int]]:
    """`(start, count)` runs of a block of `frames` adds from `added`: none wraps the ring, none over `most` adds."""
    start = 0
    while start < frames:
        position = (added + start) % max_length
        count = min(frames - start, max_length - position, most)
        yield start, count
        start += count


def time_major(leaf: np.ndarray, start: int, count: int) -> np.ndarray:
    """Frames `[start, start + count)` of a `[batch_size, T, ...]` leaf time-major, `[count, batch_size, ...]`: a view.

    As the rows hold them (they interleave the segments, `tfbuffers._ring`): `Storage.write_frames` takes it.
    """
    return np.swapaxes(leaf[:, start : start + count], 0, 1)


def write_runs(
    table: Any,
    sampler: Any,
    arrays: Sequence[np.ndarray],
    max_length: int,
    step_types: np.ndarray | None,
    stored: Callable[[int, int], None],
) -> int:
    """A py buffer's block, under its lock: each run of adds written as one block of rows, then committed.

    Returns the counter before the block. A run does not wrap the ring, and takes at most the storage's
    `block_rows()` rows (memory-mapped files: their journal's). The sampler is told of each run's adds as of
    single adds (`Sampler.on_add_block`).

    Args:
      table: The buffer's `tfbuffers.storage.Storage`.
      sampler: Its `tfbuffers.sampling.Sampler`.
      arrays: The block's checked leaves, `[batch_size, T, ...]`.
      max_length: The ring's length.
      step_types: The step-type leaf, `[batch_size, T]`, with episode boundaries, else None.
      stored: Called with `(first, count)` after each run's commit.
    """
    added = table.added
    size = len(arrays[0]) if arrays else 1
    frames = arrays[0].shape[1] if arrays else 0
    most = max(1, table.block_rows() // size)
    for start, count in pieces(added, frames, max_length, most):
        first = added + start
        first_row = _ring.block_start(first, max_length, size)
        if sampler.watches_adds:
            sampler.before_add(first, None if step_types is None else step_types[:, start])
        table.write_frames(first_row, [time_major(array, start, count) for array in arrays])
        if sampler.watches_adds:
            run_types = None if step_types is None else step_types[:, start : start + count]
            sampler.on_add_block(first, count, first_row, run_types)
        table.added = first + count  # last: the run's commit (tfbuffers.storage.memmap)
        stored(first, count)
    return added


def frame(leaves: Sequence[Any], t: int) -> list[Any]:
    """Frame `t` of every segment of a block's leaves: `add_batch`'s leaves."""
    return [leaf[:, t] for leaf in leaves]
