"""What the TF and numpy uniform buffers share: segments, rings, sampling, state and datasets.

A segmented buffer keeps `batch_size` segments of `max_length` frames (see
`tfbuffers._ring` for the layout and the ids). Its subclasses provide storage:
how to write a block, gather rows, read the add counter and snapshot or replace
the contents. A `tfbuffers._sampling.Sampler` says which windows a sample
draws. This class builds everything else from those, once.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

import numpy as np
import tensorflow as tf

from tfbuffers import _deterministic, _ring, _sampling
from tfbuffers import state as state_lib
from tfbuffers.replay_buffer import BufferInfo, ReplayBuffer, optional_positive_int, positive_int

NOT_A_BOOL = "{name}: expected a bool, got {received}"
ADDED = "added"


class SegmentedReplayBuffer(ReplayBuffer):
    """A buffer of `batch_size` rings of `max_length` frames each."""

    def __init__(
        self,
        data_spec: Any,
        batch_size: int,
        max_length: int,
        *,
        dataset_drop_remainder: bool = False,
        dataset_window_shift: int | None = None,
        stateful_dataset: bool = False,
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
        self._sampler: _sampling.Sampler = _sampling.UniformSampler(type(self).__name__, batch_size, max_length)
        # Tracked: `tf.train.Checkpoint` saves the buffer's state through it, by name.
        self._state_checkpoint = state_lib.StateCheckpoint(self)

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

    def _ids_shape(self, sample_batch_size: int | None, num_steps: int | None) -> list[int]:
        return ([] if sample_batch_size is None else [sample_batch_size]) + ([] if num_steps is None else [num_steps])

    def _frames_of(self, added: int) -> int:
        return int(_ring.frames_per_segment(_ring.NUMPY, added, self._max_length)) * self._batch_size

    # State.

    def state_template(self) -> state_lib.BufferState:
        """A `BufferState` with this buffer's format, layout, fields, names and shapes, and no contents.

        Its arrays are zero-strided views: they take no memory.
        """
        return state_lib.BufferState(
            format=state_lib.SEGMENTED,
            layout={"batch_size": self._batch_size, "max_length": self._max_length},
            fields=self._fields,
            counters={ADDED: 0},
            arrays={
                field.path: np.broadcast_to(
                    np.zeros((), field.spec.dtype.as_numpy_dtype), (self.capacity, *field.spec.shape.as_list())
                )
                for field in self._fields
            },
        )

    def state(self) -> state_lib.BufferState:
        """The buffer's contents at one moment, as numpy arrays (see `tfbuffers.state`).

        Safe while other threads use the buffer: the py buffer copies its arrays
        under its lock; the TF buffer reads its variables until no add
        overlapped the read.
        """
        self._check_open()
        added, arrays, extras = self._snapshot()
        return dataclasses.replace(
            self.state_template(),
            counters={ADDED: int(added)},
            arrays={field.path: array for field, array in zip(self._fields, arrays)},
            extras=extras,
        )

    def restore_state(self, buffer_state: state_lib.BufferState, *, source: str = "state") -> None:
        """Replaces the buffer's contents with `buffer_state`'s, at once for other threads.

        Fields are matched by nest path. The state must have this buffer's format,
        layout and fields (paths, dtypes, shapes); its buffer kind may differ.

        Args:
          buffer_state: From `state()` of this or another buffer, a file or a checkpoint.
          source: What the state came from, for error messages.

        Raises:
          ValueError: If the format, layout, fields or array shapes differ, or the
            counter is out of range; the buffer is then unchanged.
        """
        self._check_open()
        template = self.state_template()
        name = type(self).__name__
        state_lib.check_compatible(buffer_state.describe(), template.describe(), source, name)
        arrays = [
            _checked_array(buffer_state.arrays, template.arrays, field.path, source, name) for field in self._fields
        ]
        extras = {
            extra: _checked_array(buffer_state.extras, template.extras, extra, source, name)
            for extra in template.extras
        }
        added = buffer_state.counters.get(ADDED)
        if not isinstance(added, int | np.integer) or added < 0:
            raise ValueError(f"{source}: counter {ADDED}: expected an int >= 0, got {added!r}")
        self._check_extras(extras, source)
        self._restore(int(added), arrays, extras)

    def _check_extras(self, extras: dict[str, np.ndarray], source: str) -> None:
        """Raises a ValueError if the extras' values (shapes and dtypes already checked) are invalid."""

    # Datasets.

    def _as_dataset(
        self, sample_batch_size: int | None, num_steps: int | None, num_parallel_calls: int | None
    ) -> tf.data.Dataset:
        @tf.autograph.experimental.do_not_convert
        def sample(_: tf.Tensor) -> tuple[Any, BufferInfo]:
            leaves, ids, probabilities = self._sample_tensors(sample_batch_size, num_steps)
            return self._pack_for_dataset(leaves), BufferInfo(ids, probabilities)

        return tf.data.Dataset.counter().map(sample, num_parallel_calls=num_parallel_calls)

    def _single_deterministic_pass_dataset(
        self, sample_batch_size: int | None, num_steps: int | None, num_parallel_calls: int | None
    ) -> tf.data.Dataset:
        ids = _deterministic.ids_dataset(
            self._added_tensor,
            max_length=self._max_length,
            batch_size=self._batch_size,
            sample_batch_size=sample_batch_size,
            num_steps=num_steps,
            window_shift=self._dataset_window_shift,
            drop_remainder=self._dataset_drop_remainder,
        )

        @tf.autograph.experimental.do_not_convert
        def gather(frame_ids: tf.Tensor) -> tuple[Any, BufferInfo]:
            leaves = self._gather_tensors(frame_ids)
            return self._pack_for_dataset(leaves), BufferInfo(frame_ids, ())

        return ids.map(gather, num_parallel_calls=num_parallel_calls)

    def _rows(self, ids: Any) -> Any:
        return _ring.rows_of_ids(ids, self._max_length, self._batch_size)

    # Storage hooks.

    @abc.abstractmethod
    def _snapshot(self) -> tuple[int, list[Any], dict[str, np.ndarray]]:
        """(add counter, one `[capacity, *shape]` numpy array per field, extras by name): one consistent moment."""

    @abc.abstractmethod
    def _restore(self, added: int, arrays: list[Any], extras: dict[str, np.ndarray]) -> None:
        """Replaces the contents, counter and extras by a checked snapshot's, at once for other threads."""

    @abc.abstractmethod
    def _added_tensor(self) -> tf.Tensor:
        """The add counter as a scalar int64 tensor (usable inside tf.data)."""

    @abc.abstractmethod
    def _gather_tensors(self, ids: tf.Tensor) -> list[tf.Tensor]:
        """The leaves of the frames `ids`, as tensors shaped `ids.shape + spec.shape`."""

    @abc.abstractmethod
    def _sample_tensors(
        self, sample_batch_size: int | None, num_steps: int | None
    ) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]:
        """A sample by `self._sampler`, as tensors: (leaves, ids, probabilities)."""


def _checked_array(received: Any, expected: Any, name: str, source: str, buffer: str) -> np.ndarray:
    """`received[name]` as an array, if it has the shape and dtype of `expected[name]`; else a ValueError."""
    like = expected[name]
    if name not in received:
        raise ValueError(f"{source}: {name}: missing; this {buffer} stores {like.shape} {like.dtype}")
    array = np.asarray(received[name])
    if array.shape != like.shape or array.dtype != like.dtype:
        raise ValueError(
            state_lib.ARRAY_MISMATCH.format(
                source=source,
                name=name,
                received=f"{array.shape} {array.dtype}",
                expected=f"{like.shape} {like.dtype}",
                buffer=buffer,
            )
        )
    return array
