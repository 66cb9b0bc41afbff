"""Row storage in `tf.Variable`s: one variable per field of the data spec."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tfbuffers.specs import Field


def _variable_name(path: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-/]", "_", path).strip("_") or "item"


class VariableTable(tf.Module):
    """`num_rows` rows of every field, each field a `[num_rows, *shape]` variable."""

    def __init__(self, fields: Sequence[Field], num_rows: int) -> None:
        """Creates zero-filled variables in the current device and name scope, named by field path."""
        super().__init__(name=None)
        self._variables = [
            tf.Variable(
                tf.zeros([num_rows, *field.spec.shape.as_list()], field.spec.dtype),
                trainable=False,
                name=_variable_name(field.path),
            )
            for field in fields
        ]

    @property
    def table_variables(self) -> list[tf.Variable]:
        """The field variables, in `tf.nest.flatten` order of the spec."""
        return list(self._variables)

    def write(self, rows: Sequence[tf.Tensor], leaves: Sequence[Any]) -> list[Any]:
        """Writes `leaves[i]` (shaped `rows[i].shape + shape_i`) at `rows[i]`; returns the updates."""
        return [
            variable.scatter_update(tf.IndexedSlices(tf.convert_to_tensor(leaf), leaf_rows))
            for variable, leaf, leaf_rows in zip(self._variables, leaves, rows)
        ]

    def read(self, rows: tf.Tensor) -> list[tf.Tensor]:
        """Gathers `rows` (any shape) from every field."""
        return [tf.gather(variable, rows) for variable in self._variables]
