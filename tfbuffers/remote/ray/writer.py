"""`RayWriter`: the segments of a Ray-hosted buffer that one process claimed, and its adds to them."""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

import numpy as np

from tfbuffers import specs
from tfbuffers.execution import host
from tfbuffers.remote.ray.cluster import call, cause_of, import_ray


class HostedBuffer(Protocol):
    """What a writer reads of its `RayReplayBuffer`: the spec its adds are checked against, and the actor."""

    @property
    def data_spec(self) -> Any:
        """The spec each add is checked against."""

    @property
    def fields(self) -> Any:
        """Its leaves, in order."""

    @property
    def batch_size(self) -> int:
        """Its segments, for the ids."""

    @property
    def actor(self) -> Any:
        """The actor the adds go to."""

    @property
    def timeout(self) -> float | None:
        """The rate limiter's wait, in seconds."""


class RayWriter:
    """Segments of a `RayReplayBuffer` claimed by one process (`buffer.writer(num_envs)`), and its adds to them.

    `add_batch` takes a batch of `num_envs` frames, checked against the buffer's spec (nothing is
    stored from a refused batch), and returns at once: adds go to the actor in order, one call at a
    time, the adds made meanwhile together in the next call (at most `max_pending` of them wait;
    the next `add_batch` then waits for the call in flight). `flush()` returns once every add is
    stored; an error the actor raised for an add (a rate limiter's `TimeoutError`, a closed
    buffer) is raised by the next `add_batch`, `flush` or `close`. `close()` (or leaving `with`)
    flushes and releases the segments: another writer may claim them and go on adding to their
    rings. A writer whose process dies keeps them claimed, and loses the adds it had not sent;
    the other writers and the samplers go on.

    The ids `add_batch` returns are counted here from the segments' adds when they were claimed
    (`add_number * batch_size + segment`): a `clear()` of the buffer meanwhile numbers anew.
    """

    def __init__(
        self, buffer: HostedBuffer, claim: tuple[list[int], list[int]], token: str, max_pending: int = 64
    ) -> None:
        self._buffer = buffer
        self._segments = list(claim[0])
        self._adds = np.asarray(claim[1], np.int64)
        self._token = token
        self._max_pending = max_pending
        self._pending: list[list[np.ndarray]] = []  # adds not sent yet, copied
        self._in_flight: Any = None  # the call sending the adds before them
        self._closed = False

    @property
    def segments(self) -> list[int]:
        """The segments this writer adds to, in the order of its batch."""
        return list(self._segments)

    @property
    def batch_size(self) -> int:
        """The leading dimension of this writer's `add_batch`: the segments it claimed (`num_envs`)."""
        return len(self._segments)

    @property
    def data_spec(self) -> Any:
        """The buffer's spec of one frame."""
        return self._buffer.data_spec

    @property
    def fields(self) -> tuple[specs.Field, ...]:
        """The spec's leaves, as the buffer's `fields`."""
        return self._buffer.fields

    def add_batch(self, items: Any) -> np.ndarray:
        """Adds frame `i` of `items` to `segments[i]`; returns their ids (`add_number * batch_size + segment`)."""
        if self._closed:
            raise ValueError("RayWriter: the writer is closed")
        buffer = self._buffer
        leaves, _ = specs.check_batch(items, buffer.data_spec, buffer.fields, (len(self._segments),))
        # Copies: the caller may reuse its arrays before the add is sent.
        self._pending.append([np.array(leaf) for leaf in host.arrays(leaves)])
        ids = self._adds * buffer.batch_size + np.asarray(self._segments, np.int64)
        self._adds += 1
        self._send(wait=len(self._pending) >= self._max_pending)
        return ids

    def _send(self, wait: bool) -> None:
        """Sends the pending adds if no call is in flight (after waiting for it, with `wait`)."""
        ray = import_ray()
        if self._in_flight is not None:
            if not wait and not ray.wait([self._in_flight], timeout=0)[0]:
                return
            in_flight, self._in_flight = self._in_flight, None
            try:
                ray.get(in_flight)
            except ray.exceptions.RayTaskError as error:
                self._pending.clear()
                raise cause_of(error) from None
        if self._pending:
            batches, self._pending = self._pending, []
            buffer = self._buffer
            self._in_flight = buffer.actor.add_many.remote(self._segments, batches, buffer.timeout)

    def flush(self) -> None:
        """Returns once every add made so far is stored in the buffer."""
        if not self._closed:
            self._send(wait=True)
            self._send(wait=True)

    def close(self) -> None:
        """Flushes, then releases the segments (closing twice is allowed)."""
        if not self._closed:
            try:
                self.flush()
            finally:
                self._closed = True
                with contextlib.suppress(Exception):
                    call(self._buffer.actor, "release", self._token)

    def __enter__(self) -> RayWriter:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
