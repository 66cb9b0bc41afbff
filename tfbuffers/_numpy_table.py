"""Row storage in numpy arrays, checkpointable with `tf.train.Checkpoint`."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tfbuffers.specs import Field

CHECKPOINT_SHAPE_MISMATCH = "{path}: the checkpoint holds shape {received}, this buffer stores shape {expected}"
ADDED_KEY = "added"


class NumpyTable(tf.__internal__.tracking.Trackable):
    """`num_rows` rows of every field in `[num_rows, *shape]` arrays, plus an add counter.

    `tf.train.Checkpoint` saves the arrays and the counter through
    `_serialize_to_tensors`, and restores them in place. Both hold `lock`, the
    owning buffer's, so a save taken while other threads add is one consistent
    snapshot (a copy of the arrays) and a restore is never seen half done.
    """

    def __init__(self, fields: Sequence[Field], num_rows: int, lock: threading.Lock) -> None:
        """Allocates zero-filled arrays (pages are only touched when written)."""
        self._fields = list(fields)
        self._lock = lock
        self.arrays = [
            np.zeros((num_rows, *field.spec.shape.as_list()), field.spec.dtype.as_numpy_dtype) for field in fields
        ]
        self.added = 0

    def write_block(self, first_row: int, leaves: Sequence[np.ndarray]) -> None:
        """Writes each leaf's rows contiguously from `first_row`: one copy per field."""
        for array, leaf in zip(self.arrays, leaves):
            array[first_row : first_row + len(leaf)] = leaf

    def read(self, rows: np.ndarray) -> list[np.ndarray]:
        """Gathers `rows` (any shape) from every field: one gather per field."""
        return [np.take(array, rows, axis=0) for array in self.arrays]

    def _key(self, index: int) -> str:
        return f"field_{index}"

    def _serialize_to_tensors(self) -> dict[str, tf.Tensor]:
        with self._lock:  # copies: a tensor made from an array may share its memory
            tensors = {self._key(i): tf.constant(array.copy()) for i, array in enumerate(self.arrays)}
            tensors[ADDED_KEY] = tf.constant(self.added, tf.int64)
        return tensors

    def _restore_from_tensors(self, restored_tensors: dict[str, Any]) -> None:
        restored = [np.asarray(restored_tensors[self._key(i)]) for i in range(len(self.arrays))]
        for field, array, value in zip(self._fields, self.arrays, restored):
            if value.shape != array.shape or value.dtype != array.dtype:
                raise ValueError(
                    CHECKPOINT_SHAPE_MISMATCH.format(
                        path=field.path,
                        received=f"{value.shape} {value.dtype}",
                        expected=f"{array.shape} {array.dtype}",
                    )
                )
        with self._lock:
            for array, value in zip(self.arrays, restored):
                np.copyto(array, value)
            self.added = int(np.asarray(restored_tensors[ADDED_KEY]))
