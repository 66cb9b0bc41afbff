"""`BlockAdds`: the Ray actor's adds of a writer's call taken as one block (`RayHost.add_many`).

A `RayWriter` sends the adds made while its last call was in flight together, and `RayWriter.extend` and
`RayReplayBuffer.extend` send a block; where the rate limiter lets every frame in at once, the actor checks them
once and writes them as one block per segment and field (`ReplayBuffer.extend` of each segment's buffer), with
the ids, the skipped twins and the limiter's and checkpoints' counts that the adds one by one (`RayHost.add`)
would leave. Where it does not, `add_many` takes them one by one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from tfbuffers import _blocks
from tfbuffers.execution import host
from tfbuffers.remote.ray.checkpoints import Checkpoints
from tfbuffers.remote.ray.claims import Claims
from tfbuffers.remote.ray.rate_limiter import RateLimiter


class BlockAdds:
    """`add_many`'s block path: a base of `RayHost`, which holds what it reads. Runs under the actor's lock."""

    _lock: threading.Lock
    _closed: bool
    _spec: Any
    _fields: Any
    _pack: Any
    _segments: list[Any]
    _store: Any  # the elastic layout's store (`ElasticStore`), None for segments of their own
    _claims: Claims
    _limiter: RateLimiter
    _checkpoints: Checkpoints | None
    _changed: threading.Condition
    _done: dict[tuple[str | None, int], int]
    _written: list[int]
    _adds: int
    _block_checks: dict[int, _blocks.BlockCheck]  # the checks of blocks, by segments' count
    _size: Callable[[], int]  # the frames stored, for the rate limiter

    def _add_block(
        self,
        segments: list[int],
        batches: list[list[np.ndarray]],
        writer: str | None,
        first: np.ndarray | None,
        resend: bool,
    ) -> np.ndarray | None:
        """`add_many`'s batches as one block, `[batches, segments]` ids; None where `add` must take them one by one.

        None (nothing changed) when a batch is refused by the spec, the rate limiter would not let every frame
        in now, the writer no longer holds a segment, a segment's numbering has moved past the writer's count
        (a restart), or a checkpoint (`checkpoint_frames`) falls due within the block: the adds one by one then
        raise, wait, skip or checkpoint as `add` says, frame by frame.
        """
        count, frames = len(segments), len(batches)
        if count not in self._block_checks:
            self._block_checks[count] = _blocks.BlockCheck(self._spec, self._fields, (count,))
        try:
            stacked = [np.stack([batch[j] for batch in batches], axis=1) for j in range(len(self._fields))]
            block = host.arrays(self._block_checks[count](self._pack(stacked))[0])
        except (TypeError, ValueError):  # a batch refused, or batches that differ: `add` says which
            return None
        total = len(self._segments)
        with self._lock:
            if self._closed:
                return None  # `add` raises it, saying none was stored
            added = np.array([int(self._segments[s].storage.added) for s in segments], np.int64)
            numbers = np.arange(frames, dtype=np.int64)[:, None] + added[None]  # [frames, count]
            skip = np.zeros(count, np.int64)  # each segment's leading adds stored already
            twins = np.zeros(count, np.int64)  # of them, those this writer stored (`add`'s late twins)
            if first is not None:
                first = np.asarray(first, np.int64)
                done = np.array([self._done.get((writer, s), -1) for s in segments], np.int64)
                twins = np.clip(done - first + 1, 0, frames)
                skip = np.clip((np.maximum(done, added - 1) if resend else done) - first + 1, 0, frames)
                if (added > first + skip).any():  # numbered past the writer's count: `add` skips frame by frame
                    return None
                numbers = np.arange(frames, dtype=np.int64)[:, None] + first[None]  # the twins' as the writer's
            if (twins == frames).all():  # late twins, all of them: stored by this writer's other call
                return numbers * total + np.asarray(segments, np.int64)[None]
            if writer is not None:
                try:
                    self._claims.check(writer, segments)
                except ValueError:
                    return None
            stored = int(frames * count - skip.sum())
            limiter = self._limiter
            if limiter.limits and not limiter.can_insert(self._size(), stored):
                return None  # the limiter would hold some of them: `add` waits for each
            checkpoints = self._checkpoints
            if (
                checkpoints is not None
                and checkpoints.frames is not None
                and checkpoints.since + stored >= checkpoints.frames
            ):
                return None  # a checkpoint falls due within them: `add` takes it after the add it is due at
            if checkpoints is not None and first is not None:
                for i, s in enumerate(segments):
                    checkpoints.told(s, int(added[i]), int(first[i]))
            if self._store is not None:
                self._store_block(segments, block, numbers, skip)
            else:  # one write per segment and field
                for i, s in enumerate(segments):
                    start = int(skip[i])
                    if start == frames:
                        continue
                    rest = self._pack([leaf[i : i + 1, start:] for leaf in block])
                    try:
                        numbers[start:, i] = np.asarray(self._segments[s].extend(rest))[0]
                    except Exception as error:
                        where = f"segments {segments[:i]} hold the block's {frames} adds, {segments[i:]} none"
                        raise type(error)(f"{error} ({where})") from None
            if first is not None:
                for i, s in enumerate(segments):
                    if skip[i] < frames:
                        self._done[(writer, s)] = int(numbers[-1, i])
            limiter.inserts += stored
            self._adds += frames
            for s in segments:
                self._written[s] = self._adds
            if checkpoints is not None:
                checkpoints.stored(stored)  # counted, not due (above): `add` takes the one due within a block
            self._changed.notify_all()
            return numbers * total + np.asarray(segments, np.int64)[None]

    def _store_block(self, segments: list[int], block: list[np.ndarray], numbers: np.ndarray, skip: np.ndarray) -> None:
        """The elastic store's share of `_add_block`: frame by frame in the adds' order (its oldest chunks go first)."""
        frames = len(numbers)
        for t in range(frames):
            for i, s in enumerate(segments):
                if t < skip[i]:
                    continue
                try:
                    numbers[t, i] = self._store.add(s, [leaf[i : i + 1, t] for leaf in block])
                except Exception as error:
                    where = f"{t} of the {frames} adds were stored, and add {t} in segments {segments[:i]}"
                    raise type(error)(f"{error} ({where})") from None
