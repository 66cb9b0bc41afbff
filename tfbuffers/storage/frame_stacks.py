"""`FrameStackTable`: a numpy storage that keeps each distinct frame of a frame stack once, and its option."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tfbuffers.specs import Field
from tfbuffers.storage.frames import FrameBuffer
from tfbuffers.storage.tables import NumpyTable

FRAME_STACKS = (
    "frame_stacks: expected None, a field's nest path, a list of paths or a dict of path to stacking axis, "
    "paths among {paths}; got {received}"
)
FRAME_STACK_AXIS = "frame_stacks: field {path}: expected an axis of its shape {shape}, got {axis!r}"


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
        """The rows of a field that is not frame stacks, in place (the step types never are)."""
        assert index not in self.stacks, "the step types are never frame stacks"
        return super().column(index)

    def read_rows(self, index: int, first_row: int, stop_row: int) -> np.ndarray:
        """A copy of rows `[first_row, stop_row)` of field `index`, stacks rebuilt from their frames."""
        if index not in self.stacks:
            return super().read_rows(index, first_row, stop_row)
        return self._gather(index, np.arange(first_row, stop_row))

    def write_rows(self, index: int, first_row: int, rows: np.ndarray) -> None:
        """Writes `rows` of field `index`; a stack's frames are stored once each, and the old rows' released."""
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
        """Drops the arrays and the pools."""
        super().close()
        self.pools.clear()
        self.handles.clear()

    def nbytes(self) -> int:
        """The arrays', the pools' and the handles' bytes."""
        return (
            super().nbytes()
            + sum(pool.nbytes for pool in self.pools.values())
            + sum(handles.nbytes for handles in self.handles.values())
        )


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
