"""A segmented buffer's states and files: its contents at one moment, restored, streamed to and from files.

The layer of `SegmentedReplayBuffer` that turns a storage's snapshot (rows, add counter, extras) into a
`tfbuffers.state.BufferState` and back, and into files (`tfbuffers.files`) through the row source and
sink; with the constructor's options a file records and a config builds. The storage hooks it needs
are declared here: each buffer kind implements them over its storage and lock.
"""

from __future__ import annotations

import abc
import dataclasses
import inspect
import os
from collections.abc import Mapping
from typing import Any, TypeVar

import numpy as np

from tfbuffers import specs
from tfbuffers import state as state_lib
from tfbuffers.replay_buffer import ReplayBuffer, optional_positive_int, positive_int

ADDED = state_lib.ADDED
CONFIG_UNKNOWN = "config: unexpected key(s) {unexpected}; {buffer} takes {expected}"
CONFIG_SIZE = "config: expected capacity (a multiple of batch_size={batch_size}) or max_length, got {received}"
_FROM_FILE_OR_CONFIG = ("data_spec", "capacity", "batch_size", "max_length")
# Not kept: a loaded buffer's sampler is seeded anew, and a storage or sampler (factories of live objects) is
# passed again; a directory (memory-mapped storage) is named again. Every other constructor argument is a
# property of the same name.
_NOT_RECORDED = ("seed", "storage", "sampler", "directory")

Buffer = TypeVar("Buffer", bound="SegmentedStates")


class SegmentedStates(ReplayBuffer):
    """States, checkpoints (through `tfbuffers.state.StateCheckpoint`), files and configs of a segmented buffer."""

    _batch_size: int
    _max_length: int

    def state_template(self) -> state_lib.BufferState:
        """A `BufferState` with this buffer's format, layout, fields, names and shapes, and no contents.

        Its arrays are zero-strided views: they take no memory.
        """
        return state_lib.BufferState(
            format=state_lib.SEGMENTED,
            layout={"batch_size": self._batch_size, "max_length": self._max_length},
            fields=self._fields,
            counters={ADDED: 0},
            arrays={
                field.path: np.broadcast_to(
                    np.zeros((), field.spec.dtype.as_numpy_dtype), (self.capacity, *field.spec.shape.as_list())
                )
                for field in self._fields
            },
        )

    def state(self) -> state_lib.BufferState:
        """The buffer's contents at one moment, as numpy arrays (see `tfbuffers.state`).

        Safe while other threads use the buffer: the py buffer copies its arrays
        under its lock; the TF buffer reads its variables until no add
        overlapped the read.
        """
        self._check_open()
        added, arrays, extras = self._snapshot()
        return dataclasses.replace(
            self.state_template(),
            counters={ADDED: int(added)},
            arrays={field.path: array for field, array in zip(self._fields, arrays)},
            extras=extras,
        )

    def restore_state(self, buffer_state: state_lib.BufferState, *, source: str = "state") -> None:
        """Replaces the buffer's contents with `buffer_state`'s, at once for other threads.

        Fields are matched by nest path. The state must have this buffer's format,
        layout and fields (paths, dtypes, shapes); its buffer kind may differ.

        Args:
          buffer_state: From `state()` of this or another buffer, a file or a checkpoint.
          source: What the state came from, for error messages.

        Raises:
          ValueError: If the format, layout, fields or array shapes differ, or the
            counter is out of range; the buffer is then unchanged.
        """
        self._check_open()
        template = self.state_template()
        name = type(self).__name__
        state_lib.check_compatible(buffer_state.describe(), template.describe(), source, name)
        arrays = [
            _checked_array(buffer_state.arrays, template.arrays, field.path, source, name) for field in self._fields
        ]
        extras = {
            extra: _checked_array(buffer_state.extras, template.extras, extra, source, name)
            for extra in template.extras
        }
        added = buffer_state.counters.get(ADDED)
        if not isinstance(added, int | np.integer) or added < 0:
            raise ValueError(f"{source}: counter {ADDED}: expected an int >= 0, got {added!r}")
        self._check_extras(extras, source)
        self._restore(int(added), arrays, extras)

    def _check_extras(self, extras: dict[str, np.ndarray], source: str) -> None:
        """Raises a ValueError if the extras' values (shapes and dtypes already checked) are invalid."""

    # Files, and the storage streamed out and in.

    def row_source(self) -> state_lib.Rows:
        """The storage read piecewise: the add counter and extras now, the rows as asked for (eager only).

        What `save` streams from, with no copy of the whole storage: `read(field, first_row, stop_row)`
        returns storage rows (see `tfbuffers._ring` for where a frame's row is), `intact()` whether the
        rows read since are still those of the counter's moment (adds that began since may overwrite the
        oldest; a clear, restore or priority update changes them all). A reader that finds them changed
        asks again.
        """
        self._check_open()
        return self._row_source()

    def row_sink(self) -> state_lib.RowSink:
        """The storage written piecewise, for a loader filling this (new) buffer with no copy (eager only).

        `write(field, first_row, rows)` writes storage rows; `commit(added, extras, source)` checks the
        extras and makes the rows, the counter and the extras the buffer's contents at once. Rows written
        and not committed are not part of the contents: commit before any other call.
        """
        self._check_open()
        return state_lib.RowSink(self._write_rows, self._commit_rows)

    def _commit_rows(self, added: int, extras: dict[str, np.ndarray], source: str) -> None:
        self._check_extras(extras, source)
        self._restore(added, [], extras)

    def save(
        self, path: str | os.PathLike, metadata: dict[str, Any] | None = None, *, progress: bool | None = None
    ) -> Any:
        """Saves the stored frames to one file, atomically; returns its `pathlib.Path`.

        The file holds the data spec, batch size, `max_length`, this class and its
        options, so `tfbuffers.load(path)` or `<BufferClass>.load(path)` rebuilds the
        buffer from it alone. See `tfbuffers.files` (needs the `files` extra).

        Args:
          path: The file to write.
          metadata: A JSON-serialisable dict kept in the file's header.
          progress: Show a progress bar: None once the save takes 2 s, True always, False never.
        """
        from tfbuffers import files

        return files.save(self, path, metadata, progress=progress)

    @classmethod
    def load(cls: type[Buffer], path: str | os.PathLike, *, progress: bool | None = None, **overrides: Any) -> Buffer:
        """A new buffer of this class holding a file's frames (saved from any local buffer class).

        Built with the file's data spec, batch size, `max_length` and options (those
        this class takes), then `overrides`: `max_length=` a different size (a
        shorter one keeps the newest frames), `seed=`, `device=`, ... Every byte is
        verified; see `tfbuffers.files`. `progress` is as in `save`.

        Raises:
          FileNotFoundError: If there is no file at `path`.
          ValueError: If the file is not a buffer file, is damaged, or holds
            priorities and this class is uniform.
        """
        from tfbuffers import files

        return files.load_buffer(path, cls, progress=progress, **overrides)

    @classmethod
    def from_config(cls: type[Buffer], config: Mapping[str, Any]) -> Buffer:
        """A buffer from a plain dict, as MindSpore's configs make them.

        >>> import tfbuffers
        >>> config = {"capacity": 1000, "batch_size": 2, "names": ["obs", "action"],
        ...           "shapes": [[4], []], "dtypes": ["float32", "int64"], "seed": 0}
        >>> buffer = tfbuffers.PyUniformReplayBuffer.from_config(config)
        >>> buffer.max_length, buffer.data_spec["action"]
        (500, TensorSpec(shape=(), dtype=tf.int64, name='action'))

        `names`, `shapes` and `dtypes` are parallel lists, one entry per field of a
        dict data spec; `capacity` (a multiple of `batch_size`, default 1) or
        `max_length` gives the size; every other key is a constructor argument
        (`seed`, `priority_exponent`, `device`, ...).

        Raises:
          TypeError, ValueError: Naming the key, what was expected and what was received.
        """
        config = dict(config)
        data_spec = specs.spec_from_config(config)
        for key in ("names", "shapes", "dtypes"):
            config.pop(key)
        batch_size = positive_int("batch_size", config.pop("batch_size", 1))
        capacity = optional_positive_int("capacity", config.pop("capacity", None))
        max_length = optional_positive_int("max_length", config.pop("max_length", None))
        if max_length is None:
            if capacity is None or capacity % batch_size:
                received = f"capacity {capacity!r}, max_length {max_length!r}"
                raise ValueError(CONFIG_SIZE.format(batch_size=batch_size, received=received))
            max_length = capacity // batch_size
        elif capacity is not None and capacity != batch_size * max_length:
            received = f"capacity {capacity} with batch_size {batch_size} and max_length {max_length}"
            raise ValueError(CONFIG_SIZE.format(batch_size=batch_size, received=received))
        accepted = [
            name for name in inspect.signature(cls.__init__).parameters if name not in ("self", *_FROM_FILE_OR_CONFIG)
        ]
        unexpected = sorted(set(config) - set(accepted))
        if unexpected:
            raise TypeError(CONFIG_UNKNOWN.format(unexpected=unexpected, buffer=cls.__name__, expected=accepted))
        return cls(data_spec, batch_size=batch_size, max_length=max_length, **config)

    def constructor_options(self) -> dict[str, Any]:
        """The constructor's arguments beyond the data spec and sizes that the buffer keeps (what a file records).

        A sampler's seed is not kept: a buffer loaded from a file is seeded anew (`seed=`).

        >>> import tfbuffers, tensorflow as tf
        >>> buffer = tfbuffers.PyUniformReplayBuffer({"x": tf.TensorSpec([], tf.int64)}, batch_size=2,
        ...                                          max_length=4, seed=3, dataset_window_shift=2)
        >>> buffer.constructor_options()  # doctest: +NORMALIZE_WHITESPACE
        {'dataset_drop_remainder': False, 'dataset_window_shift': 2, 'stateful_dataset': False,
         'episode_boundaries': False, 'frame_stacks': None}
        """
        parameters = inspect.signature(type(self).__init__).parameters
        names = [name for name in parameters if name not in ("self", *_FROM_FILE_OR_CONFIG, *_NOT_RECORDED)]
        return {name: getattr(self, name) for name in names}

    # Storage hooks.

    @abc.abstractmethod
    def _row_source(self) -> state_lib.Rows:
        """`row_source()`'s rows: the counter and extras now, the rows read piecewise."""

    @abc.abstractmethod
    def _write_rows(self, field: int, first_row: int, rows: np.ndarray) -> None:
        """Writes storage rows from `first_row` of field number `field` (a load into a new buffer)."""

    @abc.abstractmethod
    def _snapshot(self) -> tuple[int, list[Any], dict[str, np.ndarray]]:
        """(add counter, one `[capacity, *shape]` numpy array per field, extras by name): one consistent moment."""

    @abc.abstractmethod
    def _restore(self, added: int, arrays: list[Any], extras: dict[str, np.ndarray]) -> None:
        """Replaces the contents, counter and extras by a checked snapshot's, at once for other threads.

        With `arrays` empty, the rows stay as they are (a load wrote them with `_write_rows`).
        """


def _checked_array(received: Any, expected: Any, name: str, source: str, buffer: str) -> np.ndarray:
    """`received[name]` as an array, if it has the shape and dtype of `expected[name]`; else a ValueError."""
    like = expected[name]
    if name not in received:
        raise ValueError(f"{source}: {name}: missing; this {buffer} stores {like.shape} {like.dtype}")
    array = np.asarray(received[name])
    if array.shape != like.shape or array.dtype != like.dtype:
        raise ValueError(
            state_lib.ARRAY_MISMATCH.format(
                source=source,
                name=name,
                received=f"{array.shape} {array.dtype}",
                expected=f"{like.shape} {like.dtype}",
                buffer=buffer,
            )
        )
    return array
