"""`PyUniformReplayBuffer`: numpy storage with the TF buffer's layout and API."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tfbuffers import _blocks, _ring, sampling, specs
from tfbuffers import state as state_lib
from tfbuffers.buffers._segmented import SegmentedReplayBuffer
from tfbuffers.execution import host
from tfbuffers.execution._states import HostStates
from tfbuffers.replay_buffer import (
    FRAMES_GONE,
    optional_positive_int,
    positive_int,
    weak_method,
)
from tfbuffers.storage import Storage, StorageFactory, memmap
from tfbuffers.storage import make as make_storage

_OPS = _ring.NUMPY

NO_SIZE = "capacity or max_length: expected at least one, got neither"
CAPACITY_NOT_DIVISIBLE = "capacity: expected a multiple of batch_size={batch_size}, got {capacity}"
CAPACITY_MISMATCH = "capacity: expected batch_size * max_length = {expected}, got {capacity}"
OTHER_CLASS = (
    "{header}: buffer: expected {expected} (what {expected}.open opens), got {received}; tfbuffers.open opens any"
)


def segment_sizes(capacity: Any, batch_size: Any, max_length: Any) -> tuple[int, int]:
    """`(batch_size, max_length)` from a py buffer's `capacity`, `batch_size` and `max_length` arguments, checked.

    `max_length` defaults to `capacity // batch_size`; `capacity` alone means one segment.

    Raises:
      TypeError: If neither `capacity` nor `max_length` is given, or one is not an int.
      ValueError: If one is not positive, or `capacity` is not `batch_size * max_length`.
    """
    batch_size = positive_int("batch_size", batch_size)
    capacity = optional_positive_int("capacity", capacity)
    max_length = optional_positive_int("max_length", max_length)
    if max_length is None:
        if capacity is None:
            raise TypeError(NO_SIZE)
        if capacity % batch_size:
            raise ValueError(CAPACITY_NOT_DIVISIBLE.format(batch_size=batch_size, capacity=capacity))
        max_length = capacity // batch_size
    elif capacity is not None and capacity != batch_size * max_length:
        raise ValueError(CAPACITY_MISMATCH.format(expected=batch_size * max_length, capacity=capacity))
    return batch_size, max_length


class PyUniformReplayBuffer(host.HostExecution, SegmentedReplayBuffer):
    """A numpy replay buffer with the TF buffer's layout, API and return conventions.

    Storage is the same as `TFUniformReplayBuffer`'s (`batch_size` segments of
    `max_length` frames, time-major, ids `add_number * batch_size + segment`),
    held in numpy arrays. Every `add_batch` is one array write per field, every
    sample one gather per field; adds and reads take a lock, so the buffer can
    be filled in one thread while `as_dataset` reads in tf.data's.

    Inside a graph (`tf.function`, a driver's loop, `tf.data`) every method runs
    when the graph runs, through `tf.numpy_function`, never at trace time: a
    `tf.function` that samples returns new samples on every call.

    Differences from `tf_agents.replay_buffers.PyUniformReplayBuffer`:

    * `get_next` returns `(items, BufferInfo)` like the TF buffer (TF-Agents'
      py buffer returns the items alone).
    * `add_batch` takes any leading batch size equal to `batch_size` (TF-Agents'
      takes only 1), checks it against the spec first, and returns the ids.
    * `num_frames`, the deterministic pass, `num_parallel_calls` and
      `sequence_preprocess_fn` work; `gather_all` returns only stored frames,
      oldest first; sampling an empty buffer raises instead of returning
      uninitialised memory.
    * It is checkpointed by `tf.train.Checkpoint`, contents and counter, fields
      matched by nest path (see `tfbuffers.state`).
    * `as_dataset` yields `(items, BufferInfo)` like `get_next` (TF-Agents' py
      buffer yields the items alone).

    `capacity` alone means one segment of `capacity` frames (TF-Agents' form).

    Example:
    >>> spec = {"obs": tf.TensorSpec([2], tf.float32), "step": tf.TensorSpec([], tf.int64)}
    >>> buffer = PyUniformReplayBuffer(spec, batch_size=2, max_length=3, seed=0)
    >>> for t in range(4):
    ...     _ = buffer.add_batch({"obs": np.full([2, 2], t, np.float32), "step": np.array([t, t])})
    >>> int(buffer.num_frames())
    6
    >>> buffer.gather_all()["step"].tolist()
    [[1, 2, 3], [1, 2, 3]]
    >>> items, info = buffer.get_next(sample_batch_size=4, num_steps=2)
    >>> items["obs"].shape, info.probabilities.tolist()
    ((4, 2, 2), [0.25, 0.25, 0.25, 0.25])
    """

    _HOST_READS = True

    def __init__(
        self,
        data_spec: Any,
        capacity: int | None = None,
        *,
        batch_size: int = 1,
        max_length: int | None = None,
        seed: int | None = None,
        dataset_drop_remainder: bool = False,
        dataset_window_shift: int | None = None,
        stateful_dataset: bool = False,
        episode_boundaries: bool | str = False,
        frame_stacks: str | Sequence[str] | Mapping[str, int] | None = None,
        storage: StorageFactory | None = None,
        sampler: sampling.SamplerFactory | str | None = None,
        directory: str | os.PathLike | None = None,
    ) -> None:
        """Creates the buffer and allocates its arrays.

        Args:
          data_spec: A nest of `ArraySpec` or `tf.TensorSpec` describing one item.
          capacity: Total frames held. Alone, it means one segment.
          batch_size: Number of segments: the leading dimension of `add_batch`.
          max_length: Frames per segment; default `capacity // batch_size`.
          seed: Seed of the sampler's `numpy.random.Generator`.
          dataset_drop_remainder: As in `TFUniformReplayBuffer`.
          dataset_window_shift: As in `TFUniformReplayBuffer`.
          stateful_dataset: Accepted for TF-Agents compatibility; ignored.
          episode_boundaries: As in `TFUniformReplayBuffer`.
          frame_stacks: Fields of stacked frames (Atari's `uint8[84, 84, 4]`) to store
            each distinct frame of once (`tfbuffers.storage.frames`): a nest path (stacked
            along the last axis), a list of paths, or a dict of path to stacking axis.
            Samples, `gather_all`, states, checkpoints and files are exactly those of
            the plain buffer on the same adds; a stacked observation then takes about
            one frame of memory instead of `depth` (plus 8 bytes per frame of each row).
            Frames are matched by their bytes, never by hash alone.
          storage: Where the rows live: `(fields, num_rows) -> tfbuffers.storage.Storage`
            (a `Storage` subclass, or `tfbuffers.storage.memmap.MemmapStorage(directory)`, for example);
            numpy arrays in RAM by default. With `frame_stacks`, the stacks wrap it: it holds their
            handles, and each distinct frame is kept once (memory-mapped files keep the frames in a
            pool file beside the rows). Files do not record it: pass it again to `load` (where it
            replaces the frame stacks a file records).
          sampler: Which windows a sample draws: `(buffer_name, batch_size, max_length) ->
            tfbuffers.sampling.Sampler` (a `Sampler` subclass, for example); uniform over the
            stored windows by default (`UniformSampler`, also by its name "uniform"; the names are
            `tfbuffers.sampling.NAMES`, as the Ray buffer and the manager take them). Files do not
            record it: pass it again to `load` and `open`.
          directory: Keep the rows, the counter and the extras in memory-mapped files under this
            directory (`tfbuffers.storage.memmap`), new or empty: the buffer may be larger than RAM, and
            outlives the process (`flush()`, `close()`; reopened with `tfbuffers.open(directory)`).
            Samples, probabilities and `gather_all` are exactly those of the buffer in RAM. The
            shorthand of `storage=tfbuffers.storage.memmap.MemmapStorage(directory)`, so not with `storage`;
            with `frame_stacks`, each distinct frame is stored once on the disk too.

        Raises:
          TypeError: If an argument has the wrong type, or neither `capacity`
            nor `max_length` is given.
          ValueError: If an argument is out of range, `capacity` is not
            `batch_size * max_length`, or the spec is invalid.
        """
        batch_size, max_length = segment_sizes(capacity, batch_size, max_length)
        super().__init__(
            data_spec,
            batch_size,
            max_length,
            dataset_drop_remainder=dataset_drop_remainder,
            dataset_window_shift=dataset_window_shift,
            stateful_dataset=stateful_dataset,
            episode_boundaries=episode_boundaries,
            sampler=sampler,
        )
        self._lock = threading.Lock()
        self._frame_stacks = frame_stacks
        if directory is not None:  # the shorthand of storage=MemmapStorage(directory)
            if storage is not None:
                raise ValueError(memmap.STORAGE_AND_DIRECTORY)
            storage = memmap.MemmapStorage(directory)
        self._table = make_storage(storage, self._fields, self.capacity, frame_stacks)
        self._table.attach(self._batch_size, self._max_length)
        self._rng = np.random.default_rng(seed)
        self._backend = sampling.numpy_backend(self._rng)
        self._segments = np.arange(self._batch_size, dtype=np.int64)
        # The buffer's methods held weakly: the parts it holds do not hold it (no reference cycle).
        self._states = HostStates(
            self._table,
            self._max_length,
            weak_method(self._extras_locked),
            lock=self._lock,
            check_open=weak_method(self._check_open),
            cleared=weak_method(self._sampler_cleared),
        )
        # The sampler's state (the record of episode ends, priorities) in the storage's extras.
        self._bind_sampler(self._table, self._backend)
        self._built()

    def _built(self) -> None:
        """The buffer is whole: its storage is told (`Storage.ready`); one that held a buffer is rebuilt from."""
        table = self._table
        try:
            recovery = table.ready(type(self).__name__, self._data_spec, self.constructor_options)
            if recovery.reopened:  # what derives from the rows and priorities: the sampler's state
                with self._lock:
                    self._sampler.on_restore(table.added, self._step_column(), self._sampler.state_extras())
            if recovery.reopened and recovery.clearing:  # a clear was cut short: finished
                self._clear_value()
        except BaseException:
            table.close()
            raise

    @classmethod
    def open(
        cls, directory: str | os.PathLike, *, seed: int | None = None, sampler: sampling.SamplerFactory | None = None
    ) -> Any:
        """The buffer kept in `directory` (made with `directory=`), reopened for writing (`storage.memmap`).

        Its class, data spec, sizes and options are read from the directory's header; its frames are not
        read (the kernel maps them as they are sampled). What is derived from them is rebuilt: a
        prioritized buffer's sum tree and an episode-aware buffer's record of episode ends, one pass
        over the priorities and the step types. After the process that wrote it was killed, it holds
        exactly the adds that returned.

        Args:
          directory: The buffer's directory.
          seed: Seed of the sampler's generator (not kept in the directory).
          sampler: The `sampler=` the buffer was made with, if not the default (a directory records no
            code, as a file does not: `load` takes it too). Its state is rebuilt as a restore's is.

        Raises:
          FileNotFoundError: If `directory` holds no buffer header.
          ValueError: Naming the file and what differs, if the header is of another version or
            class, or a file does not match it; naming the directory, if a restore into it was cut
            short. Nothing is changed on the disk then.
          tfbuffers.storage.memmap.DirectoryInUseError: If another process holds it open, naming that process.
        """
        header = memmap.Header(directory)
        if header.buffer != cls.__name__:
            raise ValueError(OTHER_CLASS.format(header=header.path, expected=cls.__name__, received=header.buffer))
        options: dict[str, Any] = {} if sampler is None else {"sampler": sampler}
        storage = memmap.MemmapStorage(directory, reopen=True)
        return cls(header.data_spec, **header.arguments(), **options, seed=seed, storage=storage)

    @property
    def directory(self) -> Any:
        """The directory of the storage's files (`directory=`, `MemmapStorage`: a `pathlib.Path`), or None in RAM."""
        return getattr(self._table, "directory", None)

    def flush(self) -> None:
        """Writes every stored frame back to the disk (`msync`): a memory-mapped buffer's adds survive a machine crash.

        Nothing to do for a buffer in RAM. Eagerly it runs now; inside a graph, when the graph runs.
        """
        host.now_or_when_run(self._flush_value)

    def _flush_value(self) -> np.int64:
        with self._lock:
            self._check_open()
            self._table.flush()
        return np.int64(0)

    def _num_frames_value(self) -> np.int64:
        with self._lock:
            self._check_open()
            return np.int64(self._frames_of(self._table.added))

    def _add_value(self, arrays: list[np.ndarray]) -> np.ndarray:
        with self._lock:
            added, sampler = self._table.added, self._sampler
            if sampler.watches_adds:
                sampler.before_add(added, arrays[self._step_field] if self._episodes else None)
            first_row = _ring.block_start(added, self._max_length, self._batch_size)
            self._table.write_block(first_row, arrays)
            if sampler.watches_adds:
                sampler.on_add(added, slice(first_row, first_row + self._batch_size))
            self._table.added = added + 1  # last: the add's commit (tfbuffers.storage.memmap)
            self._stored_locked(added, 1)
        return added * self._batch_size + self._segments

    def _extend_value(self, arrays: list[np.ndarray], frames: int) -> np.ndarray:
        with self._lock:  # runs of adds, each written as one block and committed (`tfbuffers._blocks.write_runs`)
            self._check_open()
            types = arrays[self._step_field] if self._episodes else None
            added = _blocks.write_runs(self._table, self._sampler, arrays, self._max_length, types, self._stored_locked)
        return _ring.block_ids(_ring.NUMPY, added, frames, self._batch_size)

    def sample_arrays(
        self, sample_batch_size: int | None, num_steps: int | None
    ) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        """`get_next` as flat numpy arrays, `(leaves, ids, probabilities)`, for a caller that joins many buffers' draws.

        The leaves in `tf.nest.flatten` order (`tfbuffers.ray_replay_buffer` draws each segment's share this way).
        """
        return self._sample_arrays(sample_batch_size, num_steps)

    def _sample_arrays(
        self, sample_batch_size: int | None, num_steps: int | None
    ) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        with self._lock:
            self._check_open()  # a dataset may outlive the buffer's storage
            sample = self._sampler.sample(self._backend, self._table.added, sample_batch_size, num_steps)
            leaves = self._table.read(sample.rows)
        return leaves, np.asarray(sample.ids), sample.probabilities

    def _gather_arrays(self, ids: np.ndarray, fields: Sequence[int] | None = None) -> list[np.ndarray]:
        with self._lock:
            self._check_open()
            if not _ring.are_stored(_OPS, ids, self._table.added, self._max_length, self._batch_size):
                raise ValueError(FRAMES_GONE)  # numpy_function raises it as InvalidArgumentError
            return self._table.read(self._rows(ids), fields)

    def _gather_indices(self, indices: Any, fields: list[int]) -> list[Any]:
        if not tf.executing_eagerly():  # read when the graph runs, whatever the indices are
            indices = tf.cast(indices, tf.int64)
            inputs = [indices, tf.constant(fields, tf.int64)]
            return host.call(self._gather_indices_in_graph, inputs, *_leaf_types(self._fields, indices.shape, fields))
        indices = np.asarray(indices, np.int64)
        with self._lock:
            self._check_open()
            ids = self._checked_ids(_OPS, indices, self._table.added)
            return self._table.read(self._rows(ids), fields)

    def _gather_indices_in_graph(self, indices: np.ndarray, fields: np.ndarray) -> list[np.ndarray]:
        try:
            return self._gather_indices(indices, fields.tolist())
        except IndexError as error:  # numpy_function would raise it as OutOfRangeError: a dataset's end
            raise ValueError(str(error)) from None

    def _step_column(self) -> np.ndarray | None:
        """The stored step types (`[capacity]`) with episode boundaries, else None (under the lock)."""
        return self._table.column(self._step_field) if self._episodes else None

    @property
    def frame_stacks(self) -> str | Sequence[str] | Mapping[str, int] | None:
        """The constructor's `frame_stacks`: the fields whose stacked frames are stored once each."""
        return self._frame_stacks

    @property
    def storage(self) -> Storage:
        """Where the rows live (`storage=`, `frame_stacks=` or numpy arrays); the buffer's lock guards each use."""
        return self._table

    def _row_source(self) -> state_lib.Rows:
        return self._states.row_source()

    def _write_rows(self, field: int, first_row: int, rows: np.ndarray) -> None:
        self._states.write_rows(field, first_row, rows)

    def _gather_all_arrays(self) -> list[np.ndarray]:
        with self._lock:
            self._check_open()
            ids = _ring.chronological_ids(_OPS, self._table.added, self._max_length, self._batch_size)
            return self._table.read(self._rows(ids))

    def _clear_value(self) -> np.int64:
        self._states.clear()
        return np.int64(0)

    def _sampler_cleared(self) -> list[Any]:
        return self._sampler.on_clear()

    def _nbytes(self) -> int:
        with self._lock:
            # The rows, the counter and the extras (priorities and their tree, the record of episode ends).
            return self._table.nbytes() + np.dtype(np.int64).itemsize + self._table.extras_nbytes()

    def _close(self) -> None:
        with self._lock:
            self._table.close()
            self._sampler.close()

    def _snapshot(self) -> tuple[int, list[np.ndarray], dict[str, np.ndarray]]:
        return self._states.snapshot()

    def _restore(self, added: int, arrays: list[Any], extras: dict[str, np.ndarray]) -> None:
        self._states.restore(added, arrays, lambda: self._sampler.on_restore(added, self._step_column(), extras))

    def _extras_locked(self) -> dict[str, np.ndarray]:
        """Copies of the extra arrays of the state (see `state_template`): a prioritized buffer's priorities."""
        return self._sampler.state_extras()

    def _stored_locked(self, first: int, count: int) -> None:
        """Adds `first` to `first + count - 1` were just written (under the lock): for a subclass that logs."""

    # Tensor views for tf.data: one numpy_function call per element. TensorFlow keeps the functions given to
    # numpy_function in a global registry for as long as it pleases, so they reach the buffer through a weak
    # reference: a dropped buffer is freed. The datasets hold the buffer (`tfbuffers.replay_buffer.keep_alive`).

    def _added_value(self) -> np.int64:
        return np.int64(self._table.added)

    def _added_tensor(self) -> tf.Tensor:
        return host.call(self._added_value, [], tf.int64, [])

    def _gather_tensors(self, ids: tf.Tensor, fields: Sequence[int] | None = None) -> list[tf.Tensor]:
        chosen = list(range(len(self._fields))) if fields is None else list(fields)
        inputs = [ids, tf.constant(chosen, tf.int64)]
        return host.call(self._gather_field_arrays, inputs, *_leaf_types(self._fields, ids.shape, chosen))

    def _gather_field_arrays(self, ids: np.ndarray, fields: np.ndarray) -> list[np.ndarray]:
        return self._gather_arrays(ids, fields.tolist())

    def _sample_tensors(
        self, sample_batch_size: int | None, num_steps: int | None
    ) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]:
        return host.sample(self._sample_arrays, self._fields, sample_batch_size, num_steps)


def _leaf_types(
    fields: Sequence[specs.Field], outer: tf.TensorShape, chosen: Sequence[int] | None = None
) -> tuple[list[tf.DType], list[tf.TensorShape]]:
    """(dtypes, shapes) of the leaves of `chosen` (indices into `fields`; all if None) under `outer`."""
    picked = fields if chosen is None else [fields[i] for i in chosen]
    return [field.spec.dtype for field in picked], [outer.concatenate(field.spec.shape) for field in picked]
