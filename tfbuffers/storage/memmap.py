"""Memory-mapped storage: a py buffer's rows, counter and extras in files under a directory, which outlive it.

    buffer = PyUniformReplayBuffer(spec, capacity=1_000_000, directory="replay/")  # a new directory
    ...                                          # adds and samples as usual; the kernel caches the pages
    buffer.close()                               # or the process dies: every returned add is on disk
    buffer = tfbuffers.open("replay/")           # another process, later: its class, spec and options too

`directory="replay/"` is short for `storage=MemmapStorage("replay/")`: memory-mapped files are a storage
(`tfbuffers.storage.Storage`) like the others, which uses the two hooks of one that outlives its buffer
(`attach`: the journal sized by the buffer's segments; `ready`: the header written, or a reopened buffer's
`Recovery`).

The directory holds `header.json` (the format version, the buffer's class, data spec, sizes and
options, and every file's dtype and shape: written once, at construction), one `.npy` file per field
(`fields/<i>.npy`, `[num_rows, *shape]`) and per extra (`extras/`: a prioritized buffer's priorities and
sum tree, an episode-aware buffer's record of episode ends), per pool (`pools/`: with `frame_stacks`,
each distinct frame once, its field's rows holding handles; a sparse file of the most frames the rows can
hold, whose pages the disk takes only as frames are written), `state.npy` (the add counter and the
words below), the journal of the add in progress (`journal/`) and `lock`. Every file is mapped with
`numpy.memmap` (`MAP_SHARED`): a write is in the kernel's page cache when it returns, and the pages
count as file-backed memory, not as the process's own (`RssFile`, not `RssAnon`, in
`/proc/self/status`); the kernel writes them back and drops them when memory is short.

Durability, exactly:

* The process killed at any moment (SIGKILL, an OOM kill, a crash): `tfbuffers.open` gives back every
  add whose `add_batch` returned, no frame of an add that had not, and no torn frame. An add first
  copies the rows (and the rows' priorities) it is about to overwrite into the journal, then marks it,
  writes, and commits by storing the counter, one aligned 8-byte word. An `extend` does so once per run
  of adds its journal holds (up to `JOURNAL_BYTES` of rows, never past the ring's end): one cut short
  keeps a prefix of its adds, each whole. Opening a directory whose add was cut short copies the
  journal back; what is derived from the rows (the sum tree, the record of episode ends) is rebuilt on
  every open. Priorities an `update_priorities` cut short set are each the old or the new value; a
  `clear` cut short is finished on open.
* `flush()` (`msync` of every file): every add that returned before it is on the disk, so a machine
  crash or power loss after it keeps them. After a machine crash (told by the boot id `state.npy`
  records), a buffer written to after its last `flush()` is refused by `open`: the kernel writes
  pages back in any order, so some of those adds may be on the disk in part. One written to since
  its last flush is marked so on the disk (one `msync` of `state.npy` with the first write after
  each flush) before the write.
* `close()` flushes and marks the directory closed.
* A restore or a load into the buffer (`restore_state`, a checkpoint, `<Class>.load(path,
  directory=...)`) killed before it finished leaves rows of two states: `open` refuses it, naming it.

One writer at a time: the constructor and `open` take an exclusive `flock` on `directory/lock`
(released when the process exits or dies) and write their pid there; a second one is refused with a
`DirectoryInUseError` naming the directory and that process. Readers in other processes are not offered:
rows change in place.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pathlib
import re
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from tfbuffers import specs
from tfbuffers.specs import Field
from tfbuffers.storage import NumpyTable, Recovery
from tfbuffers.storage._advice import AdvisedReads
from tfbuffers.storage.tables import frames_view

FORMAT = "tfbuffers-memmap"
VERSION = 2  # 2: frame stacks kept as handles and a pool of frames (`pools`); 1 (opened): stacks stored whole
VERSIONS = (1, VERSION)
HEADER = "header.json"
STATE = "state.npy"
LOCK = "lock"

# The words of `state.npy`.
ADDED = 0  # the add counter
JOURNAL_ADD = 1  # the add number the journal was taken for (-1: none)
JOURNAL_FIRST = 2  # the first row it covers
JOURNAL_COUNT = 3  # how many rows
CLEAN = 4  # 1: closed by close(); 0: open, or its writer died
BUSY = 5  # a clear (CLEARING) or restore (RESTORING) under way
UNFLUSHED = 6  # 1: written to since the last flush (on the disk before the write)
BOOT = 7  # 7 and 8: the boot id of the machine that opened it for writing
FLUSHED_ADDED = 9  # the counter at the last flush
JOURNAL_FIELDS = 10  # 1: the journal holds the fields' rows too (the ring was full); 0: the rows' extras only
JOURNAL_ROWS = 11  # the rows the journal holds (`block_rows`); 0 in a directory made before blocks: batch_size
WORDS = 16
CLEARING, RESTORING = 1, 2
JOURNAL_BYTES = 32 << 20  # a new directory's journal: the fields' rows of as many adds as fit here (one at least)

IN_USE = "directory: {directory} is held by process {pid}{ours}; one process writes a buffer directory at a time"
NOT_EMPTY = (
    "directory: expected a new or empty directory, got {directory}, which holds {held}; reopen a buffer's "
    "directory with tfbuffers.open({directory!r})"
)
NO_HEADER = "directory: {directory} has no {header}: not a buffer directory (made with directory=), or never finished"
BAD_HEADER = "{file}: {what}: expected {expected}, got {received}"
SHORT_FILE = "{file}: expected {expected} bytes ({what}, as {header} says), got {received}"
STORAGE_AND_DIRECTORY = "storage: expected None with directory (the directory is the storage), got both"
UNFINISHED_RESTORE = (
    "{directory}: a restore or load into this buffer did not finish (its process died): its rows are of two states; "
    "load the file or checkpoint again into a new directory"
)
CRASHED_UNFLUSHED = (
    "{directory}: the machine stopped (its boot id changed) while this buffer was open, and it was written to after "
    "its last flush() (at {flushed} adds; the counter reads {added}): some of those adds may be on the disk in part. "
    "Nothing was changed; the adds up to a flush() are kept only with no write after it"
)


class DirectoryInUseError(RuntimeError):
    """A buffer directory is open for writing in another process (or another buffer of this one)."""


def boot_id() -> np.ndarray:
    """This boot's id as two int64 words (Linux's `/proc/sys/kernel/random/boot_id`; zeros elsewhere)."""
    try:
        text = pathlib.Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return np.frombuffer(uuid.UUID(text).bytes, np.int64).copy()
    except (OSError, ValueError):
        return np.zeros(2, np.int64)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", name)


def _npy_layout(path: pathlib.Path) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, data offset) of an `.npy` file, read from its header alone."""
    with path.open("rb") as file:
        version = np.lib.format.read_magic(file)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(file)
        if fortran:
            raise ValueError("Fortran order")
        return tuple(shape), np.dtype(dtype), file.tell()


def check_array_file(path: pathlib.Path, shape: Sequence[int], dtype: Any, what: str) -> None:
    """Raises naming `path` if it is not an `.npy` file of `shape` and `dtype` holding all its bytes."""
    expected = f"{np.dtype(dtype).name} {list(shape)}"
    if not path.is_file():
        raise ValueError(BAD_HEADER.format(file=path, what=what, expected=f"a file of {expected}", received="none"))
    try:
        found_shape, found_dtype, offset = _npy_layout(path)
    except (OSError, ValueError) as error:
        raise ValueError(BAD_HEADER.format(file=path, what=what, expected=expected, received=error)) from None
    if found_shape != tuple(shape) or found_dtype != np.dtype(dtype):
        received = f"{found_dtype.name} {list(found_shape)}"
        raise ValueError(BAD_HEADER.format(file=path, what=what, expected=expected, received=received))
    size = offset + int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if path.stat().st_size < size:
        raise ValueError(
            SHORT_FILE.format(
                file=path, expected=size, what=f"{what}: {expected}", header=HEADER, received=path.stat().st_size
            )
        )


class Header:
    """A directory's `header.json`, read and checked against its version."""

    def __init__(self, directory: str | os.PathLike) -> None:
        """Reads `directory/header.json`.

        Raises:
          FileNotFoundError: If there is no directory or no header in it.
          ValueError: If the header is not this format's, or of another version.
        """
        self.directory = pathlib.Path(directory)
        self.path = self.directory / HEADER
        if not self.path.is_file():
            raise FileNotFoundError(errno.ENOENT, NO_HEADER.format(directory=self.directory, header=HEADER))
        try:
            self.content = json.loads(self.path.read_text())
        except ValueError as error:
            raise ValueError(
                BAD_HEADER.format(file=self.path, what="JSON", expected="a header", received=error)
            ) from None
        found = (self.content.get("format"), self.content.get("version"))
        if found[0] != FORMAT or found[1] not in VERSIONS:
            expected = f"{(FORMAT, VERSION)} (or version {', '.join(map(str, VERSIONS[:-1]))})"
            raise ValueError(
                BAD_HEADER.format(file=self.path, what="format and version", expected=expected, received=found)
            )

    @property
    def version(self) -> int:
        """The format version the directory was written in (1: frame stacks stored whole)."""
        return int(self.content["version"])

    @property
    def buffer(self) -> str:
        """The class name of the buffer."""
        return str(self.content["buffer"])

    @property
    def data_spec(self) -> Any:
        """The buffer's data spec."""
        return specs.spec_from_json(self.content["spec"])

    def arguments(self) -> dict[str, Any]:
        """The constructor's arguments beyond the data spec: sizes and options."""
        sizes = {"batch_size": self.content["batch_size"], "max_length": self.content["max_length"]}
        return {**self.content["options"], **sizes}

    def check(self, fields: Sequence[Field], num_rows: int) -> None:
        """Raises naming the file and what differs if a data file is not what the header and `fields` say."""
        described = [(entry["path"], entry["dtype"], entry["shape"]) for entry in self.content["fields"]]
        made = [(field.path, field.spec.dtype.name, field.spec.shape.as_list()) for field in fields]
        if described != made:
            raise ValueError(BAD_HEADER.format(file=self.path, what="fields", expected=made, received=described))
        for entry in self.content["fields"]:
            check_array_file(
                self.directory / entry["file"], [num_rows, *entry["shape"]], entry["dtype"], f"field {entry['path']}"
            )
        for entry in self.content["extras"]:
            check_array_file(self.directory / entry["file"], entry["shape"], entry["dtype"], f"extra {entry['name']}")
        for entry in self.content.get("pools", []):
            check_array_file(self.directory / entry["file"], entry["shape"], entry["dtype"], f"pool {entry['name']}")
        check_array_file(self.directory / STATE, [WORDS], np.int64, "state words")


class MemmapStorage:
    """`storage=` of the py buffers: their rows, counter and extras in memory-mapped files under `directory`.

    `PyUniformReplayBuffer(spec, ..., storage=MemmapStorage("replay/"))` is what `directory="replay/"` does: a
    new or empty directory, which outlives the buffer (see the module). `MemmapStorage(directory, reopen=True)`
    maps a directory that holds a buffer again (what `tfbuffers.open` passes). With `frame_stacks`, the
    stacks wrap it (`tfbuffers.storage.FrameStackTable`): their fields' rows hold handles, and each distinct
    frame is kept once in a pool file beside them (`pools/`); a directory of format version 1 (before
    frame stacks composed with storages) holds its stacks whole, and is reopened so.
    """

    def __init__(self, directory: str | os.PathLike, *, reopen: bool = False) -> None:
        """A storage factory for a new (or empty) `directory`, or (`reopen`) for the buffer it holds.

        Raises:
          FileNotFoundError: With `reopen`, if `directory` holds no buffer header.
          ValueError: With `reopen`, naming the file, if the header is of another format or version.
        """
        self.directory = pathlib.Path(directory)
        self._header = Header(directory) if reopen else None  # read and checked now

    def __call__(self, fields: Sequence[Field], num_rows: int) -> MemmapTable:
        """The storage: the directory's lock taken, its files made or (reopened) checked and mapped."""
        return MemmapTable(self.directory, fields, num_rows, reopen=self._header)

    @property
    def stores_frame_stacks_whole(self) -> bool:
        """Read by `tfbuffers.storage.make`: a reopened directory of version 1 holds its stacks whole."""
        return self._header is not None and self._header.version == 1

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.directory)!r}{', reopened' if self._header else ''})"


class MemmapTable(AdvisedReads, NumpyTable):
    """A `NumpyTable` whose arrays are `.npy` files under a directory, memory-mapped (see the module).

    Made by `MemmapStorage` (a py buffer's `directory=`: a new directory) or `MemmapStorage(..., reopen=True)` (`open`:
    an existing one). The buffer gives its segments (`attach`: the journal's size), writes the header once it
    is built (`ready`), and reads and changes the arrays in place under its lock.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        fields: Sequence[Field],
        num_rows: int,
        reopen: Header | None = None,
    ) -> None:
        """Takes the directory's lock, then makes its files (new) or checks and maps them (`reopen`).

        Raises:
          DirectoryInUseError: If another process (or buffer) holds the directory.
          ValueError: Naming the directory or file, if a new directory is not empty, or a reopened one's
            files are not what its header says (nothing is changed on the disk then).
        """
        self.directory = pathlib.Path(directory)
        self._batch_size = self._journal_rows = 0  # the buffer's segments, the journal's rows (`attach`)
        self._max_length = 0
        self._reopened = reopen is not None
        if reopen is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            held = sorted(path.name for path in self.directory.iterdir())
            if held:
                raise ValueError(NOT_EMPTY.format(directory=str(self.directory), held=held))
        else:
            reopen.check(fields, num_rows)
        self._lock_fd = _take_lock(self.directory)
        self._finalizer = weakref.finalize(self, os.close, self._lock_fd)
        try:
            self._map_files(fields, num_rows, reopen)
        except BaseException:
            self._finalizer()  # refused or failed: the lock released at once
            raise

    def _map_files(self, fields: Sequence[Field], num_rows: int, reopen: Header | None) -> None:
        self._maps: dict[str, np.memmap] = {}  # every mapped file by its path under the directory
        self._journals: list[np.ndarray] = []
        self._row_extras: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # name -> (array, its journal)
        self._pools: list[dict[str, Any]] = []  # the header's entries
        self._unflushed = False
        self._state = self._map(STATE, (WORDS,), np.int64, None if reopen else np.zeros(WORDS, np.int64))
        if reopen is not None:
            self._check_state()  # refused: nothing written
        os.ftruncate(self._lock_fd, 0)
        os.pwrite(self._lock_fd, f"{os.getpid()}\n".encode(), 0)
        # NumpyTable's constructor maps the fields (`_allocate`) and sets `added` (the counter on disk).
        self._opening = True
        super().__init__(fields, num_rows)
        self._opening = False
        self._pending = self._pending_journal() if reopen is not None else None
        state = self._state
        state[CLEAN] = 0
        state[BOOT : BOOT + 2] = boot_id()

    def attach(self, batch_size: int, max_length: int) -> None:
        """The buffer's segments: the journal holds the rows one commit writes (`JOURNAL_BYTES`, `block_rows`).

        A reopened directory's add that was cut short is undone here: its rows as they were before it.
        """
        self._batch_size, self._max_length = batch_size, max_length
        if not self._reopened:
            row_bytes = sum(field.spec.shape.num_elements() * field.spec.dtype.size for field in self.fields)
            adds = min(max_length, max(1, JOURNAL_BYTES // max(1, row_bytes * batch_size)))
            self._state[JOURNAL_ROWS] = adds * batch_size
        self._journal_rows = int(self._state[JOURNAL_ROWS]) or batch_size
        try:
            self._journals = [
                self._map(
                    f"journal/{index}.npy",
                    (self._journal_rows, *field.spec.shape.as_list()),
                    field.spec.dtype.as_numpy_dtype,
                    None if self._reopened else 0,
                )
                for index, field in enumerate(self.fields)
            ]
            if self._pending is not None:
                self._touch()
                first, count = self._pending
                if self._state[JOURNAL_FIELDS]:
                    for index, journal in enumerate(self._journals):
                        self.arrays[index][first : first + count] = journal[:count]
        except BaseException:
            self._finalizer()  # refused or failed: the lock released at once
            raise

    # The counter: an aligned 8-byte word of state.npy.

    @property
    def added(self) -> int:
        """The number of adds since the last clear, as `state.npy` holds it."""
        return int(self._state[ADDED])

    @added.setter
    def added(self, value: int) -> None:
        if getattr(self, "_opening", False):
            return  # NumpyTable's constructor: the counter is the directory's
        state = self._state
        self._touch()
        if value > state[ADDED] and state[JOURNAL_ADD] == state[ADDED]:  # an add's, or a run of adds', commit
            state[ADDED] = value
            state[JOURNAL_ADD] = -1
        else:  # a clear or a restore: the journal no longer applies, before the counter moves
            state[JOURNAL_ADD] = -1
            state[ADDED] = value

    # Files.

    def _map(self, name: str, shape: Sequence[int], dtype: Any, initial: Any) -> np.ndarray:
        """The file `name` mapped as a plain array: made (filled with `initial`) unless `initial` is None."""
        path = self.directory / name
        if initial is None:
            check_array_file(path, shape, dtype, name)
            mapped = np.lib.format.open_memmap(path, mode="r+")
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            mapped = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=tuple(shape))
            if np.any(initial):
                mapped[...] = initial
        self._maps[name] = mapped
        return mapped.view(np.ndarray)  # numpy's memmap subclass costs on every index; the mapping is its base

    def _allocate(self, index: int, field: Field) -> np.ndarray:
        name, shape = f"fields/{index}.npy", (self.num_rows, *field.spec.shape.as_list())
        array = self._map(name, shape, field.spec.dtype.as_numpy_dtype, None if self._reopened else 0)
        return self._advised(name, array)

    def extra(self, name: str, initial: np.ndarray) -> np.ndarray:
        """The extra `name` in `extras/`: `initial`'s values in a new directory, the file's in a reopened one.

        An extra with a row per storage row (`[num_rows, ...]`: the priorities) is journaled with the rows.
        """
        initial = np.asarray(initial)
        file = f"extras/{_safe(name)}.npy"
        array = self._map(file, initial.shape, initial.dtype, None if self._reopened else initial)
        self.extras[name] = array
        if initial.shape[:1] == (self.num_rows,):
            journal_file = f"journal/extras/{_safe(name)}.npy"
            shape = (self._journal_rows, *initial.shape[1:])
            journal = self._map(journal_file, shape, initial.dtype, None if self._reopened else 0)
            self._row_extras[name] = (array, journal)
            if self._pending is not None:
                first, count = self._pending
                array[first : first + count] = journal[:count]
        return array

    def pool(self, name: str, shape: Sequence[int], dtype: Any) -> np.ndarray:
        """The pool `name` in `pools/`: a new sparse file of zeros, or a reopened directory's (see `Storage.pool`).

        Not journaled: its user writes only slots no row refers to, so an add undone from the journal finds
        its rows' frames as they were.
        """
        file = f"pools/{_safe(name)}.npy"
        array = self._map(file, shape, dtype, None if self._reopened else 0)
        self._pools.append({"name": name, "dtype": array.dtype.name, "shape": list(array.shape), "file": file})
        return array

    def describe(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The header's `fields` and `extras` entries."""
        fields = [
            {
                "path": field.path,
                "dtype": field.spec.dtype.name,
                "shape": field.spec.shape.as_list(),
                "file": f"fields/{index}.npy",
            }
            for index, field in enumerate(self.fields)
        ]
        extras = [
            {"name": name, "dtype": array.dtype.name, "shape": list(array.shape), "file": f"extras/{_safe(name)}.npy"}
            for name, array in self.extras.items()
        ]
        return fields, extras

    def ready(self, buffer_name: str, data_spec: Any, options: Callable[[], Mapping[str, Any]]) -> Recovery:
        """The buffer is built: a new directory gets its header; a reopened one's journal is spent.

        Returns whether the directory held a buffer (`reopened`: the buffer rebuilds what derives from its
        rows) and whether that buffer's clear was cut short (`clearing`: the buffer finishes it).
        """
        if self._reopened:
            self._state[JOURNAL_ADD] = -1
            self._pending = None
            return Recovery(reopened=True, clearing=int(self._state[BUSY]) == CLEARING)
        fields, extras = self.describe()
        header = {
            "format": FORMAT,
            "version": VERSION,
            "buffer": buffer_name,
            "spec": specs.spec_to_json(data_spec),
            "batch_size": self._batch_size,
            "max_length": self._max_length,
            "options": dict(options()),
            "fields": fields,
            "extras": extras,
            "pools": self._pools,
        }
        self.flush()
        temporary = self.directory / f".{HEADER}.tmp"
        with temporary.open("w") as file:
            json.dump(header, file, indent=1)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, self.directory / HEADER)
        _fsync_directory(self.directory)
        return Recovery()

    # Writes.

    def _touch(self) -> None:
        """Before the first write since the last flush: `UNFLUSHED` set, and on the disk."""
        if not self._unflushed:
            self._state[UNFLUSHED] = 1
            self._maps[STATE].flush()
            self._unflushed = True

    def block_rows(self) -> int:  # noqa: D102 (`Storage.block_rows`: the journal's rows, one commit's)
        return self._journal_rows

    def write_block(self, first_row: int, leaves: Sequence[np.ndarray]) -> None:
        """One add or run of adds: the rows (and rows' extras) it overwrites journaled, then written (`_journal`)."""
        self.write_frames(first_row, [np.asarray(leaf)[None] for leaf in leaves])  # rows: one "add" of them

    def write_frames(self, first_row: int, leaves: Sequence[np.ndarray]) -> None:
        """`write_block` of a run of adds' `[adds, batch_size, *shape]` frames, each assigned in place."""
        self._journal(first_row, leaves[0].shape[0] * leaves[0].shape[1] if leaves else 0)
        for array, leaf in zip(self.arrays, leaves):
            frames_view(array, first_row, leaf)[...] = leaf

    def _journal(self, first_row: int, count: int) -> None:
        """The rows `[first_row, first_row + count)` copied to the journal and marked, before they are written.

        The counter's move commits them. While the ring is filling, the rows hold no stored frame: only their
        extras are journaled (an add cut short there leaves rows past the counter, which the next add writes whole).
        """
        self._touch()
        rows = slice(first_row, first_row + count)
        state = self._state
        whole = count == self._journal_rows
        full = state[ADDED] * self._batch_size >= self.num_rows
        if full:
            for array, journal in zip(self.arrays, self._journals):
                (journal if whole else journal[:count])[...] = array[rows]
        for array, journal in self._row_extras.values():
            (journal if whole else journal[:count])[...] = array[rows]
        state[JOURNAL_FIRST] = first_row
        state[JOURNAL_COUNT] = count
        state[JOURNAL_FIELDS] = full
        state[JOURNAL_ADD] = state[ADDED]  # from here an open copies the journal back, until the counter moves

    def write_rows(self, index: int, first_row: int, rows: np.ndarray) -> None:
        """Writes rows of one field: a restore's or a load's (marked busy until `changing` ends)."""
        self._touch()
        if not self._state[BUSY]:
            self._state[BUSY] = RESTORING
        super().write_rows(index, first_row, rows)

    def replace(self, arrays: Sequence[np.ndarray]) -> None:
        """Every field's rows replaced (a restore), marked busy until `changing` ends."""
        self._touch()
        self._state[BUSY] = RESTORING
        super().replace(arrays)

    @contextlib.contextmanager
    def changing(self, what: str) -> Iterator[None]:
        """Marks a clear or a restore under way on the disk while it runs (see `Storage.changing`)."""
        self._touch()
        if not self._state[BUSY]:
            self._state[BUSY] = CLEARING if what == "clear" else RESTORING
        yield
        self._state[BUSY] = 0

    def flush(self) -> None:
        """Every mapped file written back to the disk (`msync`), then the state marked flushed and written back."""
        for name, mapped in self._maps.items():
            if name != STATE:
                mapped.flush()
        state = self._state
        state[FLUSHED_ADDED] = state[ADDED]
        state[UNFLUSHED] = 0
        self._maps[STATE].flush()
        self._unflushed = False

    def close(self) -> None:
        """Flushes, marks the directory closed, unmaps the files and releases the lock."""
        if not self._maps:
            return
        self.flush()
        self._state[CLEAN] = 1
        self._maps[STATE].flush()
        super().close()
        self._journals, self._row_extras, self._advice = [], {}, []
        self._maps.clear()
        self._finalizer()  # the lock's descriptor closed: released

    def _check_state(self) -> None:
        state = self._state
        if state[BUSY] == RESTORING:
            raise ValueError(UNFINISHED_RESTORE.format(directory=self.directory))
        crashed = not state[CLEAN] and not np.array_equal(state[BOOT : BOOT + 2], boot_id())
        if crashed and state[UNFLUSHED]:
            raise ValueError(
                CRASHED_UNFLUSHED.format(directory=self.directory, flushed=state[FLUSHED_ADDED], added=state[ADDED])
            )

    def _pending_journal(self) -> tuple[int, int] | None:
        state = self._state
        if state[JOURNAL_ADD] < 0 or state[JOURNAL_ADD] != state[ADDED]:
            return None
        return int(state[JOURNAL_FIRST]), int(state[JOURNAL_COUNT])


def _take_lock(directory: pathlib.Path) -> int:
    """An exclusive `flock` on `directory/lock`; raises naming the holder (the pid written there)."""
    import fcntl  # POSIX: imported here, so that the package imports where it is not (the buffers in RAM)

    fd = os.open(directory / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        ours = " (this process: another buffer on it is open; close it first)" if holder == str(os.getpid()) else ""
        raise DirectoryInUseError(IN_USE.format(directory=directory, pid=holder, ours=ours)) from None
    return fd  # the pid is written once the directory is accepted


def _fsync_directory(directory: pathlib.Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
