"""A TF buffer's states: its variables read at one moment, streamed out piecewise, and replaced at once.

What `tfbuffers._segmented_states` asks of the TF buffers, apart from their adds and samples. Reads are
checked like a sample's (the seqlock of `tfbuffers._tf_concurrency`): eager writers wait for a snapshot,
graph writers are checked for and the read is made again. A restore is a writer, in the writers' lock.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tfbuffers import _ring
from tfbuffers import state as state_lib
from tfbuffers._graph_calls import GraphCalls
from tfbuffers._tf_concurrency import Concurrency
from tfbuffers.storage import GraphStorage

_OPS = _ring.TENSORFLOW

SNAPSHOT_ATTEMPTS = 100
SNAPSHOT_BUSY = (
    "TFUniformReplayBuffer: no consistent snapshot in {attempts} reads: adds kept overwriting stored frames "
    "while the variables were read; pause adds (e.g. between driver runs) while saving"
)


class GraphStates:
    """The states of a TF buffer's storage: snapshots, row sources and sinks, restores."""

    def __init__(
        self,
        storage: GraphStorage,
        concurrency: Concurrency,
        calls: GraphCalls,
        max_length: int,
        placement: tuple[str, str],
        extras: Callable[[], dict[str, tf.Variable]],
        restored: Callable[[], Sequence[tf.Variable]],
    ) -> None:
        """The states of `storage`, whose writers take turns by `concurrency`.

        Args:
          storage: The buffer's storage.
          concurrency: Its writers' lock and seqlock.
          calls: Its compiled calls (the reads and the restore run compiled).
          max_length: Frames per segment.
          placement: `(device, name scope)` of the ops.
          extras: The state's extras by name (a prioritized buffer's priorities), read with the rows.
          restored: The variables a restore assigns beside the rows, in order (priorities, the record of
            episode ends).
        """
        self._storage = storage
        self._concurrency = concurrency
        self._calls = calls
        self._max_length = max_length
        self._device, self._scope = placement
        self._extras = extras
        self._restored = restored

    def snapshot(self) -> tuple[int, list[np.ndarray], dict[str, np.ndarray]]:
        """The add counter, every field's rows and the extras, all of one moment."""
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
        # checked like a sample's (see `tfbuffers._tf_concurrency`).
        with tf.device(self._device), tf.name_scope(self._scope):
            counter = self._storage.added

            def read() -> tuple[list[tf.Tensor], tf.Tensor]:
                added = counter.read_value()
                with tf.control_dependencies([added]):
                    values = [*self._storage.values(), *(v.read_value() for v in self._extras().values())]
                return [added, *values], _ring.oldest_add(_OPS, added, self._max_length)

            whole, tensors = self._concurrency.checked_read(read, counter, self._max_length)
            return whole, tensors[0], tensors[1:]

    def row_source(self) -> state_lib.Rows:
        """The counter and extras now, the rows read piecewise (see `SegmentedStates.row_source`)."""
        # Each read gathers a chunk of rows from the variables. The rows read are the snapshot's when, read
        # after them, the generation is the one read with the counter and extras (no clear, restore or
        # priority update ran) and no add that began since reached the oldest of them (the seqlock check of
        # `tfbuffers._tf_concurrency`).
        for _ in range(SNAPSHOT_ATTEMPTS):
            whole, values = self._calls.compiled(self._counter_and_extras_tensors)()
            if whole:
                break
        else:
            raise RuntimeError(SNAPSHOT_BUSY.format(attempts=SNAPSHOT_ATTEMPTS))
        generation, added, *extras = (value.numpy() for value in values)
        oldest = int(_ring.oldest_add(_ring.NUMPY, int(added), self._max_length))
        intact = functools.partial(self._rows_intact, int(generation), oldest)
        return state_lib.Rows(int(added), dict(zip(self._extras(), extras)), self._read_rows, intact)

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

    def _rows_intact(self, generation: int, oldest: int) -> bool:
        writing = int(self._concurrency.writing().numpy())
        added = int(self._storage.added.numpy())
        return int(self._concurrency.generation.numpy()) == generation and oldest >= added + writing - self._max_length

    def write_rows(self, field: int, first_row: int, rows: np.ndarray) -> None:
        """Writes storage rows of `field` from `first_row` (a loader's, before its commit)."""
        # In place (a scatter, for the variables): a sliced assign would copy the whole variable (copy-on-write).
        self._storage.write_rows(field, first_row, rows)

    def restore(self, added: int, values: Sequence[np.ndarray]) -> None:
        """Sets the counter to `added` and the last `len(values)` of the rows and `restored()` to `values`, at once.

        `values`: every field's rows then the restored variables', or (a load wrote the rows) the latter only.
        """
        tensors = [tf.convert_to_tensor(value) for value in values]
        self._calls.locked(self._restore_tensors, tf.constant(added, tf.int64), tensors)

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


def _assign(variable: tf.Variable, value: tf.Tensor) -> Any:
    return variable.assign(value)
