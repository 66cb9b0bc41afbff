"""`RayHost`: the actor holding a Ray-hosted buffer's segments, each a py buffer of one segment.

Writers claim segments (`claim`, `release`), add to them, and the actor samples each segment in proportion to
the weight of the windows it can draw, then a window in it, with the rate limiter's waits.
"""

from __future__ import annotations

import os
import pathlib
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from tfbuffers import _blocks, prioritized, sampling, specs
from tfbuffers.remote.ray.blocks import BlockAdds
from tfbuffers.remote.ray.checkpoints import LIMITER_FILE, Checkpoints
from tfbuffers.remote.ray.claims import Claims, WriterCalls
from tfbuffers.remote.ray.cluster import cause_of, import_ray
from tfbuffers.remote.ray.elastic import ElasticStore
from tfbuffers.remote.ray.manifest import SEGMENT_DIRECTORY, save_segments, write_manifest
from tfbuffers.remote.ray.rate_limiter import RateLimiter
from tfbuffers.remote.ray.writer import WRITES

WAITED = (
    "RayReplayBuffer {name!r}: {what} waited {seconds:g} s for the rate limiter (min_size_to_sample={min_size}, "
    "samples_per_insert={ratio}, error_buffer={error_buffer}): {reason}"
)


UNEVEN = (
    "gather_all: the segments hold different numbers of frames ({counts}; writers add at their own pace), so they "
    "do not stack into [batch_size, frames, ...]: use gather_segment(segment)"
)


class RayHost(WriterCalls, BlockAdds):
    """What the Ray actor runs: the segments' buffers, the claims on them, the rate limiter and checkpoints.

    Methods run in the actor's threads (`max_concurrency`); one lock (and its condition, for the rate
    limiter's waits) orders adds, samples, clears and claims. Made by `RayReplayBuffer`, not by hand.
    """

    def __init__(self, config: dict[str, Any]) -> None:
        from tfbuffers.py_prioritized_replay_buffer import PyPrioritizedReplayBuffer
        from tfbuffers.py_uniform_replay_buffer import PyUniformReplayBuffer

        self._config = config
        self._label = f"RayReplayBuffer {config['name']!r}"
        self._spec = config["data_spec"]
        self._pack = specs.packer(self._spec)
        self._fields = specs.flatten_spec(self._spec)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._rng = np.random.default_rng(config["seed"])
        self._backend = sampling.numpy_backend(self._rng)  # the segments' weights: each sampler's `Sample.mass`
        self._claims = Claims(config["batch_size"], config.get("writer_lease"))
        self._closed = False
        prioritized_ = config["sampler"] == "prioritized"
        self._class: Any = PyPrioritizedReplayBuffer if prioritized_ else PyUniformReplayBuffer
        source = config.pop("source", None)  # ["open"] or ["load", the saved files' directory]; None: empty
        context = import_ray().get_runtime_context() if config.get("max_restarts") else None
        self.restarted = context is not None and context.was_current_actor_reconstructed
        self._checkpoints = None
        if config.get("checkpoint_dir") is not None:  # in RAM: written there every so many frames or seconds
            self._checkpoints = Checkpoints(
                config["checkpoint_dir"], config["checkpoint_frames"], config["checkpoint_seconds"]
            )  # fmt: skip
            restored = self._checkpoints.restored_from
            if self.restarted and restored is not None:  # Ray restarted the actor: its last checkpoint
                source = ["load", str(restored)]
        elif self.restarted:  # Ray restarted the actor after its process died: the directory holds every returned add
            source = ["open"]
        self._store, self._segments = made_segments(config, self._class, source)
        samples_per_insert, error_buffer = config["ratio"] or (None, None)
        counts = limiter_counts(config["directory"], self._size(), source)
        if self._checkpoints is not None and self.restarted:  # from the last checkpoint, or empty before the first
            if self._checkpoints.restored_from is not None:
                counts = self._checkpoints.limiter_counts()
            self._checkpoints.restored = {s: int(segment.storage.added) for s, segment in enumerate(self._segments)}
        self._limiter = RateLimiter(config["min_size_to_sample"] or 0, samples_per_insert, error_buffer, counts)
        self._share_largest()
        self._adds = 0  # adds since the actor started, and the latest that wrote each segment (-1: none yet)
        self._written = [-1] * len(self._segments)
        self._done: dict[tuple[str | None, int], int] = {}  # (writer, segment) -> the number of its last add there
        self._adopting: set[str] = set()  # dropped writers whose adds `adopt` holds, waiting to store them
        self._block_checks: dict[int, _blocks.BlockCheck] = {}  # add_many's checks of blocks, by segments' count
        if config["directory"] is not None and (source is None or source[0] != "open"):
            write_manifest(pathlib.Path(config["directory"]), config, config["sampler_record"])
        if self._checkpoints is not None:
            self._checkpoints.start(self._lock, self._checkpoint)

    def config(self) -> dict[str, Any]:
        """The configuration the buffer was made with (`RayReplayBuffer.connect` reads it)."""
        return dict(self._config)

    def ping(self) -> int:
        """The actor's pid, once it is built (its constructor's errors are raised by the first call)."""
        return os.getpid()

    # Adds and samples.

    def _size(self) -> int:
        return sum(int(segment.num_frames()) for segment in self._segments)

    def _wait(self, ready: Callable[[], bool], what: str, reason: Callable[[], str], timeout: float | None) -> None:
        """Waits (the lock held, released while waiting) until `ready()`; raises `TimeoutError` saying why."""
        if not self._limiter.limits:
            return
        start = time.monotonic()
        while not ready():
            left = None if timeout is None else timeout - (time.monotonic() - start)
            if left is not None and left <= 0:
                limiter = self._limiter
                raise TimeoutError(
                    WAITED.format(
                        name=self._config["name"],
                        what=what,
                        seconds=round(time.monotonic() - start, 1),
                        min_size=limiter.min_size,
                        ratio=limiter.samples_per_insert,
                        error_buffer=limiter.error_buffer,
                        reason=reason(),
                    )
                )
            self._changed.wait(left)
            self._check_open()

    def add(
        self,
        segments: list[int],
        leaves: list[np.ndarray],
        timeout: float | None,
        writer: str | None = None,
        expected: np.ndarray | None = None,
        resend: bool = False,
    ) -> np.ndarray:
        """Adds frame `i` of `leaves` to segment `segments[i]`, all or none; returns their ids.

        `writer`: the `RayWriter` adding, which must hold `segments`. `expected`: each frame's add number in
        its segment as the writer counts them: a frame this writer already stored is not stored again, so
        its calls may run in any order (a dropped writer's `adopt` beside the call it had in flight, in the
        writers' threads). On a `resend` (the writer's retry after the actor restarted), a frame its segment
        already holds (stored before the process died) is not stored twice either; after a restart from a
        checkpoint, the frames it counts past the segment's are counted lost.
        """
        count = len(segments)
        items = self._pack(leaves)
        checked, _ = specs.check_batch(items, self._spec, self._fields, (count,))
        total = len(self._segments)
        with self._lock:
            self._check_open()
            done = [self._done.get((writer, s), -1) for s in segments]
            if writer is not None and expected is not None and (np.asarray(done) >= expected).all():
                return np.asarray(expected, np.int64) * total + np.asarray(segments, np.int64)  # a late twin: stored
            if writer is not None:
                self._claims.check(writer, segments)
            limiter = self._limiter
            self._wait(
                lambda: limiter.can_insert(self._size(), count),
                f"add of {count} frame(s)",
                lambda: limiter.why_no_insert(count),
                timeout,
            )
            ids = np.empty(count, np.int64)
            stored = 0
            for i, s in enumerate(segments):
                added = int(self._segments[s].storage.added)
                if expected is not None:
                    e = int(expected[i])
                    if self._checkpoints is not None:
                        self._checkpoints.told(s, added, e)
                    if self._done.get((writer, s), -1) >= e or (resend and added > e):
                        ids[i] = e * total + s  # stored already: by this writer's other call, or before a restart
                        continue
                frame = [np.asarray(leaf[i : i + 1]) for leaf in checked]
                if self._store is not None:  # the elastic store takes the checked leaves as they are
                    number = self._store.add(s, frame)
                else:
                    number = int(self._segments[s].add_batch(self._pack(frame))[0])
                ids[i] = number * total + s
                stored += 1
                if expected is not None:  # the actor's number, which the writer counts on from (after a restart too)
                    self._done[(writer, s)] = number
            limiter.inserts += stored
            self._adds += 1
            for s in segments:
                self._written[s] = self._adds
            if self._checkpoints is not None and self._checkpoints.stored(stored):
                self._checkpoints.attempt(self._checkpoint)  # a failure is reported, not raised: the frames are in
            self._changed.notify_all()
            return ids

    def add_many(
        self,
        segments: list[int],
        batches: list[list[np.ndarray]],
        timeout: float | None,
        writer: str | None = None,
        first: np.ndarray | None = None,
        resend: bool = False,
    ) -> np.ndarray:
        """`add` of each batch in turn (a writer's adds sent in one call); returns their ids, `[batches, segments]`.

        `first`: the add numbers of the first batch's frames as the writer counts them (`add`'s `expected`);
        `resend`: the writer's retry after a restart.

        Batches the rate limiter lets in at once go in as one block (`BlockAdds._add_block`); otherwise one by
        one, which stores those before one that fails and says how many.
        """
        if len(batches) > 1:
            block = self._add_block(segments, batches, writer, first, resend)
            if block is not None:
                return block
        ids = []
        for index, leaves in enumerate(batches):
            try:
                expected = None if first is None else first + index
                ids.append(self.add(segments, leaves, timeout, writer, expected, resend))
            except Exception as error:  # said with how many were stored: nothing is dropped unsaid
                stored = f"{len(ids)} of the {len(batches)} adds this writer sent in one call were stored, the rest not"
                raise type(error)(f"{error} ({stored})") from None
        return np.stack(ids)

    def sample(
        self, sample_batch_size: int | None, num_steps: int | None, batches: int, timeout: float | None
    ) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        """Up to `batches` samples (at least one, waiting for the rate limiter; the others only if it allows).

        Returned stacked, `(leaves, ids, probabilities)` of `allowed * (sample_batch_size or 1)` windows, in
        few arrays however many windows: `split_samples` makes them the samples.
        """
        count = sample_batch_size or 1
        limiter = self._limiter
        with self._lock:
            self._check_open()
            self._wait(
                lambda: limiter.can_sample(self._size(), count),
                f"sample of {count} window(s)",
                lambda: limiter.why_no_sample(self._size(), count),
                timeout,
            )
            allowed = 1  # as many of `batches` as the limiter allows, counted before any is drawn
            limiter.samples += count
            while allowed < batches and limiter.can_sample(self._size(), count):
                allowed += 1
                limiter.samples += count
            # Nothing changes under the lock, so the batches are one draw of allowed * count windows: each
            # segment weighed and read once per call, not once per batch.
            if self._store is not None:
                drawn = self._store.draw(self._rng, allowed * count, num_steps)
            else:
                drawn = draw(self._segments, self._rng, self._backend, self._label, allowed * count, num_steps)
            self._changed.notify_all()
        return drawn

    def update_priorities(self, ids: np.ndarray, priorities: np.ndarray) -> int:
        """Sets priorities by global id (`RayReplayBuffer.update_priorities`); returns how many were skipped."""
        with self._lock:
            self._check_open()
            adds = [int(segment.storage.added) for segment in self._segments]
            ids, priorities = checked_update(ids, priorities, adds)
            total, skipped = len(self._segments), 0
            for s in np.unique(ids % total):
                mine = ids % total == s
                skipped += int(self._segments[s].update_priorities(ids[mine] // total, priorities[mine]))
            self._share_largest()
            if self._checkpoints is not None:
                self._checkpoints.changed = True
            return skipped

    def _share_largest(self) -> None:
        """Every segment's new frames get the largest priority of any (one buffer's rule), not their own's."""
        if self._config["sampler"] != "prioritized":
            return
        largest = max(segment.sampler.max_priority for segment in self._segments)  # under the actor's lock
        for segment in self._segments:
            segment.sampler.raise_max_priority(largest)

    # Reads and the rest.

    def limiter_counts(self) -> dict[str, Any]:
        """The rate limiter's counts and bounds, read at one moment (`RayReplayBuffer.rate_limiter_counts`)."""
        with self._lock:
            self._check_open()
            limiter = self._limiter
            return {
                "inserts": limiter.inserts,
                "samples": limiter.samples,
                "frames": self._size(),
                "min_diff": float(limiter.min_diff),
                "max_diff": float(limiter.max_diff),
            }

    def num_frames(self) -> int:
        """Frames stored in every segment."""
        with self._lock:
            self._check_open()
            return self._size()

    def frames_per_segment(self) -> list[int]:
        """Frames stored in each segment."""
        with self._lock:
            self._check_open()
            return [int(segment.num_frames()) for segment in self._segments]

    def gather_all(self) -> list[np.ndarray]:
        """Every segment's frames, `[batch_size, frames, ...]`; refused if the segments hold different counts."""
        with self._lock:
            self._check_open()
            counts = [int(segment.num_frames()) for segment in self._segments]
            if len(set(counts)) > 1:
                raise ValueError(UNEVEN.format(counts=counts))
            gathered = [tf.nest.flatten(segment.gather_all()) for segment in self._segments]
            return [np.concatenate(column) for column in zip(*gathered)]

    def gather_segment(self, segment: int) -> list[np.ndarray]:
        """One segment's frames, oldest first."""
        with self._lock:
            self._check_open()
            return [leaf[0] for leaf in tf.nest.flatten(self._segments[segment].gather_all())]

    def clear(self) -> None:
        """Empties every segment and resets the rate limiter."""
        with self._lock:
            self._check_open()
            for segment in self._segments:
                segment.clear()
            self._done.clear()  # the writers number anew from the actor's count
            self._limiter.clear()
            if self._checkpoints is not None:
                self._checkpoints.changed = True
            self._changed.notify_all()

    def flush(self) -> None:
        """Writes every memory-mapped segment back to the disk."""
        with self._lock:
            self._check_open()
            for segment in self._segments:
                segment.flush()

    def save(self, path: str, sampler: str) -> str:
        """Each segment's file under the directory `path`, and a manifest of the buffer's configuration.

        `sampler`: the sampler as the manifest records it (`write_manifest`).
        """
        with self._lock:
            self._check_open()
            save_segments(self._segments, pathlib.Path(path), self._config, sampler)
            return path

    def checkpoint(self) -> str:
        """Writes a checkpoint under `checkpoint_dir` now (`RayReplayBuffer.checkpoint`); returns its path."""
        with self._lock:
            self._check_open()
            if self._checkpoints is None:
                raise ValueError(
                    f"{self._label}: checkpoint: expected a buffer made with checkpoint_dir=, got one without"
                )
            return self._checkpoint()

    def _checkpoint(self) -> str:
        assert self._checkpoints is not None  # noqa: S101 - called only with checkpoints
        counts = (self._limiter.inserts, self._limiter.samples)
        return str(self._checkpoints.write(self._segments, self._config, counts))

    def checkpoint_report(self) -> dict[str, Any] | None:
        """The checkpoints written and what a restart lost (`RayReplayBuffer.checkpoint_report`); None without."""
        with self._lock:
            return None if self._checkpoints is None else self._checkpoints.report()

    def close(self) -> None:
        """Closes every segment (a memory-mapped one flushes first); later calls raise."""
        with self._lock:
            if self._checkpoints is not None:
                self._checkpoints.stop()
            if not self._closed:
                self._closed = True
                for segment in self._segments:
                    segment.close()
                self._changed.notify_all()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"{self._label}: the buffer is closed")


def checked_update(ids: Any, priorities: Any, adds: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """`update_priorities`' arguments checked, every id before any is set: each segment (of `adds` adds) stored it."""
    total = len(adds)
    ids, priorities = prioritized.check_update(ids, priorities, max(adds) * total)
    segment_of, local = ids % total, ids // total
    for s, added in enumerate(adds):
        mine = local[segment_of == s]
        if mine.size and mine.max() >= added:
            bad = int(np.flatnonzero((segment_of == s) & (local >= added))[0])
            next_id = f"{added * total + s} in segment {s}"
            raise ValueError(prioritized.NEVER_STORED.format(next_id=next_id, value=ids[bad], index=bad))
    return ids, priorities


def limiter_counts(directory: str | None, size: int, source: list[str] | None) -> np.ndarray:
    """The rate limiter's counts: in a file beside the segments with a directory, kept across restarts.

    A reopened directory's file gives the counts as they were; a new or loaded buffer (or a directory from
    before the file) counts its `size` frames as inserted and nothing sampled.
    """
    if directory is None:
        return np.array([size, 0], np.int64)
    path = pathlib.Path(directory) / LIMITER_FILE
    if source is not None and source[0] == "open" and path.exists():
        return np.lib.format.open_memmap(path, mode="r+")
    counts = np.lib.format.open_memmap(path, mode="w+", dtype=np.int64, shape=(2,))
    counts[:] = [size, 0]
    return counts


def made_segments(config: dict[str, Any], buffer_class: Any, source: list[str] | None) -> tuple[Any, list[Any]]:
    """The buffer's store (the elastic layout's, or None) and its segments, new, reopened or loaded (`source`)."""
    if config.get("layout") == "elastic":  # the segments share one storage (`tfbuffers.remote.ray.elastic`)
        store = ElasticStore(config, reopen=source is not None and source[0] == "open")
        try:
            if source is not None and source[0] == "load":  # a saved buffer's or a checkpoint's directory
                store.load(pathlib.Path(source[1]))
        except BaseException:
            store.close()
            raise
        return store, list(store.views)
    segments: list[Any] = []
    try:
        for s in range(config["batch_size"]):
            segments.append(make_segment(config, buffer_class, s, source))
    except BaseException:
        for segment in segments:
            segment.close()
        raise
    return None, segments


def make_segment(config: dict[str, Any], buffer_class: Any, s: int, source: list[str] | None) -> Any:
    """Segment `s` of the buffer `config` describes: a `buffer_class` of one frame, new, reopened or loaded."""
    seed = None if config["seed"] is None else [config["seed"], s]
    directory = config["directory"]
    directory = None if directory is None else pathlib.Path(directory) / SEGMENT_DIRECTORY.format(s)
    sampler = config["sampler"]
    options: dict[str, Any] = {"seed": seed}
    if sampler not in ("uniform", "prioritized"):  # a factory, as the local buffers take it
        options["sampler"] = sampler
    if source is not None and source[0] == "open":
        return buffer_class.open(directory, **options)
    options["directory"] = directory
    if source is not None:  # "load": the segment's file, streamed into `directory` if there is one
        return buffer_class.load(pathlib.Path(source[1]) / f"{SEGMENT_DIRECTORY.format(s)}.tfb", **options)
    options.update(max_length=config["max_length"], episode_boundaries=config["episode_boundaries"])
    options["frame_stacks"] = config["frame_stacks"]
    if buffer_class.__name__ == "PyPrioritizedReplayBuffer":
        options["priority_exponent"] = config["priority_exponent"]
    return buffer_class(config["data_spec"], batch_size=1, **options)


def draw(
    segments: list[Any],
    rng: np.random.Generator,
    backend: Any,
    label: str,
    sample_batch_size: int,
    num_steps: int | None,
) -> tuple[list[np.ndarray], np.ndarray, Any]:
    """`sample_batch_size` windows across the segments, each segment drawn in proportion to its windows' weight.

    `label` names the buffer in a refusal; `backend` weighs the segments (each sampler's `Sample.mass`).
    """
    masses = np.zeros(len(segments))
    refusal = None
    for s, segment in enumerate(segments):
        try:
            masses[s] = segment_mass(segment, backend, num_steps)
        except tf.errors.InvalidArgumentError as error:
            if refusal is None or "is empty" in refusal:
                refusal = error.message.replace(type(segment).__name__, label)
    total = masses.sum()
    if not total > 0:
        raise ValueError(refusal or sampling.EMPTY.format(buffer=label))
    shares = masses / total
    counts = rng.multinomial(sample_batch_size, shares)
    parts, ids, probabilities = [], [], []
    for s in np.flatnonzero(counts):
        leaves, local_ids, local_probabilities = segments[s].sample_arrays(int(counts[s]), num_steps)
        parts.append(leaves)
        ids.append(np.asarray(local_ids) * len(segments) + s)
        probabilities.append(np.asarray(local_probabilities, np.float64) * shares[s])
    order = rng.permutation(sample_batch_size)
    leaves = [np.concatenate(column)[order] for column in zip(*parts)]
    all_ids = np.concatenate(ids)[order]
    all_probabilities = np.asarray(np.concatenate(probabilities)[order], np.float32)
    return leaves, all_ids, all_probabilities


def segment_mass(segment: Any, backend: Any, num_steps: int | None) -> float:
    """The weight of the windows of `num_steps` a draw from `segment` chooses among now (`Sample.mass`).

    Raises as a sample would (an empty segment, no window), or if the sampler does not say. The segments
    are read under the actor's lock only: their sampler and storage are read directly.
    """
    mass = segment.sampler.sample(backend, segment.storage.added, 1, num_steps).mass
    if mass is None:
        raise ValueError(f"sampler: {type(segment.sampler).__name__} does not say its windows' weight (Sample.mass)")
    return float(mass)


_ACTOR_CLASS: Any = None


def actor_class(ray: Any) -> Any:
    """`RayHost` as a Ray actor class: threads for waits, no CPU held (it sleeps between calls)."""
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        # The writers' calls wait for the rate limiter in threads of their own: never in the samples' way.
        _ACTOR_CLASS = ray.remote(num_cpus=0, max_concurrency=16, concurrency_groups={WRITES: 64})(RayHost)
    return _ACTOR_CLASS


def started_actor(ray: Any, config: dict[str, Any], namespace: str) -> Any:
    """A new `RayHost` actor named `config["name"]` in `namespace`, once its constructor ran.

    Raises:
      Exception: What the constructor raised (a bad spec or option), the actor killed.
    """
    restarts = config.get("max_restarts", 0)  # Ray restarts a dead actor; each call is retried by the client
    actor = (
        actor_class(ray)
        .options(
            name=config["name"],
            namespace=namespace,
            max_restarts=restarts,
            max_task_retries=0,
            **config.get("actor_options", {}),
        )  # fmt: skip
        .remote(config)
    )
    try:
        ray.get(actor.ping.remote())
    except Exception as error:
        ray.kill(actor)
        raise cause_of(error) from None
    return actor
