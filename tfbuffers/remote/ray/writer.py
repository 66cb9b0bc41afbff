"""`RayWriter`: the segments of a Ray-hosted buffer that one process claimed, and its adds to them.

What a writer holds lives in a `Claim`, apart from the writer, so that a writer dropped without `close()`
still stores what it accepted (`weakref.finalize`), and so that this process's heartbeat (`Heartbeat`) keeps
its claims' leases while it lives.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import threading
import time
import warnings
import weakref
from typing import Any, Protocol

import numpy as np

from tfbuffers import _blocks, specs
from tfbuffers.execution import host
from tfbuffers.remote.ray.cluster import call, cause_of, import_ray, wait_for_restart

WRITES = "writes"
"""The actor's concurrency group of the writers' calls: adds waiting for the rate limiter never take the threads
that samples and the rest run in."""


WAITED = (
    "RayWriter of RayReplayBuffer {name!r}: add_batch waited {seconds:g} s for {pending} earlier add(s) to be "
    "stored (the rate limiter holds them until the learner samples): this frame was not added; the earlier ones "
    "are kept and will be stored (flush() waits for them)"
)


FLUSH_WAITED = (
    "RayWriter of RayReplayBuffer {name!r}: {what} waited {seconds:g} s for {pending} add(s) to be stored (the "
    "rate limiter holds them until the learner samples); they are kept and will be stored: call it again"
)


NOT_STORED = "{error} (this writer's adds not stored: {lost})"


DROPPED = (
    "RayWriter of RayReplayBuffer {name!r} was dropped without close() and could not hand its {count} add(s) not yet "
    "stored to the buffer ({reason}): they are lost"
)


class HostedBuffer(Protocol):
    """What a writer reads of its `RayReplayBuffer`: the spec its adds are checked against, and the actor."""

    @property
    def name(self) -> str:
        """The buffer's name, for messages."""

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


class Claim:
    """A writer's segments, its adds not stored yet, and the call in flight: what outlives a dropped writer."""

    def __init__(
        self,
        actor: Any,
        name: str,
        segments: list[int],
        adds: np.ndarray,
        token: str,
        lease: float | None,
        restarts: bool,
    ) -> None:
        self.actor = actor
        self.name = name
        self.segments = segments
        self.adds = adds  # each segment's add number of the next add
        self.token = token
        self.lease = lease
        self.restarts = restarts  # Ray restarts the actor: a call in flight is sent again
        self.pending: list[list[np.ndarray]] = []  # adds not sent yet, copied
        self.in_flight: Any = None  # the call sending the adds before them
        self.in_flight_batches: list[list[np.ndarray]] = []
        self.in_flight_first: np.ndarray | None = None  # their first add's numbers, for a resend
        self.in_flight_count = 0
        self.open = True

    def send(self) -> None:
        """Sends the pending adds in one call (none may be in flight)."""
        if self.pending:
            batches, self.pending = self.pending, []
            self.in_flight_batches, self.in_flight_first = batches, self.adds - len(batches)
            self.in_flight_count = len(batches)
            self.in_flight = self._submit(batches, self.in_flight_first, resend=False)

    def resend(self) -> None:
        """Sends the call in flight again, to the restarted actor: what it stored before it died is skipped."""
        self.in_flight = self._submit(self.in_flight_batches, self.in_flight_first, resend=True)

    def _submit(self, batches: list[list[np.ndarray]], first: np.ndarray | None, resend: bool) -> Any:
        return self.actor.add_many.options(concurrency_group=WRITES).remote(
            self.segments, batches, None, self.token, first, resend
        )

    def stored(self, ids: np.ndarray, total: int) -> None:
        """The call in flight returned `ids`: the add numbers count on from the actor's.

        A restart from a checkpoint, or a `clear()`, numbers anew.
        """
        self.adds = np.asarray(ids)[-1] // total + 1 + len(self.pending)

    def abandon(self) -> None:
        """The writer was dropped without `close()`: the actor stores its adds after the call in flight, then releases.

        Runs as the writer's finalizer, when it is collected: it sends one call, and waits until the
        actor has stored the adds or holds them (`_until_held`: a rate limiter may hold them as long as
        no learner samples) unless the garbage collector runs it (then in any thread, in the middle of
        anything: it waits for nothing). At exit, `_wait_for_abandoned` waits for the calls not waited
        for, before Ray shuts down. Waiting keeps a process that ends right after dropping its writer (a
        Ray actor whose handles are gone) from taking the call with it before it is sent.
        """
        if not self.open:
            return
        self.open = False
        HEARTBEAT.forget(self)
        ray = import_ray()
        count = len(self.pending) + self.in_flight_count
        if not ray.is_initialized():
            if count:
                warnings.warn(DROPPED.format(name=self.name, count=count, reason="Ray is shut down"), stacklevel=2)
            return
        # Every add not known to be stored, from the call in flight's first: the actor skips what it holds.
        batches = (self.in_flight_batches if self.in_flight is not None else []) + self.pending
        first = self.adds - len(batches)
        while True:
            try:
                done = self.actor.adopt.options(concurrency_group=WRITES).remote(
                    self.token, self.segments, batches, first
                )
            except Exception as error:  # noqa: BLE001 - a finalizer must not raise; it says what was lost
                warnings.warn(DROPPED.format(name=self.name, count=count, reason=error), stacklevel=2)
                return
            if _COLLECTING[0]:
                _ABANDONED.append((done, self.actor, self.token))
                return
            try:
                _until_held(done, self.actor, self.token)
                return
            except ray.exceptions.RayActorError as error:  # the buffer's actor died
                if not self.restarts:
                    warnings.warn(DROPPED.format(name=self.name, count=count, reason=error), stacklevel=2)
                    return
                with contextlib.suppress(Exception):
                    wait_for_restart(self.actor)  # Ray restarts it: the call goes again
            except Exception:  # noqa: BLE001 - the actor counts what it could not store (writer_report)
                return


_ABANDONED: list[tuple[Any, Any, str]] = []  # the dropped writers' last calls (call, actor, writer), waited for at exit
_EXIT_WAIT_SECONDS = 60.0
_HELD_POLL_SECONDS = 0.5


def _until_held(done: Any, actor: Any, writer: str) -> None:
    """Waits until the call `done` (an `adopt`) returned or the actor holds its adds, at most `_EXIT_WAIT_SECONDS`.

    Raises what the call raised.
    """
    ray = import_ray()
    deadline = time.monotonic() + _EXIT_WAIT_SECONDS
    while time.monotonic() < deadline:
        if ray.wait([done], timeout=_HELD_POLL_SECONDS)[0]:
            ray.get(done)
            return
        with contextlib.suppress(Exception):  # a busy or restarting actor: asked again
            if ray.get(actor.adopting.remote(writer), timeout=_HELD_POLL_SECONDS):
                return


_COLLECTING = [False]  # whether the garbage collector runs (a finalizer then must not wait)


def _note_collection(phase: str, _: dict[str, Any]) -> None:
    _COLLECTING[0] = phase == "start"


gc.callbacks.append(_note_collection)


def _wait_for_abandoned() -> None:
    """At exit (before Ray shuts down): hands every dropped writer's adds over, and waits until they are stored."""
    for claim in list(HEARTBEAT.claims):
        claim.abandon()
    ray = import_ray()
    if ray.is_initialized():
        for done, actor, writer in _ABANDONED:
            with contextlib.suppress(Exception):  # the actor counts what it could not store (writer_report)
                _until_held(done, actor, writer)


class Heartbeat:
    """Renews this process's claims' leases (a daemon thread), so that only a dead process's claims expire."""

    def __init__(self) -> None:
        self.claims: set[Claim] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def keep(self, claim: Claim) -> None:
        """Renews `claim`'s lease from now on (the thread starts with the first)."""
        with self._lock:
            self.claims.add(claim)
            if self._thread is None:
                # Registered after Ray's own exit hook, so it runs first: dropped writers are stored before shutdown.
                atexit.register(_wait_for_abandoned)
                self._thread = threading.Thread(target=self._run, name="tfbuffers-ray-heartbeat", daemon=True)
                self._thread.start()

    def forget(self, claim: Claim) -> None:
        """Stops renewing `claim` (released, or handed to the actor)."""
        with self._lock:
            self.claims.discard(claim)

    def _run(self) -> None:
        while True:
            with self._lock:
                claims = [claim for claim in self.claims if claim.lease is not None]
            interval = min((float(claim.lease or 0.0) for claim in claims), default=10.0) / 4
            by_actor: dict[Any, dict[str, list[int]]] = {}
            for claim in claims:
                by_actor.setdefault(claim.actor, {})[claim.token] = claim.segments
            for actor, tokens in by_actor.items():
                try:
                    actor.renew.remote(tokens)  # not waited for: a late renewal only shortens the next interval
                except Exception:  # noqa: BLE001, S112 - the actor may be gone; its writers say so on their next call
                    continue
            time.sleep(interval)


HEARTBEAT = Heartbeat()


class RayWriter:
    """Segments of a `RayReplayBuffer` claimed by one process (`buffer.writer(num_envs)`), and its adds to them.

    `add_batch` takes a batch of `num_envs` frames, checked against the buffer's spec (nothing is
    stored from a refused batch), and returns at once: adds go to the actor in order, one call at a
    time, the adds made meanwhile together in the next call. An add that returned is stored
    unless this process dies: the actor keeps it waiting for the rate limiter as long as the
    limiter says (in a thread group of its own, so samples go on). When `max_pending` adds wait,
    the next `add_batch` waits for the call in flight, at most the buffer's `timeout`; past it,
    it raises `TimeoutError` and does not take its frame (the earlier adds are kept). `flush()`
    returns once every add is stored (`TimeoutError` past `timeout`, the adds kept). An error of the
    actor (a closed buffer) is raised by the next call, naming the adds not stored.

    `close()` (or leaving `with`) flushes and releases the segments: another writer may claim them
    and go on adding to them. A writer dropped without `close()` (as TF-Agents observers
    drop theirs) hands its adds to the actor, which stores them and releases the segments. A
    claim is a lease, renewed by a thread of this process: a writer whose process dies (or its Ray
    actor) gives its segments up once the lease (`writer_lease`, 30 s) runs out, losing the adds it
    had not sent (at most `max_pending` and the call in flight); the other writers and the
    samplers go on.

    The ids `add_batch` returns are counted here (`add_number * batch_size + segment`) from the
    segments' adds when they were claimed, and again from the actor's each time a call returns: the
    adds made while the buffer was cleared, or restarted from a checkpoint (`checkpoint_dir=`), may
    return ids the actor gives other frames.
    """

    def __init__(
        self,
        buffer: HostedBuffer,
        claim: tuple[list[int], list[int]],
        token: str,
        max_pending: int = 64,
        lease: float | None = None,
        restarts: bool = False,
    ) -> None:
        self._buffer = buffer
        adds = np.asarray(claim[1], np.int64)
        self._claim = Claim(buffer.actor, buffer.name, list(claim[0]), adds, token, lease, restarts)
        self._max_pending = max_pending
        self._block_check: _blocks.BlockCheck | None = None  # extend's, made at its first block
        HEARTBEAT.keep(self._claim)
        self._finalizer = weakref.finalize(self, self._claim.abandon)

    @property
    def segments(self) -> list[int]:
        """The segments this writer adds to, in the order of its batch."""
        return list(self._claim.segments)

    @property
    def batch_size(self) -> int:
        """The leading dimension of this writer's `add_batch`: the segments it claimed (`num_envs`)."""
        return len(self._claim.segments)

    @property
    def data_spec(self) -> Any:
        """The buffer's spec of one frame."""
        return self._buffer.data_spec

    @property
    def fields(self) -> tuple[specs.Field, ...]:
        """The spec's leaves, as the buffer's `fields`."""
        return self._buffer.fields

    @property
    def pending(self) -> int:
        """Adds that returned and are not known to be stored yet."""
        return len(self._claim.pending) + self._claim.in_flight_count

    def add_batch(self, items: Any) -> np.ndarray:
        """Adds frame `i` of `items` to `segments[i]`; returns their ids (`add_number * batch_size + segment`)."""
        claim = self._claim
        if not claim.open:
            raise ValueError("RayWriter: the writer is closed")
        buffer = self._buffer
        leaves, _ = specs.check_batch(items, buffer.data_spec, buffer.fields, (len(claim.segments),))
        if len(claim.pending) >= self._max_pending and not self._wait(buffer.timeout):
            raise TimeoutError(
                WAITED.format(name=claim.name, seconds=buffer.timeout, pending=self.pending)
            )  # fmt: skip
        # Copies: the caller may reuse its arrays before the add is sent.
        claim.pending.append([np.array(leaf) for leaf in host.arrays(leaves)])
        ids = claim.adds * buffer.batch_size + np.asarray(claim.segments, np.int64)
        claim.adds = claim.adds + 1
        if self._wait(0):
            claim.send()
        return ids

    def extend(self, items: Any) -> np.ndarray:
        """Adds a block of `T` frames per segment, `[num_envs, T, ...]`: exactly `add_batch(items[:, t])` for each `t`.

        One check of the block, one copy, and `T` adds pending at once (returning at once, as `add_batch`),
        which the actor writes as one block per segment and field when its rate limiter lets them all in.
        It waits as `add_batch` does when `max_pending` adds wait, then takes the whole block, so up to
        `max_pending + T - 1` adds may wait. Returns the ids, `[num_envs, T]`.

        Raises:
          TypeError: If the structure differs from `data_spec` or a leaf is not array-like.
          ValueError: Naming the field, if a leaf's number of frames differs from the first leaf's, or its
            dtype, batch size or inner shape differs; or if the writer is closed. Nothing is taken then.
          TimeoutError: If `max_pending` adds waited past the buffer's `timeout`: the block is not taken.
        """
        claim = self._claim
        if not claim.open:
            raise ValueError("RayWriter: the writer is closed")
        buffer = self._buffer
        if self._block_check is None:
            self._block_check = _blocks.BlockCheck(buffer.data_spec, buffer.fields, (len(claim.segments),))
        leaves, _, frames = self._block_check(items)
        segments = np.asarray(claim.segments, np.int64)
        if frames == 0:
            return np.zeros([len(segments), 0], np.int64)
        if len(claim.pending) >= self._max_pending and not self._wait(buffer.timeout):
            raise TimeoutError(WAITED.format(name=claim.name, seconds=buffer.timeout, pending=self.pending))
        # One copy, time-major: each add's arrays are contiguous views of it, which the caller cannot change.
        block = [np.swapaxes(leaf, 0, 1).copy() for leaf in host.arrays(leaves)]
        claim.pending.extend([leaf[t] for leaf in block] for t in range(frames))
        numbers = claim.adds[:, None] + np.arange(frames, dtype=np.int64)[None]
        claim.adds = claim.adds + frames
        if self._wait(0):
            claim.send()
        return numbers * buffer.batch_size + segments[:, None]

    def _wait(self, timeout: float | None) -> bool:
        """Waits up to `timeout` for the call in flight (None: as long as it takes); whether none is in flight now.

        Raises what the actor raised for it, naming the adds not stored.
        """
        claim = self._claim
        ray = import_ray()
        while claim.in_flight is not None:
            if not ray.wait([claim.in_flight], timeout=timeout)[0]:
                return False
            try:
                claim.stored(ray.get(claim.in_flight), self._buffer.batch_size)
            except ray.exceptions.RayTaskError as error:  # the actor refused them: said with how many it stored
                claim.in_flight, claim.in_flight_count = None, 0
                lost = f"the {len(claim.pending)} add(s) made after them"
                claim.pending.clear()
                cause = cause_of(error)
                raise type(cause)(NOT_STORED.format(error=cause, lost=lost)) from None
            except ray.exceptions.RayActorError:  # the buffer's actor died
                if not claim.restarts:
                    claim.in_flight, claim.in_flight_count = None, 0
                    claim.pending.clear()
                    raise
                wait_for_restart(claim.actor)  # Ray restarts it: the call goes again
                claim.resend()
                continue
            claim.in_flight, claim.in_flight_count = None, 0
            claim.in_flight_batches, claim.in_flight_first = [], None
        return True

    def flush(self) -> None:
        """Returns once every add made so far is stored in the buffer.

        Raises:
          TimeoutError: If the rate limiter held them past the buffer's `timeout`: they are kept.
        """
        claim = self._claim
        if not claim.open:
            return
        timeout = self._buffer.timeout
        start = time.monotonic()
        for _ in range(2):  # the call in flight, then the adds made meanwhile
            left = None if timeout is None else max(0.0, timeout - (time.monotonic() - start))
            if not self._wait(left):
                raise TimeoutError(
                    FLUSH_WAITED.format(name=claim.name, what="flush", seconds=timeout, pending=self.pending)
                )
            claim.send()

    def close(self) -> None:
        """Flushes, then releases the segments (closing twice is allowed).

        Raises:
          TimeoutError: From `flush`: the writer stays open, its adds kept; call `close()` again.
        """
        claim = self._claim
        if not claim.open:
            return
        try:
            self.flush()
        except TimeoutError:
            raise
        except Exception:
            self._release()
            raise
        self._release()

    def _release(self) -> None:
        claim = self._claim
        claim.open = False
        self._finalizer.detach()
        HEARTBEAT.forget(claim)
        with contextlib.suppress(Exception):  # a dead actor holds nothing; a closed buffer released everything
            call(claim.actor, "release", claim.token)

    def __enter__(self) -> RayWriter:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
