"""What the TF and numpy uniform buffers share: segments, options, the sampler's wiring and random access.

A segmented buffer keeps `batch_size` segments of `max_length` frames (see
`tfbuffers._ring` for the layout and the ids). Its subclasses are the execution
modes (graph ops on a `VariableStorage`, host numpy behind `tfbuffers.execution.host`): how
to write a block, gather rows, read the add counter and snapshot or replace the
contents. A `tfbuffers.sampling.Sampler` says which windows a sample draws; the
datasets are a part (`tfbuffers.buffers._datasets.SegmentedDatasets`) built on the
buffer's reads as tensors; states, files and configs are its layer
`tfbuffers.buffers._segmented_states.SegmentedStates`.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tfbuffers import _ring, sampling, specs
from tfbuffers import state as state_lib
from tfbuffers.buffers import _datasets
from tfbuffers.buffers._segmented_states import SegmentedStates
from tfbuffers.replay_buffer import (
    _not_converted,
    keep_alive,
    optional_positive_int,
    positive_int,
    weak_method,
)

NOT_A_BOOL = "{name}: expected a bool, got {received}"
INDEX_OUT_OF_RANGE = (
    "indices: expected values in [-{frames}, {frames}) ({frames} frames stored), got {value} at position {position}"
)
GRAPH_INDEX_OUT_OF_RANGE = "indices: expected values in [-frames, frames); (value, position, frames stored):"
UNKNOWN_FIELDS = "fields: expected paths among {expected}, got {received}"
NOT_AN_INTEGER_INDEX = "indices: expected integers, got dtype {received}"
STEP_TYPE_PATH = "step_type"
EPISODE_OPTION = (
    "episode_boundaries: expected False, True (the data spec's `step_type` field, as in a TF-Agents Trajectory) "
    "or the nest path of a step-type field among {paths}, got {received}"
)
EPISODE_FIELD = "episode_boundaries: field {path}: expected an integer scalar spec (step types), got {received}"


class SegmentedReplayBuffer(SegmentedStates):
    """A buffer of `batch_size` rings of `max_length` frames each."""

    _PRIORITIZED = False
    """Whether it draws by priority (a prioritized sampler, `update_priorities`): the prioritized presets'."""

    _HOST_READS: bool
    """Whether the buffer's reads are host calls (numpy behind `tfbuffers.execution.host`): then every dataset of it
    reads when asked (`tfbuffers.buffers._datasets.READ_WHEN_ASKED`)."""

    def __init__(
        self,
        data_spec: Any,
        batch_size: int,
        max_length: int,
        *,
        dataset_drop_remainder: bool = False,
        dataset_window_shift: int | None = None,
        stateful_dataset: bool = False,
        episode_boundaries: bool | str = False,
        sampler: sampling.SamplerFactory | str | None = None,
    ) -> None:
        batch_size = positive_int("batch_size", batch_size)
        max_length = positive_int("max_length", max_length)
        dataset_window_shift = optional_positive_int("dataset_window_shift", dataset_window_shift)
        for name, value in (("dataset_drop_remainder", dataset_drop_remainder), ("stateful_dataset", stateful_dataset)):
            if not isinstance(value, bool):
                raise TypeError(NOT_A_BOOL.format(name=name, received=f"{type(value).__name__} {value!r}"))
        super().__init__(data_spec, batch_size * max_length, stateful_dataset)
        self._batch_size = batch_size
        self._max_length = max_length
        self._dataset_drop_remainder = dataset_drop_remainder
        self._dataset_window_shift = dataset_window_shift
        self._episode_boundaries = episode_boundaries
        self._step_field: int = -1  # the step-type field's index, when `_episodes` (see `_step_type_field`)
        step_field = _step_type_field(self._fields, episode_boundaries)
        self._episodes = step_field is not None
        if step_field is not None:
            self._step_field = step_field
        self._use_sampler(
            sampling.make(sampler, type(self).__name__, batch_size, max_length, prioritized=self._PRIORITIZED)
        )
        self._datasets = _datasets.SegmentedDatasets(
            weak_method(self._dataset_reads),
            batch_size=batch_size,
            max_length=max_length,
            window_shift=dataset_window_shift,
            drop_remainder=dataset_drop_remainder,
            host_reads=self._HOST_READS,
        )
        # Tracked: `tf.train.Checkpoint` saves the buffer's state through it, by name.
        self._state_checkpoint = state_lib.StateCheckpoint(self)

    def _use_sampler(self, sampler: sampling.Sampler) -> None:
        """Samples with `sampler`, bound to the storage by the subclass (`_bind_sampler`)."""
        if self._episodes and not sampler.keeps_episode_boundaries:
            raise ValueError(sampling.NO_EPISODES.format(sampler=type(sampler).__name__))
        self._sampler = sampler

    def _bind_sampler(self, storage: Any, backend: sampling.Backend) -> None:
        """The sampler keeps its state in `storage` (`Sampler.bind`), told of the step-type field."""
        self._sampler.bind(storage, backend, self._step_field if self._episodes else None)

    def state_template(self) -> state_lib.BufferState:
        """A `BufferState` with this buffer's format, layout, fields, names and shapes, and no contents.

        Its arrays are zero-strided views: they take no memory. A prioritized buffer's is in the
        prioritized format, with the priorities as extras (its sampler's `state_template`).
        """
        return self._sampler.state_template(super().state_template())

    def _check_extras(self, extras: dict[str, np.ndarray], source: str) -> None:
        self._sampler.check_extras(extras, source)

    @property
    def prioritized(self) -> bool:
        """Whether the buffer samples by priority (its sampler's `prioritized`): then `update_priorities` sets them."""
        return self._sampler.prioritized

    @property
    def sampler(self) -> sampling.Sampler:
        """What draws the samples (`sampler=`; a `PrioritizedSampler` in the prioritized buffers)."""
        return self._sampler

    @property
    def dataset_drop_remainder(self) -> bool:
        """The constructor's `dataset_drop_remainder`: the deterministic pass leaves out partial batches and windows."""
        return self._dataset_drop_remainder

    @property
    def dataset_window_shift(self) -> int | None:
        """The constructor's `dataset_window_shift`: frames between the deterministic pass's window starts."""
        return self._dataset_window_shift

    @property
    def episode_boundaries(self) -> bool | str:
        """The constructor's `episode_boundaries`: False, True (the `step_type` field) or a field's path."""
        return self._episode_boundaries

    @property
    def batch_size(self) -> int:
        """The number of segments: the leading dimension `add_batch` expects."""
        return self._batch_size

    @property
    def max_length(self) -> int:
        """How many frames one segment holds."""
        return self._max_length

    def _add_batch_outer_dims(self) -> tuple[int, ...]:
        return (self._batch_size,)

    def _max_num_steps(self) -> int:
        return self._max_length

    def _ids_shape(self, sample_batch_size: Any, num_steps: int | None) -> list[Any]:
        """The static shape of a sample's ids: a tensor `sample_batch_size` (known when the graph runs) is None."""
        size = None if tf.is_tensor(sample_batch_size) else sample_batch_size
        return ([] if sample_batch_size is None else [size]) + ([] if num_steps is None else [num_steps])

    def _frames_of(self, added: int) -> int:
        return int(_ring.frames_per_segment(_ring.NUMPY, added, self._max_length)) * self._batch_size

    # Random access.

    @property
    def nbytes(self) -> int:
        """Bytes the buffer's storage takes (eager only; 0 once closed).

        Every field's rows (with `frame_stacks`, each distinct frame once and a handle per
        frame), the add counter, and what the buffer kind keeps beside them: priorities and
        their sum tree, the record of episode ends. Allocated at construction, so it depends
        on the capacity, not on the frames held, except for frame stacks, whose pool grows
        with the distinct frames stored.
        """
        return 0 if self.closed else self._nbytes()

    @_not_converted
    def sample_all(self) -> Any:
        """Every stored frame, `[num_frames, ...]`, oldest first: by id (add number, then segment).

        The frames of `gather_all()` with the segment axis flattened away; index `i`
        here is index `i` of `get_item` and `sample_by_index`.
        """
        gathered = self.gather_all()
        return tf.nest.map_structure(_time_major, gathered)

    @_not_converted
    def get_item(self, index: Any) -> Any:
        """The stored frame at `index` of `sample_all()` (negative counts from the newest), without a batch axis.

        Raises:
          IndexError: (eagerly; `InvalidArgumentError` inside a graph) If `index` is
            not in `[-num_frames, num_frames)`.
        """
        items = self.sample_by_index(tf.reshape(index, [1]) if tf.is_tensor(index) else [index])
        return tf.nest.map_structure(lambda x: x[0], items)

    @_not_converted
    def sample_by_index(self, indices: Any, fields: Sequence[str] | None = None) -> Any:
        """The stored frames at `indices` of `sample_all()`'s order, shaped `indices.shape + spec.shape`.

        Args:
          indices: Integers, any shape, each in `[-num_frames, num_frames)`
            (negative counts from the newest frame).
          fields: Nest paths (`"observation/pixels"`) to read, in this order; None reads all.

        Returns:
          The items as the data spec's nest, or, with `fields`, a dict from each path to its values.

        Raises:
          TypeError: If `indices` are not integers.
          ValueError: If a path in `fields` is not a field of the data spec.
          IndexError: (eagerly; `InvalidArgumentError` inside a graph) If an index is out of range.
        """
        self._check_open()
        paths = [field.path for field in self._fields]
        if fields is None:
            chosen = list(range(len(paths)))
        else:
            unknown = [path for path in fields if path not in paths]
            if unknown or isinstance(fields, str) or not fields:
                raise ValueError(UNKNOWN_FIELDS.format(expected=paths, received=repr(fields)))
            chosen = [paths.index(path) for path in fields]
        if tf.is_tensor(indices):
            if not indices.dtype.is_integer:
                raise TypeError(NOT_AN_INTEGER_INDEX.format(received=indices.dtype.name))
        else:
            indices = np.asarray(indices)
            if indices.dtype.kind not in "iu":
                raise TypeError(NOT_AN_INTEGER_INDEX.format(received=indices.dtype))
            indices = indices.astype(np.int64)
        leaves = self._gather_indices(indices, chosen)
        if fields is None:
            return self._pack(leaves)
        return dict(zip(fields, leaves))

    def _checked_ids(self, ops: _ring.Ops, indices: Any, added: Any) -> Any:
        """The ids of `sample_all()` indices, numpy (raising IndexError) or tensors (with an assertion)."""
        frames = _ring.frames_per_segment(ops, added, self._max_length) * self._batch_size
        first = _ring.oldest_add(ops, added, self._max_length) * self._batch_size
        if ops is _ring.NUMPY:
            bad = np.flatnonzero((indices < -frames) | (indices >= frames))
            if bad.size:
                position = int(bad[0])
                value = int(indices.ravel()[position])
                raise IndexError(INDEX_OUT_OF_RANGE.format(frames=frames, value=value, position=position))
            return first + np.where(indices < 0, indices + frames, indices)
        indices = tf.cast(indices, tf.int64)
        flat = tf.reshape(indices, [-1])
        bad = (flat < -frames) | (flat >= frames)
        position = tf.argmax(tf.cast(bad, tf.int32), output_type=tf.int64)
        value = tf.gather(flat, position) if flat.shape[0] != 0 else tf.constant(0, tf.int64)
        check = tf.debugging.Assert(
            tf.logical_not(tf.reduce_any(bad)), [GRAPH_INDEX_OUT_OF_RANGE, value, position, frames]
        )
        with tf.control_dependencies([check]):
            return first + tf.where(indices < 0, indices + frames, indices)

    # Epochs.

    def full_batches_per_epoch(self, sample_batch_size: int, num_steps: int | None = None) -> int:
        """How many full batches of `sample_batch_size` windows `epoch_dataset` yields now (eager only)."""
        sample_batch_size = positive_int("sample_batch_size", sample_batch_size)
        num_steps = self._check_num_steps(num_steps)
        self._check_open()
        return self._datasets.full_batches_per_epoch(sample_batch_size, num_steps)

    @_not_converted
    def epoch_dataset(
        self,
        sample_batch_size: int,
        num_steps: int | None = None,
        *,
        drop_remainder: bool = False,
        seed: int | None = None,
        num_parallel_calls: int | None = None,
    ) -> tf.data.Dataset:
        """One shuffled epoch: every stored window exactly once, in random order, in batches.

        The windows are those `get_next(num_steps=num_steps)` can draw (one segment,
        consecutive frames, within one episode with `episode_boundaries`), all of them,
        as the buffer holds them when iteration starts; iterating again is a new epoch. Elements are
        `(items, BufferInfo(ids, ()))`, `[sample_batch_size, num_steps, ...]` (no time
        axis without `num_steps`); the last batch is smaller unless `drop_remainder`
        (`full_batches_per_epoch` counts the full ones). Priorities are ignored. A
        window overwritten by adds before it is read fails the iteration, as the
        deterministic pass does: pause adds during an epoch.

        Args:
          sample_batch_size: Windows per batch.
          num_steps: Frames per window; None for single frames.
          drop_remainder: Leave out the last, smaller batch.
          seed: Seed of the order: each iteration then has the same order. Without it,
            each iteration draws a new one.
          num_parallel_calls: As in `as_dataset`.
        """
        self._check_open()
        sample_batch_size = positive_int("sample_batch_size", sample_batch_size)
        num_steps = self._check_num_steps(num_steps)
        if not isinstance(drop_remainder, bool):
            raise TypeError(
                NOT_A_BOOL.format(name="drop_remainder", received=f"{type(drop_remainder).__name__} {drop_remainder!r}")
            )
        dataset = self._datasets.epoch(
            sample_batch_size,
            num_steps,
            drop_remainder=drop_remainder,
            seed=seed,
            num_parallel_calls=num_parallel_calls,
        )
        return keep_alive(dataset, self)

    # Datasets (`tfbuffers.buffers._datasets`), each holding the buffer.

    def _as_dataset(
        self, sample_batch_size: int | None, num_steps: int | None, num_parallel_calls: int | None
    ) -> tf.data.Dataset:
        return keep_alive(self._datasets.sampled(sample_batch_size, num_steps, num_parallel_calls), self)

    def _single_deterministic_pass_dataset(
        self, sample_batch_size: int | None, num_steps: int | None, num_parallel_calls: int | None
    ) -> tf.data.Dataset:
        dataset = self._datasets.deterministic_pass(sample_batch_size, num_steps, num_parallel_calls)
        return keep_alive(dataset, self)

    def _dataset_reads(self) -> _datasets.Reads:
        """The reads the buffer's datasets call: its reads as tensors, held weakly, and its sampler."""
        return _datasets.Reads(
            added=weak_method(self._added_tensor),
            gather=weak_method(self._gather_tensors),
            sample=weak_method(self._sample_tensors),
            pack=weak_method(self._pack_for_dataset),
            sampler=self._sampler,
        )

    def _rows(self, ids: Any) -> Any:
        return _ring.rows_of_ids(ids, self._max_length, self._batch_size)

    # Storage hooks.

    @abc.abstractmethod
    def _nbytes(self) -> int:
        """`nbytes` of an open buffer."""

    @abc.abstractmethod
    def _gather_indices(self, indices: Any, fields: list[int]) -> list[Any]:
        """The leaves of `fields` (indices into `self.fields`) at `sample_all()` indices (checked here)."""

    @abc.abstractmethod
    def _added_tensor(self) -> tf.Tensor:
        """The add counter as a scalar int64 tensor (usable inside tf.data)."""

    @abc.abstractmethod
    def _gather_tensors(self, ids: tf.Tensor, fields: Sequence[int] | None = None) -> list[tf.Tensor]:
        """The leaves of the frames `ids`, as tensors shaped `ids.shape + spec.shape`.

        Only those of `fields` (indices into `self.fields`) when given.
        """

    @abc.abstractmethod
    def _sample_tensors(
        self, sample_batch_size: int | None, num_steps: int | None
    ) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]:
        """A sample by `self._sampler`, as tensors: (leaves, ids, probabilities)."""


def _step_type_field(fields: Sequence[specs.Field], option: Any) -> int | None:
    """The index of the step-type field `episode_boundaries` names, or None; raises naming what is wrong."""
    paths = [field.path for field in fields]
    if option is False:
        return None
    path = STEP_TYPE_PATH if option is True else option
    if not isinstance(path, str) or path not in paths:
        message = EPISODE_OPTION.format(paths=paths, received=f"{type(option).__name__} {option!r}")
        raise TypeError(message) if not isinstance(path, str) else ValueError(message)
    spec = fields[paths.index(path)].spec
    if not spec.dtype.is_integer or spec.shape.rank != 0:
        raise ValueError(EPISODE_FIELD.format(path=path, received=f"{spec.dtype.name} {spec.shape}"))
    return paths.index(path)


def _time_major(x: Any) -> Any:
    """`[B, T, ...]` as `[T * B, ...]`, frame `t * B + b` from `x[b, t]`: ids in increasing order."""
    if isinstance(x, np.ndarray):
        return np.swapaxes(x, 0, 1).reshape(-1, *x.shape[2:])
    return tf.reshape(tf.transpose(x, [1, 0, *range(2, x.shape.rank)]), [-1, *x.shape[2:].as_list()])
