"""Where a buffer's frames live: the storage interfaces, and the storages tfbuffers has.

A buffer of `batch_size` segments of `max_length` frames stores them in `num_rows = batch_size *
max_length` rows per field of its data spec, time-major: add number `t` writes one row per segment,
rows `(t % max_length) * batch_size + segment`, each field's into that field's rows.

    row:        0     1     2     3     4     5        (batch_size 2, max_length 3)
    add t=0:   s0    s1                                 rows 0-1
    add t=1:               s0    s1                     rows 2-3
    add t=2:                           s0    s1         rows 4-5
    add t=3:   s0    s1                                 rows 0-1 again: the oldest frames go

A storage keeps those rows, `added`, the number of adds since the last clear (which fixes which
rows hold which frames: `tfbuffers._ring`), and the buffer's named extras: arrays it keeps beside
the rows and changes with them (a prioritized buffer's `"priority"`, `"max_priority"` and
`"sum_tree"`, an episode-aware buffer's `"episodes/distance"`, `"episodes/near"` and
`"episodes/last_end"`), which the buffer asks the storage for once with `extra(name, initial)`. So a
storage that keeps its rows somewhere (a file on disk) keeps everything the buffer holds there too.
The buffer picks the rows (ring arithmetic, sampling, episode records and priorities are the
buffer's) and takes its lock around every call; states, checkpoints and files carry the rows, the
counter and the extras whatever the storage.

Two interfaces, one per way a buffer runs:

* `Storage`, numpy on the host, for the py buffers (`PyUniformReplayBuffer`,
  `PyPrioritizedReplayBuffer`), which take any: `storage=` a callable `(fields, num_rows) -> Storage`.
  tfbuffers has numpy arrays in RAM (`NumpyTable`, the default) and the frame-stack pool
  (`FrameStackTable`, made by `frame_stacks=`). A new one (files on disk, another process) implements
  the three abstract methods; the contract, files, state and fuzz tests run on it through one entry in
  the test registry.
* `VariableStorage`, `tf.Variable`s in the graph, for the TF buffers: its writes and reads are ops.

>>> import numpy as np, tensorflow as tf
>>> from tfbuffers import PyUniformReplayBuffer
>>> buffer = PyUniformReplayBuffer({"x": tf.TensorSpec([], tf.int64)}, batch_size=2, max_length=3,
...                                storage=NumpyTable)
>>> _ = buffer.add_batch({"x": np.array([7, 8])})
>>> buffer.gather_all()["x"].tolist()
[[7], [8]]
"""

from __future__ import annotations

import abc
import contextlib
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tfbuffers.frames import FrameBuffer
from tfbuffers.specs import Field

NOT_A_STORAGE = "storage: expected a callable (fields, num_rows) -> tfbuffers.storage.Storage, got {received}"
STORAGE_AND_STACKS = "storage: expected None with frame_stacks (frame stacks are a storage of their own), got both"
FRAME_STACKS = (
    "frame_stacks: expected None, a field's nest path, a list of paths or a dict of path to stacking axis, "
    "paths among {paths}; got {received}"
)
FRAME_STACK_AXIS = "frame_stacks: field {path}: expected an axis of its shape {shape}, got {axis!r}"


class Storage(abc.ABC):
    """`num_rows` rows of every field of a data spec, and the add counter `added` (see the module).

    Fields are numbered in `tf.nest.flatten` order of the data spec (`fields[i]`); a row of field `i`
    is an array of `fields[i].spec`'s shape and dtype. Rows never written read as zeros.
    """

    def __init__(self, fields: Sequence[Field], num_rows: int) -> None:
        self.fields = tuple(fields)
        self.num_rows = num_rows
        self.added = 0
        self.extras: dict[str, np.ndarray] = {}

    def extra(self, name: str, initial: np.ndarray) -> np.ndarray:
        """The buffer's extra array `name`, of `initial`'s shape and dtype, holding `initial`'s values.

        Asked for once, at the buffer's construction; the buffer then reads and changes the array in place
        (under its lock), never replaces it. In RAM by default; a storage that keeps its rows elsewhere keeps
        its extras there too (a new storage starts with `initial`'s values, a reopened one with its own).
        """
        array = self.extras[name] = np.array(initial, copy=True)
        return array

    def extras_nbytes(self) -> int:
        """Bytes the extras take."""
        return sum(array.nbytes for array in self.extras.values())

    @abc.abstractmethod
    def write_rows(self, index: int, first_row: int, rows: np.ndarray) -> None:
        """Writes `rows` (`[n, *shape]`) of field `index` at rows `[first_row, first_row + n)`."""

    @abc.abstractmethod
    def read(self, rows: np.ndarray, fields: Sequence[int] | None = None) -> list[np.ndarray]:
        """Gathers `rows` (an int64 array of any shape) of every field (or those numbered in `fields`)."""

    @abc.abstractmethod
    def nbytes(self) -> int:
        """Bytes of storage the rows take."""

    def write_block(self, first_row: int, leaves: Sequence[np.ndarray]) -> None:
        """Writes one add: each field's `[batch_size, *shape]` rows contiguously from `first_row`."""
        for index, leaf in enumerate(leaves):
            self.write_rows(index, first_row, leaf)

    def read_rows(self, index: int, first_row: int, stop_row: int) -> np.ndarray:
        """A copy of rows `[first_row, stop_row)` of field `index`."""
        return self.read(np.arange(first_row, stop_row, dtype=np.int64), [index])[0]

    def column(self, index: int) -> np.ndarray:
        """All rows of field `index` (a scalar field: the step types), read as they are now."""
        return self.read_rows(index, 0, self.num_rows)

    def copies(self) -> list[np.ndarray]:
        """Every field's `[num_rows, *shape]` rows, copied."""
        return [self.read_rows(index, 0, self.num_rows) for index in range(len(self.fields))]

    def replace(self, arrays: Sequence[np.ndarray]) -> None:
        """Replaces every field's rows by `arrays` (shapes and dtypes already checked)."""
        for index, array in enumerate(arrays):
            self.write_rows(index, 0, array)

    def changing(self, what: str) -> contextlib.AbstractContextManager[None]:
        """Brackets a `"clear"` or a `"restore"` (rows, counter and extras replaced): nothing by default.

        A storage that outlives its process marks it on the disk while it runs (`tfbuffers.memmap`).
        """
        return contextlib.nullcontext()

    def flush(self) -> None:  # noqa: B027 (a storage in memory has nothing to write back)
        """Writes everything back to where it outlives the process (a disk); nothing by default."""

    def close(self) -> None:  # noqa: B027 (most storages hold nothing to release beyond their arrays)
        """Releases the rows (files, memory); no call follows."""


StorageFactory = Callable[[Sequence[Field], int], Storage]
"""What `storage=` takes: `(fields, num_rows) -> Storage`, a `Storage` subclass itself for example."""


class NumpyTable(Storage):
    """The default storage: each field's rows in a `[num_rows, *shape]` numpy array in RAM."""

    def __init__(self, fields: Sequence[Field], num_rows: int) -> None:
        """Allocates zero-filled arrays (pages are only touched when written)."""
        super().__init__(fields, num_rows)
        self.arrays = [self._allocate(index, field) for index, field in enumerate(fields)]

    def _allocate(self, index: int, field: Field) -> np.ndarray:
        return np.zeros((self.num_rows, *field.spec.shape.as_list()), field.spec.dtype.as_numpy_dtype)

    def read(self, rows: np.ndarray, fields: Sequence[int] | None = None) -> list[np.ndarray]:
        """Gathers `rows` (any shape) from every field (or those numbered in `fields`): one gather per field."""
        chosen = range(len(self.arrays)) if fields is None else fields
        return [self._gather(index, rows) for index in chosen]

    def _gather(self, index: int, rows: np.ndarray) -> np.ndarray:
        return np.take(self.arrays[index], rows, axis=0)

    def column(self, index: int) -> np.ndarray:
        """The stored array of field `index` itself (not a copy; a field that is not frame stacks)."""
        return self.arrays[index]

    def read_rows(self, index: int, first_row: int, stop_row: int) -> np.ndarray:
        """A copy of rows `[first_row, stop_row)` of field `index`."""
        return self.arrays[index][first_row:stop_row].copy()

    def write_rows(self, index: int, first_row: int, rows: np.ndarray) -> None:
        """Writes `rows` of field `index` from `first_row`."""
        self.arrays[index][first_row : first_row + len(rows)] = rows

    def close(self) -> None:
        """Drops the storage."""
        self.arrays = []
        self.extras.clear()

    def nbytes(self) -> int:
        """Bytes of storage allocated (pages never written take no memory)."""
        return sum(array.nbytes for array in self.arrays)


class FrameStackTable(NumpyTable):
    """A `NumpyTable` whose fields of stacked frames hold handles into a `FrameBuffer`, one per field.

    A stack of `depth` frames along `axis` (Atari's `[84, 84, 4]` along -1) is
    stored as `depth` handles; each distinct frame is stored once, however many
    stacks (of any rows and segments) hold it, and freed when the last row holding it
    is overwritten. Rows never written hold the all-zero frame, as a plain table's
    zero-filled rows do. Reads gather the frames and rebuild the stacks: exactly the
    arrays a plain table returns.
    """

    def __init__(self, fields: Sequence[Field], num_rows: int, stacks: Mapping[int, int]) -> None:
        """`stacks` maps field indices to their stacking axis (`0 <= axis < rank`)."""
        self.stacks = dict(stacks)
        self.pools: dict[int, FrameBuffer] = {}
        self.handles: dict[int, np.ndarray] = {}
        self._previous: dict[int, np.ndarray] = {}  # the handles of the last rows written, per field
        super().__init__(fields, num_rows)

    def _allocate(self, index: int, field: Field) -> np.ndarray:
        if index not in self.stacks:
            return super()._allocate(index, field)
        shape = field.spec.shape.as_list()
        axis = self.stacks[index]
        depth = shape[axis]
        pool = FrameBuffer(capacity_hint=self.num_rows + self.num_rows // 64 + 4 * depth)  # slack: untouched
        zero = pool.add_frames(np.zeros([1, *shape[:axis], *shape[axis + 1 :]], field.spec.dtype.as_numpy_dtype))
        pool.reference(np.repeat(zero, self.num_rows * depth - 1))  # every row's every frame, unwritten
        self.pools[index] = pool
        self.handles[index] = np.full([self.num_rows, depth], zero[0], np.int64)
        return np.zeros([0, *shape], field.spec.dtype.as_numpy_dtype)  # never read: the rows are the handles

    def _gather(self, index: int, rows: np.ndarray) -> np.ndarray:
        if index not in self.stacks:
            return super()._gather(index, rows)
        handles, pool = self.handles[index][rows], self.pools[index]  # handles: [*rows, depth]
        stacks = np.empty(rows.shape + self.arrays[index].shape[1:], self.arrays[index].dtype)
        # One gather per stacked position, each written to its place along the axis: for the last axis, a
        # strided copy of contiguous frames, 3-4x faster in numpy than gathering all and transposing.
        by_position = np.moveaxis(stacks, rows.ndim + self.stacks[index], -1)
        for position in range(handles.shape[-1]):
            by_position[..., position] = pool.gather(handles[..., position])
        return stacks

    def column(self, index: int) -> np.ndarray:
        """The rows of a field that is not frame stacks, in place (the step types never are)."""
        assert index not in self.stacks, "the step types are never frame stacks"
        return super().column(index)

    def read_rows(self, index: int, first_row: int, stop_row: int) -> np.ndarray:
        """A copy of rows `[first_row, stop_row)` of field `index`, stacks rebuilt from their frames."""
        if index not in self.stacks:
            return super().read_rows(index, first_row, stop_row)
        return self._gather(index, np.arange(first_row, stop_row))

    def write_rows(self, index: int, first_row: int, rows: np.ndarray) -> None:
        """Writes `rows` of field `index`; a stack's frames are stored once each, and the old rows' released."""
        if index not in self.stacks:
            super().write_rows(index, first_row, rows)
            return
        pool, handles = self.pools[index], self.handles[index]
        frames = np.moveaxis(np.asarray(rows), self.stacks[index] + 1, 1)  # [n, depth, *frame]
        count, depth = frames.shape[:2]
        previous = self._previous.get(index)
        new = np.empty([count, depth], np.int64)
        shifted = np.zeros(count, bool)
        if previous is not None and len(previous) == count and depth > 1:
            # An add's stacks are usually the previous add's shifted by one frame: where the bytes say so, the
            # older frames keep their handles and only the newest frame is looked up. Only handles still
            # held (a restore may have freed them since), and only equal bytes.
            shifted = pool.held(previous[:, 1:]).all(axis=1)
            shifted &= (pool.gather(previous[:, 1:]) == frames[:, :-1]).reshape(count, -1).all(axis=1)
            new[shifted, :-1] = previous[shifted, 1:]
            pool.reference(new[shifted, :-1].ravel())
        new[shifted, -1] = pool.add_frames(frames[shifted, -1])
        new[~shifted] = pool.add_frames(frames[~shifted].reshape(-1, *frames.shape[2:])).reshape(-1, depth)
        self._previous[index] = new
        old = handles[first_row : first_row + count].ravel().copy()
        handles[first_row : first_row + count] = new
        pool.release(old)  # after the adds: frames the old and new rows share are never freed in between

    def close(self) -> None:
        """Drops the arrays and the pools."""
        super().close()
        self.pools.clear()
        self.handles.clear()

    def nbytes(self) -> int:
        """The arrays', the pools' and the handles' bytes."""
        return (
            super().nbytes()
            + sum(pool.nbytes for pool in self.pools.values())
            + sum(handles.nbytes for handles in self.handles.values())
        )


class VariableStorage:
    """The TF buffers' storage: each field's rows a `[num_rows, *shape]` `tf.Variable`, the counter and extras too.

    Its methods build ops (eagerly, they run): the TF buffers call them inside their graphs and their
    writers' lock (`tfbuffers._tf_concurrency`). A plain object, not a `tf.Module`: the buffer
    checkpoints its contents as a whole (`tfbuffers.state`), by field path, never variable by variable.
    """

    def __init__(self, fields: Sequence[Field], num_rows: int) -> None:
        """Creates zero-filled variables in the current device and name scope, named by field path."""
        self.fields = tuple(fields)
        self.num_rows = num_rows
        self.variables = [
            tf.Variable(
                tf.zeros([num_rows, *field.spec.shape.as_list()], field.spec.dtype),
                trainable=False,
                name=_variable_name(field.path),
            )
            for field in fields
        ]
        self.added = tf.Variable(tf.constant(0, tf.int64), trainable=False, name="added")
        self.extras: dict[str, tf.Variable] = {}

    def extra(self, name: str, initial: Any) -> tf.Variable:
        """The buffer's extra `name` (see the module): a variable holding `initial`, made in the current scope."""
        variable = self.extras[name] = tf.Variable(initial, trainable=False, name=_variable_name(name))
        return variable

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


def _variable_name(path: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-/]", "_", path).strip("_") or "item"


def make(storage: StorageFactory | None, fields: Sequence[Field], num_rows: int, frame_stacks: Any = None) -> Storage:
    """The storage of a py buffer's `storage=` and `frame_stacks=` (see `PyUniformReplayBuffer`), checked.

    Raises:
      TypeError, ValueError: Naming the option, if either is not what the py buffers take, or both are given.
    """
    stacks = frame_stack_axes(fields, frame_stacks)
    if stacks and storage is not None:
        raise ValueError(STORAGE_AND_STACKS)
    if stacks:
        return FrameStackTable(fields, num_rows, stacks)
    if storage is None:
        return NumpyTable(fields, num_rows)
    if not callable(storage):
        raise TypeError(NOT_A_STORAGE.format(received=f"{type(storage).__name__} {storage!r}"))
    made = storage(fields, num_rows)
    if not isinstance(made, Storage):
        raise TypeError(NOT_A_STORAGE.format(received=f"a factory that made {type(made).__name__}"))
    return made


def frame_stack_axes(fields: Sequence[Field], option: Any) -> dict[int, int]:
    """Field index -> non-negative stacking axis of the `frame_stacks` option; raises naming what is wrong."""
    paths = [field.path for field in fields]
    if option is None:
        return {}
    if isinstance(option, str):
        option = {option: -1}
    elif isinstance(option, Sequence) and option and all(isinstance(path, str) for path in option):
        option = {path: -1 for path in option}
    elif not isinstance(option, Mapping) or not option:
        raise TypeError(FRAME_STACKS.format(paths=paths, received=f"{type(option).__name__} {option!r}"))
    axes = {}
    for path, axis in option.items():
        if path not in paths:
            raise ValueError(FRAME_STACKS.format(paths=paths, received=f"path {path!r}"))
        shape = fields[paths.index(path)].spec.shape
        if isinstance(axis, bool) or not isinstance(axis, int) or not -shape.rank <= axis < shape.rank:
            raise ValueError(FRAME_STACK_AXIS.format(path=path, shape=shape, axis=axis))
        axes[paths.index(path)] = axis % shape.rank
    return axes
