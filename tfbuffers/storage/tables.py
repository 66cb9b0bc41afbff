"""`NumpyTable`: the py buffers' default storage, each field's rows a numpy array in RAM."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tfbuffers.specs import Field
from tfbuffers.storage.base import Storage


def frames_view(array: np.ndarray, first_row: int, leaf: np.ndarray) -> np.ndarray:
    """The rows a run of adds' frames `leaf` (`[adds, batch_size, *shape]`) go to from `first_row`, in its shape."""
    return array[first_row : first_row + leaf.shape[0] * leaf.shape[1]].reshape(leaf.shape)


class NumpyTable(Storage):
    """The default storage: each field's rows in a `[num_rows, *shape]` numpy array in RAM."""

    def __init__(self, fields: Sequence[Field], num_rows: int) -> None:
        """Allocates zero-filled arrays (pages are only touched when written)."""
        super().__init__(fields, num_rows)
        self.arrays = [self._allocate(index, field) for index, field in enumerate(fields)]

    def _allocate(self, index: int, field: Field) -> np.ndarray:
        return np.zeros((self.num_rows, *field.spec.shape.as_list()), field.spec.dtype.as_numpy_dtype)

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

    def write_frames(self, first_row: int, leaves: Sequence[np.ndarray]) -> None:
        """A run of adds' `[adds, batch_size, *shape]` frames, each assigned in place: one strided copy per field."""
        if type(self).write_rows is not NumpyTable.write_rows or type(self).write_block is not Storage.write_block:
            super().write_frames(first_row, leaves)  # a subclass that writes its own way is given rows
            return
        for array, leaf in zip(self.arrays, leaves):
            frames_view(array, first_row, leaf)[...] = leaf

    def close(self) -> None:
        """Drops the storage."""
        self.arrays = []
        self.extras.clear()

    def nbytes(self) -> int:
        """Bytes of storage allocated (pages never written take no memory)."""
        return sum(array.nbytes for array in self.arrays)
