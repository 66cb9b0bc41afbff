"""`TFUniformReplayBuffer`: an in-graph buffer on `tf.Variable`s, sampled uniformly."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfbuffers import _ring, specs
from tfbuffers._segmented import SegmentedReplayBuffer
from tfbuffers._variable_table import VariableTable
from tfbuffers.replay_buffer import NOT_ENOUGH_FRAMES, BufferInfo

_OPS = _ring.TENSORFLOW


class TFUniformReplayBuffer(SegmentedReplayBuffer):
    """A replay buffer in TensorFlow variables, with batched adds and uniform sampling.

    A drop-in replacement for `tf_agents.replay_buffers.TFUniformReplayBuffer`:
    same constructor, same methods, same return conventions. The buffer holds
    `batch_size` segments (one per parallel environment) of `max_length` frames;
    each segment is a ring that overwrites its oldest frame once full, and every
    `add_batch` writes one frame to every segment. Storage is time-major, so an
    add writes one contiguous block::

                     segment 0 .. segment B-1
        position 0   [ row 0   .. row B-1   ]   <- adds 0, L, 2L, ...
        position 1   [ row B   .. row 2B-1  ]   <- adds 1, L+1, ...
        ...
        position L-1 [ ...     .. row LB-1  ]

    Frame ids are `add_number * batch_size + segment`: unique, increasing in
    time, and the same on every buffer kind (TF-Agents repeats one id across
    segments). No id table is stored: ids follow from the add counter.

    It works eagerly, inside `tf.function` (`tf.function(buffer.add_batch)`
    included) and inside `tf.while_loop`, and is checkpointed by
    `tf.train.Checkpoint` like any `tf.Module`.

    Where it differs from TF-Agents 0.19, on purpose:

    * `add_batch` checks the whole batch first and names the faulty field; it
      returns the stored frames' ids (a tensor) rather than an op.
    * Sampled windows never read past the newest frame nor into overwritten
      rows, and the deterministic pass keeps every window inside one segment,
      also after the rings have wrapped.
    * `as_dataset(single_deterministic_pass=True)` on an empty buffer is an
      empty dataset, and partial windows at a segment's end are returned (unless
      `dataset_drop_remainder`) for batched passes too, so that every frame is
      visited once.
    * `sequence_preprocess_fn` is applied rather than refused.

    Example:
    >>> spec = {"obs": tf.TensorSpec([2], tf.float32), "step": tf.TensorSpec([], tf.int64)}
    >>> buffer = TFUniformReplayBuffer(spec, batch_size=2, max_length=3)
    >>> for t in range(4):
    ...     _ = buffer.add_batch({"obs": tf.fill([2, 2], float(t)), "step": tf.constant([t, t], tf.int64)})
    >>> int(buffer.num_frames())
    6
    >>> buffer.gather_all()["step"].numpy().tolist()
    [[1, 2, 3], [1, 2, 3]]
    >>> items, info = buffer.get_next(sample_batch_size=4, num_steps=2)
    >>> items["obs"].shape.as_list(), info.probabilities.numpy().tolist()
    ([4, 2, 2], [0.25, 0.25, 0.25, 0.25])
    """

    _ADDS_IN_GRAPH = True

    def __init__(
        self,
        data_spec: Any,
        batch_size: int,
        max_length: int = 1000,
        scope: str = "TFUniformReplayBuffer",
        device: str = "cpu:*",
        dataset_drop_remainder: bool = False,
        dataset_window_shift: int | None = None,
        stateful_dataset: bool = False,
    ) -> None:
        """Creates the buffer and its variables.

        Args:
          data_spec: A nest of `tf.TensorSpec` (or `ArraySpec`) describing one
            item, usually `agent.collect_data_spec`.
          batch_size: Number of segments: the leading dimension of every
            `add_batch` (the number of parallel environments).
          max_length: Frames per segment; capacity is `batch_size * max_length`.
          scope: Name prefix of the variables.
          device: Device of the variables and ops, e.g. `'gpu:0'`.
          dataset_drop_remainder: In the deterministic pass, skip the last group
            of segments when smaller than `sample_batch_size`, and windows
            shorter than `num_steps`; elements then have static shapes.
          dataset_window_shift: In the deterministic pass with `num_steps`, the
            frames between window starts; None means `num_steps` (windows do
            not overlap, each frame is visited once), 1 gives every window.
          stateful_dataset: Whether the datasets hold stateful ops.

        Raises:
          TypeError: If an argument has the wrong type.
          ValueError: If an argument is out of range or the spec is invalid.
        """
        super().__init__(
            data_spec,
            batch_size,
            max_length,
            dataset_drop_remainder=dataset_drop_remainder,
            dataset_window_shift=dataset_window_shift,
            stateful_dataset=stateful_dataset,
        )
        self._scope = scope
        self._device = device
        with tf.device(device), tf.name_scope(scope):
            self._table = VariableTable(self._fields, self.capacity)
            self._added = tf.Variable(tf.constant(0, tf.int64), trainable=False, name="added")

    @property
    def device(self) -> str:
        """The device of the variables."""
        return self._device

    @property
    def scope(self) -> str:
        """The variables' name prefix."""
        return self._scope

    def variables(self) -> tuple[tf.Variable, ...]:
        """The buffer's variables: the field tables, then the add counter."""
        return (*self._table.table_variables, self._added)

    def _num_frames(self) -> tf.Tensor:
        with tf.device(self._device):
            return _ring.frames_per_segment(_OPS, self._added.read_value(), self._max_length) * self._batch_size

    def _add_batch(self, leaves: list[Any], deferred: list[specs.DeferredShapeCheck]) -> tf.Tensor:
        with tf.device(self._device), tf.name_scope(self._scope):
            with tf.control_dependencies(specs.graph_shape_assertions(deferred)):
                added = self._added.read_value()
            ids = added * self._batch_size + _OPS.arange(self._batch_size)
            if deferred:
                # A shape unknown at trace time: index each leaf by its own length, so that no
                # static shape conflict fires before the assertions name the faulty field.
                rows = [self._rows(added * self._batch_size + _OPS.arange(tf.shape(x)[0])) for x in leaves]
            else:
                rows = [self._rows(ids)] * len(leaves)
            writes = self._table.write(rows, leaves)
            # The counter moves only once the rows are written, so that readers
            # never count a frame that is not there yet.
            with tf.control_dependencies(writes):
                self._added.assign_add(1)
                return tf.identity(ids)

    def _added_tensor(self) -> tf.Tensor:
        return self._added.read_value()

    def _gather_tensors(self, ids: tf.Tensor) -> list[tf.Tensor]:
        with tf.device(self._device), tf.name_scope(self._scope):
            return self._table.read(self._rows(ids))

    def _sample_tensors(
        self, sample_batch_size: int | None, num_steps: int | None
    ) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]:
        with tf.device(self._device), tf.name_scope(self._scope):
            added = self._added.read_value()
            windows = _ring.windows_per_segment(_OPS, added, self._max_length, num_steps or 1)
            total = windows * self._batch_size
            message = NOT_ENOUGH_FRAMES.format(buffer=type(self).__name__, num_steps=num_steps or 1)
            # A plain Assert with string data needs no tf.cond guard: fewer ops per sample.
            with tf.control_dependencies([tf.debugging.Assert(total > 0, [message])]):
                shape = [] if sample_batch_size is None else [sample_batch_size]
                draws = tf.random.uniform(shape, 0, tf.maximum(total, 1), dtype=tf.int64)
            ids, rows = _ring.window_ids_and_rows(
                _OPS, draws, added, self._max_length, self._batch_size, num_steps or 1
            )
            if num_steps is None:
                ids, rows = ids[..., 0], rows[..., 0]
            probability = tf.cast(1.0 / tf.cast(total, tf.float64), tf.float32)
            return self._table.read(rows), ids, tf.fill(shape, probability)

    def _get_next(self, sample_batch_size: int | None, num_steps: int | None) -> tuple[Any, BufferInfo]:
        leaves, ids, probabilities = self._sample_tensors(sample_batch_size, num_steps)
        return self._pack(leaves), BufferInfo(ids, probabilities)

    def _gather_all(self) -> Any:
        with tf.device(self._device), tf.name_scope(self._scope):
            ids = _ring.chronological_ids(_OPS, self._added.read_value(), self._max_length, self._batch_size)
            return self._pack(self._table.read(self._rows(ids)))

    def _clear(self) -> None:
        self._added.assign(0)
