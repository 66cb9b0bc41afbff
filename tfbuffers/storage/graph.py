"""The graph storage interface: where a TF buffer's rows, add counter and extras live (see `tfbuffers.storage`).

A `GraphStorage` is what `Storage` is for the py buffers, for `TFUniformReplayBuffer` and
`TFPrioritizedReplayBuffer` (`storage=`): its methods build ops (eagerly, they run), which the buffer calls
inside its graphs and its writers' lock (`tfbuffers.execution._tf_concurrency`) and on its device. The default,
`VariableStorage`, keeps each field's rows in one `tf.Variable`.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tfbuffers.specs import Field


class GraphStorage(abc.ABC):
    """`num_rows` rows of every field of a data spec in the graph, the add counter `added`, and named extras.

    Fields are numbered in `tf.nest.flatten` order of the data spec (`fields[i]`); rows are laid out as
    `tfbuffers.storage` draws them, and rows never written read as zeros. A storage implements three
    methods (`read`, `write_field`, `row_variables`); the rest have defaults built on them, which a storage
    overrides where it has a cheaper op. The counter and the extras are variables the base makes (`added`,
    `extra`), so every storage keeps them alike.

    Not a `tf.Module`: the buffer checkpoints its contents as a whole (`tfbuffers.state`), by field path,
    never variable by variable, and lists the variables by `variables()`.
    """

    def __init__(self, fields: Sequence[Field], num_rows: int, device: str) -> None:
        """The storage of `num_rows` rows of `fields` on `device` (made inside the buffer's device and name scope)."""
        self.fields = tuple(fields)
        self.num_rows = num_rows
        self._device = device
        self.added = tf.Variable(tf.constant(0, tf.int64), trainable=False, name="added")
        self.extras: dict[str, tf.Variable] = {}

    @property
    def device(self) -> str:
        """The device of the variables and of the buffer's ops on them (`TFUniformReplayBuffer(device=)`)."""
        return self._device

    def extra(self, name: str, initial: Any) -> tf.Variable:
        """The buffer's extra `name` (see `tfbuffers.storage`): a variable holding `initial`, made in the current scope.

        Asked for once, at the buffer's construction; the buffer's ops then read and change it.
        """
        variable = self.extras[name] = tf.Variable(initial, trainable=False, name=variable_name(name))
        return variable

    @abc.abstractmethod
    def read(self, rows: tf.Tensor, fields: Sequence[int] | None = None) -> list[tf.Tensor]:
        """Gathers `rows` (an int64 tensor of any shape) of every field (or those numbered in `fields`).

        Field `i`'s tensor is shaped `rows.shape + fields[i].spec.shape`, of its dtype.
        """

    @abc.abstractmethod
    def write_field(self, index: int, rows: tf.Tensor, values: tf.Tensor) -> Any:
        """The op that writes `values` (`rows.shape + shape`) of field `index` at `rows` (an int64 vector)."""

    @abc.abstractmethod
    def row_variables(self) -> Sequence[tf.Variable]:
        """The variables that hold the rows (those `variables()` lists first)."""

    def write(self, rows: Sequence[tf.Tensor], leaves: Sequence[Any]) -> list[Any]:
        """Writes `leaves[i]` (shaped `rows[i].shape + shape_i`) at `rows[i]`, one op per field; returns them."""
        return [
            self.write_field(index, leaf_rows, tf.convert_to_tensor(leaf))
            for index, (leaf, leaf_rows) in enumerate(zip(leaves, rows))
        ]

    def column(self, index: int) -> tf.Tensor:
        """All rows of field `index` (a scalar field: the step types), read as they are now."""
        return self.read(tf.range(self.num_rows, dtype=tf.int64), [index])[0]

    def values(self) -> list[tf.Tensor]:
        """Every field's rows, whole (a snapshot, read in one graph)."""
        return [self.column(index) for index in range(len(self.fields))]

    def assign(self, values: Sequence[tf.Tensor]) -> list[Any]:
        """The ops that replace every field's rows by `values` (a restore; shapes and dtypes already checked).

        A scatter of every row, in place: a variable's `assign` allocated a second variable's worth first (a TF
        buffer's load of 1.1 GB peaked at 2.2 GB beyond its storage for it, 2026-12-03).
        """
        every_row = tf.range(self.num_rows, dtype=tf.int64)
        return [self.write_field(index, every_row, value) for index, value in enumerate(values)]

    def read_rows(self, index: int, first_row: int, stop_row: int) -> np.ndarray:
        """Rows `[first_row, stop_row)` of field `index`, eagerly (a file's writer reads them piecewise)."""
        with tf.device(self.device):
            return self.read(tf.range(first_row, stop_row, dtype=tf.int64), [index])[0].numpy()

    def write_rows(self, index: int, first_row: int, rows: np.ndarray) -> None:
        """Writes `rows` of field `index` from `first_row`, eagerly (a loader's, before its commit)."""
        with tf.device(self.device):
            self.write_field(index, tf.range(first_row, first_row + len(rows), dtype=tf.int64), tf.constant(rows))

    def variables(self) -> tuple[tf.Variable, ...]:
        """Every variable: the rows', the counter, then the extras in the order asked for."""
        return (*self.row_variables(), self.added, *self.extras.values())

    def nbytes(self) -> int:
        """Bytes the variables take."""
        return sum(variable.shape.num_elements() * variable.dtype.size for variable in self.variables())

    def close(self) -> None:  # noqa: B027 (variables go when nothing holds them)
        """Drops what the storage holds beyond its variables; no call follows."""


GraphStorageFactory = Callable[[Sequence[Field], int, str], GraphStorage]
"""What the TF buffers' `storage=` takes: `(fields, num_rows, device) -> GraphStorage`, a subclass for example."""


class VariableStorage(GraphStorage):
    """The TF buffers' default storage: each field's rows a `[num_rows, *shape]` `tf.Variable`, named by path."""

    def __init__(self, fields: Sequence[Field], num_rows: int, device: str) -> None:
        """Creates zero-filled variables in the current device and name scope, named by field path."""
        self.tables = [
            tf.Variable(
                tf.zeros([num_rows, *field.spec.shape.as_list()], field.spec.dtype),
                trainable=False,
                name=variable_name(field.path),
            )
            for field in fields
        ]
        super().__init__(fields, num_rows, device)  # the counter after the rows, as it always was made

    def row_variables(self) -> Sequence[tf.Variable]:
        """One variable per field, in field order."""
        return self.tables

    def read(self, rows: tf.Tensor, fields: Sequence[int] | None = None) -> list[tf.Tensor]:
        """Gathers `rows` (any shape) from every field (or those numbered in `fields`): one gather per field."""
        tables = self.tables if fields is None else [self.tables[i] for i in fields]
        return [tf.gather(table, rows) for table in tables]

    def write_field(self, index: int, rows: tf.Tensor, values: tf.Tensor) -> Any:
        """A scatter into field `index`'s variable: in place (a sliced assign would copy it whole)."""
        return self.tables[index].scatter_update(tf.IndexedSlices(values, rows))

    def column(self, index: int) -> tf.Tensor:
        """Field `index`'s variable, read: one op."""
        return self.tables[index].read_value()


def variable_name(path: str) -> str:
    """A variable name for a field's nest path or an extra's name (characters TF refuses replaced)."""
    return re.sub(r"[^A-Za-z0-9_.\-/]", "_", path).strip("_") or "item"
