"""The host storage interface: where a py buffer's rows, add counter and extras live (see `tfbuffers.storage`)."""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from tfbuffers.specs import Field


class Recovery(NamedTuple):
    """What a storage found when its buffer was built (`Storage.ready`): nothing, for a new one."""

    reopened: bool = False
    """It holds the rows, counter and extras of an earlier buffer (a reopened directory): the buffer rebuilds
    what derives from them (its sampler's state, `tfbuffers.sampling.Sampler.on_restore`)."""
    clearing: bool = False
    """A clear of that buffer was cut short: the buffer finishes it."""


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

    def pool(self, name: str, shape: Sequence[int], dtype: Any) -> np.ndarray | None:
        """A large array named `name` for a wrapper to keep beside the rows, zeros at first; None by default.

        The frames stored once of `frame_stacks` (`FrameStackTable`), which writes a slot only where no row
        refers, lowest slots first, and asks once, when attached. None (the default): the wrapper keeps its
        own in RAM, grown as needed. A storage whose rows outlive the process keeps it with them, unjournaled
        (`tfbuffers.storage.memmap`: a sparse file, whose pages the disk holds only once written).
        """
        return None

    def attach(self, batch_size: int, max_length: int) -> None:  # noqa: B027 (most storages need no sizes)
        """The buffer's segments: told once, after the storage is made and before any `extra` is asked for.

        Nothing by default; a storage that journals each add's block (`tfbuffers.storage.memmap`) sizes it here.
        """

    def ready(self, buffer_name: str, data_spec: Any, options: Callable[[], Mapping[str, Any]]) -> Recovery:
        """The buffer is built (its sampler's extras made): what the storage found, `Recovery()` by default.

        A storage that outlives its buffer records the buffer here (`tfbuffers.storage.memmap` writes its header:
        the class, `data_spec` and `options()`, the constructor's options), or says it holds an earlier one's.
        """
        return Recovery()

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
        """Writes one add, or a run of adds: each field's `[n, *shape]` rows contiguously from `first_row`.

        `n` is a multiple of the buffer's `batch_size` (the adds' rows, time-major), at most `block_rows()`, and
        the rows do not wrap: `first_row + n <= num_rows`. The counter moves after it (the run's commit).
        """
        for index, leaf in enumerate(leaves):
            self.write_rows(index, first_row, leaf)

    def write_frames(self, first_row: int, leaves: Sequence[np.ndarray]) -> None:
        """Writes a run of adds as `write_block` does, each field's frames given `[adds, batch_size, *shape]`.

        The frames time-major and of any strides (a block's `[batch_size, T]` leaves with their axes swapped, a
        view): by default each made contiguous (one copy) for `write_block`; a storage that assigns them in place
        (`NumpyTable`, memory-mapped files) saves that copy.
        """
        self.write_block(first_row, [np.reshape(leaf, (-1, *leaf.shape[2:])) for leaf in leaves])

    def block_rows(self) -> int:
        """The most rows one `write_block` takes: every row by default; a storage that journals a block, its journal's.

        A py buffer's `extend` writes a longer block as several, each committed before the next.
        """
        return self.num_rows

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

        A storage that outlives its process marks it on the disk while it runs (`tfbuffers.storage.memmap`).
        """
        return contextlib.nullcontext()

    def flush(self) -> None:  # noqa: B027 (a storage in memory has nothing to write back)
        """Writes everything back to where it outlives the process (a disk); nothing by default."""

    def close(self) -> None:  # noqa: B027 (most storages hold nothing to release beyond their arrays)
        """Releases the rows (files, memory); no call follows."""


StorageFactory = Callable[[Sequence[Field], int], Storage]
"""What `storage=` takes: `(fields, num_rows) -> Storage`, a `Storage` subclass itself for example."""
