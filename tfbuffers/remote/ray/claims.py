"""`Claims`: which writer holds which segment of a Ray-hosted buffer, on a lease, and how the claims ended.

`WriterCalls`: the actor's calls that writers make about their claims.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

NOT_ENOUGH_SEGMENTS = (
    "num_envs: expected at most the {free} free segment(s) of the buffer's {total} (claimed: {claimed}), got {received}"
)


CLAIM_LOST = (
    "RayWriter {writer}: its claim on segment(s) {segments} expired (no renewal for writer_lease={lease:g} s: its "
    "process was taken for dead) and segment(s) {taken} went to another writer"
)


class Claims:
    """The segments each writer holds, each claim a lease its process renews, and a count of how claims ended.

    Not thread-safe: `RayHost` calls it under its lock. A claim whose lease ran out (`writer_lease` seconds
    without a renewal, an add or a claim) is released when claims are next read; if its writer was only
    late, its next add takes the segments back while nobody else claimed them.
    """

    def __init__(self, segments: int, lease: float | None) -> None:
        self._segments = segments
        self._lease = lease
        self._holder: dict[int, str] = {}  # segment -> writer
        self._deadline: dict[str, float] = {}  # writer -> when its lease runs out (time.monotonic())
        self._expired: set[str] = set()  # writers whose lease ran out and that did not come back
        self._released: set[str] = set()  # writers that gave their segments up: a late renewal takes none back
        self.ended = {"closed": 0, "dropped": 0, "lost_adds": 0}

    def claim(self, num_envs: int, writer: str, order: list[int] | None = None) -> list[int]:
        """`num_envs` free segments, now `writer`'s; raises if fewer are free.

        `order`: every segment, those to take first first (`RayHost` puts the ones written longest ago,
        never-written ones before them, so a new writer's ring overwrites the oldest frames, not the
        frames a writer that just closed left); default: the lowest first.
        """
        self.expire()
        order = list(range(self._segments)) if order is None else order
        free = [s for s in order if s not in self._holder]
        if num_envs > len(free):
            claimed = sorted(set(self._holder.values()))
            raise ValueError(
                NOT_ENOUGH_SEGMENTS.format(
                    free=len(free), total=self._segments, claimed=claimed or "none", received=num_envs
                )
            )
        taken = sorted(free[:num_envs])
        for s in taken:
            self._holder[s] = writer
        self._renew([writer])
        return taken

    def _renew(self, writers: list[str]) -> None:
        if self._lease is not None:
            deadline = time.monotonic() + self._lease
            self._deadline.update((writer, deadline) for writer in writers)

    def renew(self, writers: dict[str, list[int]]) -> list[str]:
        """Extends the leases of `writers` (each with its segments); returns those whose segments another holds.

        A writer whose segments nobody holds (its lease lapsed, or the actor restarted) holds them again.
        """
        lost = []
        for writer, segments in writers.items():
            if writer in self._released or any(self._holder.get(s, writer) != writer for s in segments):
                lost.append(writer)
            else:
                self._take(writer, segments)
        return lost

    def _take(self, writer: str, segments: list[int]) -> None:
        if any(s not in self._holder for s in segments):
            self._expired.discard(writer)  # it lived after all (or the actor restarted): not counted as expired
        for s in segments:
            self._holder[s] = writer
        self._renew([writer])

    def expire(self) -> None:
        """Releases the claims whose lease ran out."""
        now = time.monotonic()
        expired = {writer for writer, deadline in self._deadline.items() if deadline < now}
        if expired:
            self._holder = {s: w for s, w in self._holder.items() if w not in expired}
            self._expired |= expired
            for writer in expired:
                del self._deadline[writer]

    def check(self, writer: str, segments: list[int]) -> None:
        """Refuses adds from `writer` to segments another writer holds; a lapsed claim nobody took is its again."""
        self.expire()
        taken = [s for s in segments if self._holder.get(s, writer) != writer]
        if taken:
            raise ValueError(
                CLAIM_LOST.format(writer=writer, segments=segments, lease=self._lease or 0.0, taken=taken)
            )  # fmt: skip
        self._take(writer, segments)

    def release(self, writer: str, how: str) -> None:
        """Frees `writer`'s segments; `how` its claim ended ("closed", "dropped") is counted."""
        self._released.add(writer)
        if writer in self._holder.values():
            self.ended[how] += 1
        self._holder = {s: w for s, w in self._holder.items() if w != writer}
        self._deadline.pop(writer, None)

    def holders(self) -> dict[int, str]:
        """Which writer holds each claimed segment."""
        self.expire()
        return dict(self._holder)

    def report(self) -> dict[str, Any]:
        """The claims now, and how many ended each way (`RayReplayBuffer.writer_report`)."""
        return {"claims": self.holders(), **self.ended, "expired": len(self._expired)}


class WriterCalls:
    """The actor's calls a `RayWriter` makes about its claim: a base of `RayHost`, which holds what they read.

    Each runs under the actor's lock.
    """

    _lock: threading.Lock
    _claims: Claims
    _segments: list[Any]
    _written: list[int]  # the actor's add count at each segment's latest add (-1: none yet)
    _done: dict[tuple[str | None, int], int]  # (writer, segment) -> the writer's last add number stored there
    _adopting: set[str]  # dropped writers whose adds `adopt` holds
    _store: Any  # the elastic layout's store (`ElasticStore`), None for segments of their own
    add: Callable[..., np.ndarray]

    def claim(self, num_envs: int, writer: str) -> tuple[list[int], list[int]]:
        """`num_envs` free segments, now claimed by `writer`, and their add counts (`Claims.claim`)."""
        with self._lock:
            # The free segments written longest ago first (never written, then the emptiest, first): FIFO over
            # segments, so a writer joining after another left overwrites the oldest frames, not its.
            frames = [int(segment.num_frames()) for segment in self._segments]
            order = sorted(range(len(self._segments)), key=lambda s: (self._written[s], frames[s], s))
            segments = self._claims.claim(num_envs, writer, order)
            if self._store is not None:  # a new writer's frames start a stream: no window reaches back
                for s in segments:
                    self._store.new_stream(s)
            for key in [key for key in self._done if key[1] in segments]:  # earlier writers' calls now refused
                del self._done[key]
            return segments, [int(self._segments[s].storage.added) for s in segments]

    def renew(self, writers: dict[str, list[int]]) -> list[str]:
        """Extends the leases of `writers`' claims (their process's heartbeat); returns those that lost theirs.

        `writers`: each writer's segments, claimed again if nobody holds them (after a restart).
        """
        with self._lock:
            return self._claims.renew(writers)

    def release(self, writer: str, how: str = "closed") -> None:
        """Frees the segments `writer` claimed (`how` its claim ended, for `writer_report`)."""
        with self._lock:
            if self._store is not None:  # its stream ends: the buffer's own adds there start another
                for s, holder in self._claims.holders().items():
                    if holder == writer:
                        self._store.new_stream(s)
            self._claims.release(writer, how)

    def claims(self) -> dict[int, str]:
        """Which writer claimed each claimed segment."""
        with self._lock:
            return self._claims.holders()

    def writer_report(self) -> dict[str, Any]:
        """The claims held now, and how many writers gave theirs up each way (`RayReplayBuffer.writer_report`)."""
        with self._lock:
            return self._claims.report()

    def adopt(self, writer: str, segments: list[int], batches: list[list[np.ndarray]], first: np.ndarray) -> int:
        """A writer dropped without `close()`: its adds not known to be stored, stored, then its segments freed.

        `batches`: its call in flight's and the adds after it, `first` the first one's add numbers: what the
        segments hold already (the call in flight stored it) is skipped (`add`'s `resend`). Returns how
        many batches went through; those that could not (a closed buffer) are counted in `writer_report`'s
        `lost_adds`.
        """
        self._adopting.add(writer)  # held here: the writer's process may end (`adopting`)
        stored = 0
        try:
            for index, leaves in enumerate(batches):
                self.add(segments, leaves, None, writer, first + index, resend=True)
                stored += 1
        except Exception:  # noqa: BLE001 - nobody is left to tell but the report
            with self._lock:
                self._claims.ended["lost_adds"] += len(batches) - stored
        finally:
            self.release(writer, "dropped")
            self._adopting.discard(writer)
        return stored

    def adopting(self, writer: str) -> bool:
        """Whether `adopt` holds `writer`'s adds (waiting for the rate limiter, say): its process may end now."""
        return writer in self._adopting
