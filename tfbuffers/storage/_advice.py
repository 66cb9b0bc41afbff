"""`Advice`: how the memory-mapped storage (`tfbuffers.storage.memmap`) tells the kernel its fields are read."""

from __future__ import annotations

import mmap
import time

import numpy as np


class Advice:
    """The kernel told how a field's mapping is read: at random, and which rows' pages are wanted next.

    A fault on a mapped page that is not in the page cache reads the pages around it too (the device's
    `read_ahead_kb`: 8 MiB on the project's machine), which a draw of random rows from files larger than the
    cache pays on every frame: 15 MB/s of Atari frames where the disk gives 1.4 GB/s in sequence
    (docs/benchmarks.md, "Beyond the page cache"). So each field's mapping is advised `MADV_RANDOM` (a fault reads
    its own page), and a gather whose rows span a page or more first asks for every row's pages
    (`MADV_WILLNEED`, one call per run of consecutive rows): the disk reads them all at once, and the copy then
    finds them or waits for reads already under way. A sequential read of rows (`read_rows`) asks for its run.

    Asking costs a call per run even where the pages are in the cache (Atari batches of 32 windows: 190 to 350
    µs a `get_next`), so a gather asks only while the files are read from the disk: a gather that copied less
    than `COLD_BYTES_PER_SECOND` (memory copies run at several GB/s, reads at random from the disk at tens to
    hundreds of MB/s) makes the next `COLD_GATHERS` ask first; then one gather is timed without asking again.
    Only speed depends on it: what a gather returns is the same.
    """

    COLD_BYTES_PER_SECOND = 1e9
    COLD_GATHERS = 64
    PROBE_BYTES = 1 << 16  # a gather of fewer bytes is not timed (too short to tell)

    def __init__(self, mapped: mmap.mmap, first: int, row_bytes: int) -> None:
        self.mapped, self.first, self.row_bytes = mapped, first, row_bytes
        self.asking = 0  # gathers left that ask first

    def gather(self, array: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """`np.take(array, rows, axis=0)`, asking for the rows' pages first while the files are cold."""
        if self.asking:
            self.asking -= 1
            self.will_need(rows)
            return np.take(array, rows, axis=0)
        started = time.perf_counter()
        gathered = np.take(array, rows, axis=0)
        size = gathered.nbytes
        if size >= self.PROBE_BYTES and size < self.COLD_BYTES_PER_SECOND * (time.perf_counter() - started):
            self.asking = self.COLD_GATHERS
        return gathered

    @classmethod
    def of(cls, memmap: np.memmap, array: np.ndarray) -> Advice | None:
        """The advice of `memmap`'s mapping (`array` its rows), or None where this platform or numpy takes none."""
        mapped = getattr(memmap, "_mmap", None)  # numpy's mapping of the file, from its allocation granule
        if not isinstance(mapped, mmap.mmap) or not hasattr(mmap, "MADV_WILLNEED") or not array.size:
            return None
        first = memmap.offset % mmap.ALLOCATIONGRANULARITY  # where the rows start in the mapping
        advice = cls(mapped, first, array.strides[0])
        mapped.madvise(mmap.MADV_RANDOM)
        return advice

    def will_need(self, rows: np.ndarray) -> None:
        """`MADV_WILLNEED` for the pages of `rows` (any shape), one call per run of consecutive rows."""
        flat = np.unique(rows)
        if not flat.size:
            return
        breaks = np.flatnonzero(np.diff(flat) != 1) + 1
        for start, stop in zip(flat[np.r_[0, breaks]].tolist(), (flat[np.r_[breaks - 1, -1]] + 1).tolist()):
            self.will_need_run(start, stop)

    def will_need_run(self, first_row: int, stop_row: int) -> None:
        """`MADV_WILLNEED` for the pages of rows `[first_row, stop_row)`."""
        begin = self.first + first_row * self.row_bytes
        aligned = begin - begin % mmap.PAGESIZE
        length = self.first + stop_row * self.row_bytes - aligned
        if length > 0:
            self.mapped.madvise(mmap.MADV_WILLNEED, aligned, length)


class AdvisedReads:
    """The memory-mapped storage's reads of its fields, each field's mapping advised (`Advice`)."""

    arrays: list[np.ndarray]
    _maps: dict[str, np.memmap]
    _advice: list[Advice | None]

    def _advised(self, name: str, array: np.ndarray) -> np.ndarray:
        """`array`, the field mapped as `name`, with its mapping's advice kept (in the fields' order)."""
        self.__dict__.setdefault("_advice", []).append(Advice.of(self._maps[name], array))
        return array

    def _gather(self, index: int, rows: np.ndarray) -> np.ndarray:
        """As `NumpyTable`'s, the rows' pages asked of the disk at once first while it reads them (`Advice`)."""
        advice = self._advice[index]
        if advice is None or advice.row_bytes < mmap.PAGESIZE:
            return np.take(self.arrays[index], rows, axis=0)
        return advice.gather(self.arrays[index], rows)

    def read_rows(self, index: int, first_row: int, stop_row: int) -> np.ndarray:
        """As `NumpyTable`'s, the run's pages asked of the disk in one call first (the fields are read at random)."""
        advice = self._advice[index]
        if advice is not None:
            advice.will_need_run(first_row, stop_row)
        return super().read_rows(index, first_row, stop_row)  # type: ignore[misc]
