"""A py buffer's states: its arrays copied under its lock, streamed out and in piecewise, and replaced at once.

What `tfbuffers._segmented_states` asks of the py buffers, apart from their adds and samples. Every call
holds the buffer's lock for as long as it reads or writes; a row source's reads tell whether a writer
overwrote the rows since (an add reaching the oldest of them, or a clear or restore: the generation).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from tfbuffers import _ring
from tfbuffers import state as state_lib
from tfbuffers.storage import Storage


class HostStates:
    """The states of a py buffer's storage: snapshots, row sources and sinks, restores."""

    def __init__(
        self,
        storage: Storage,
        lock: threading.Lock,
        max_length: int,
        extras: Callable[[], dict[str, np.ndarray]],
        check_open: Callable[[], None],
    ) -> None:
        """The states of `storage`, guarded by the buffer's `lock`.

        Args:
          storage: The buffer's storage.
          lock: The buffer's lock.
          max_length: Frames per segment.
          extras: Copies of the state's extras (a prioritized buffer's priorities), called under the lock.
          check_open: Raises if the buffer was closed.
        """
        self._storage = storage
        self._lock = lock
        self._max_length = max_length
        self._extras = extras
        self._check_open = check_open
        self._generation = 0  # moved by clears and restores: what a row source cannot tell from the counter

    def snapshot(self) -> tuple[int, list[np.ndarray], dict[str, np.ndarray]]:
        """The add counter, copies of every field's rows, and the extras, of one moment."""
        with self._lock:
            return self._storage.added, self._storage.copies(), self._extras()

    def row_source(self) -> state_lib.Rows:
        """The counter and extras now, the rows read piecewise (see `SegmentedStates.row_source`)."""
        # Each read copies a chunk of rows under the lock. The rows read are the snapshot's while no add
        # overwrote the oldest of them (adds up to `oldest + max_length` write elsewhere) and no clear or
        # restore ran.
        with self._lock:
            self._check_open()
            added, extras, generation = self._storage.added, self._extras(), self._generation
        oldest = int(_ring.oldest_add(_ring.NUMPY, added, self._max_length))
        return state_lib.Rows(added, extras, self._read_rows, functools.partial(self._rows_intact, generation, oldest))

    def _read_rows(self, field: int, first_row: int, stop_row: int) -> np.ndarray:
        with self._lock:
            self._check_open()
            return self._storage.read_rows(field, first_row, stop_row)

    def _rows_intact(self, generation: int, oldest: int) -> bool:
        with self._lock:
            return self._generation == generation and self._storage.added <= oldest + self._max_length

    def write_rows(self, field: int, first_row: int, rows: np.ndarray) -> None:
        """Writes storage rows of `field` from `first_row` (a loader's, before its commit)."""
        with self._lock:
            self._storage.write_rows(field, first_row, rows)

    def replaced_locked(self, added: int, arrays: list[Any]) -> None:
        """Under the lock: the rows (unless `arrays` is empty: a loader wrote them) and the counter replaced."""
        if arrays:
            self._storage.replace(arrays)
        self._storage.added = added
        self._generation += 1

    def cleared_locked(self) -> None:
        """Under the lock: no frame is stored."""
        self._storage.added = 0
        self._generation += 1
