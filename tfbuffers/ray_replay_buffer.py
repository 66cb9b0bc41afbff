"""`RayReplayBuffer`: a py buffer hosted by a Ray actor, shared by processes and machines.

The buffer's frames live in one Ray actor (`RayHost`), in `batch_size` rings of `max_length`
frames, one per segment, each a `PyUniformReplayBuffer` or `PyPrioritizedReplayBuffer` of one
segment (in RAM, or memory-mapped under `directory`). Segments fill on their own: a process that
claims some (`RayReplayBuffer.writer`) adds to them at its own pace, and one that dies stops only
its own. A sample draws each segment in proportion to the weight of the windows it can draw (their
count, or the sum of their priorities' weights), then a window within it, so the probabilities are
exactly those of one buffer holding every segment's windows.

Only this module imports Ray (the `ray` extra), and only when a buffer is made or connected.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pathlib
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from tfbuffers import host, prioritized, sampling, specs
from tfbuffers import state as state_lib
from tfbuffers.remote.base import RemoteReplayBuffer
from tfbuffers.remote.options import check_ratio, check_sampler
from tfbuffers.replay_buffer import BufferInfo, keep_alive, optional_positive_int, positive_int

logger = logging.getLogger(__name__)

NAMESPACE = "tfbuffers"
"""The Ray namespace of every buffer's actor: `RayReplayBuffer.connect(name)` finds it from any driver."""
NO_RAY = "RayReplayBuffer needs Ray, which did not import ({error}). Install the extra: pip install 'tfbuffers[ray]'"
STARTED = (
    "tfbuffers started a local Ray cluster for RayReplayBuffer (no dashboard, no job server; token authentication "
    "%s). Listening: %s. Ray's GCS, raylet and workers listen on every interface whatever the node address: keep "
    "these ports private to the machine (docs/scaling.md). It stops when this process exits."
)
NOT_ENOUGH_SEGMENTS = (
    "num_envs: expected at most the {free} free segment(s) of the buffer's {total} (claimed: {claimed}), got {received}"
)
WAITED = (
    "RayReplayBuffer {name!r}: {what} waited {seconds:g} s for the rate limiter (min_size_to_sample={min_size}, "
    "samples_per_insert={ratio}, error_buffer={error_buffer}): {reason}"
)
BATCH_OVER_LIMITER = (
    "sample_batch_size: expected at most {most} (a sample of more can never proceed with error_buffer={error_buffer}, "
    "samples_per_insert={ratio} and adds of {frames} frames), got {received}"
)
UNEVEN = (
    "gather_all: the segments hold different numbers of frames ({counts}; writers add at their own pace), so they "
    "do not stack into [batch_size, frames, ...]: use gather_segment(segment)"
)
NO_PASS = (
    "single_deterministic_pass: not supported by RayReplayBuffer (its segments fill at their own pace); "
    "use gather_all() or gather_segment(segment)"
)
NOT_PRIORITIZED = (
    "update_priorities: the buffer samples uniformly (sampler='uniform'); make it with sampler='prioritized'"
)
NO_ACTOR = (
    "RayReplayBuffer.connect: no buffer named {name!r} in Ray namespace {namespace!r} of the cluster at {address}"
)
OTHER_FRAMES = (
    "data_spec: expected RayReplayBuffer {name!r} to hold frames of the data_spec given, got a buffer whose "
    "{differences}"
)
# `prefetch_items`' default by sampler: a prioritized learner's priorities move between fetches, so it fetches less.
PREFETCH_ITEMS = {"uniform": 8192, "prioritized": 512}
PREFETCH_BYTES = 32 << 20  # the most one of `as_dataset`'s fetches holds (two are in flight: the next is asked for)
MANIFEST = "ray_buffer.json"
MANIFEST_FORMAT = 1
SEGMENT_DIRECTORY = "segment-{:04d}"


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as error:
        raise ImportError(NO_RAY.format(error=error)) from error
    return ray


def ensure_ray(address: str | None = None) -> Any:
    """Ray, connected: the running connection, the cluster at `address` (or `RAY_ADDRESS`), or a new local one.

    A driver joining a cluster at an address sends the cluster's token where Ray finds one
    (`RAY_AUTH_TOKEN`, `RAY_AUTH_TOKEN_PATH`, `~/.ray/auth_token`) and `RAY_AUTH_MODE` is unset.

    A new local cluster has no dashboard and keeps Ray's token authentication on (`RAY_AUTH_MODE=token`
    unless the environment says otherwise); one log line says which ports it listens on.
    """
    ray = _import_ray()
    if ray.is_initialized():
        return ray
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is not None:
        # Ray sends a token to an address only when RAY_AUTH_MODE=token, and a cluster with token
        # authentication (what a local start makes) refuses drivers without: with a token at hand
        # and no mode set, send it, as Ray itself does for address="auto".
        with contextlib.suppress(ImportError):  # Ray before 2.52 has no token authentication
            from ray._private.authentication import authentication_token_setup

            authentication_token_setup.maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
        ray.init(address=address, log_to_driver=False, configure_logging=False)
        return ray
    # Ray 2.52+ turns token authentication on for a new local cluster unless RAY_AUTH_MODE says otherwise.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(
        address="local",
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        configure_logging=False,
    )
    auth = "on" if os.environ.get("RAY_AUTH_MODE", "").lower() == "token" else "OFF (RAY_AUTH_MODE=disabled)"
    token = private_token() if auth == "on" else None
    if token is not None:
        auth += f"; its token file {token} made readable by its owner only"
    sockets = listening(ray_processes())
    described = ", ".join(f"{name} {address}:{port}" for name, address, port in sockets) or "none found"
    logger.warning(STARTED, auth, described)
    return ray


def private_token() -> pathlib.Path | None:
    """Ray's default token file (`~/.ray/auth_token`), made mode 0600 if others could read it; else None.

    Ray writes it with the process's umask (0644 here): any local user could then read the token and
    join the cluster. A token given by `RAY_AUTH_TOKEN` or `RAY_AUTH_TOKEN_PATH` is the user's own: left.
    """
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return None
    token = pathlib.Path.home() / ".ray" / "auth_token"
    try:
        if not token.stat().st_mode & 0o077:
            return None
        token.chmod(0o600)
    except OSError:  # no token file (authentication off), or not ours to change
        return None
    return token


def ray_processes() -> list[int]:
    """The pids of the processes this one started (Ray's GCS, raylet, workers, ...), read from `/proc`."""
    children: dict[int, list[int]] = {}
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, stack = [], list(children.get(os.getpid(), []))
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return sorted(found)


def listening(pids: Sequence[int]) -> list[tuple[str, str, int]]:
    """`(process name, address, port)` of every TCP socket the processes `pids` listen on ("*" for every interface).

    Read from `/proc/net/tcp`, `/proc/net/tcp6` and each process's descriptors (Linux).
    """
    sockets: dict[str, tuple[str, int]] = {}
    for table, width in (("tcp", 8), ("tcp6", 32)):
        with contextlib.suppress(OSError):
            for line in pathlib.Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
                parts = line.split()
                if parts[3] != "0A":  # LISTEN
                    continue
                hex_address, hex_port = parts[1].split(":")
                sockets[parts[9]] = (_address(hex_address, width), int(hex_port, 16))
    found = set()
    for pid in pids:
        try:
            name = pathlib.Path(f"/proc/{pid}/comm").read_text().strip()
            descriptors = list(pathlib.Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for descriptor in descriptors:
            with contextlib.suppress(OSError):
                target = os.readlink(descriptor)
                if target.startswith("socket:[") and target[8:-1] in sockets:
                    found.add((name, *sockets[target[8:-1]]))
    return sorted(found, key=lambda entry: (entry[2], entry[0]))


def _address(hex_address: str, width: int) -> str:
    raw = bytes.fromhex(hex_address)
    if width == 8:
        ip = ".".join(str(b) for b in raw[::-1])
        return "*" if ip == "0.0.0.0" else ip
    words = [raw[i : i + 4][::-1] for i in range(0, 16, 4)]  # four little-endian words
    packed = b"".join(words)
    if packed == bytes(16):
        return "*"
    if packed[:12] == bytes(10) + b"\xff\xff":
        return ".".join(str(b) for b in packed[12:])
    return ":".join(packed[i : i + 2].hex() for i in range(0, 16, 2))


class RateLimiter:
    """Reverb's `MinSize` and `SampleToInsertRatio` rate limiters, over frames inserted and windows sampled.

    A sample of `n` may proceed once the buffer holds `min_size_to_sample` frames and
    `inserts * samples_per_insert - samples - n >= min_diff`; an insert of `n` frames once the buffer
    holds no more than `min_size_to_sample` frames after it, or `(inserts + n) * samples_per_insert -
    samples <= max_diff`, where `min_diff` and `max_diff` are `min_size_to_sample * samples_per_insert`
    less and plus `error_buffer` (no bounds without `samples_per_insert`). Cleared with the buffer.
    """

    def __init__(self, min_size: int, samples_per_insert: float | None, error_buffer: float | None) -> None:
        self.min_size = min_size
        self.samples_per_insert = samples_per_insert
        self.error_buffer = error_buffer
        if samples_per_insert is None or error_buffer is None:
            self.min_diff, self.max_diff = -np.inf, np.inf
        else:
            self.min_diff = min_size * samples_per_insert - error_buffer
            self.max_diff = min_size * samples_per_insert + error_buffer
        self.inserts = 0
        self.samples = 0
        self.limits = min_size > 0 or samples_per_insert is not None
        """Whether anything ever waits (else the checks are skipped)."""

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


class RayHost:
    """What the Ray actor runs: the segments' buffers, the claims on them and the rate limiter.

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
        self._limiter = RateLimiter(config["min_size_to_sample"] or 0, *(config["ratio"] or (None, None)))
        self._claims: dict[int, str] = {}  # segment -> writer
        self._closed = False
        prioritized_ = config["sampler"] == "prioritized"
        self._class = PyPrioritizedReplayBuffer if prioritized_ else PyUniformReplayBuffer
        source = config.pop("source", None)  # ["open"] or ["load", the saved files' directory]; None: empty
        self._segments: list[Any] = []
        try:
            for s in range(config["batch_size"]):
                self._segments.append(self._segment(s, source))
        except BaseException:
            for segment in self._segments:
                segment.close()
            raise
        self._limiter.inserts = self._size()
        self._share_largest()
        if config["directory"] is not None and (source is None or source[0] != "open"):
            write_manifest(pathlib.Path(config["directory"]), config)

    def _segment(self, s: int, source: list[str] | None) -> Any:
        config = self._config
        seed = None if config["seed"] is None else [config["seed"], s]
        directory = config["directory"]
        directory = None if directory is None else pathlib.Path(directory) / SEGMENT_DIRECTORY.format(s)
        if source is not None and source[0] == "open":
            return self._class.open(directory, seed=seed)
        options: dict[str, Any] = {"seed": seed, "directory": directory}
        if source is not None:  # "load": the segment's file, streamed into `directory` if there is one
            return self._class.load(pathlib.Path(source[1]) / f"{SEGMENT_DIRECTORY.format(s)}.tfb", **options)
        options.update(max_length=config["max_length"], episode_boundaries=config["episode_boundaries"])
        options["frame_stacks"] = config["frame_stacks"]
        if self._class.__name__ == "PyPrioritizedReplayBuffer":
            options["priority_exponent"] = config["priority_exponent"]
        return self._class(self._spec, batch_size=1, **options)

    def config(self) -> dict[str, Any]:
        """The configuration the buffer was made with (`RayReplayBuffer.connect` reads it)."""
        return dict(self._config)

    def ping(self) -> int:
        """The actor's pid, once it is built (its constructor's errors are raised by the first call)."""
        return os.getpid()

    # Claims.

    def claim(self, num_envs: int, writer: str) -> tuple[list[int], list[int]]:
        """`num_envs` free segments, now claimed by `writer`, and their add counts; raises if fewer are free."""
        with self._lock:
            free = [s for s in range(len(self._segments)) if s not in self._claims]
            if num_envs > len(free):
                claimed = sorted(set(self._claims.values()))
                raise ValueError(
                    NOT_ENOUGH_SEGMENTS.format(
                        free=len(free), total=len(self._segments), claimed=claimed or "none", received=num_envs
                    )
                )
            for s in free[:num_envs]:
                self._claims[s] = writer
            return free[:num_envs], [int(self._segments[s].storage.added) for s in free[:num_envs]]

    def release(self, writer: str) -> None:
        """Frees the segments `writer` claimed."""
        with self._lock:
            self._claims = {s: w for s, w in self._claims.items() if w != writer}

    def claims(self) -> dict[int, str]:
        """Which writer claimed each claimed segment."""
        with self._lock:
            return dict(self._claims)

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

    def add(self, segments: list[int], leaves: list[np.ndarray], timeout: float | None) -> np.ndarray:
        """Adds frame `i` of `leaves` to segment `segments[i]`, all or none; returns their ids."""
        count = len(segments)
        items = self._pack(leaves)
        checked, _ = specs.check_batch(items, self._spec, self._fields, (count,))
        with self._lock:
            self._check_open()
            limiter = self._limiter
            self._wait(
                lambda: limiter.can_insert(self._size(), count),
                f"add of {count} frame(s)",
                lambda: limiter.why_no_insert(count),
                timeout,
            )
            ids = np.empty(count, np.int64)
            for i, s in enumerate(segments):
                frame = self._pack([leaf[i : i + 1] for leaf in checked])
                ids[i] = int(self._segments[s].add_batch(frame)[0]) * len(self._segments) + s
            limiter.inserts += count
            self._changed.notify_all()
            return ids

    def add_many(self, segments: list[int], batches: list[list[np.ndarray]], timeout: float | None) -> np.ndarray:
        """`add` of each batch in turn (a writer's adds sent in one call); returns their ids, `[batches, segments]`."""
        ids = []
        for leaves in batches:
            try:
                ids.append(self.add(segments, leaves, timeout))
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
            drawn = self._draw(allowed * count, num_steps)
            self._changed.notify_all()
        return drawn

    def _draw(self, sample_batch_size: int, num_steps: int | None) -> tuple[list[np.ndarray], np.ndarray, Any]:
        """`sample_batch_size` windows across the segments, each segment drawn in proportion to its windows' weight."""
        masses = np.zeros(len(self._segments))
        refusal = None
        for s, segment in enumerate(self._segments):
            try:
                masses[s] = segment.window_mass(num_steps)
            except tf.errors.InvalidArgumentError as error:
                if refusal is None or "is empty" in refusal:
                    refusal = error.message.replace(type(segment).__name__, self._label)
        total = masses.sum()
        if not total > 0:
            raise ValueError(refusal or sampling.EMPTY.format(buffer=self._label))
        shares = masses / total
        counts = self._rng.multinomial(sample_batch_size, shares)
        parts, ids, probabilities = [], [], []
        for s in np.flatnonzero(counts):
            leaves, local_ids, local_probabilities = self._segments[s].sample_arrays(int(counts[s]), num_steps)
            parts.append(leaves)
            ids.append(np.asarray(local_ids) * len(self._segments) + s)
            probabilities.append(np.asarray(local_probabilities, np.float64) * shares[s])
        order = self._rng.permutation(sample_batch_size)
        leaves = [np.concatenate(column)[order] for column in zip(*parts)]
        all_ids = np.concatenate(ids)[order]
        all_probabilities = np.asarray(np.concatenate(probabilities)[order], np.float32)
        return leaves, all_ids, all_probabilities

    def update_priorities(self, ids: np.ndarray, priorities: np.ndarray) -> int:
        """Sets priorities by global id (`RayReplayBuffer.update_priorities`); returns how many were skipped."""
        with self._lock:
            self._check_open()
            total = len(self._segments)
            adds = [int(segment.storage.added) for segment in self._segments]
            next_id = max(adds) * total
            ids, priorities = prioritized.check_update(ids, priorities, next_id)
            segment_of, local = ids % total, ids // total
            for s, added in enumerate(adds):  # every id checked before any is set
                mine = local[segment_of == s]
                if mine.size and mine.max() >= added:
                    bad = int(np.flatnonzero((segment_of == s) & (local >= added))[0])
                    raise ValueError(
                        prioritized.NEVER_STORED.format(
                            next_id=f"{added * total + s} in segment {s}",
                            value=ids[bad],
                            index=bad,
                        )
                    )
            skipped = 0
            for s in np.unique(segment_of):
                mine = segment_of == s
                skipped += int(self._segments[s].update_priorities(local[mine], priorities[mine]))
            self._share_largest()
            return skipped

    def _share_largest(self) -> None:
        """Every segment's new frames get the largest priority of any (one buffer's rule), not their own's."""
        if self._config["sampler"] != "prioritized":
            return
        largest = max(segment.max_priority for segment in self._segments)
        for segment in self._segments:
            segment.raise_max_priority(largest)

    # Reads and the rest.

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
            self._limiter.clear()
            self._changed.notify_all()

    def flush(self) -> None:
        """Writes every memory-mapped segment back to the disk."""
        with self._lock:
            self._check_open()
            for segment in self._segments:
                segment.flush()

    def save(self, path: str) -> str:
        """Each segment's file under the directory `path`, and a manifest of the buffer's configuration."""
        with self._lock:
            self._check_open()
            directory = pathlib.Path(path)
            directory.mkdir(parents=True, exist_ok=True)
            for s, segment in enumerate(self._segments):
                segment.save(directory / f"{SEGMENT_DIRECTORY.format(s)}.tfb", progress=False)
            write_manifest(directory, self._config)
            return str(directory)

    def close(self) -> None:
        """Closes every segment (a memory-mapped one flushes first); later calls raise."""
        with self._lock:
            if not self._closed:
                self._closed = True
                for segment in self._segments:
                    segment.close()
                self._changed.notify_all()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"{self._label}: the buffer is closed")


class RayReplayBuffer(RemoteReplayBuffer):
    """A replay buffer hosted by a Ray actor: many processes (and machines) add, any samples.

    The frames live in one Ray actor, in `batch_size` segments of `max_length` frames (a
    `PyUniformReplayBuffer` or `PyPrioritizedReplayBuffer` per segment, in RAM or memory-mapped under
    `directory`). `add_batch` adds one frame to every segment, as the local buffers do; a process
    that adds its own environments' frames claims segments of its own with `writer(num_envs)`, and
    adds to those alone, at its own pace. Windows never leave a segment (nor, with
    `episode_boundaries`, an episode), so frames of different writers never mix in a window; a
    writer that dies stops only its own segments.

    A sample draws each segment with probability in proportion to the weight of the windows it can
    draw (their count, uniform; the sum of their first frames' `priority ** priority_exponent`,
    prioritized), then a window in it as its buffer does: the probabilities in `BufferInfo` are
    exact. Ids are `add_number * batch_size + segment`, `add_number` counted per segment (the local
    buffers' numbering when every segment has the same number of adds).

    Rate limiting, when asked for, with Reverb's semantics: with `min_size_to_sample` a sample waits
    until the buffer holds that many frames (without, an empty buffer is refused at once, as the
    local buffers refuse it); with `samples_per_insert`, samples and inserts wait for each other
    to keep about that many windows sampled per frame inserted (`error_buffer` of slack, as Reverb's
    `SampleToInsertRatio`). A wait longer than `timeout` seconds raises `TimeoutError`, saying what
    waited for what.

    With no Ray connection in the process, the buffer connects to `address` (or `RAY_ADDRESS`), or
    starts a local cluster: no dashboard, token authentication on, and one log line saying which
    ports it listens on (Ray's GCS, raylet and workers listen on every interface whatever the node
    address; keep them private, docs/scaling.md). The handle pickles: pass it to Ray tasks and
    actors, or `RayReplayBuffer.connect(name)` from another driver of the cluster.

    Eagerly every method is one remote call; inside a `tf.function` or `tf.data` each runs when the
    graph runs (`tfbuffers.host`). `as_dataset` fetches several batches per remote call, ahead.

    docs/guide.md ("Ray") and docs/scaling.md show it with writer processes; tests/ray_replay_buffer_test.py runs
    them on a local cluster.
    """

    def __init__(
        self,
        data_spec: Any,
        capacity: int | None = None,
        *,
        batch_size: int = 1,
        max_length: int | None = None,
        sampler: str = "uniform",
        priority_exponent: float = 0.6,
        episode_boundaries: bool | str = False,
        frame_stacks: Any = None,
        directory: str | os.PathLike | None = None,
        min_size_to_sample: int | None = None,
        samples_per_insert: float | None = None,
        error_buffer: float | None = None,
        timeout: float | None = 60.0,
        seed: int | None = None,
        name: str | None = None,
        address: str | None = None,
        prefetch_items: int | None = None,
    ) -> None:
        """Creates the buffer's actor (and a local Ray cluster, if none is connected).

        Args:
          data_spec: A nest of `tf.TensorSpec` (or `ArraySpec`) describing one frame.
          capacity: Total frames held (`batch_size * max_length`).
          batch_size: Segments: the leading dimension of `add_batch`, and how many environments
            writers can claim in all.
          max_length: Frames per segment; default `capacity // batch_size`.
          sampler: "uniform" or "prioritized" (`update_priorities` sets priorities).
          priority_exponent: Alpha, for the prioritized sampler.
          episode_boundaries: As in `PyUniformReplayBuffer`: windows never cross an episode.
          frame_stacks: As in `PyUniformReplayBuffer`.
          directory: Keep every segment memory-mapped under this directory (new or empty), one
            subdirectory per segment (`tfbuffers.memmap`); `RayReplayBuffer.open(directory)` reopens
            it after the actor died, with every add that returned.
          min_size_to_sample: Frames the buffer must hold before a sample proceeds (it waits until
            then). None, with no `samples_per_insert`: no wait, and sampling an empty buffer raises,
            as the local buffers do; 1 with `samples_per_insert`.
          samples_per_insert: None: no ratio kept. A number: Reverb's `SampleToInsertRatio`.
          error_buffer: The ratio's slack, as `ReverbReplayBuffer`'s.
          timeout: Seconds a sample or add waits for the rate limiter before `TimeoutError`; None:
            forever.
          seed: Seed of the draws (each segment's, and the choice of segments).
          name: The actor's name in the cluster (namespace "tfbuffers"), for `connect`; default a
            new unique one.
          address: A Ray cluster to connect to, if this process is not connected yet.
          prefetch_items: About how many windows `as_dataset` fetches in one remote call (whole
            batches, at least one, at most `PREFETCH_BYTES` of them: `fetch_batches`); None:
            `PREFETCH_ITEMS[sampler]`, 8192 uniform, 512 prioritized. The actor weighs and reads each
            segment once per call, so larger fetches sample faster; a fetched window is drawn from the
            buffer as it was then (prioritized: from the priorities of then, so fewer are fetched).

        Raises:
          ImportError: If Ray cannot be imported.
          TypeError, ValueError: If an argument has the wrong type or is out of range, naming it.
        """
        from tfbuffers.py_uniform_replay_buffer import PyUniformReplayBuffer, segment_sizes

        batch_size, max_length = segment_sizes(capacity, batch_size, max_length)
        sampler = check_sampler(sampler)
        priority_exponent = prioritized.check_exponent(priority_exponent)
        min_size_to_sample = optional_positive_int("min_size_to_sample", min_size_to_sample)
        ratio = check_ratio(min_size_to_sample or 1, samples_per_insert, error_buffer)
        if ratio is not None and min_size_to_sample is None:
            min_size_to_sample = 1
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0):
            raise ValueError(f"timeout: expected a number of seconds > 0 or None, got {timeout!r}")
        if name is not None and (not isinstance(name, str) or not name):
            raise TypeError(f"name: expected a non-empty string or None, got {name!r}")
        prefetch_items = optional_positive_int("prefetch_items", prefetch_items)
        source: _Source | None = directory if isinstance(directory, _Source) else None  # from open() or load()
        if source is not None:
            directory = source.directory
        if directory is not None and (source is None or source.kind == "load"):
            directory = pathlib.Path(directory).absolute()
            if directory.exists() and any(directory.iterdir()):
                raise ValueError(
                    f"directory: expected a new or empty directory, got {str(directory)!r}, which holds files "
                    "(RayReplayBuffer.open reopens a buffer's directory)"
                )
        # The segments' options checked here, by a buffer of one frame in RAM: refused before an actor starts.
        probe = PyUniformReplayBuffer(
            data_spec, batch_size=1, max_length=1, episode_boundaries=episode_boundaries, frame_stacks=frame_stacks
        )
        probe.close()
        config = {
            "data_spec": specs.unwrap(data_spec),
            "batch_size": batch_size,
            "max_length": max_length,
            "sampler": sampler,
            "priority_exponent": priority_exponent,
            "episode_boundaries": episode_boundaries,
            "frame_stacks": frame_stacks,
            "directory": None if directory is None else str(directory),
            "min_size_to_sample": min_size_to_sample,
            "ratio": ratio,
            "seed": seed,
            "name": name or f"buffer-{uuid.uuid4().hex[:12]}",
            "source": None if source is None else [source.kind, str(source.path)],
        }
        ray = ensure_ray(address)
        actor = _actor_class(ray).options(name=config["name"], namespace=NAMESPACE).remote(config)
        try:
            ray.get(actor.ping.remote())  # the constructor's errors (a bad spec or option) raised here
        except Exception as error:
            ray.kill(actor)
            raise _cause(error) from None
        self._attach(actor, config, owner=True, timeout=timeout, prefetch_items=prefetch_items)

    @tf.__internal__.tracking.no_automatic_dependency_tracking
    def _attach(
        self, actor: Any, config: dict[str, Any], *, owner: bool, timeout: Any, prefetch_items: int | None
    ) -> None:
        super().__init__(config["data_spec"], config["batch_size"] * config["max_length"])
        self._actor = actor
        self._config = config
        self._owner = owner
        self._timeout = timeout
        self._prefetch_items = prefetch_items

    @classmethod
    def connect(
        cls,
        name: str,
        *,
        data_spec: Any = None,
        address: str | None = None,
        timeout: float | None = 60.0,
        prefetch_items: int | None = None,
    ) -> RayReplayBuffer:
        """A handle on the buffer named `name` in the cluster (another driver's): it shares its frames.

        Closing it closes only the handle; the buffer lives as long as the handle that made it.

        Args:
          name: The buffer's `name`.
          data_spec: The frames the caller will add or expects to sample; a buffer holding others (a field
            missing, extra, or of another dtype or shape) is refused naming each such field. None: the
            buffer's own spec, unchecked.
          address: A Ray cluster to connect to, if this process is not connected yet.
          timeout: As in the constructor, for this handle.
          prefetch_items: As in the constructor, for this handle's datasets.

        Raises:
          ValueError: If no buffer of that name is in the cluster, or it holds other frames than `data_spec`.
        """
        prefetch_items = optional_positive_int("prefetch_items", prefetch_items)
        wanted = None if data_spec is None else specs.flatten_spec(data_spec)  # a bad spec refused before connecting
        ray = ensure_ray(address)
        try:
            actor = ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            raise ValueError(
                NO_ACTOR.format(name=name, namespace=NAMESPACE, address=ray.get_runtime_context().gcs_address)
            ) from None
        config = ray.get(actor.config.remote())
        if wanted is not None:
            differences = state_lib.field_differences(
                state_lib.field_list(specs.flatten_spec(config["data_spec"])),
                state_lib.field_list(wanted),
                extra="{path} is not in the data_spec given",
                missing="{path} is missing",
                differs="{path} holds {received}, the data_spec given {expected}",
            )
            if differences:
                raise ValueError(OTHER_FRAMES.format(name=name, differences="; ".join(differences)))
        return cls._handle(actor, config, owner=False, timeout=timeout, prefetch=prefetch_items)

    @classmethod
    def _handle(
        cls, actor: Any, config: dict[str, Any], *, owner: bool, timeout: Any, prefetch: int | None = None
    ) -> Any:
        buffer = cls.__new__(cls)
        cls._attach(buffer, actor, config, owner=owner, timeout=timeout, prefetch_items=prefetch)
        return buffer

    def __reduce__(self) -> Any:
        # A handle elsewhere (a Ray task or actor) shares the actor; only the handle that made it ends it.
        return (self._unpickled, (self._actor, self._config, self._timeout, self._prefetch_items))

    @classmethod
    def _unpickled(cls, actor: Any, config: dict[str, Any], timeout: Any, prefetch: int | None) -> RayReplayBuffer:
        return cls._handle(actor, config, owner=False, timeout=timeout, prefetch=prefetch)

    @classmethod
    def load(cls, path: str | os.PathLike, **overrides: Any) -> RayReplayBuffer:
        """A new buffer holding what `save(path)` wrote: its configuration and every segment's frames.

        `overrides` go to the constructor (`directory=`, `name=`, `seed=`, `timeout=`, ...). The actor
        reads the files: `path` is on its machine.

        Raises:
          FileNotFoundError: If `path` holds no buffer saved by `save`.
          ValueError: If a file is damaged or of another format (see `tfbuffers.files`).
        """
        path = pathlib.Path(path).absolute()
        spec, arguments = read_manifest(path)
        directory = overrides.pop("directory", None)
        mapped = None if directory is None else pathlib.Path(directory).absolute()
        return cls(spec, **{**arguments, **overrides, "directory": _Source("load", path, mapped)})

    @classmethod
    def open(cls, directory: str | os.PathLike, **overrides: Any) -> RayReplayBuffer:
        """The buffer kept under `directory` (made with `directory=`) in a new actor, after the last one died.

        It holds every add that returned (`tfbuffers.memmap`: each segment's directory is reopened).
        `overrides`: `name=`, `seed=`, `timeout=`, `address=`, `prefetch_items=`.

        Raises:
          FileNotFoundError: If `directory` holds no RayReplayBuffer.
          tfbuffers.memmap.DirectoryInUseError: If an actor still holds it open.
        """
        directory = pathlib.Path(directory).absolute()
        spec, arguments = read_manifest(directory)
        return cls(spec, **{**arguments, **overrides, "directory": _Source("open", directory, directory)})

    # Properties.

    @property
    def name(self) -> str:
        """The actor's name in the cluster (namespace "tfbuffers"), for `connect`."""
        return self._config["name"]

    @property
    def batch_size(self) -> int:
        """The number of segments: the leading dimension of `add_batch`."""
        return self._config["batch_size"]

    @property
    def max_length(self) -> int:
        """Frames per segment."""
        return self._config["max_length"]

    @property
    def sampler(self) -> str:
        """The sampler: "uniform" or "prioritized"."""
        return self._config["sampler"]

    @property
    def prioritized(self) -> bool:
        """Whether the buffer samples by priority (`sampler="prioritized"`)."""
        return self._config["sampler"] == "prioritized"

    @property
    def directory(self) -> pathlib.Path | None:
        """Where the segments are memory-mapped (`directory=`), or None in RAM."""
        directory = self._config["directory"]
        return None if directory is None else pathlib.Path(directory)

    @property
    def actor(self) -> Any:
        """The Ray actor handle hosting the frames."""
        return self._actor

    # The remote calls.

    def _remote(self, method: str, *args: Any) -> Any:
        return call(self._actor, method, *args)

    @property
    def timeout(self) -> float | None:
        """Seconds a sample or add waits for the rate limiter before `TimeoutError` (None: forever)."""
        return self._timeout

    def _add_batch_outer_dims(self) -> tuple[int, ...]:
        return (self.batch_size,)

    def _max_num_steps(self) -> int:
        return self.max_length

    def _num_frames(self) -> Any:
        return host.now_or_when_run(self._num_frames_value)

    def _num_frames_value(self) -> np.int64:
        self._check_open()
        return np.int64(self._remote("num_frames"))

    def frames_per_segment(self) -> list[int]:
        """How many frames each segment holds (writers fill theirs at their own pace)."""
        self._check_open()
        return list(self._remote("frames_per_segment"))

    def _add_batch(self, leaves: list[Any], deferred: list[specs.DeferredShapeCheck]) -> Any:
        if not tf.executing_eagerly():
            return host.add_when_run(self._add_arrays, leaves, self.batch_size)
        return self._add_leaves(host.arrays(leaves))

    def _add_arrays(self, *arrays: np.ndarray) -> np.ndarray:
        return self._add_leaves(list(arrays))

    def _add_leaves(self, arrays: list[np.ndarray]) -> np.ndarray:
        self._check_open()
        return self._remote("add", list(range(self.batch_size)), arrays, self._timeout)

    def _sample_arrays(
        self, sample_batch_size: int | None, num_steps: int | None
    ) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        self._check_open()
        try:
            return split_samples(
                self._remote("sample", sample_batch_size, num_steps, 1, self._timeout), sample_batch_size
            )[0]
        except ValueError as error:  # sampling an empty buffer: as the local buffers refuse it
            raise tf.errors.InvalidArgumentError(None, None, str(error)) from None

    def _get_next(self, sample_batch_size: Any, num_steps: int | None) -> tuple[Any, BufferInfo]:
        if tf.executing_eagerly():
            leaves, ids, probabilities = self._sample_arrays(sample_batch_size, num_steps)
        else:
            leaves, ids, probabilities = host.sample(self._sample_arrays, self._fields, sample_batch_size, num_steps)
        return self._pack(leaves), BufferInfo(ids, probabilities)

    def _as_dataset(
        self, sample_batch_size: int | None, num_steps: int | None, num_parallel_calls: int | None
    ) -> tf.data.Dataset:
        items = self._prefetch_items or PREFETCH_ITEMS[self.sampler]
        batches = fetch_batches(self._fields, sample_batch_size, num_steps, items)
        fetch = _Prefetch(self, (sample_batch_size, num_steps, batches, self._timeout))

        def element(_: Any) -> tuple[Any, BufferInfo]:
            leaves, ids, probabilities = host.sample(fetch.next, self._fields, sample_batch_size, num_steps)
            return self._pack_for_dataset(leaves), BufferInfo(ids, probabilities)

        dataset = tf.data.Dataset.from_tensors(np.int64(0)).repeat().map(element, num_parallel_calls=num_parallel_calls)
        return keep_alive(dataset, (self, fetch))

    def _single_deterministic_pass_dataset(
        self, sample_batch_size: int | None, num_steps: int | None, num_parallel_calls: int | None
    ) -> tf.data.Dataset:
        raise ValueError(NO_PASS)

    def _gather_all(self) -> Any:
        if tf.executing_eagerly():
            return self._pack(self._gather_all_arrays())
        dtypes = [field.spec.dtype for field in self._fields]
        shapes = [tf.TensorShape([self.batch_size, None]).concatenate(field.spec.shape) for field in self._fields]
        return self._pack(host.call(self._gather_all_arrays, [], dtypes, shapes))

    def _gather_all_arrays(self) -> list[np.ndarray]:
        self._check_open()
        return self._remote("gather_all")

    def gather_segment(self, segment: int) -> Any:
        """Every frame segment `segment` holds, oldest first (`[frames, ...]` leaves); eager only."""
        self._check_open()
        if isinstance(segment, bool) or not isinstance(segment, int | np.integer) or not 0 <= segment < self.batch_size:
            raise ValueError(f"segment: expected an int in [0, {self.batch_size}), got {segment!r}")
        return self._pack(self._remote("gather_segment", int(segment)))

    def _clear(self) -> None:
        host.now_or_when_run(self._clear_value)

    def _clear_value(self) -> np.int64:
        self._check_open()
        self._remote("clear")
        return np.int64(0)

    def update_priorities(self, ids: Any, priorities: Any) -> Any:
        """Sets the priorities of the frames `ids` (as `BufferInfo.ids` gives them; a window's first id).

        As `PyPrioritizedReplayBuffer.update_priorities`: ids overwritten since they were sampled are
        skipped and counted in the return value; an id never stored (in its segment) or a priority that is
        negative, NaN or infinite is refused, naming it, before any priority changes.
        """
        self._check_open()
        if not self.prioritized:
            raise ValueError(NOT_PRIORITIZED)
        if not tf.executing_eagerly():
            inputs = [tf.convert_to_tensor(ids), tf.convert_to_tensor(priorities, tf.float64)]
            return host.call(self._update_value, inputs, tf.int64, [])
        return int(self._update_value(np.asarray(ids), np.asarray(priorities)))

    def _update_value(self, ids: np.ndarray, priorities: np.ndarray) -> np.int64:
        self._check_open()
        return np.int64(self._remote("update_priorities", ids, priorities))

    def flush(self) -> None:
        """Writes every memory-mapped segment back to the disk (`msync`); nothing to do in RAM."""
        self._check_open()
        self._remote("flush")

    def save(self, path: str | os.PathLike) -> pathlib.Path:
        """Writes every segment's file (`tfbuffers.files`) and the buffer's configuration under the directory `path`.

        The actor writes them: `path` is on the actor's machine. `RayReplayBuffer.load(path)` reads them.
        """
        self._check_open()
        return pathlib.Path(self._remote("save", str(pathlib.Path(path).absolute())))

    def writer(self, num_envs: int) -> RayWriter:
        """Claims `num_envs` free segments for this process: a `RayWriter` adds to them alone.

        Raises:
          ValueError: If fewer segments are free, naming how many are and who holds the others.
        """
        self._check_open()
        num_envs = positive_int("num_envs", num_envs)
        token = f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        return RayWriter(self, self._remote("claim", num_envs, token), token)

    def _close(self) -> None:
        ray = _import_ray()
        if self._owner and ray.is_initialized():
            with contextlib.suppress(Exception):
                ray.get(self._actor.close.remote())
            with contextlib.suppress(Exception):
                ray.kill(self._actor)


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
        self, buffer: RayReplayBuffer, claim: tuple[list[int], list[int]], token: str, max_pending: int = 64
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
        ray = _import_ray()
        if self._in_flight is not None:
            if not wait and not ray.wait([self._in_flight], timeout=0)[0]:
                return
            in_flight, self._in_flight = self._in_flight, None
            try:
                ray.get(in_flight)
            except ray.exceptions.RayTaskError as error:
                self._pending.clear()
                raise _cause(error) from None
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


class _Prefetch:
    """Samples for one dataset, fetched several batches a call, the next call already asked for while these are read.

    `arguments`: the actor's `sample` arguments, `(sample_batch_size, num_steps, batches, timeout)`.
    """

    def __init__(self, buffer: RayReplayBuffer, arguments: tuple[Any, ...]) -> None:
        self._buffer = weakref.ref(buffer)  # to refuse reads once it is closed; the dataset keeps it alive
        self._actor = buffer.actor
        self._arguments = arguments
        self._ready: deque[Any] = deque()
        self._pending: Any = None
        self._lock = threading.Lock()

    def next(self, sample_batch_size: int | None, num_steps: int | None) -> tuple[Any, ...]:
        """The next sample, `(leaves, ids, probabilities)` (`tfbuffers.host.sample`'s draw)."""
        ray = _import_ray()
        with self._lock:
            buffer = self._buffer()
            if buffer is None or buffer.closed:
                raise ValueError("RayReplayBuffer: the buffer is closed")
            while not self._ready:
                pending = self._pending or self._actor.sample.remote(*self._arguments)
                self._pending = None
                try:
                    self._ready.extend(split_samples(ray.get(pending), self._arguments[0]))
                except ray.exceptions.RayTaskError as error:
                    cause = _cause(error)
                    if isinstance(cause, ValueError):  # an empty buffer: refused as get_next refuses it
                        raise tf.errors.InvalidArgumentError(None, None, str(cause)) from None
                    raise cause from None
                self._pending = self._actor.sample.remote(*self._arguments)
            return self._ready.popleft()


def split_samples(
    drawn: tuple[list[np.ndarray], np.ndarray, np.ndarray], sample_batch_size: int | None
) -> list[tuple[list[np.ndarray], np.ndarray, np.ndarray]]:
    """`RayHost.sample`'s stacked windows as its samples: batches of `sample_batch_size`, or single windows."""
    leaves, ids, probabilities = drawn
    if sample_batch_size is None:
        return [([leaf[i] for leaf in leaves], ids[i], probabilities[i]) for i in range(len(ids))]
    return [
        ([leaf[start : start + sample_batch_size] for leaf in leaves], ids[start : start + sample_batch_size],
         probabilities[start : start + sample_batch_size])
        for start in range(0, len(ids), sample_batch_size)
    ]  # fmt: skip


def fetch_batches(fields: Sequence[Any], sample_batch_size: int | None, num_steps: int | None, items: int) -> int:
    """How many batches one of `as_dataset`'s remote calls fetches.

    `items // sample_batch_size` (whole batches of windows), at most `PREFETCH_BYTES` of frames of `fields` (the
    flat data spec), at least one.
    """
    window = (num_steps or 1) * sum(int(np.prod(f.spec.shape)) * f.spec.dtype.size for f in fields)
    batch = sample_batch_size or 1
    return max(1, min(items // batch, PREFETCH_BYTES // (batch * window)))


def call(actor: Any, method: str, *args: Any) -> Any:
    """`actor.method(*args)`, waited for; an exception the actor raised is raised as it was raised there."""
    ray = _import_ray()
    try:
        return ray.get(getattr(actor, method).remote(*args))
    except ray.exceptions.RayTaskError as error:
        raise _cause(error) from None


def _cause(error: BaseException) -> BaseException:
    """The exception a remote call raised, as it was raised in the actor (Ray wraps it)."""
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, BaseException) else error


class _Source(NamedTuple):
    """`directory=` as `RayReplayBuffer.open` and `load` pass it: segments reopened or loaded, not made empty."""

    kind: str  # "open" or "load"
    path: pathlib.Path  # the directory to reopen, or the one `save` wrote
    directory: pathlib.Path | None  # where the segments are memory-mapped


def write_manifest(directory: pathlib.Path, config: dict[str, Any]) -> None:
    """`ray_buffer.json` under `directory`: the buffer's configuration, for `load` and `open`."""
    manifest = {key: value for key, value in config.items() if key not in ("data_spec", "directory", "source")}
    manifest.update(format=MANIFEST_FORMAT, spec=specs.spec_to_json(config["data_spec"]))
    directory.mkdir(parents=True, exist_ok=True)
    temporary = directory / f".{MANIFEST}.{os.getpid()}"
    temporary.write_text(json.dumps(manifest, indent=1))
    temporary.replace(directory / MANIFEST)


def read_manifest(directory: pathlib.Path) -> tuple[Any, dict[str, Any]]:
    """The data spec and the constructor's arguments `write_manifest` wrote under `directory`."""
    path = directory / MANIFEST
    if not path.exists():
        raise FileNotFoundError(f"{path}: no RayReplayBuffer here (RayReplayBuffer.save or directory= write it)")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"{path}: format: expected {MANIFEST_FORMAT}, got {manifest.get('format')!r}")
    return specs.spec_from_json(manifest["spec"]), _arguments(manifest)


def _arguments(manifest: dict[str, Any]) -> dict[str, Any]:
    ratio = manifest.get("ratio")
    return {
        "batch_size": manifest["batch_size"],
        "max_length": manifest["max_length"],
        "sampler": manifest["sampler"],
        "priority_exponent": manifest["priority_exponent"],
        "episode_boundaries": manifest["episode_boundaries"],
        "frame_stacks": manifest["frame_stacks"],
        "min_size_to_sample": manifest["min_size_to_sample"],
        "samples_per_insert": None if ratio is None else ratio[0],
        "error_buffer": None if ratio is None else ratio[1],
        "seed": manifest["seed"],
    }


_ACTOR_CLASS: Any = None


def _actor_class(ray: Any) -> Any:
    """`RayHost` as a Ray actor class: threads for waits, no CPU held (it sleeps between calls)."""
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        _ACTOR_CLASS = ray.remote(num_cpus=0, max_concurrency=16)(RayHost)
    return _ACTOR_CLASS


__all__ = ["RateLimiter", "RayHost", "RayReplayBuffer", "RayWriter", "ensure_ray", "listening", "ray_processes"]
