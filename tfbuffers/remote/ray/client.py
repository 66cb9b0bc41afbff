"""`RayReplayBuffer`: the handle a driver, an actor or a learner holds on a buffer hosted by a Ray actor.

It checks arguments here, then calls the actor (`tfbuffers.remote.ray.actor.RayHost`) once per method, eagerly
or when a graph runs; `as_dataset` fetches several batches a call, ahead. `tfbuffers.ray_replay_buffer` says how
the segments, writers and samples fit together.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pathlib
from typing import Any

import numpy as np
import tensorflow as tf

from tfbuffers import specs
from tfbuffers.execution import host
from tfbuffers.remote.base import RemoteReplayBuffer
from tfbuffers.remote.options import optional_seconds
from tfbuffers.remote.ray.actor import started_actor
from tfbuffers.remote.ray.cluster import NAMESPACE, call, ensure_ray, import_ray
from tfbuffers.remote.ray.config import WRITER_LEASE, actor_config, found_actor
from tfbuffers.remote.ray.hosting import RayHosting
from tfbuffers.remote.ray.prefetch import PREFETCH_ITEMS, Prefetch, fetch_batches, split_samples
from tfbuffers.replay_buffer import BufferInfo, keep_alive, optional_positive_int
from tfbuffers.sampling import SamplerFactory

NO_PASS = (
    "single_deterministic_pass: not supported by RayReplayBuffer (its segments fill at their own pace); "
    "use gather_all() or gather_segment(segment)"
)


NOT_PRIORITIZED = (
    "update_priorities: the buffer samples uniformly (sampler={sampler!r}); make it with sampler='prioritized'"
)
NO_PRIORITIES = (
    "update_priorities: the buffer's sampler keeps no priorities (sampler={sampler!r}); make it with "
    "sampler='prioritized'"
)


class RayReplayBuffer(RayHosting, RemoteReplayBuffer):
    """A replay buffer hosted by a Ray actor: many processes (and machines) add, any samples.

    The frames live in one Ray actor, `capacity` of them shared by its `batch_size` segments, oldest
    out whichever holds them (`layout="elastic"`); or in `batch_size` rings of `max_length` frames
    (`layout="segments"`: a py buffer per segment); in RAM, or memory-mapped under `directory`.
    `add_batch` adds one frame to every segment, as the local buffers do; a process that adds its
    own environments' frames claims segments of its own with `writer(num_envs)`, and adds to those
    alone, at its own pace. Windows never leave a writer's stream (a segment, with segments; nor,
    with `episode_boundaries`, an episode), so frames of different writers never mix in a window;
    a writer that dies stops only its own segments.

    A sample draws among every stream's windows (elastic), or each segment with probability in
    proportion to the weight of the windows it can draw (their count, uniform; the sum of their
    first frames' `priority ** priority_exponent`, prioritized), then a window in it as its buffer
    does: the probabilities in `BufferInfo` are exact either way. Ids are `add_number * batch_size +
    segment`, `add_number` counted per segment (the local buffers' numbering when every segment has
    the same number of adds).

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
    graph runs (`tfbuffers.execution.host`). `as_dataset` fetches several batches per remote call, ahead.

    docs/guide.md ("Ray") and docs/scaling.md show it with writer processes; tests/remote/ray_replay_buffer_test.py runs
    them on a local cluster.
    """

    NO_PASS = NO_PASS
    NOT_PRIORITIZED, NO_PRIORITIES = NOT_PRIORITIZED, NO_PRIORITIES

    def __init__(
        self,
        data_spec: Any,
        capacity: int | None = None,
        *,
        batch_size: int = 1,
        max_length: int | None = None,
        sampler: SamplerFactory | str = "uniform",
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
        writer_lease: float | None = WRITER_LEASE,
        max_restarts: int = 0,
        actor_options: dict[str, Any] | None = None,
        checkpoint_dir: str | os.PathLike | None = None,
        checkpoint_frames: int | None = None,
        checkpoint_seconds: float | None = None,
        layout: str | None = None,
    ) -> None:
        """Creates the buffer's actor (and a local Ray cluster, if none is connected).

        Args:
          data_spec: A nest of `tf.TensorSpec` (or `ArraySpec`) describing one frame.
          capacity: Total frames held (`batch_size * max_length`).
          batch_size: Segments: the leading dimension of `add_batch`, and how many environments
            writers can claim in all.
          max_length: Frames per segment; default `capacity // batch_size`.
          sampler: "uniform", "prioritized" (`update_priorities` sets priorities), or any `sampler=` the
            local buffers take: a callable `(buffer_name, batch_size, max_length) -> Sampler`, pickled to the
            actor, where each segment samples with its own (`tfbuffers.sampling`). The actor weighs the
            segments by the sampler's `Sample.mass`. With `directory=` or `save`, the manifest records it by
            its import path: a module-level class or function.
          priority_exponent: Alpha, for the prioritized sampler.
          episode_boundaries: As in `PyUniformReplayBuffer`: windows never cross an episode.
          frame_stacks: As in `PyUniformReplayBuffer`.
          directory: Keep the frames memory-mapped under this directory (new or empty): the elastic
            store's files in `elastic/`, or one subdirectory per segment (`tfbuffers.storage.memmap`);
            `RayReplayBuffer.open(directory)` reopens it after the actor died, with every add that returned
            (the elastic layout's streams closed: a writer's next frames start a new one).
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
            `PREFETCH_ITEMS`, 8192 (512 prioritized). The actor weighs and reads each
            segment once per call, so larger fetches sample faster; a fetched window is drawn from the
            buffer as it was then (prioritized: from the priorities of then, so fewer are fetched).
          writer_lease: Seconds a writer's claim lasts without a renewal (its process renews it while it
            lives): a writer whose process died gives its segments up within that; None: never.
          max_restarts: With `directory=` or `checkpoint_dir=`: how many times Ray restarts the actor when
            its process dies (-1: without end). The restarted actor reopens the directory (every add that
            returned, and the rate limiter's counts) or loads its last checkpoint; calls wait for it
            (`RESTART_SECONDS`) and run again, writers resend what was in flight, datasets fetch on. The
            buffer's own `add_batch` in flight then raises.
          actor_options: Ray's options for the actor, to place it: `resources`, `scheduling_strategy`
            (a node of its own, with the memory), `runtime_env`, ...
          checkpoint_dir: A buffer in RAM (no `directory=`) writes a checkpoint under this directory (new
            or empty, on the actor's machine) every `checkpoint_frames` frames stored or `checkpoint_seconds`
            (default `CHECKPOINT_SECONDS`, 60, when neither is given; only when anything changed), and on
            `checkpoint()`: what `save` writes, with the rate limiter's counts, in `checkpoint-NNNNNNNN`,
            named by the file `LATEST`; the one before is deleted. An actor that Ray restarts
            (`max_restarts=`) loads the last one: the frames stored after it are lost, and counted
            (`checkpoint_report()["lost_frames"]`) as each writer's next add reaches its segments.
            `RayReplayBuffer.load(checkpoint_dir)` loads the last one in a new actor. Adds wait while
            a checkpoint is written (the actor's lock).
          checkpoint_frames: Frames stored between checkpoints; None: by time only.
          checkpoint_seconds: Seconds between checkpoints; None: by frames only.
          layout: "elastic": the segments share the buffer's `capacity`, oldest frames out across all of them,
            whatever the number of writers (`tfbuffers.remote.ray.elastic`); each claim of a segment starts
            a new stream, and windows never cross from one stream into another. "segments": each segment
            is a ring of `max_length` frames of its own (a segment no writer holds holds nothing). None:
            "elastic", but with `frame_stacks` or a sampler factory, which it does not take yet.

        Raises:
          ImportError: If Ray cannot be imported.
          TypeError, ValueError: If an argument has the wrong type or is out of range, naming it.
        """
        config = actor_config(
            data_spec, capacity, batch_size=batch_size, max_length=max_length, sampler=sampler,
            priority_exponent=priority_exponent, episode_boundaries=episode_boundaries, frame_stacks=frame_stacks,
            directory=directory, min_size_to_sample=min_size_to_sample, samples_per_insert=samples_per_insert,
            error_buffer=error_buffer, seed=seed, name=name, writer_lease=writer_lease, max_restarts=max_restarts,
            actor_options=actor_options, checkpoint_dir=checkpoint_dir, checkpoint_frames=checkpoint_frames,
            checkpoint_seconds=checkpoint_seconds, layout=layout,
        )  # fmt: skip
        timeout = optional_seconds("timeout", timeout)
        prefetch_items = optional_positive_int("prefetch_items", prefetch_items)
        actor = started_actor(ensure_ray(address), config, NAMESPACE)  # a bad spec or option raised here
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
        actor, config = found_actor(ensure_ray(address), name, wanted)
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
        handle = functools.partial(self._handle, owner=False, timeout=self._timeout, prefetch=self._prefetch_items)
        return (handle, (self._actor, self._config))

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
    def sampler(self) -> SamplerFactory | str:
        """The sampler, as given: "uniform", "prioritized" or a callable making one."""
        return self._config["sampler"]

    @property
    def directory(self) -> pathlib.Path | None:
        """Where the segments are memory-mapped (`directory=`), or None in RAM."""
        directory = self._config["directory"]
        return None if directory is None else pathlib.Path(directory)

    @property
    def layout(self) -> str:
        """How the frames are kept: "elastic" (one capacity every stream shares) or "segments" (a ring each)."""
        return self._config["layout"]

    @property
    def max_restarts(self) -> int:
        """How many times Ray restarts the actor when its process dies (-1: without end; 0: never)."""
        return int(self._config.get("max_restarts", 0))

    @property
    def actor(self) -> Any:
        """The Ray actor handle hosting the frames."""
        return self._actor

    # The remote calls.

    def _remote(self, method: str, *args: Any) -> Any:
        self._check_open()  # every call: a closed handle reaches no actor
        # A restarted actor takes every call again but the buffer's own add (it may have been stored already).
        restarts = bool(self._config.get("max_restarts")) and method not in ("add", "add_many")
        return call(self._actor, method, *args, restarts=restarts)

    @property
    def timeout(self) -> float | None:
        """Seconds a sample or add waits for the rate limiter before `TimeoutError` (None: forever)."""
        return self._timeout

    def _max_num_steps(self) -> int:
        return self.max_length

    def _num_frames_value(self) -> np.int64:
        return np.int64(self._remote("num_frames"))

    def rate_limiter_counts(self) -> dict[str, Any]:
        """The rate limiter's counts at one moment, and the bounds it keeps.

        `inserts` (frames), `samples` (windows), `frames` stored, and the bounds of
        `inserts * samples_per_insert - samples` (`min_diff`, `max_diff`; infinite without a ratio).
        Every insert keeps that difference at most `max_diff`, every sample at least `min_diff`
        (docs/scaling.md measures it with writers and a learner running).
        """
        return dict(self._remote("limiter_counts"))

    def frames_per_segment(self) -> list[int]:
        """How many frames each segment holds (writers fill theirs at their own pace)."""
        return list(self._remote("frames_per_segment"))

    def _add_value(self, arrays: list[np.ndarray]) -> np.ndarray:
        return self._remote("add", list(range(self.batch_size)), arrays, self._timeout)

    def _extend_value(self, arrays: list[np.ndarray], frames: int) -> np.ndarray:
        """A block in one call (`RayHost.add_many`; a limiter that holds some: one by one, a timeout says how many)."""
        if frames == 0:
            return np.zeros([self.batch_size, 0], np.int64)
        batches = [[np.ascontiguousarray(leaf[:, t]) for leaf in arrays] for t in range(frames)]
        ids = self._remote("add_many", list(range(self.batch_size)), batches, self._timeout)
        return np.ascontiguousarray(np.asarray(ids).T)

    def _sample_arrays(
        self, sample_batch_size: int | None, num_steps: int | None
    ) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        self._check_open()  # a closed handle: ValueError, not the empty buffer's error below
        try:
            return split_samples(
                self._remote("sample", sample_batch_size, num_steps, 1, self._timeout), sample_batch_size
            )[0]
        except ValueError as error:  # sampling an empty buffer: as the local buffers refuse it
            raise tf.errors.InvalidArgumentError(None, None, str(error)) from None

    def _as_dataset(
        self, sample_batch_size: int | None, num_steps: int | None, num_parallel_calls: int | None
    ) -> tf.data.Dataset:
        items = self._prefetch_items or PREFETCH_ITEMS["prioritized" if self.prioritized else "uniform"]
        batches = fetch_batches(self._fields, sample_batch_size, num_steps, items)
        fetch = Prefetch(self, (sample_batch_size, num_steps, batches, self._timeout))

        def element(_: Any) -> tuple[Any, BufferInfo]:
            leaves, ids, probabilities = host.sample(fetch.next, self._fields, sample_batch_size, num_steps)
            return self._pack_for_dataset(leaves), BufferInfo(ids, probabilities)

        dataset = tf.data.Dataset.from_tensors(np.int64(0)).repeat().map(element, num_parallel_calls=num_parallel_calls)
        return keep_alive(dataset, (self, fetch))

    def _gather_all_arrays(self) -> list[np.ndarray]:
        return self._remote("gather_all")

    def gather_segment(self, segment: int) -> Any:
        """Every frame segment `segment` holds, oldest first (`[frames, ...]` leaves); eager only."""
        self._check_open()
        if isinstance(segment, bool) or not isinstance(segment, int | np.integer) or not 0 <= segment < self.batch_size:
            raise ValueError(f"segment: expected an int in [0, {self.batch_size}), got {segment!r}")
        return self._pack(self._remote("gather_segment", int(segment)))

    def _clear_value(self) -> np.int64:
        self._remote("clear")
        return np.int64(0)

    def update_priorities(self, ids: Any, priorities: Any) -> Any:
        """Sets the priorities of the frames `ids` (as `BufferInfo.ids` gives them; a window's first id).

        As `PyPrioritizedReplayBuffer.update_priorities`: ids overwritten since they were sampled are
        skipped and counted in the return value; an id never stored (in its segment) or a priority that is
        negative, NaN or infinite is refused, naming it, before any priority changes.
        """
        return self._send_priorities(ids, priorities)

    def _update_value(self, ids: np.ndarray, priorities: np.ndarray) -> np.int64:
        return np.int64(self._remote("update_priorities", ids, priorities))

    def _close(self) -> None:
        ray = import_ray()
        if self._owner and ray.is_initialized():
            with contextlib.suppress(Exception):
                ray.get(self._actor.close.remote())
            with contextlib.suppress(Exception):
                ray.kill(self._actor)
