"""Row storage in numpy arrays, with the add counter."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tfbuffers.specs import Field


class NumpyTable:
    """`num_rows` rows of every field in `[num_rows, *shape]` arrays, plus an add counter.

    The owning buffer holds its lock around every use.
    """

    def __init__(self, fields: Sequence[Field], num_rows: int) -> None:
        """Allocates zero-filled arrays (pages are only touched when written)."""
        self.arrays = [
            np.zeros((num_rows, *field.spec.shape.as_list()), field.spec.dtype.as_numpy_dtype) for field in fields
        ]
        self.added = 0

    def write_block(self, first_row: int, leaves: Sequence[np.ndarray]) -> None:
        """Writes each leaf's rows contiguously from `first_row`: one copy per field."""
        for array, leaf in zip(self.arrays, leaves):
            array[first_row : first_row + len(leaf)] = leaf

    def read(self, rows: np.ndarray, fields: Sequence[int] | None = None) -> list[np.ndarray]:
        """Gathers `rows` (any shape) from every field (or those numbered in `fields`): one gather per field."""
        arrays = self.arrays if fields is None else [self.arrays[i] for i in fields]
        return [np.take(array, rows, axis=0) for array in arrays]
