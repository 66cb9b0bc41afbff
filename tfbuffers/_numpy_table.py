"""Row storage in numpy arrays, with the add counter; stacked frames optionally stored once each."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from tfbuffers.frames import FrameBuffer
from tfbuffers.specs import Field


class NumpyTable:
    """`num_rows` rows of every field in `[num_rows, *shape]` arrays, plus an add counter.

    The owning buffer holds its lock around every use.
    """

    def __init__(self, fields: Sequence[Field], num_rows: int) -> None:
        """Allocates zero-filled arrays (pages are only touched when written)."""
        self.num_rows = num_rows
        self.arrays = [self._allocate(index, field) for index, field in enumerate(fields)]
        self.added = 0

    def _allocate(self, index: int, field: Field) -> np.ndarray:
        return np.zeros((self.num_rows, *field.spec.shape.as_list()), field.spec.dtype.as_numpy_dtype)

    def write_block(self, first_row: int, leaves: Sequence[np.ndarray]) -> None:
        """Writes each leaf's rows contiguously from `first_row`: one copy per field."""
        for index, leaf in enumerate(leaves):
            self.write_rows(index, first_row, leaf)

    def read(self, rows: np.ndarray, fields: Sequence[int] | None = None) -> list[np.ndarray]:
        """Gathers `rows` (any shape) from every field (or those numbered in `fields`): one gather per field."""
        chosen = range(len(self.arrays)) if fields is None else fields
        return [self._gather(index, rows) for index in chosen]

    def _gather(self, index: int, rows: np.ndarray) -> np.ndarray:
        return np.take(self.arrays[index], rows, axis=0)

    def column(self, index: int) -> np.ndarray:
        """The stored array of field `index` itself (not a copy; a field that is not frame stacks)."""
        return self.arrays[index]

    def read_rows(self, index: int, first_row: int, stop_row: int) -> np.ndarray:
        """A copy of rows `[first_row, stop_row)` of field `index`."""
        return self.arrays[index][first_row:stop_row].copy()

    def write_rows(self, index: int, first_row: int, rows: np.ndarray) -> None:
        """Writes `rows` of field `index` from `first_row`."""
        self.arrays[index][first_row : first_row + len(rows)] = rows

    def copies(self) -> list[np.ndarray]:
        """Every field's `[num_rows, *shape]` array, copied."""
        return [self.read_rows(index, 0, self.num_rows) for index in range(len(self.arrays))]

    def replace(self, arrays: Sequence[np.ndarray]) -> None:
        """Replaces every field's rows by `arrays` (checked shapes and dtypes)."""
        for index, array in enumerate(arrays):
            self.write_rows(index, 0, array)

    def close(self) -> None:
        """Drops the storage."""
        self.arrays = []

    def nbytes(self) -> int:
        """Bytes of storage allocated (pages never written take no memory)."""
        return sum(array.nbytes for array in self.arrays)


class FrameStackTable(NumpyTable):
    """A `NumpyTable` whose fields of stacked frames hold handles into a `FrameBuffer`, one per field.

    A stack of `depth` frames along `axis` (Atari's `[84, 84, 4]` along -1) is
    stored as `depth` handles; each distinct frame is stored once, however many
    stacks (of any rows and segments) hold it, and freed when the last row holding it
    is overwritten. Rows never written hold the all-zero frame, as a plain table's
    zero-filled rows do. Reads gather the frames and rebuild the stacks: exactly the
    arrays a plain table returns.
    """

    def __init__(self, fields: Sequence[Field], num_rows: int, stacks: Mapping[int, int]) -> None:
        """`stacks` maps field indices to their stacking axis (`0 <= axis < rank`)."""
        self.stacks = dict(stacks)
        self.pools: dict[int, FrameBuffer] = {}
        self.handles: dict[int, np.ndarray] = {}
        self._previous: dict[int, np.ndarray] = {}  # the handles of the last rows written, per field
        super().__init__(fields, num_rows)

    def _allocate(self, index: int, field: Field) -> np.ndarray:
        if index not in self.stacks:
            return super()._allocate(index, field)
        shape = field.spec.shape.as_list()
        axis = self.stacks[index]
        depth = shape[axis]
        pool = FrameBuffer(capacity_hint=self.num_rows + self.num_rows // 64 + 4 * depth)  # slack: untouched
        zero = pool.add_frames(np.zeros([1, *shape[:axis], *shape[axis + 1 :]], field.spec.dtype.as_numpy_dtype))
        pool.reference(np.repeat(zero, self.num_rows * depth - 1))  # every row's every frame, unwritten
        self.pools[index] = pool
        self.handles[index] = np.full([self.num_rows, depth], zero[0], np.int64)
        return np.zeros([0, *shape], field.spec.dtype.as_numpy_dtype)  # never read: the rows are the handles

    def _gather(self, index: int, rows: np.ndarray) -> np.ndarray:
        if index not in self.stacks:
            return super()._gather(index, rows)
        handles, pool = self.handles[index][rows], self.pools[index]  # handles: [*rows, depth]
        stacks = np.empty(rows.shape + self.arrays[index].shape[1:], self.arrays[index].dtype)
        # One gather per stacked position, each written to its place along the axis: for the last axis, a
        # strided copy of contiguous frames, 3-4x faster in numpy than gathering all and transposing.
        by_position = np.moveaxis(stacks, rows.ndim + self.stacks[index], -1)
        for position in range(handles.shape[-1]):
            by_position[..., position] = pool.gather(handles[..., position])
        return stacks

    def column(self, index: int) -> np.ndarray:
        assert index not in self.stacks, "the step types are never frame stacks"
        return super().column(index)

    def read_rows(self, index: int, first_row: int, stop_row: int) -> np.ndarray:
        if index not in self.stacks:
            return super().read_rows(index, first_row, stop_row)
        return self._gather(index, np.arange(first_row, stop_row))

    def write_rows(self, index: int, first_row: int, rows: np.ndarray) -> None:
        if index not in self.stacks:
            super().write_rows(index, first_row, rows)
            return
        pool, handles = self.pools[index], self.handles[index]
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
        old = handles[first_row : first_row + count].ravel().copy()
        handles[first_row : first_row + count] = new
        pool.release(old)  # after the adds: frames the old and new rows share are never freed in between

    def close(self) -> None:
        super().close()
        self.pools.clear()
        self.handles.clear()

    def nbytes(self) -> int:
        return (
            super().nbytes()
            + sum(pool.nbytes for pool in self.pools.values())
            + sum(handles.nbytes for handles in self.handles.values())
        )
