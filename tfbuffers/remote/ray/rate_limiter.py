"""`RateLimiter`: Reverb's `SampleToInsertRatio` and `MinSize` semantics for the Ray-hosted buffer's actor."""

from __future__ import annotations

import numpy as np


class RateLimiter:
    """Reverb's `MinSize` and `SampleToInsertRatio` rate limiters, over frames inserted and windows sampled.

    A sample of `n` may proceed once the buffer holds `min_size_to_sample` frames and
    `inserts * samples_per_insert - samples - n >= min_diff`; an insert of `n` frames once the buffer
    holds no more than `min_size_to_sample` frames after it, or `(inserts + n) * samples_per_insert -
    samples <= max_diff`, where `min_diff` and `max_diff` are `min_size_to_sample * samples_per_insert`
    less and plus `error_buffer` (no bounds without `samples_per_insert`). Cleared with the buffer.
    """

    def __init__(
        self,
        min_size: int,
        samples_per_insert: float | None,
        error_buffer: float | None,
        counts: np.ndarray | None = None,
    ) -> None:
        """A limiter counting from `counts`.

        `counts`: where `inserts` and `samples` live, an int64 array of 2 (a memory-mapped file survives the
        process: `RayHost` keeps one beside a buffer's `directory`); a new zeroed array by default.
        """
        self._counts = np.zeros(2, np.int64) if counts is None else counts
        self.min_size = min_size
        self.samples_per_insert = samples_per_insert
        self.error_buffer = error_buffer
        if samples_per_insert is None or error_buffer is None:
            self.min_diff, self.max_diff = -np.inf, np.inf
        else:
            self.min_diff = min_size * samples_per_insert - error_buffer
            self.max_diff = min_size * samples_per_insert + error_buffer
        self.limits = min_size > 0 or samples_per_insert is not None
        """Whether anything ever waits (else the checks are skipped)."""

    @property
    def inserts(self) -> int:
        """Frames inserted since the last clear."""
        return int(self._counts[0])

    @inserts.setter
    def inserts(self, value: int) -> None:
        self._counts[0] = value

    @property
    def samples(self) -> int:
        """Windows sampled since the last clear."""
        return int(self._counts[1])

    @samples.setter
    def samples(self, value: int) -> None:
        self._counts[1] = value

    def can_sample(self, size: int, count: int) -> bool:
        """Whether a sample of `count` windows may proceed with `size` frames stored."""
        if size < self.min_size:
            return False
        return self.inserts * (self.samples_per_insert or 1.0) - self.samples - count >= self.min_diff

    def can_insert(self, size: int, count: int) -> bool:
        """Whether an add of `count` frames may proceed with `size` frames stored."""
        if size + count <= self.min_size:
            return True
        return (self.inserts + count) * (self.samples_per_insert or 1.0) - self.samples <= self.max_diff

    def why_no_sample(self, size: int, count: int) -> str:
        """Why a sample of `count` waits, for its `TimeoutError`."""
        if size < self.min_size:
            return f"the buffer holds {size} frame(s), fewer than min_size_to_sample; add frames"
        return (
            f"{self.samples} window(s) sampled for {self.inserts} frame(s) inserted: {count} more would put the "
            "ratio past error_buffer; add frames"
        )

    def why_no_insert(self, count: int) -> str:
        """Why an add of `count` frames waits, for its `TimeoutError`."""
        return (
            f"{self.inserts} frame(s) inserted for {self.samples} window(s) sampled: {count} more would put the "
            "ratio past error_buffer; sample"
        )

    def clear(self) -> None:
        """Counts from nothing again (Reverb resets its limiter with its table)."""
        self.inserts = self.samples = 0
