"""Row storage in `tf.Variable`s: one variable per field of the data spec."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tfbuffers.specs import Field


def _variable_name(path: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-/]", "_", path).strip("_") or "item"


class VariableTable:
    """`num_rows` rows of every field, each field a `[num_rows, *shape]` variable.

    A plain object, not a `tf.Module`: the buffer checkpoints its contents as a
    whole (`tfbuffers.state`), by field path, never variable by variable.
    """

    def __init__(self, fields: Sequence[Field], num_rows: int) -> None:
        """Creates zero-filled variables in the current device and name scope, named by field path."""
        self.variables = [
            tf.Variable(
                tf.zeros([num_rows, *field.spec.shape.as_list()], field.spec.dtype),
                trainable=False,
                name=_variable_name(field.path),
            )
            for field in fields
        ]

    def write(self, rows: Sequence[tf.Tensor], leaves: Sequence[Any]) -> list[Any]:
        """Writes `leaves[i]` (shaped `rows[i].shape + shape_i`) at `rows[i]`; returns the updates."""
        return [
            variable.scatter_update(tf.IndexedSlices(tf.convert_to_tensor(leaf), leaf_rows))
            for variable, leaf, leaf_rows in zip(self.variables, leaves, rows)
        ]

    def read(self, rows: tf.Tensor, fields: Sequence[int] | None = None) -> list[tf.Tensor]:
        """Gathers `rows` (any shape) from every field (or those numbered in `fields`)."""
        variables = self.variables if fields is None else [self.variables[i] for i in fields]
        return [tf.gather(variable, rows) for variable in variables]
