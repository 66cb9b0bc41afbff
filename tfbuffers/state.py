"""A buffer's contents as named arrays: what files, checkpoints and tools read and write.

Every local buffer hands out its state and takes one back::

    state = buffer.state()           # one consistent moment, as numpy arrays
    other.restore_state(state)       # refused, with the reason, unless the layouts match

A `BufferState` names everything it holds, so nothing is ever matched by
position: fields by their nest path, counters and extra arrays (a prioritized
buffer's priorities) by name, and the whole by its `format` and `layout`. A state
restores into any buffer kind of the same format and layout (a TF buffer's into
a py buffer and back) and nowhere else.

>>> import numpy as np, tensorflow as tf, tfbuffers
>>> buffer = tfbuffers.PyUniformReplayBuffer({"x": tf.TensorSpec([], tf.int32)}, batch_size=2, max_length=3)
>>> _ = buffer.add_batch({"x": np.array([7, 8], np.int32)})
>>> state = buffer.state()
>>> state.format, state.layout, state.counters, state.arrays["x"].tolist()
('tfbuffers.segmented/1', {'batch_size': 2, 'max_length': 3}, {'added': 1}, [7, 8, 0, 0, 0, 0])
>>> other = tfbuffers.TFUniformReplayBuffer({"x": tf.TensorSpec([], tf.int32)}, batch_size=2, max_length=3)
>>> other.restore_state(state)
>>> other.gather_all()["x"].numpy().tolist()
[[7], [8]]

`tf.train.Checkpoint` saves the same state (`StateCheckpoint`), so a
checkpoint is checked the same way when it is restored.
"""

from __future__ import annotations

import dataclasses
import json
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tfbuffers.specs import Field

SEGMENTED = "tfbuffers.segmented/1"
"""`batch_size` rings of `max_length` rows, time-major (see `tfbuffers._ring`); counter `added`."""
PRIORITIZED = "tfbuffers.prioritized/1"
"""`SEGMENTED`, plus extras `priority` (`[capacity]` float64) and `max_priority` (a float64 scalar)."""

ADDED = "added"  # the counter of adds since the last clear
FORMAT_MISMATCH = "{source}: format: holds {received}, this {buffer} stores {expected}"
LAYOUT_MISMATCH = "{source}: {what}: holds {received}, this {buffer} expects {expected}"
FIELDS_MISMATCH = "{source}: fields: {differences}; a field is restored only into the field of the same nest path"
ARRAY_MISMATCH = "{source}: {name}: holds shape {received}, this {buffer} stores {expected}"


@dataclasses.dataclass(frozen=True)
class BufferState:
    """One consistent moment of a buffer's contents.

    Attributes:
      format: What the arrays mean (`SEGMENTED` for the uniform buffers, `PRIORITIZED` for the prioritized).
      layout: The sizes that fix the arrays' shapes (`batch_size`, `max_length`).
      fields: One `Field(path, spec)` per leaf of the data spec.
      counters: Named integers (`added`: adds since the last clear).
      arrays: Each field's storage, `[capacity, *spec.shape]`, by field path.
      extras: Arrays a buffer kind keeps beside its fields, by name (a prioritized buffer's priorities).
    """

    format: str
    layout: Mapping[str, int]
    fields: tuple[Field, ...]
    counters: Mapping[str, int]
    arrays: Mapping[str, np.ndarray]
    extras: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        """The JSON-serialisable description: format, layout and each field's path, dtype and shape."""
        return describe(self.format, self.layout, self.fields)


@dataclasses.dataclass(frozen=True)
class Rows:
    """A buffer's storage read piecewise (`buffer.row_source()`): what a save streams, with no copy of it whole.

    Attributes:
      added: The add counter at one moment.
      extras: The extras (see `BufferState.extras`) at that moment, copied.
      read: `read(field, first_row, stop_row)`: storage rows `[first_row, stop_row)` of field number `field`.
      intact: `intact()`: whether every row read so far is still the one of that moment (no clear,
        restore or priority update since, and no add that reached the oldest row).
    """

    added: int
    extras: Mapping[str, np.ndarray]
    read: Callable[[int, int, int], np.ndarray]
    intact: Callable[[], bool]

    @classmethod
    def of_state(cls, state: BufferState) -> Rows:
        """The rows of a `BufferState` in memory (always intact)."""
        arrays = list(state.arrays.values())

        def read(field: int, first_row: int, stop_row: int) -> np.ndarray:
            return arrays[field][first_row:stop_row]

        return cls(int(state.counters[ADDED]), state.extras, read, _true)


@dataclasses.dataclass(frozen=True)
class RowSink:
    """A new buffer's storage written piecewise (`buffer.row_sink()`): what a load streams in, with no copy.

    Attributes:
      write: `write(field, first_row, rows)`: writes storage rows of field number `field` from `first_row`.
      commit: `commit(added, extras, source)`: checks the extras (a ValueError naming `source` if they are
        not valid) and makes the rows written, the counter and the extras the buffer's contents at once.
    """

    write: Callable[[int, int, np.ndarray], None]
    commit: Callable[[int, dict[str, np.ndarray], str], None]


def _true() -> bool:
    return True


def describe(format: str, layout: Mapping[str, int], fields: Sequence[Field]) -> dict[str, Any]:  # noqa: A002
    """A JSON-serialisable description of a state: format, layout and each field's path, dtype and shape."""
    return {
        "format": format,
        "layout": dict(layout),
        "fields": field_list(fields),
    }


def field_list(fields: Sequence[Field]) -> list[list[Any]]:
    """`describe()["fields"]`: each field's path, dtype name and shape."""
    return [[f.path, f.spec.dtype.name, f.spec.shape.as_list()] for f in fields]


def check_compatible(received: Mapping[str, Any], expected: Mapping[str, Any], source: str, buffer: str) -> None:
    """Raises a ValueError naming the first difference between two `describe()` results.

    Args:
      received: The description of what is being restored.
      expected: The description of the buffer restored into.
      source: What is being restored (a path, "checkpoint", "state"), for the message.
      buffer: The buffer's class name, for the message.
    """
    if received.get("format") != expected["format"]:
        raise ValueError(
            FORMAT_MISMATCH.format(
                source=source, received=received.get("format"), expected=expected["format"], buffer=buffer
            )
        )
    layout = received.get("layout", {})
    for what, value in expected["layout"].items():
        if layout.get(what) != value:
            raise ValueError(
                LAYOUT_MISMATCH.format(
                    source=source, what=what, received=layout.get(what), expected=value, buffer=buffer
                )
            )
    differences = field_differences(
        received.get("fields", []),
        expected["fields"],
        extra=f"{{path}} is not in this {buffer}",
        missing="{path} is missing",
        differs=f"{{path}} holds {{received}}, this {buffer} stores {{expected}}",
    )
    if differences:
        raise ValueError(FIELDS_MISMATCH.format(source=source, differences="; ".join(differences)))


def field_differences(
    received: Sequence[Sequence[Any]], expected: Sequence[Sequence[Any]], *, extra: str, missing: str, differs: str
) -> list[str]:
    """Every field (by nest path, in path order) where two `describe()["fields"]` lists differ, said by the templates.

    `extra` and `missing` are formatted with `path` (a field only `received`, only `expected` has), `differs`
    with `path`, `received` and `expected` (the field's dtype and shape in each, as "float32[3]").
    """
    got = {path: (dtype, list(shape)) for path, dtype, shape in received}
    want = {path: (dtype, list(shape)) for path, dtype, shape in expected}
    differences = []
    for path in sorted(set(got) | set(want)):
        if path not in want:
            differences.append(extra.format(path=path))
        elif path not in got:
            differences.append(missing.format(path=path))
        elif got[path] != want[path]:
            differences.append(
                differs.format(path=path, received=_field_str(got[path]), expected=_field_str(want[path]))
            )
    return differences


def _field_str(dtype_and_shape: tuple[str, list[int]]) -> str:
    dtype, shape = dtype_and_shape
    return f"{dtype}{list(shape)}"


_FORMAT_KEY = "format"
_COUNTER_PREFIX = "counter:"
_FIELD_PREFIX = "field:"
_EXTRA_PREFIX = "extra:"


def _key(prefix: str, name: str) -> str:
    # TensorFlow's checkpoint keys treat "/" specially: field paths keep theirs escaped.
    return prefix + name.replace("%", "%25").replace("/", "%2F")


class StateCheckpoint(tf.__internal__.tracking.Trackable):
    """Puts a buffer's `BufferState` in `tf.train.Checkpoint`s, checked when restored.

    The checkpoint holds the description (`format`), the counters and every array
    under its name: `field:<path>`, `counter:<name>`, `extra:<name>` (with `/`
    written `%2F`). A restore reads them all, checks the description against the
    buffer's, and replaces the buffer's contents in one step (`restore_state`), or
    raises and changes nothing.
    A checkpoint that lacks a field the buffer has fails in TensorFlow's own
    restore, naming the key. Inside a graph (a SavedModel export traces these
    functions) they run as Python callbacks.
    """

    def __init__(self, buffer: Any) -> None:
        """Checkpoints `buffer` (held weakly: the buffer holds this object)."""
        self._buffer = weakref.ref(buffer)

    def __repr__(self) -> str:
        buffer = self._buffer()
        return f"StateCheckpoint({type(buffer).__name__ if buffer is not None else 'collected'})"

    def _target(self) -> Any:
        buffer = self._buffer()
        if buffer is None:
            raise ValueError("StateCheckpoint: the buffer was garbage-collected")
        return buffer

    def _names(self, state: BufferState) -> list[str]:
        return (
            [_key(_COUNTER_PREFIX, name) for name in state.counters]
            + [_key(_FIELD_PREFIX, name) for name in state.arrays]
            + [_key(_EXTRA_PREFIX, name) for name in state.extras]
        )

    def _serialize_to_tensors(self) -> dict[str, Any]:
        buffer = self._target()
        template = buffer.state_template()
        tensors = {_FORMAT_KEY: tf.constant(json.dumps(template.describe()))}
        names = self._names(template)
        if tf.executing_eagerly():
            values = [tf.constant(value) for value in _state_values(buffer.state())]
        else:
            dtypes = [tf.as_dtype(value.dtype) for value in _state_values(template)]
            # Through `self`, which holds the buffer weakly: a traced function does not keep it alive.
            values = tf.py_function(lambda: [tf.constant(v) for v in _state_values(self._target().state())], [], dtypes)
            for value, like in zip(values, _state_values(template)):
                value.set_shape(like.shape)
        tensors.update(zip(names, values))
        return tensors

    def _restore_from_tensors(self, restored_tensors: Mapping[str, Any]) -> Any:
        names = sorted(restored_tensors)
        if tf.executing_eagerly():
            self._restore({name: restored_tensors[name].numpy() for name in names})
            return tf.no_op()

        def restore(*values: Any) -> list[Any]:
            self._restore({n: v.numpy() for n, v in zip(names, values)})
            return []

        return tf.py_function(restore, [restored_tensors[name] for name in names], [])

    def _restore(self, values: Mapping[str, Any]) -> None:
        buffer = self._target()
        template = buffer.state_template()
        raw = values[_FORMAT_KEY]
        received = json.loads(raw.decode() if isinstance(raw, bytes) else str(raw))
        check_compatible(received, template.describe(), "checkpoint", type(buffer).__name__)

        def pick(prefix: str, names: Mapping[str, Any]) -> dict[str, Any]:
            return {name: values[_key(prefix, name)] for name in names}

        state = dataclasses.replace(
            template,
            counters={name: int(value) for name, value in pick(_COUNTER_PREFIX, template.counters).items()},
            arrays=pick(_FIELD_PREFIX, template.arrays),
            extras=pick(_EXTRA_PREFIX, template.extras),
        )
        buffer.restore_state(state, source="checkpoint")


def _state_values(state: BufferState) -> list[np.ndarray]:
    return (
        [np.asarray(value, np.int64) for value in state.counters.values()]
        + list(state.arrays.values())
        + list(state.extras.values())
    )
