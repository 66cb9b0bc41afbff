"""`FrameStackTable`: frame stacks over any storage, each distinct frame kept once, and its option."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tfbuffers.specs import Field
from tfbuffers.storage.base import Recovery, Storage
from tfbuffers.storage.frames import FrameBuffer
from tfbuffers.storage.tables import NumpyTable

FRAME_STACKS = (
    "frame_stacks: expected None, a field's nest path, a list of paths or a dict of path to stacking axis, "
    "paths among {paths}; got {received}"
)
FRAME_STACK_AXIS = "frame_stacks: field {path}: expected an axis of its shape {shape}, got {axis!r}"
RESTORE_CHUNK = 4096  # rows a restore or a load writes at a time (adds write theirs whole)


class FrameStackTable(Storage):
    """Frame stacks over any storage: stacked fields kept as handles into `FrameBuffer`s, one per field.

    A stack of `depth` frames along `axis` (Atari's `[84, 84, 4]` along -1) is stored as `depth` int64
    handles, in a field `int64[depth]` of the inner storage (`inner`: numpy arrays in RAM by default, or any
    `Storage`, memory-mapped files for one); each distinct frame is stored once, however many stacks (of any
    rows and segments) hold it, and freed when the last row holding it is overwritten. Rows never written
    hold handle 0, the all-zero frame, as a plain table's zero-filled rows do. Reads gather the frames and
    rebuild the stacks: exactly the arrays a plain table returns. Every other field, the counter and the
    extras are the inner storage's, as are `attach`, `ready`, `changing`, `flush` and `close`.

    The frames live where the inner storage keeps a pool (`Storage.pool`: a sparse file beside the rows of
    memory-mapped files, which outlives the process with them), or in RAM, grown as needed. A frame is only
    written into a slot no row holds, and an add's old frames are released after its rows are written, so a
    storage that undoes an add cut short (`tfbuffers.storage.memmap`) undoes it to rows whose frames are
    all still there; the counts are rebuilt from the rows when the inner storage is attached.
    """

    def __init__(
        self, fields: Sequence[Field], num_rows: int, stacks: Mapping[int, int], inner: Storage | None = None
    ) -> None:
        """`stacks` maps field indices to their stacking axis (`0 <= axis < rank`); `inner` holds the rows.

        `inner` must be made for `handle_fields(fields, stacks)`; a `NumpyTable` of them by default.
        """
        # Not Storage.__init__: the counter and the extras are the inner storage's.
        self.fields = tuple(fields)
        self.num_rows = num_rows
        self.stacks = dict(stacks)
        self.inner = NumpyTable(handle_fields(fields, stacks), num_rows) if inner is None else inner
        self.extras = self.inner.extras
        self.pools: dict[int, FrameBuffer] = {}
        self._chunk = num_rows  # rows written at a time (`attach`), which bounds the frames held at once
        self._previous: dict[int, np.ndarray] = {}  # the handles of the last rows written, per field
        self._batch_size = 1  # rows per add (`attach`)

    @property
    def added(self) -> int:
        """The inner storage's counter."""
        return self.inner.added

    @added.setter
    def added(self, value: int) -> None:
        self.inner.added = value

    @property
    def directory(self) -> Any:
        """The inner storage's directory (memory-mapped files), or None."""
        return getattr(self.inner, "directory", None)

    def extra(self, name: str, initial: np.ndarray) -> np.ndarray:
        """The inner storage's extra."""
        return self.inner.extra(name, initial)

    def extras_nbytes(self) -> int:
        """The inner storage's extras' bytes."""
        return self.inner.extras_nbytes()

    def attach(self, batch_size: int, max_length: int) -> None:
        """The inner storage attached, then each stacked field's pool made and its counts taken from the rows."""
        self.inner.attach(batch_size, max_length)
        self._batch_size = batch_size
        # A restore's or a load's rows are written a chunk at a time: an add's at least, a few thousand rows at once.
        self._chunk = max(batch_size, min(self.num_rows, RESTORE_CHUNK))
        for index, axis in self.stacks.items():
            spec = self.fields[index].spec
            shape = spec.shape.as_list()
            depth = shape[axis]
            frame_shape = [*shape[:axis], *shape[axis + 1 :]]
            # Held at once: every row's frames, and one chunk's new frames before its old ones are released.
            slots = (self.num_rows + self._chunk) * depth
            frames = self.inner.pool(
                f"frames/{self.fields[index].path}", [slots, *frame_shape], spec.dtype.as_numpy_dtype
            )
            pool = FrameBuffer(capacity_hint=self.num_rows + self.num_rows // 64 + 4 * depth, frames=frames)
            pool.recount(
                self.inner.read_rows(index, 0, self.num_rows), np.zeros(frame_shape, spec.dtype.as_numpy_dtype)
            )
            self.pools[index] = pool

    def block_rows(self) -> int:
        """The inner storage's, at most a restore's chunk (the pools hold one chunk's new frames beside the rows')."""
        return min(self.inner.block_rows(), self._chunk)

    def ready(self, buffer_name: str, data_spec: Any, options: Callable[[], Mapping[str, Any]]) -> Recovery:
        """The inner storage's."""
        return self.inner.ready(buffer_name, data_spec, options)

    def handles(self, index: int) -> np.ndarray:
        """A copy of every row's handles of stacked field `index`: `[num_rows, depth]`."""
        return self.inner.read_rows(index, 0, self.num_rows)

    def _stacks_of(self, index: int, handles: np.ndarray) -> np.ndarray:
        spec, pool = self.fields[index].spec, self.pools[index]  # handles: [*rows, depth]
        stacks = np.empty(handles.shape[:-1] + tuple(spec.shape.as_list()), spec.dtype.as_numpy_dtype)
        # One gather per stacked position, each written to its place along the axis: for the last axis, a
        # strided copy of contiguous frames, 3-4x faster in numpy than gathering all and transposing.
        by_position = np.moveaxis(stacks, handles.ndim - 1 + self.stacks[index], -1)
        for position in range(handles.shape[-1]):
            by_position[..., position] = pool.gather(handles[..., position])
        return stacks

    def read(self, rows: np.ndarray, fields: Sequence[int] | None = None) -> list[np.ndarray]:
        """The inner storage's rows, stacks rebuilt from their frames."""
        chosen = range(len(self.fields)) if fields is None else fields
        leaves = self.inner.read(rows, list(chosen))
        return [self._stacks_of(i, leaf) if i in self.stacks else leaf for i, leaf in zip(chosen, leaves)]

    def column(self, index: int) -> np.ndarray:
        """The rows of a field that is not frame stacks, as the inner storage gives them (the step types)."""
        assert index not in self.stacks, "the step types are never frame stacks"
        return self.inner.column(index)

    def read_rows(self, index: int, first_row: int, stop_row: int) -> np.ndarray:
        """A copy of rows `[first_row, stop_row)` of field `index`, stacks rebuilt from their frames."""
        rows = self.inner.read_rows(index, first_row, stop_row)
        return self._stacks_of(index, rows) if index in self.stacks else rows

    def _handles_of(self, index: int, rows: np.ndarray) -> np.ndarray:
        """Handles of `rows`' stacks (`[n, depth]`), each frame added once more to the pool."""
        pool = self.pools[index]
        frames = np.moveaxis(np.asarray(rows), self.stacks[index] + 1, 1)  # [n, depth, *frame]
        count, depth = frames.shape[:2]
        previous = self._previous.get(index)
        new = np.empty([count, depth], np.int64)
        shifted = np.zeros(count, bool)
        if previous is not None and len(previous) == count and depth > 1:
            # An add's stacks are usually the previous add's shifted by one frame: where the bytes say so, the
            # older frames keep their handles and only the newest frame is looked up. Only handles still
            # held (a restore may have freed them since), and only equal bytes.
            shifted = pool.held(previous[:, 1:]).all(axis=1)
            shifted &= (pool.gather(previous[:, 1:]) == frames[:, :-1]).reshape(count, -1).all(axis=1)
            new[shifted, :-1] = previous[shifted, 1:]
            pool.reference(new[shifted, :-1].ravel())
        new[shifted, -1] = pool.add_frames(frames[shifted, -1])
        new[~shifted] = pool.add_frames(frames[~shifted].reshape(-1, *frames.shape[2:])).reshape(-1, depth)
        self._previous[index] = new
        return new

    def write_block(self, first_row: int, leaves: Sequence[np.ndarray]) -> None:
        """One add: the stacks' frames added, the handles written as the inner storage writes a block.

        The old rows' frames are released after (frames the old and new rows share are never freed in between).
        """
        count = len(leaves[0]) if leaves else 0
        handles = list(leaves)
        old = {}
        size = self._batch_size
        for index in self.stacks:
            # A run of adds (`extend`): add by add, each against the one before, as single adds are.
            adds = [leaves[index][row : row + size] for row in range(0, count, size)]
            handles[index] = np.concatenate([self._handles_of(index, rows) for rows in adds]) if adds else leaves[index]
            old[index] = self.inner.read_rows(index, first_row, first_row + count)
        self.inner.write_block(first_row, handles)
        for index, released in old.items():
            self.pools[index].release(released.ravel())

    def write_rows(self, index: int, first_row: int, rows: np.ndarray) -> None:
        """Writes `rows` of field `index` (a restore's, a load's), stacks as handles, `RESTORE_CHUNK` rows at a time."""
        if index not in self.stacks:
            self.inner.write_rows(index, first_row, rows)
            return
        for start in range(0, len(rows), self._chunk):
            part = rows[start : start + self._chunk]
            row = first_row + start
            handles = self._handles_of(index, part)
            released = self.inner.read_rows(index, row, row + len(part))
            self.inner.write_rows(index, row, handles)
            self.pools[index].release(released.ravel())

    def changing(self, what: str) -> contextlib.AbstractContextManager[None]:
        """The inner storage's."""
        return self.inner.changing(what)

    def flush(self) -> None:
        """The inner storage's (its pools' files with its rows)."""
        self.inner.flush()

    def close(self) -> None:
        """Closes the inner storage and drops the pools."""
        self.inner.close()
        self.pools.clear()
        self._previous.clear()

    def nbytes(self) -> int:
        """The inner storage's (the handles among its rows), and the frames the pools hold."""
        return self.inner.nbytes() + sum(pool.nbytes for pool in self.pools.values())


def handle_fields(fields: Sequence[Field], stacks: Mapping[int, int]) -> list[Field]:
    """The inner storage's fields: each stacked field an `int64[depth]` of handles, the others as they are."""
    return [
        Field(field.path, tf.TensorSpec([field.spec.shape[stacks[index]]], tf.int64)) if index in stacks else field
        for index, field in enumerate(fields)
    ]


def frame_stack_axes(fields: Sequence[Field], option: Any) -> dict[int, int]:
    """Field index -> non-negative stacking axis of the `frame_stacks` option; raises naming what is wrong."""
    paths = [field.path for field in fields]
    if option is None:
        return {}
    if isinstance(option, str):
        option = {option: -1}
    elif isinstance(option, Sequence) and option and all(isinstance(path, str) for path in option):
        option = {path: -1 for path in option}
    elif not isinstance(option, Mapping) or not option:
        raise TypeError(FRAME_STACKS.format(paths=paths, received=f"{type(option).__name__} {option!r}"))
    axes = {}
    for path, axis in option.items():
        if path not in paths:
            raise ValueError(FRAME_STACKS.format(paths=paths, received=f"path {path!r}"))
        shape = fields[paths.index(path)].spec.shape
        if isinstance(axis, bool) or not isinstance(axis, int) or not -shape.rank <= axis < shape.rank:
            raise ValueError(FRAME_STACK_AXIS.format(path=path, shape=shape, axis=axis))
        axes[paths.index(path)] = axis % shape.rank
    return axes
