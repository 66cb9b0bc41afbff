"""A buffer's states: its storage read at one moment, streamed out and in piecewise, replaced or cleared at once.

What `tfbuffers.buffers._segmented_states` asks of the segmented buffers apart from their adds and samples. `States`
holds the algorithm and the interface, once; each execution mode gives the primitives it rests on:

- `HostStates` (the py buffers): every call holds the buffer's lock for as long as it reads or writes; the
  generation that clears and restores move is a Python int.
- `GraphStates` (the TF buffers): reads are checked like a sample's (the seqlock of
  `tfbuffers.execution._tf_concurrency`): eager writers wait for a snapshot, graph writers are checked for and the read
  is made again; a restore or a clear is a writer, in the writers' lock, and moves the generation variable.
"""

from __future__ import annotations

import abc
import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tfbuffers import _ring
from tfbuffers import state as state_lib
from tfbuffers.execution._graph_calls import GraphCalls
from tfbuffers.execution._tf_concurrency import Concurrency

_OPS = _ring.TENSORFLOW

SNAPSHOT_ATTEMPTS = 100
SNAPSHOT_BUSY = (
    "TFUniformReplayBuffer: no consistent snapshot in {attempts} reads: adds kept overwriting stored frames "
    "while the variables were read; pause adds (e.g. between driver runs) while saving"
)


class States(abc.ABC):
    """The states of a buffer's storage: snapshots, row sources and sinks, restores, clears.

    A row source (`row_source`) reads the counter and extras of one moment, then the rows piecewise: what it
    read is the snapshot's while no clear or restore ran since (the generation) and no add that began since
    reached the oldest of its rows (adds up to `oldest + max_length` write elsewhere). That rule is this
    class's; how the moment is read and what guards each read is the execution mode's.
    """

    def __init__(self, storage: Any, max_length: int, extras: Callable[[], dict[str, Any]]) -> None:
        """The states of `storage` (a ring of `max_length` frames per segment).

        `extras`: the state's extras by name (the sampler's: a prioritized buffer's priorities), read with the
        rows; host copies, or graph variables.
        """
        self._storage = storage
        self._max_length = max_length
        self._extras = extras

    def row_source(self) -> state_lib.Rows:
        """The counter and extras now, the rows read piecewise (see `SegmentedStates.row_source`)."""
        generation, added, extras = self._counter_and_extras()
        oldest = int(_ring.oldest_add(_ring.NUMPY, added, self._max_length))
        intact = functools.partial(self._rows_intact, generation, oldest)
        return state_lib.Rows(added, extras, self._read_rows, intact)

    def _rows_intact(self, generation: int, oldest: int) -> bool:
        now, added, writing = self._progress()
        return now == generation and oldest >= added + writing - self._max_length

    @abc.abstractmethod
    def snapshot(self) -> tuple[int, list[np.ndarray], dict[str, np.ndarray]]:
        """The add counter, every field's rows and the extras, all of one moment."""

    @abc.abstractmethod
    def write_rows(self, field: int, first_row: int, rows: np.ndarray) -> None:
        """Writes storage rows of `field` from `first_row` (a loader's, before its commit)."""

    @abc.abstractmethod
    def restore(self, added: int, arrays: list[Any], sampler_restore: Callable[[], list[Any]]) -> None:
        """Replaces the counter, the rows (unless `arrays` is empty: a loader wrote them) and the sampler's state.

        `sampler_restore()`: the sampler's `on_restore`, which changes its host state in place, or gives the
        values of its `restore_targets` (assigned with the rows, in one step).
        """

    @abc.abstractmethod
    def clear(self) -> None:
        """Empties the buffer: the counter 0, the sampler told (`on_clear`), in one step."""

    @abc.abstractmethod
    def _counter_and_extras(self) -> tuple[int, int, dict[str, np.ndarray]]:
        """`(generation, added, extras)` of one moment."""

    @abc.abstractmethod
    def _progress(self) -> tuple[int, int, int]:
        """`(generation, added, adds in progress)` now."""

    @abc.abstractmethod
    def _read_rows(self, field: int, first_row: int, stop_row: int) -> np.ndarray:
        """Storage rows `first_row:stop_row` of `field`, as numpy."""


class HostStates(States):
    """The states of a py buffer's storage: copies under the buffer's lock."""

    def __init__(
        self,
        storage: Any,
        max_length: int,
        extras: Callable[[], dict[str, np.ndarray]],
        *,
        lock: threading.Lock,
        check_open: Callable[[], None],
        cleared: Callable[[], Any],
    ) -> None:
        """As `States`; `lock`: the buffer's; `check_open` raises if it was closed; `cleared`: the sampler's `on_clear`.

        `extras` is called under the lock.
        """
        super().__init__(storage, max_length, extras)
        self._lock = lock
        self._check_open = check_open
        self._cleared = cleared
        self._generation = 0  # moved by clears and restores: what a row source cannot tell from the counter

    def snapshot(self) -> tuple[int, list[np.ndarray], dict[str, np.ndarray]]:
        with self._lock:
            return self._storage.added, self._storage.copies(), self._extras()

    def _counter_and_extras(self) -> tuple[int, int, dict[str, np.ndarray]]:
        # Each read of a row source copies a chunk of rows under the lock.
        with self._lock:
            self._check_open()
            return self._generation, self._storage.added, self._extras()

    def _read_rows(self, field: int, first_row: int, stop_row: int) -> np.ndarray:
        with self._lock:
            self._check_open()
            return self._storage.read_rows(field, first_row, stop_row)

    def _progress(self) -> tuple[int, int, int]:
        with self._lock:
            return self._generation, self._storage.added, 0

    def write_rows(self, field: int, first_row: int, rows: np.ndarray) -> None:
        with self._lock:
            self._storage.write_rows(field, first_row, rows)

    def restore(self, added: int, arrays: list[Any], sampler_restore: Callable[[], list[Any]]) -> None:
        with self._lock, self._storage.changing("restore"):
            if arrays:
                self._storage.replace(arrays)
            self._storage.added = added
            self._generation += 1
            sampler_restore()  # after the rows: it reads the restored step types

    def clear(self) -> None:
        with self._lock:
            self._check_open()
            with self._storage.changing("clear"):
                self._storage.added = 0
                self._generation += 1
                self._cleared()


class GraphStates(States):
    """The states of a TF buffer's storage: seqlock-checked reads; restores and clears in the writers' lock."""

    def __init__(
        self,
        storage: Any,
        max_length: int,
        extras: Callable[[], dict[str, tf.Variable]],
        *,
        concurrency: Concurrency,
        calls: GraphCalls,
        placement: tuple[str, str],
        restored: Callable[[], Sequence[tf.Variable]],
        cleared: Callable[[], list[Any]],
    ) -> None:
        """As `States`, for a `GraphStorage` whose writers take turns by `concurrency`.

        Args:
          storage: The buffer's storage.
          max_length: Frames per segment.
          extras: The state's extras by name (variables), read with the rows.
          concurrency: Its writers' lock and seqlock.
          calls: Its compiled calls (the reads, restores and clears run compiled).
          placement: `(device, name scope)` of the ops.
          restored: The variables a restore assigns beside the rows, in order (the sampler's `restore_targets`).
          cleared: The sampler's `on_clear`: the ops of a clear beside the counter's.
        """
        super().__init__(storage, max_length, extras)
        self._concurrency = concurrency
        self._calls = calls
        self._device, self._scope = placement
        self._restored = restored
        self._cleared = cleared

    def snapshot(self) -> tuple[int, list[np.ndarray], dict[str, np.ndarray]]:
        for _ in range(SNAPSHOT_ATTEMPTS):
            # Eager writers wait; graph writers are checked for.
            whole, added, values = self._calls.locked(self._snapshot_tensors)
            if whole:
                arrays = [value.numpy() for value in values]
                fields = len(self._storage.fields)
                return int(added), arrays[:fields], dict(zip(self._extras(), arrays[fields:]))
        raise RuntimeError(SNAPSHOT_BUSY.format(attempts=SNAPSHOT_ATTEMPTS))

    def _snapshot_tensors(self) -> tuple[tf.Tensor, tf.Tensor, list[tf.Tensor]]:
        # The storage is read in one graph, within microseconds; the reads are then
        # checked like a sample's (see `tfbuffers.execution._tf_concurrency`).
        with tf.device(self._device), tf.name_scope(self._scope):
            counter = self._storage.added

            def read() -> tuple[list[tf.Tensor], tf.Tensor]:
                added = counter.read_value()
                with tf.control_dependencies([added]):
                    values = [*self._storage.values(), *(v.read_value() for v in self._extras().values())]
                return [added, *values], _ring.oldest_add(_OPS, added, self._max_length)

            whole, tensors = self._concurrency.checked_read(read, counter, self._max_length)
            return whole, tensors[0], tensors[1:]

    def _counter_and_extras(self) -> tuple[int, int, dict[str, np.ndarray]]:
        # Each read of a row source gathers a chunk of rows from the variables. A priority update moves the
        # generation too.
        for _ in range(SNAPSHOT_ATTEMPTS):
            whole, values = self._calls.compiled(self._counter_and_extras_tensors)()
            if whole:
                generation, added, *extras = (value.numpy() for value in values)
                return int(generation), int(added), dict(zip(self._extras(), extras))
        raise RuntimeError(SNAPSHOT_BUSY.format(attempts=SNAPSHOT_ATTEMPTS))

    def _counter_and_extras_tensors(self) -> tuple[tf.Tensor, list[tf.Tensor]]:
        with tf.device(self._device), tf.name_scope(self._scope):
            counter = self._storage.added

            def read() -> tuple[list[tf.Tensor], tf.Tensor]:
                added = counter.read_value()
                with tf.control_dependencies([added]):
                    extras = [v.read_value() for v in self._extras().values()]
                # No rows are read here: every add counts as overlapping none (oldest = added).
                return [self._concurrency.generation.read_value(), added, *extras], added + self._max_length

            return self._concurrency.checked_read(read, counter, self._max_length)

    def _read_rows(self, field: int, first_row: int, stop_row: int) -> np.ndarray:
        # A gather of the rows only: a slice would read (and may copy) the whole variable first.
        return self._storage.read_rows(field, first_row, stop_row)

    def _progress(self) -> tuple[int, int, int]:
        writing = int(self._concurrency.writing().numpy())  # before the counter: an add that began is counted
        added = int(self._storage.added.numpy())
        return int(self._concurrency.generation.numpy()), added, writing

    def write_rows(self, field: int, first_row: int, rows: np.ndarray) -> None:
        # In place (a scatter, for the variables): a sliced assign would copy the whole variable (copy-on-write).
        self._storage.write_rows(field, first_row, rows)

    def restore(self, added: int, arrays: list[Any], sampler_restore: Callable[[], list[Any]]) -> None:
        # The sampler's values first (from numpy: the restored step types), then everything in one writer.
        tensors = [shared_tensor(value) for value in [*arrays, *sampler_restore()]]
        self._calls.locked(self._restore_tensors, tf.constant(added, tf.int64), tensors)
        del tensors  # held through the call: its assigns copy the rows, never adopt the arrays' memory

    def _restore_tensors(self, added: tf.Tensor, values: list[tf.Tensor]) -> tf.Tensor:
        with tf.device(self._device), tf.name_scope(self._scope):

            def restore() -> tuple[list[Any], tf.Tensor]:
                restored = self._restored()
                rows, others = values[: len(values) - len(restored)], values[len(values) - len(restored) :]

                def assign() -> list[Any]:
                    assigns = [*(self._storage.assign(rows) if rows else []), *map(_assign, restored, others)]
                    with tf.control_dependencies(assigns):
                        return [self._storage.added.assign(added, read_value=False)]

                effects = self._concurrency.rewrite(assign)
                with tf.control_dependencies(effects):
                    return effects, tf.identity(added)

            return self._concurrency.exclusive([added, *values], restore, "restore")

    def clear(self) -> None:
        if tf.executing_eagerly():
            self._calls.locked(self._clear_tensor)
        else:
            self._clear_tensor()

    def _clear_tensor(self) -> tf.Tensor:
        with tf.device(self._device), tf.name_scope(self._scope):

            def clear() -> tuple[list[Any], tf.Tensor]:
                def reset() -> list[Any]:
                    return [self._storage.added.assign(0, read_value=False), *self._cleared()]

                effects = self._concurrency.rewrite(reset)
                return effects, tf.constant(0, tf.int64)

            return self._concurrency.exclusive([], clear, "clear")


SHARED_BYTES = 1 << 20  # arrays this large are handed to a restore's graph without a copy (`shared_tensor`)


def shared_tensor(value: Any) -> tf.Tensor:
    """`value` as a tensor; a large, C-contiguous, 64-byte aligned numpy array's memory shared (DLPack), not copied.

    A restore's arrays are as large as the buffer: converted, they took a second copy beside them, and TensorFlow's
    allocator kept it afterwards (a TF buffer's `files.load` of atari's 1.1 GB took 4.7 GB beyond its storage at
    its peak and kept 2.5 GB, 2026-12-03). The restore's graph only reads the tensor, and its caller holds it
    through the call, so no op can adopt its memory. Other values (a bool array, which numpy 1.26 cannot export,
    a strided or small one) are converted.
    """
    shareable = isinstance(value, np.ndarray) and value.nbytes >= SHARED_BYTES and value.flags.c_contiguous
    if shareable and value.ctypes.data % 64 == 0:
        try:
            return tf.experimental.dlpack.from_dlpack(value.__dlpack__())
        except (tf.errors.InvalidArgumentError, TypeError, BufferError):
            pass
    return tf.convert_to_tensor(value)


def _assign(variable: tf.Variable, value: tf.Tensor) -> Any:
    return variable.assign(value)
