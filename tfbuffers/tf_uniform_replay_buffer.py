"""`TFUniformReplayBuffer`: an in-graph buffer on `tf.Variable`s, sampled uniformly."""

from __future__ import annotations

import gc
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tfbuffers import _ring, sampling, specs
from tfbuffers import state as state_lib
from tfbuffers import storage as storage_lib
from tfbuffers.buffers import _datasets
from tfbuffers.buffers._segmented import NOT_A_BOOL, SegmentedReplayBuffer
from tfbuffers.execution import _graph_blocks
from tfbuffers.execution._graph_calls import GraphCalls
from tfbuffers.execution._graph_reads import GraphReads
from tfbuffers.execution._states import GraphStates
from tfbuffers.execution._tf_concurrency import Concurrency
from tfbuffers.replay_buffer import BufferInfo, weak_method
from tfbuffers.storage import GraphStorage, GraphStorageFactory

_OPS = _ring.TENSORFLOW


def _ensure_inner_shape(leaf: Any, check: specs.DeferredShapeCheck) -> tf.Tensor:
    shape = [None] * check.outer_dims + list(check.expected[check.outer_dims :])
    return tf.ensure_shape(leaf, shape, name="check_" + re.sub(r"[^A-Za-z0-9_.\-]", "_", check.path))


def _checked(leaves: list[Any], deferred: list[specs.DeferredShapeCheck]) -> tuple[list[Any], list[tf.Tensor]]:
    """The in-graph checks of shapes unknown at trace time, and the leaves as tensors that follow them."""
    checks = specs.graph_shape_assertions(deferred)
    deferred_by_leaf = {id(check.value): check for check in deferred}
    with tf.control_dependencies(checks):
        # Grappler infers an inner dimension unknown at trace time from the write and may fold the
        # named checks above into constants; EnsureShape, which it keeps, then refuses the leaf (its
        # node named for the field) before the lock is tried. Batch dimensions stay unpinned (rows
        # follow each leaf's length), so their named check is never folded.
        tensors = [
            _ensure_inner_shape(leaf, deferred_by_leaf[id(leaf)])
            if id(leaf) in deferred_by_leaf
            else tf.convert_to_tensor(leaf)
            for leaf in leaves
        ]
    return checks, tensors


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
    included), inside `tf.while_loop` and inside `tf.function(jit_compile=True)`,
    where XLA compiles its adds, blocks and samples with the rest of a train
    step (a sample the graph would refuse, from an empty buffer say, then
    returns probabilities 0 and ids -1: see the guide), and is checkpointed by
    `tf.train.Checkpoint` like any `tf.Module`: one consistent state, fields
    matched by nest path (see `tfbuffers.state`).

    Threads: any number may read while others write; eager writers take turns;
    a second writer inside a graph is refused (see `tfbuffers.execution._tf_concurrency`).

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

    _HOST_READS = False

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
        *,
        episode_boundaries: bool | str = False,
        wait_for_writers: bool = False,
        sampler: sampling.SamplerFactory | str | None = None,
        storage: GraphStorageFactory | None = None,
    ) -> None:
        """Creates the buffer and its variables.

        Args:
          data_spec: A nest of `tf.TensorSpec` (or `ArraySpec`) describing one
            item, usually `agent.collect_data_spec`.
          batch_size: Number of segments: the leading dimension of every
            `add_batch` (the number of parallel environments).
          max_length: Frames per segment; capacity is `batch_size * max_length`.
          scope: Name prefix of the variables.
          device: Device of the storage and the ops, e.g. `'gpu:0'` (the storage's `device`).
          dataset_drop_remainder: In the deterministic pass, skip the last group
            of segments when smaller than `sample_batch_size`, and windows
            shorter than `num_steps`; elements then have static shapes.
          dataset_window_shift: In the deterministic pass with `num_steps`, the
            frames between window starts; None means `num_steps` (windows do
            not overlap, each frame is visited once), 1 gives every window.
          stateful_dataset: Accepted for TF-Agents compatibility; ignored.
          episode_boundaries: Keep windows of `num_steps` frames within one episode: True
            reads the `step_type` field (a TF-Agents `Trajectory`'s), a nest path names
            another integer scalar field of TF-Agents step types (FIRST 0, MID 1, LAST 2).
            Samples are then uniform over the windows that cross no LAST -> FIRST boundary
            (in proportion to priority, for a prioritized buffer), with exact
            probabilities; the deterministic pass and `epoch_dataset` yield those windows
            only. Single frames are never affected. Adds keep the distance of each
            episode's last 16 frames to its end (`tfbuffers.sampling._episodes`: a byte per frame,
            some 30 ops per add), so a sample draws among the stored windows and leaves
            out those that cross a boundary, with exact totals; windows of more than 17
            frames, or too few draws kept, take a pass over the step types (see
            docs/benchmarks.md).
          wait_for_writers: Whether a write inside a graph (`add_batch` in a driver's
            `tf.function`) that finds another thread's graph write under way waits its turn,
            for up to 10 s, instead of raising at once. It costs a `tf.cond` on every write
            (about 30% of an in-graph add, measured), so it is off unless several threads
            write inside graphs. Eager writers always take turns.
          sampler: Which windows a sample draws: `(buffer_name, batch_size, max_length) ->
            tfbuffers.sampling.Sampler` (a `Sampler` subclass, for example); uniform over the
            stored windows by default (`UniformSampler`, also by its name "uniform"; the names are
            `tfbuffers.sampling.NAMES`, as the Ray buffer and the manager take them). Files do not
            record it: pass it again to `load`.
          storage: Where the rows, the add counter and the extras live: `(fields, num_rows, device)
            -> tfbuffers.storage.GraphStorage` (a subclass, for example), called inside `device` and
            `scope`; one `tf.Variable` per field by default (`VariableStorage`). Files and
            checkpoints do not record it: pass it again to `load`.

        Raises:
          TypeError: If an argument has the wrong type.
          ValueError: If an argument is out of range or the spec is invalid.
        """
        if not isinstance(wait_for_writers, bool):
            received = f"{type(wait_for_writers).__name__} {wait_for_writers!r}"
            raise TypeError(NOT_A_BOOL.format(name="wait_for_writers", received=received))
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
        self._scope = scope
        self._wait_for_writers = wait_for_writers
        with tf.device(device), tf.name_scope(scope):
            table = storage_lib.make_graph(storage, self._fields, self.capacity, device)
        self._device = table.device
        with tf.device(self._device), tf.name_scope(scope):
            concurrency = Concurrency(type(self).__name__, wait=wait_for_writers)
            # The sampler's state (the record of episode ends, priorities) in the storage's extras.
            self._bind_sampler(table, sampling.TENSORFLOW)
        # Not tracked by `tf.Module`: checkpoints hold the buffer's state as a whole, by name.
        calls = GraphCalls(concurrency.eager_lock)
        placement = (self._device, scope)
        # The buffer's methods held weakly: the parts it holds do not hold it (no reference cycle).
        states = GraphStates(
            table,
            self._max_length,
            weak_method(self._extra_variables),
            concurrency=concurrency,
            calls=calls,
            placement=placement,
            restored=weak_method(self._restored_variables),
            cleared=weak_method(self._sampler_cleared),
        )
        reads = GraphReads(table, concurrency, self._sampler, (self._batch_size, self._max_length), placement)
        self._untracked(
            _table=table, _added=table.added, _concurrency=concurrency, _calls=calls, _states=states, _reads=reads
        )

    @tf.__internal__.tracking.no_automatic_dependency_tracking
    def _untracked(self, **attributes: Any) -> None:
        for name, value in attributes.items():
            setattr(self, name, value)

    @property
    def device(self) -> str:
        """The device of the storage and of the buffer's ops (`storage.device`)."""
        return self._device

    @property
    def storage(self) -> GraphStorage:
        """Its rows, add counter and extras: a `tfbuffers.storage.GraphStorage` (`VariableStorage` by default)."""
        return self._table

    @property
    def wait_for_writers(self) -> bool:
        """Whether a graph write that finds another under way waits its turn (the constructor's option)."""
        return self._wait_for_writers

    @property
    def scope(self) -> str:
        """The variables' name prefix."""
        return self._scope

    def variables(self) -> tuple[tf.Variable, ...]:
        """The buffer's variables, its storage's: the rows', the add counter, then the extras as made.

        The extras: the record of episode ends (with `episode_boundaries`), then a prioritized buffer's
        priorities, max priority and sum tree.
        """
        if self._closed:
            return ()
        return self._table.variables()

    def _nbytes(self) -> int:
        return self._table.nbytes()

    def _num_frames(self) -> tf.Tensor:
        if tf.executing_eagerly():
            # One read and one constant: half the time of the ops, a sixth of a compiled call's, fewer tensors.
            added = int(self._added.numpy())
            return tf.constant(self._frames_of(added), tf.int64)
        with tf.device(self._device):
            return _ring.frames_per_segment(_OPS, self._added.read_value(), self._max_length) * self._batch_size

    def _add_batch(self, leaves: list[Any], deferred: list[specs.DeferredShapeCheck]) -> tf.Tensor:
        if tf.executing_eagerly():
            tensors = [tf.convert_to_tensor(leaf) for leaf in leaves]  # eager shapes are all known
            return self._calls.locked(self._write, tensors, [])
        return self._write(leaves, deferred)

    def _write(self, leaves: list[Any], deferred: list[specs.DeferredShapeCheck]) -> tf.Tensor:
        with tf.device(self._device), tf.name_scope(self._scope):
            checks, leaves = _checked(leaves, deferred)

            def write() -> tuple[list[Any], tf.Tensor]:
                added = self._added.read_value()
                ids = added * self._batch_size + _OPS.arange(self._batch_size)
                block = self._rows(ids)
                if deferred:
                    # Each leaf indexed by its own length: no static shape conflict fires before the checks.
                    start = _ring.block_start(added, self._max_length, self._batch_size)
                    rows = [start + _OPS.arange(tf.shape(x, out_type=tf.int64)[0]) for x in leaves]
                else:
                    rows = [block] * len(leaves)
                # The counter moves only once the rows are written, so that readers
                # never count a frame that is not there yet.
                with tf.control_dependencies(self._add_ops(added, leaves, rows, block)):
                    moved = self._added.assign_add(1, read_value=False)
                return [moved], ids

            return self._concurrency.exclusive([*checks, *leaves], write, "add_batch")

    def _add_ops(self, added: tf.Tensor, leaves: list[tf.Tensor], rows: list[tf.Tensor], block: tf.Tensor) -> list[Any]:
        """The writes of add number `added`: its rows and the sampler's state (which reads what it needs first)."""
        read = self._sampler.before_add(added, leaves[self._step_field] if self._episodes else None)
        with tf.control_dependencies(read):
            return [*read, *self._table.write(rows, leaves), *self._sampler.on_add(added, block)]

    def _extend(self, leaves: list[Any], deferred: list[specs.DeferredShapeCheck], frames: int) -> tf.Tensor:
        if tf.executing_eagerly():
            tensors = [tf.convert_to_tensor(leaf) for leaf in leaves]
            return self._calls.locked(self._write_block, tensors, [])
        return self._write_block(leaves, deferred)

    def _write_block(self, leaves: list[Any], deferred: list[specs.DeferredShapeCheck]) -> tf.Tensor:
        with tf.device(self._device), tf.name_scope(self._scope):
            checks, leaves = _checked(leaves, deferred)
            frames = int(leaves[0].shape[1]) if leaves else 0
            if frames == 0:  # nothing to write (and XLA gathers nothing from an axis of length 0)
                with tf.control_dependencies(checks):
                    return tf.zeros([self._batch_size, 0], tf.int64)
            sizes = _graph_blocks.Sizes(self._batch_size, self._max_length, frames)

            def write() -> tuple[list[Any], tf.Tensor]:
                if self._sampler.watches_adds:  # add by add, each the writes of `add_batch`, in one loop
                    return _graph_blocks.add_by_add(self._added, leaves, sizes, self._add_ops)
                return _graph_blocks.scattered(self._added, leaves, sizes, self._table)

            return self._concurrency.exclusive([*checks, *leaves], write, "extend")

    def _added_tensor(self) -> tf.Tensor:
        return self._added.read_value()

    def _gather_tensors(self, ids: tf.Tensor, fields: Sequence[int] | None = None) -> list[tf.Tensor]:
        return self._reads.gather(ids, fields)

    def _gather_indices(self, indices: Any, fields: list[int]) -> list[Any]:
        if tf.executing_eagerly():
            # The exact IndexError first; the graph checks again against the counter it reads.
            self._checked_ids(_ring.NUMPY, np.asarray(indices, np.int64), int(self._added.numpy()))
            return self._calls.compiled(self._gather_indices_tensors)(tf.convert_to_tensor(indices, tf.int64), fields)
        return self._gather_indices_tensors(indices, fields)

    def _gather_indices_tensors(self, indices: tf.Tensor, fields: list[int]) -> list[tf.Tensor]:
        with tf.device(self._device), tf.name_scope(self._scope):
            ids = self._checked_ids(_OPS, indices, self._added.read_value())
        return self._gather_tensors(ids, fields)

    def _row_source(self) -> state_lib.Rows:
        return self._states.row_source()

    def _write_rows(self, field: int, first_row: int, rows: np.ndarray) -> None:
        self._states.write_rows(field, first_row, rows)

    def _sample_tensors(
        self, sample_batch_size: int | None, num_steps: int | None
    ) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]:
        return self._reads.sample(sample_batch_size, num_steps)

    def _dataset_reads(self) -> _datasets.Reads:
        # A dataset's element is one read: a torn one is dropped and the next one drawn (`GraphReads.attempt`).
        return super()._dataset_reads()._replace(attempt=weak_method(self._reads.attempt))

    def _get_next(self, sample_batch_size: int | None, num_steps: int | None) -> tuple[Any, BufferInfo]:
        leaves, ids, probabilities = self._calls.if_eager(self._sample_tensors)(sample_batch_size, num_steps)
        return self._pack(leaves), BufferInfo(ids, probabilities)

    def _close(self) -> None:
        # The variables go once nothing else holds them (a dataset made earlier may).
        self._table.close()
        del self._table
        self._sampler.close()
        self._untracked(_states=None, _reads=None)
        self._calls.clear()
        # A `tf.function` (ours, a dataset's) sits in reference cycles that hold the variables
        # it captured: they would go at some later full collection, and meanwhile a process
        # making buffers in a loop grows (by about half of each 32 MB buffer, measured).
        gc.collect()

    def _snapshot(self) -> tuple[int, list[Any], dict[str, np.ndarray]]:
        return self._states.snapshot()

    def _restore(self, added: int, arrays: list[Any], extras: dict[str, np.ndarray]) -> None:
        column = None
        if self._episodes:  # the restored step types (a load wrote them to the variable)
            column = arrays[self._step_field] if arrays else self._table.column(self._step_field).numpy()
        self._states.restore(added, arrays, lambda: self._sampler.on_restore(added, column, extras))

    def _restored_variables(self) -> list[tf.Variable]:
        """What a restore assigns beside the rows: the sampler's state (priorities, the record of episode ends)."""
        return self._sampler.restore_targets()

    def _gather_all(self) -> Any:
        if tf.executing_eagerly():
            # Every row is read, and every add overwrites one when the ring is full: among eager writers
            # that never pause, a lock-free read could seldom find a moment between two writes. Eager
            # writers wait for it, as for a snapshot; graph writers are checked for.
            return self._pack(self._calls.locked(self._gather_all_tensors))
        return self._pack(self._gather_all_tensors())

    def _gather_all_tensors(self) -> list[tf.Tensor]:
        return self._reads.gather_all()

    def _clear(self) -> None:
        self._states.clear()

    def _sampler_cleared(self) -> list[Any]:
        return self._sampler.on_clear()

    def _extra_variables(self) -> dict[str, tf.Variable]:
        """The state's extras (see `state_template`), by name: read with the rows by `state()`."""
        return self._sampler.state_extras()
