"""`TFUniformReplayBuffer`: an in-graph buffer on `tf.Variable`s, sampled uniformly."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tfbuffers import _ring, specs
from tfbuffers._segmented import SegmentedReplayBuffer
from tfbuffers._variable_table import VariableTable
from tfbuffers.replay_buffer import FRAMES_GONE, NOT_ENOUGH_FRAMES, BufferInfo, weak_method

_OPS = _ring.TENSORFLOW

SNAPSHOT_ATTEMPTS = 100
SNAPSHOT_BUSY = (
    "TFUniformReplayBuffer: no consistent snapshot in {attempts} reads: adds kept overwriting stored frames "
    "while the variables were read; pause adds (e.g. between driver runs) while saving"
)

CONCURRENT_WRITERS = (
    "TFUniformReplayBuffer.{name}: another thread is writing to this buffer inside a graph; concurrent graph "
    "writers are not supported: call add_batch eagerly from each thread (serialized), use one buffer per "
    "writer, or guard the writers with your own lock"
)


_PHILOX = 1  # the RNG algorithm id of `RngReadAndSkip`, whose state's first word counts in steps of 256
_ONE = 1
_MINUS_ONE = 2**64 - 1  # -1 as the op's uint64 delta: the counter wraps modulo 2**64


class _Concurrency:
    """What lets threads share a buffer: a try-lock for writers, and what lock-free readers check against.

    Writers (`add_batch`, `clear`, a restore) hold `writers`, a counter moved
    atomically by `RngReadAndSkip` (TensorFlow's only fetch-and-add): a writer
    that finds it non-zero undoes its increment and raises, before touching
    storage. Eager writers also take a Python lock, so any number of threads may
    call `add_batch` eagerly; graph writers (a driver's `tf.function`) in several
    threads at once raise `CONCURRENT_WRITERS` instead of corrupting the buffer.
    (A `tf.CriticalSection` would queue them, but costs 2.5x the whole in-graph
    add and deadlocks a driver loop that also holds a TF-Agents buffer.)

    Readers take no lock (a seqlock): they read `generation` and the counter,
    gather, then read `writers`, the counter and `generation` again. What they
    gathered is whole iff the generation is unchanged and every add it reads is
    at least `added' + writers' - max_length`, i.e. not overwritten by a write
    that started before the gather ended; otherwise they read again.

    Eager calls run each method as one compiled `tf.function` (`compiled`):
    one call instead of dozens of eager ops.

    A plain object, not a `tf.Module`: none of this is checkpointed.
    """

    def __init__(self) -> None:
        self.eager_lock = threading.Lock()
        self.writers = tf.Variable(tf.zeros([3], tf.int64), trainable=False, name="writers")
        self.generation = tf.Variable(tf.constant(0, tf.int64), trainable=False, name="generation")
        self.functions: dict[str, Any] = {}

    def compiled(self, buffer: TFUniformReplayBuffer, method: str) -> Any:
        """`tf.function` of `buffer.<method>`, made once; it holds the buffer weakly (no reference cycle)."""
        if method not in self.functions:
            function = tf.function(weak_method(buffer, method), autograph=False)
            # Each buffer traces its own functions: expected, not the retracing TensorFlow warns of.
            function._omit_frequent_tracing_warning = True
            self.functions[method] = function
        return self.functions[method]

    def _fetch_add(self, delta: Any) -> tf.Tensor:
        """Adds `delta` writers; returns the old state, whose first word is 256 times the old count."""
        return tf.raw_ops.RngReadAndSkip(resource=self.writers.handle, alg=_PHILOX, delta=delta)

    def writing(self) -> tf.Tensor:
        """How many writers hold or are trying the lock (0 at rest)."""
        return self.writers.read_value()[0] // 256

    def exclusive(self, write: Callable[[], tuple[list[Any], Any]], name: str) -> Any:
        """Builds `write()` holding the writers' lock; it raises `CONCURRENT_WRITERS` if another writer holds it.

        `write()` returns the ops that must run before the lock is released, and
        a nest of tensors to return once it is: a caller that ignores them (a
        driver's loop) then does not compute them. Eager callers run it through
        `compiled`, holding `eager_lock`.
        """
        held = tf.equal(self._fetch_add(tf.constant(_ONE, tf.uint64))[0], 0)
        undo = self._fetch_add(tf.where(held, tf.constant(0, tf.uint64), tf.constant(_MINUS_ONE, tf.uint64)))
        with tf.control_dependencies([undo]):  # undone before the assertion can stop the graph
            refused = tf.debugging.Assert(held, [CONCURRENT_WRITERS.format(name=name)])
        with tf.control_dependencies([refused]):
            effects, result = write()
        with tf.control_dependencies(effects):
            released = self._fetch_add(tf.constant(_MINUS_ONE, tf.uint64))
        with tf.control_dependencies([released]):
            return tf.nest.map_structure(tf.identity, result)


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
            self._concurrency = _Concurrency()

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
        if self._closed:
            return ()
        return (*self._table.table_variables, self._added)

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
            return self._locked("_write", tensors, [])
        return self._write(leaves, deferred)

    def _write(self, leaves: list[Any], deferred: list[specs.DeferredShapeCheck]) -> tf.Tensor:
        with tf.device(self._device), tf.name_scope(self._scope):
            assertions = specs.graph_shape_assertions(deferred)
            leaves = [tf.convert_to_tensor(leaf) for leaf in leaves]

            def write() -> tuple[list[Any], tf.Tensor]:
                with tf.control_dependencies(assertions):
                    added = self._added.read_value()
                segments = _OPS.arange(self._batch_size)
                ids = added * self._batch_size + segments
                start = _ring.block_start(added, self._max_length, self._batch_size)
                if deferred:
                    # A shape unknown at trace time: index each leaf by its own length, so that no
                    # static shape conflict fires before the assertions name the faulty field.
                    rows = [start + _OPS.arange(tf.shape(x)[0]) for x in leaves]
                else:
                    rows = [start + segments] * len(leaves)
                writes = self._table.write(rows, leaves)
                # The counter moves only once the rows are written, so that readers
                # never count a frame that is not there yet.
                with tf.control_dependencies(writes):
                    moved = self._added.assign_add(1, read_value=False)
                return [moved], ids

            return self._concurrency.exclusive(write, "add_batch")

    def _added_tensor(self) -> tf.Tensor:
        return self._added.read_value()

    def _gather_tensors(self, ids: tf.Tensor) -> list[tf.Tensor]:
        with tf.device(self._device), tf.name_scope(self._scope):
            # Planned ids must still be stored, and not overwritten while they were read.
            stored = _ring.are_stored(_OPS, ids, self._added.read_value(), self._max_length, self._batch_size)
            with tf.control_dependencies([tf.debugging.Assert(stored, [FRAMES_GONE])]):
                leaves = self._table.read(self._rows(ids))
            with tf.control_dependencies(leaves):
                writing = self._concurrency.writing()
            with tf.control_dependencies([writing]):
                added = self._added.read_value()
            oldest_whole = added + writing - self._max_length
            whole = tf.reduce_min(ids) // self._batch_size >= oldest_whole
            with tf.control_dependencies([tf.debugging.Assert(whole, [FRAMES_GONE])]):
                return [tf.identity(leaf) for leaf in leaves]

    def _sample_tensors(
        self, sample_batch_size: int | None, num_steps: int | None
    ) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]:
        with tf.device(self._device), tf.name_scope(self._scope):

            def draw() -> tuple[list[tf.Tensor], tf.Tensor]:
                leaves, ids, probabilities = self._draw(sample_batch_size, num_steps)
                return [*leaves, ids, probabilities], tf.reduce_min(ids) // self._batch_size

            outputs = self._read_whole(draw)
            return outputs[:-2], outputs[-2], outputs[-1]

    def _read_whole(self, read: Callable[[], tuple[list[tf.Tensor], tf.Tensor]]) -> list[tf.Tensor]:
        """`read()`'s tensors, read again until no write overlapped the read (see `_Concurrency`).

        `read` returns its tensors and the oldest add number they hold.
        """
        whole, tensors = self._checked_read(read)
        _, retried = tf.while_loop(
            lambda whole, _: tf.logical_not(whole),
            lambda whole, _: self._checked_read(read),
            [whole, tensors],
            shape_invariants=[whole.shape, [tf.TensorShape([None] * t.shape.rank) for t in tensors]],
        )
        for tensor, first in zip(retried, tensors):
            tensor.set_shape(first.shape)
        return retried

    def _checked_read(self, read: Callable[[], tuple[list[tf.Tensor], tf.Tensor]]) -> tuple[tf.Tensor, list[tf.Tensor]]:
        """One attempt of `read()`, and whether no write overlapped it (see `_Concurrency`)."""
        concurrency = self._concurrency
        generation = concurrency.generation.read_value()
        with tf.control_dependencies([generation]):
            tensors, oldest = read()
        with tf.control_dependencies(tensors):
            writing = concurrency.writing()
        with tf.control_dependencies([writing]):
            added = self._added.read_value()
        with tf.control_dependencies([added]):
            unchanged = tf.equal(concurrency.generation.read_value(), generation)
        return tf.logical_and(unchanged, oldest >= added + writing - self._max_length), tensors

    def _draw(
        self, sample_batch_size: int | None, num_steps: int | None
    ) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]:
        added = self._added.read_value()
        windows = _ring.windows_per_segment(_OPS, added, self._max_length, num_steps or 1)
        total = windows * self._batch_size
        message = NOT_ENOUGH_FRAMES.format(buffer=type(self).__name__, num_steps=num_steps or 1)
        # A plain Assert with string data needs no tf.cond guard: fewer ops per sample.
        with tf.control_dependencies([tf.debugging.Assert(total > 0, [message])]):
            shape = [] if sample_batch_size is None else [sample_batch_size]
            draws = tf.random.uniform(shape, 0, tf.maximum(total, 1), dtype=tf.int64)
        ids, rows = _ring.window_ids_and_rows(_OPS, draws, added, self._max_length, self._batch_size, num_steps or 1)
        if num_steps is None:
            ids, rows = ids[..., 0], rows[..., 0]
        probability = tf.cast(1.0 / tf.cast(total, tf.float64), tf.float32)
        return self._table.read(rows), ids, tf.fill(shape, probability)

    def _get_next(self, sample_batch_size: int | None, num_steps: int | None) -> tuple[Any, BufferInfo]:
        leaves, ids, probabilities = self._compiled_if_eager("_sample_tensors")(sample_batch_size, num_steps)
        return self._pack(leaves), BufferInfo(ids, probabilities)

    def _locked(self, method: str, *args: Any) -> Any:
        """An eager call of `self.<method>(*args)`, compiled, holding the eager writers' lock."""
        with self._concurrency.eager_lock:
            return self._concurrency.compiled(self, method)(*args)

    def _compiled_if_eager(self, method: str) -> Callable[..., Any]:
        """`self.<method>`, through its compiled `tf.function` when called eagerly (see `_Concurrency`)."""
        if tf.executing_eagerly():
            return self._concurrency.compiled(self, method)
        return getattr(self, method)

    def _close(self) -> None:
        # The variables go once nothing else holds them (a dataset made earlier may).
        del self._table
        self._concurrency.functions.clear()
        # A `tf.function` (ours, a dataset's) sits in reference cycles that hold the variables
        # it captured: they would go at some later full collection, and meanwhile a process
        # making buffers in a loop grows (by about half of each 32 MB buffer, measured).
        gc.collect()

    def _snapshot(self) -> tuple[int, list[Any]]:
        for _ in range(SNAPSHOT_ATTEMPTS):
            # Eager writers wait; graph writers are checked for.
            whole, added, values = self._locked("_snapshot_tensors")
            if whole:
                return int(added), [value.numpy() for value in values]
        raise RuntimeError(SNAPSHOT_BUSY.format(attempts=SNAPSHOT_ATTEMPTS))

    def _snapshot_tensors(self) -> tuple[tf.Tensor, tf.Tensor, list[tf.Tensor]]:
        # The variables are read in one graph, within microseconds; the reads are then
        # checked like a sample's (see `_Concurrency`).
        with tf.device(self._device), tf.name_scope(self._scope):

            def read() -> tuple[list[tf.Tensor], tf.Tensor]:
                added = self._added.read_value()
                with tf.control_dependencies([added]):
                    values = [variable.read_value() for variable in self._table.table_variables]
                return [added, *values], _ring.oldest_add(_OPS, added, self._max_length)

            whole, tensors = self._checked_read(read)
            return whole, tensors[0], tensors[1:]

    def _restore(self, added: int, arrays: list[Any]) -> None:
        values = [tf.convert_to_tensor(array) for array in arrays]
        self._locked("_restore_tensors", tf.constant(added, tf.int64), values)

    def _restore_tensors(self, added: tf.Tensor, values: list[tf.Tensor]) -> tf.Tensor:
        with tf.device(self._device), tf.name_scope(self._scope):

            def restore() -> tuple[list[Any], tf.Tensor]:
                with tf.control_dependencies([self._concurrency.generation.assign_add(1)]):
                    assigns = [v.assign(x) for v, x in zip(self._table.table_variables, values)]
                with tf.control_dependencies(assigns):
                    restored = self._added.assign(added, read_value=True)
                return [restored], restored

            return self._concurrency.exclusive(restore, "restore")

    def _gather_all(self) -> Any:
        return self._pack(self._compiled_if_eager("_gather_all_tensors")())

    def _gather_all_tensors(self) -> list[tf.Tensor]:
        with tf.device(self._device), tf.name_scope(self._scope):

            def gather_all() -> tuple[list[tf.Tensor], tf.Tensor]:
                added = self._added.read_value()
                ids = _ring.chronological_ids(_OPS, added, self._max_length, self._batch_size)
                return self._table.read(self._rows(ids)), _ring.oldest_add(_OPS, added, self._max_length)

            return self._read_whole(gather_all)

    def _clear(self) -> None:
        if tf.executing_eagerly():
            self._locked("_clear_tensor")
        else:
            self._clear_tensor()

    def _clear_tensor(self) -> tf.Tensor:
        with tf.device(self._device), tf.name_scope(self._scope):

            def clear() -> tuple[list[Any], tf.Tensor]:
                with tf.control_dependencies([self._concurrency.generation.assign_add(1)]):
                    cleared = self._added.assign(0, read_value=True)
                return [cleared], cleared

            return self._concurrency.exclusive(clear, "clear")
