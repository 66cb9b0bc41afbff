"""Buffer files: one safetensors file per buffer, checked on load, written so that a crash never leaves a bad one.

    buffer.save("starter.safetensors", {"policy": "random"})      # or files.save(buffer, path, metadata)
    buffer = tfbuffers.load("starter.safetensors")                # the class it was saved from
    buffer = tfbuffers.PyUniformReplayBuffer.load(path, max_length=100_000)   # another class, another size
    files.load(path, existing_buffer)                             # into a buffer you already have

**What a file holds.** The stored frames only, oldest first, one tensor per field
(`field/<path>`, shaped `[frames per segment, batch_size, *shape]`), so a file grows
with the frames held, not with the capacity; a prioritized buffer's priorities
(`extra/priority`, `[frames per segment, batch_size]`) and largest priority
(`extra/max_priority`). The header holds the data spec (nest and leaves, as JSON:
no pickle anywhere), the buffer's class and constructor options, `batch_size`,
`max_length`, the add counter, your metadata, a SHA-256 of every tensor and one of
the header itself. It is a plain safetensors file: `safetensors.safe_open` reads it.

**Loading.** `load_buffer` (behind `tfbuffers.load` and `<BufferClass>.load`)
builds the buffer from the file alone; a file loads into any local buffer class
(a TF buffer's file as a py buffer and back) of the same batch size, and into a
prioritized class from a uniform buffer's file (the loaded frames then get
priority 1.0, as new frames do). A different `max_length` keeps the newest frames
that fit (the oldest are dropped); the add counter is kept when the frames fill
the new buffer, else it becomes the number of adds loaded (ids then start at 0).
Everything is verified while it is read: a truncated, corrupted or tampered file,
or one written by a newer tfbuffers, raises a `ValueError` naming the file and
what is wrong, and nothing is left changed: `load_buffer` reads straight into the
new buffer's storage (a TF buffer's variables) and drops it on failure;
`load(path, buffer)` into an existing buffer assembles the state first and
replaces the buffer's contents only once the whole file checked out.

**Saving** streams field by field in chunks of `CHUNK_BYTES` (no copy of the
whole buffer) into a temporary file beside `path` (in a private directory),
flushes it, renames it over `path` (atomic on POSIX) and flushes the directory: a
process killed at any moment leaves the previous file or the new one, never a
partial one; temporaries of killed saves are removed by the next save to the same
path. Saves are consistent snapshots while other threads add: a save that an add
overwrote (or a clear, a restore, a TF buffer's priority update changed) while it
streamed is written again, and after `SAVE_ATTEMPTS` from one in-memory snapshot.
A save or load that takes more than `PROGRESS_DELAY_SECONDS` shows a tqdm progress bar.

Files written by tfbuffers before format version 2 (whole-capacity arrays, no
checksums) still load.

    >>> import tempfile
    >>> import numpy as np
    >>> import tfbuffers
    >>> from tfbuffers import files
    >>> spec = {"step": tf.TensorSpec([], tf.int64)}
    >>> buffer = tfbuffers.PyUniformReplayBuffer(spec, batch_size=2, max_length=3)
    >>> _ = buffer.add_batch({"step": np.array([7, 8])})
    >>> path = tempfile.mkdtemp() + "/buffer.safetensors"
    >>> _ = buffer.save(path, {"policy": "random"})
    >>> loaded = tfbuffers.TFUniformReplayBuffer.load(path)
    >>> loaded.gather_all()["step"].numpy().tolist(), files.read_header(path)["metadata"]
    ([[7], [8]], {'policy': 'random'})
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import os
import pathlib
import shutil
import struct
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any, BinaryIO

import numpy as np
import tensorflow as tf  # noqa: F401 (the doctest uses it)

from tfbuffers import kinds, prioritized, specs, state

try:
    import tqdm
except ImportError:  # pragma: no cover - tqdm comes with the files extra
    tqdm = None

FORMAT_NAME = "tfbuffers.buffer"
VERSION = 2
FORMAT = f"{FORMAT_NAME}/{VERSION}"
LEGACY_FORMAT = "tfbuffers.segmented/1"
"""Format version 1: whole-capacity arrays of the segmented state, no checksums, no spec (loaded into a buffer only)."""
CHUNK_BYTES = 16 << 20
SAVE_ATTEMPTS = 3
PROGRESS_DELAY_SECONDS = 2.0
FIELD_PREFIX = "field/"
EXTRA_PREFIX = "extra/"
V1_COUNTER = "added"  # version 1 files: the counter tensor's name (a file format, apart from the state's)

NOT_A_BUFFER_FILE = "{path}: expected a tfbuffers buffer file ({format}), got {received}"
NEWER_VERSION = (
    "{path}: written by a newer tfbuffers (format {received}); this tfbuffers reads format versions 1 to {version}: "
    "upgrade tfbuffers to load it"
)
TRUNCATED = "{path}: truncated: expected {expected} bytes, the file has {received}"
TRAILING = "{path}: expected {expected} bytes, the file has {received}: something was appended to it"
CORRUPTED = "{path}: {name}: checksum mismatch (sha256 {received}, the header says {expected}): the file is corrupted"
HEADER_TAMPERED = (
    "{path}: header: checksum mismatch (sha256 {received}, the header says {expected}): the header was changed "
    "after the file was written"
)
BAD_HEADER = "{path}: header: {what}"
NOT_JSON = "metadata: expected a JSON-serialisable dict, got {received}"
NO_SAFETENSORS_DTYPE = "{path}: expected a dtype that safetensors stores (bool, ints, floats), got {received}"
NO_SPEC = (
    "{path}: a format version 1 file holds no data spec: load it into a buffer you build (files.load(path, buffer))"
)
UNKNOWN_CLASS = "{path}: buffer: expected one of {expected}, got {received}"
PRIORITIES_DROPPED = (
    "{path}: format: holds tfbuffers.prioritized/1 (priorities), this {buffer} stores tfbuffers.segmented/1: "
    "loading would drop the priorities; load it into a prioritized buffer"
)

_SAFETENSORS_DTYPES = {
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.uint8): "U8",
    np.dtype(np.int8): "I8",
    np.dtype(np.uint16): "U16",
    np.dtype(np.int16): "I16",
    np.dtype(np.uint32): "U32",
    np.dtype(np.int32): "I32",
    np.dtype(np.uint64): "U64",
    np.dtype(np.int64): "I64",
    np.dtype(np.float16): "F16",
    np.dtype(np.float32): "F32",
    np.dtype(np.float64): "F64",
}
_ZERO_DIGEST = "0" * 64
_HEADER_START = b'{"__metadata__":{"format":"tfbuffers.'  # how every file `save` writes begins
_HEADER_DIGEST = "header_sha256"


# Saving.


def save(
    buffer: Any, path: str | os.PathLike, metadata: dict[str, Any] | None = None, *, progress: bool | None = None
) -> pathlib.Path:
    """Saves `buffer`'s stored frames to `path` atomically; returns the path.

    Safe while other threads use the buffer: it saves one consistent snapshot
    (see the module docstring).

    Args:
      buffer: A local tfbuffers buffer (uniform or prioritized, TF or py).
      path: The file to write; its directory is created if needed.
      metadata: A JSON-serialisable dict stored in the header, returned by `load`
        and by `read_header(path)["metadata"]`.
      progress: Show a progress bar: None (default) once the save has taken
        `PROGRESS_DELAY_SECONDS`, True from the start, False never.

    Returns:
      `path` as a `pathlib.Path`.

    Raises:
      TypeError: If `metadata` is not a JSON-serialisable dict, or a field's
        dtype has no safetensors dtype (complex numbers).
    """
    path = pathlib.Path(path)
    if not isinstance(metadata, dict | None):
        raise TypeError(NOT_JSON.format(received=type(metadata).__name__))
    try:
        user = json.dumps(metadata or {})
    except (TypeError, ValueError) as error:
        raise TypeError(NOT_JSON.format(received=error)) from None
    for field in buffer.fields:
        if np.dtype(field.spec.dtype.as_numpy_dtype) not in _SAFETENSORS_DTYPES:
            raise TypeError(NO_SAFETENSORS_DTYPE.format(path=field.path, received=field.spec.dtype.name))
    template = buffer.state_template()
    description = {
        "format": FORMAT,
        "state": template.format,
        "buffer": type(buffer).__name__,
        "options": json.dumps(buffer.constructor_options()),
        "spec": json.dumps(specs.spec_to_json(buffer.data_spec)),
        "batch_size": str(buffer.batch_size),
        "max_length": str(buffer.max_length),
        "fields": json.dumps(template.describe()["fields"]),
        "metadata": user,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(path)
    # A private directory beside `path` holds the file being written, so that one rmtree removes it.
    workspace = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    workspace.mkdir()
    try:
        written = workspace / path.name
        with _Progress(f"saving {path.name}", progress) as bar:
            for _ in range(SAVE_ATTEMPTS):
                if _write(written, buffer, buffer.row_source(), description, bar):
                    break
            else:  # writers kept changing what was read: the state, copied at one moment
                _write(written, buffer, state.Rows.of_state(buffer.state()), description, bar)
        os.replace(written, path)
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return path


def _write(file: pathlib.Path, buffer: Any, source: state.Rows, description: dict[str, str], bar: Any) -> bool:
    """Writes `source` to `file` in safetensors' layout; False if a writer changed what it read meanwhile."""
    batch_size, max_length = buffer.batch_size, buffer.max_length
    added = source.added
    held = min(added, max_length)
    runs = _runs(added - held, held, max_length)
    tensors: list[tuple[str, np.dtype, list[int], Callable[[], Iterator[np.ndarray]]]] = []

    def whole(values: np.ndarray) -> Callable[[], Iterator[np.ndarray]]:
        return lambda: iter([values])

    for index, field in enumerate(buffer.fields):
        dtype = np.dtype(field.spec.dtype.as_numpy_dtype)
        inner = field.spec.shape.as_list()

        tensors.append(
            (
                FIELD_PREFIX + field.path,
                dtype,
                [held, batch_size, *inner],
                _field_chunks(source, index, runs, batch_size, dtype.itemsize * int(np.prod(inner))),
            )
        )
    capacity = buffer.capacity
    for name, extra in source.extras.items():
        extra = np.asarray(extra)
        if extra.shape[:1] == (capacity,):  # one value per row: only the stored frames', oldest first
            rows = [np.arange(p * batch_size, (p + n) * batch_size) for p, n in runs]
            values = extra[np.concatenate([np.zeros(0, np.int64), *rows])].reshape(held, batch_size, *extra.shape[1:])
        else:
            values = extra
        tensors.append((EXTRA_PREFIX + name, values.dtype, list(values.shape), whole(values)))
    entries: dict[str, Any] = {}
    offset = 0
    for name, dtype, shape, _ in tensors:
        size = dtype.itemsize * int(np.prod(shape))
        entries[name] = {"dtype": _SAFETENSORS_DTYPES[dtype], "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    meta = dict(
        description,
        added=str(added),
        frames=str(held * batch_size),
        checksums=json.dumps({name: _ZERO_DIGEST for name in entries}),
        **{_HEADER_DIGEST: _ZERO_DIGEST},
    )
    placeholder = _header_bytes(meta, entries)
    digests = {}
    with open(file, "wb") as handle:
        handle.write(struct.pack("<Q", len(placeholder)) + placeholder)
        for name, _, _, chunks in tensors:
            digest = hashlib.sha256()
            for chunk in chunks():
                data = memoryview(np.ascontiguousarray(chunk).reshape(-1).view(np.uint8))  # type: ignore[arg-type]
                digest.update(data)
                handle.write(data)
                bar.update(len(data))
            digests[name] = digest.hexdigest()
        if not source.intact():
            return False
        meta["checksums"] = json.dumps(digests)
        meta[_HEADER_DIGEST] = _header_digest(meta, entries)
        header = _header_bytes(meta, entries)
        assert len(header) == len(placeholder)  # only fixed-length hex digits changed
        handle.seek(8)
        handle.write(header)
        handle.flush()
        os.fsync(handle.fileno())
    return True


def _field_chunks(
    source: state.Rows, field: int, runs: list[tuple[int, int]], batch_size: int, row_bytes: int
) -> Callable[[], Iterator[np.ndarray]]:
    """Reads field number `field`'s rows of `runs` from `source`, chunk by chunk, when called."""

    def chunks() -> Iterator[np.ndarray]:
        for first_row, stop_row in _row_chunks(runs, batch_size, row_bytes):
            yield source.read(field, first_row, stop_row)

    return chunks


def _header_bytes(meta: Mapping[str, str], entries: Mapping[str, Any]) -> bytes:
    header = json.dumps({"__metadata__": dict(meta), **entries}, separators=(",", ":")).encode()
    return header + b" " * (-len(header) % 8)  # safetensors aligns the data to 8 bytes


def _header_digest(meta: Mapping[str, str], entries: Mapping[str, Any]) -> str:
    covered = {key: value for key, value in meta.items() if key != _HEADER_DIGEST}
    return hashlib.sha256(json.dumps([covered, dict(entries)], sort_keys=True).encode()).hexdigest()


def _runs(oldest: int, count: int, max_length: int) -> list[tuple[int, int]]:
    """The ring positions of adds `[oldest, oldest + count)`: at most two `(first_position, adds)` runs."""
    if count == 0:
        return []
    first = oldest % max_length
    head = min(count, max_length - first)
    return [(first, head)] + ([(0, count - head)] if count > head else [])


def _row_chunks(runs: list[tuple[int, int]], batch_size: int, row_bytes: int) -> Iterator[tuple[int, int]]:
    """Storage row ranges covering `runs`, whole adds each, at most `CHUNK_BYTES` (but one add) per range."""
    adds_per_chunk = max(1, CHUNK_BYTES // max(1, row_bytes * batch_size))
    for position, count in runs:
        for start in range(position, position + count, adds_per_chunk):
            stop = min(start + adds_per_chunk, position + count)
            yield start * batch_size, stop * batch_size


class _Progress:
    """A tqdm bar of bytes, shown after `PROGRESS_DELAY_SECONDS` (None), at once (True) or never (False)."""

    def __init__(self, description: str, progress: bool | None) -> None:
        self._bar = None
        if progress is not False and tqdm is not None:
            delay = 0.0 if progress else PROGRESS_DELAY_SECONDS
            self._bar = tqdm.tqdm(desc=description, unit="B", unit_scale=True, delay=delay, leave=False)

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self._bar is not None:
            self._bar.close()

    def update(self, count: int) -> None:
        if self._bar is not None:
            self._bar.update(count)


# Reading.


@dataclasses.dataclass(frozen=True)
class _Header:
    path: pathlib.Path
    version: int
    meta: dict[str, Any]
    entries: dict[str, Any]
    data_start: int

    @property
    def batch_size(self) -> int:
        return int(self.meta["batch_size"])

    @property
    def max_length(self) -> int:
        return int(self.meta["max_length"])

    @property
    def added(self) -> int:
        return int(self.meta["added"])

    @property
    def held(self) -> int:
        return min(self.added, self.max_length)

    @property
    def state_format(self) -> str:
        # Files written before prioritized buffers existed hold uniform buffers' states.
        return self.meta.get("state", state.SEGMENTED)


def _read_header(path: pathlib.Path) -> _Header:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such buffer file")
    size = path.stat().st_size
    with open(path, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise ValueError(TRUNCATED.format(path=path, expected="at least 8", received=size))
        (length,) = struct.unpack("<Q", prefix)
        raw = handle.read(min(length, size))
    if 8 + length > size:
        if not raw.startswith(_HEADER_START):
            received = f"{size} bytes that do not start as one does"
            raise ValueError(NOT_A_BUFFER_FILE.format(path=path, format=FORMAT, received=received))
        received = f"{size} (its header alone says {8 + length})"
        raise ValueError(TRUNCATED.format(path=path, expected=f"at least {8 + length}", received=received))
    try:
        header = json.loads(raw)
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict):
            raise ValueError("__metadata__ is not an object")
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(
            NOT_A_BUFFER_FILE.format(path=path, format=FORMAT, received=f"no safetensors header ({error})")
        ) from None
    name, _, version = str(meta.get("format")).rpartition("/")
    if meta.get("format") == LEGACY_FORMAT:
        number = 1
    elif name == FORMAT_NAME and version.isdigit():
        number = int(version)
        if number > VERSION:
            raise ValueError(NEWER_VERSION.format(path=path, received=meta["format"], version=VERSION))
    else:
        received = f"format {meta.get('format')!r}"
        raise ValueError(NOT_A_BUFFER_FILE.format(path=path, format=FORMAT, received=received))
    end = 0
    for tensor, entry in header.items():
        try:
            begin, stop = entry["data_offsets"]
            end = max(end, int(stop))
        except (KeyError, TypeError, ValueError):
            raise ValueError(BAD_HEADER.format(path=path, what=f"{tensor}: no data_offsets")) from None
    expected = 8 + length + end
    if size < expected:
        raise ValueError(TRUNCATED.format(path=path, expected=expected, received=size))
    if size > expected:
        raise ValueError(TRAILING.format(path=path, expected=expected, received=size))
    if number >= 2:
        digest = _header_digest(meta, header)
        if digest != meta.get(_HEADER_DIGEST):
            raise ValueError(HEADER_TAMPERED.format(path=path, received=digest, expected=meta.get(_HEADER_DIGEST)))
    return _Header(path, number, meta, header, 8 + length)


def read_header(path: str | os.PathLike) -> dict[str, Any]:
    """What the file says about itself, without reading its data.

    Returns:
      A dict: `version` (the format version), `buffer` (the class saved from),
      `state` (its state format), `batch_size`, `max_length`, `added` (the add
      counter), `frames` (stored frames), `fields` (`[path, dtype, shape]` each),
      `data_spec` (rebuilt; None in version 1 files), `options` (the class's
      constructor options) and `metadata` (given to `save`).

    Raises:
      FileNotFoundError: If there is no file at `path`.
      ValueError: If the file is not a buffer file, is truncated, has a changed
        header, or comes from a newer tfbuffers.
    """
    header = _read_header(pathlib.Path(path))
    meta = header.meta
    try:
        return {
            "version": header.version,
            "buffer": meta["buffer"],
            "state": header.state_format,
            "batch_size": header.batch_size,
            "max_length": header.max_length,
            "added": header.added if header.version >= 2 else None,
            "frames": int(meta["frames"]),
            "fields": json.loads(meta["fields"]),
            "data_spec": specs.spec_from_json(json.loads(meta["spec"])) if "spec" in meta else None,
            "options": json.loads(meta.get("options", "{}")),
            "metadata": json.loads(meta["metadata"]),
        }
    except (KeyError, ValueError) as error:
        raise ValueError(BAD_HEADER.format(path=path, what=f"{type(error).__name__}: {error}")) from None


def load(path: str | os.PathLike, buffer: Any, *, progress: bool | None = None) -> dict[str, Any]:
    """Replaces `buffer`'s contents with the file's; returns the metadata given to `save`.

    The buffer must have the file's batch_size and fields (paths, dtypes,
    shapes); its kind (TF or py) and `max_length` may differ (a shorter one keeps
    the newest frames). A uniform buffer's file loads into a prioritized buffer
    (priorities 1.0), not the reverse. The whole file is read and verified before
    the buffer changes: on any error it is left as it was. That takes one copy of
    the frames in memory beside the buffer (more for a TF buffer, whose restore
    converts it to tensors: see docs/benchmarks.md); `load_buffer`, which builds
    the buffer, needs none.

    Args:
      path: The file.
      buffer: A local buffer.
      progress: As in `save`.

    Raises:
      FileNotFoundError: If there is no file at `path`.
      ValueError: If the file is not a buffer file, is damaged, or does not fit the buffer.
    """
    header = _read_header(pathlib.Path(path))
    template = buffer.state_template()
    _check_fits(header, buffer, template)
    arrays = {name: np.zeros(like.shape, like.dtype) for name, like in template.arrays.items()}
    extras = {name: np.zeros(like.shape, like.dtype) for name, like in template.extras.items()}

    def write_rows(index: int, first_row: int, rows: np.ndarray) -> None:
        arrays[buffer.fields[index].path][first_row : first_row + len(rows)] = rows

    added = _read_frames(header, buffer, write_rows, extras, progress)
    restored = dataclasses.replace(template, counters={state.ADDED: added}, arrays=arrays, extras=extras)
    buffer.restore_state(restored, source=str(header.path))
    return json.loads(header.meta["metadata"])


def load_buffer(
    path: str | os.PathLike, buffer_class: type | None = None, *, progress: bool | None = None, **overrides: Any
) -> Any:
    """A new buffer holding the file's frames: of `buffer_class`, or of the class the file was saved from.

    The buffer is built with the file's data spec, batch size, `max_length` and
    constructor options (those `buffer_class` accepts), then `overrides`
    (`max_length=`, `seed=`, `device=`, ...), and filled straight from the file:
    no second copy of the frames in memory. `progress` is as in `save`.

    Raises:
      FileNotFoundError: If there is no file at `path`.
      ValueError: If the file is not a buffer file, is damaged, or holds what
        `buffer_class` cannot load (priorities into a uniform buffer).
    """
    header = _read_header(pathlib.Path(path))
    if header.version < 2:
        raise ValueError(NO_SPEC.format(path=header.path))
    if buffer_class is None:
        name = header.meta.get("buffer")
        if name not in kinds.BY_CLASS:
            raise ValueError(
                UNKNOWN_CLASS.format(path=header.path, expected=sorted(kinds.BY_CLASS), received=repr(name))
            )
        buffer_class = kinds.BY_CLASS[name].buffer_class
    data_spec = specs.spec_from_json(json.loads(header.meta["spec"]))
    accepted = inspect.signature(buffer_class).parameters
    options = {key: value for key, value in json.loads(header.meta.get("options", "{}")).items() if key in accepted}
    if "storage" in overrides:  # a storage given replaces the one the file names (its frame stacks)
        options.pop("frame_stacks", None)
    arguments = {**options, "batch_size": header.batch_size, "max_length": header.max_length, **overrides}
    buffer = buffer_class(data_spec, **arguments)
    try:
        _check_fits(header, buffer, buffer.state_template())
        extras = {name: np.zeros(like.shape, like.dtype) for name, like in buffer.state_template().extras.items()}
        sink = buffer.row_sink()
        added = _read_frames(header, buffer, sink.write, extras, progress)
        sink.commit(added, extras, str(header.path))
    except BaseException:
        buffer.close()
        raise
    return buffer


def _check_fits(header: _Header, buffer: Any, template: state.BufferState) -> None:
    name = type(buffer).__name__
    if header.state_format == state.PRIORITIZED and template.format != state.PRIORITIZED:
        raise ValueError(PRIORITIES_DROPPED.format(path=header.path, buffer=name))
    if header.state_format not in (state.SEGMENTED, state.PRIORITIZED):
        state.check_compatible({"format": header.state_format}, {"format": template.format}, str(header.path), name)
    try:
        fields = json.loads(header.meta["fields"])
    except (KeyError, ValueError):
        raise ValueError(BAD_HEADER.format(path=header.path, what="fields: missing or not JSON")) from None
    received: dict[str, Any] = {
        "format": template.format,
        "layout": {"batch_size": header.batch_size},
        "fields": fields,
    }
    expected = template.describe()
    expected["layout"] = {"batch_size": buffer.batch_size}
    state.check_compatible(received, expected, str(header.path), name)


def _read_frames(
    header: _Header,
    buffer: Any,
    write_rows: Callable[[int, int, np.ndarray], None],
    extras: dict[str, np.ndarray],
    progress: bool | None,
) -> int:
    """Streams the file's frames into `write_rows(field, first_row, rows)` and `extras`, verifying every byte.

    Returns the buffer's new add counter. Raises before returning if anything fails to verify.
    """
    if header.version < 2:
        return _read_legacy(header, buffer, write_rows, extras)
    batch_size, max_length = buffer.batch_size, buffer.max_length
    added, held = header.added, header.held
    if held > header.max_length or header.max_length <= 0 or added < 0:
        raise ValueError(BAD_HEADER.format(path=header.path, what=f"added {added}, max_length {header.max_length}"))
    kept = min(held, max_length)
    new_added = added if kept == max_length else kept
    runs = _runs(new_added - kept, kept, max_length)
    checksums = json.loads(header.meta.get("checksums", "{}"))
    with open(header.path, "rb") as handle, _Progress(f"loading {header.path.name}", progress) as bar:
        for index, field in enumerate(buffer.fields):
            inner = field.spec.shape.as_list()
            dtype = np.dtype(field.spec.dtype.as_numpy_dtype)
            name = FIELD_PREFIX + field.path
            stream = _TensorStream(header, handle, name, dtype, [held, batch_size, *inner], checksums, bar)
            stream.skip_adds(held - kept)
            for first_row, stop_row in _row_chunks(runs, batch_size, stream.add_bytes // batch_size):
                write_rows(index, first_row, stream.read_adds((stop_row - first_row) // batch_size))
            stream.verify()
        capacity = buffer.capacity
        for name, extra in extras.items():
            key = EXTRA_PREFIX + name
            if key not in header.entries:
                _default_extra(name, extra, runs, batch_size, header)
                continue
            if extra.shape[:1] == (capacity,):
                stream = _TensorStream(
                    header, handle, key, extra.dtype, [held, batch_size, *extra.shape[1:]], checksums, bar
                )
                stream.skip_adds(held - kept)
                for position, count in runs:
                    rows = stream.read_adds(count)
                    extra[position * batch_size : (position + count) * batch_size] = rows
            else:
                stream = _TensorStream(header, handle, key, extra.dtype, list(extra.shape), checksums, bar)
                extra[...] = stream.read_all()
            stream.verify()
    return new_added


def _default_extra(name: str, extra: np.ndarray, runs: list[tuple[int, int]], batch_size: int, header: _Header) -> None:
    """A prioritized buffer's extras when the file is a uniform buffer's: the loaded frames get priority 1.0."""
    if name == prioritized.PRIORITY:
        for position, count in runs:
            extra[position * batch_size : (position + count) * batch_size] = 1.0
    elif name == prioritized.MAX_PRIORITY:
        extra[...] = 1.0
    else:
        raise ValueError(BAD_HEADER.format(path=header.path, what=f"{EXTRA_PREFIX}{name}: missing"))


class _TensorStream:
    """One tensor of a file, read in order and hashed as it goes; `verify` compares the hash with the header's."""

    def __init__(
        self,
        header: _Header,
        handle: BinaryIO,
        name: str,
        dtype: np.dtype,
        shape: list[int],
        checksums: Mapping[str, str],
        bar: _Progress,
    ) -> None:
        entry = header.entries.get(name)
        if entry is None:
            raise ValueError(BAD_HEADER.format(path=header.path, what=f"{name}: missing"))
        got = (entry.get("dtype"), list(entry.get("shape", [])))
        if got != (_SAFETENSORS_DTYPES.get(dtype), shape):
            expected = f"{_SAFETENSORS_DTYPES.get(dtype)} {shape}"
            raise ValueError(
                BAD_HEADER.format(path=header.path, what=f"{name}: holds {got[0]} {got[1]}, expected {expected}")
            )
        begin, end = entry["data_offsets"]
        if end - begin != dtype.itemsize * int(np.prod(shape)):
            raise ValueError(BAD_HEADER.format(path=header.path, what=f"{name}: {end - begin} bytes for shape {shape}"))
        self._header, self._handle, self._name, self._dtype, self._shape = header, handle, name, dtype, shape
        self._expected = checksums.get(name)
        self._digest = hashlib.sha256()
        self._bar = bar
        self.add_bytes = dtype.itemsize * int(np.prod(shape[1:])) if shape else dtype.itemsize
        handle.seek(header.data_start + begin)

    def _read(self, count: int) -> bytes:
        data = self._handle.read(count)
        if len(data) != count:
            raise ValueError(TRUNCATED.format(path=self._header.path, expected="more", received=self._handle.tell()))
        self._digest.update(data)
        self._bar.update(count)
        return data

    def skip_adds(self, adds: int) -> None:
        remaining = adds * self.add_bytes
        while remaining:
            remaining -= len(self._read(min(remaining, CHUNK_BYTES)))

    def read_adds(self, adds: int) -> np.ndarray:
        """The next `adds` adds, as rows `[adds * batch_size, *inner]`."""
        data = self._read(adds * self.add_bytes)
        return np.frombuffer(data, self._dtype).reshape(-1, *self._shape[2:])

    def read_all(self) -> np.ndarray:
        return np.frombuffer(self._read(self._dtype.itemsize * int(np.prod(self._shape))), self._dtype).reshape(
            self._shape
        )

    def verify(self) -> None:
        received = self._digest.hexdigest()
        if received != self._expected:
            raise ValueError(
                CORRUPTED.format(path=self._header.path, name=self._name, received=received, expected=self._expected)
            )


def _read_legacy(
    header: _Header, buffer: Any, write_rows: Callable[[int, int, np.ndarray], None], extras: dict[str, np.ndarray]
) -> int:
    """Version 1 files: whole-capacity arrays, laid out as the buffer's own when `max_length` is the file's."""
    if header.max_length != buffer.max_length:
        received = f"{header.max_length} (a format version 1 file loads only into its own max_length)"
        raise ValueError(
            state.LAYOUT_MISMATCH.format(
                source=header.path,
                what="max_length",
                received=received,
                expected=buffer.max_length,
                buffer=type(buffer).__name__,
            )
        )
    try:  # only format version 1 is read through safetensors: the core installs without it
        import safetensors
    except ImportError as error:  # pragma: no cover - depends on the installed extras
        raise ImportError(
            f"{header.path}: a format version 1 file is read with safetensors ({error}): pip install 'tfbuffers[files]'"
        ) from error
    with safetensors.safe_open(str(header.path), framework="np") as opened:
        added = int(opened.get_tensor(V1_COUNTER)[0])
        for index, field in enumerate(buffer.fields):
            write_rows(index, 0, opened.get_tensor(FIELD_PREFIX + field.path))
        for name, extra in extras.items():
            extra[...] = opened.get_tensor(EXTRA_PREFIX + name)
    return added


# Temporaries.


def _remove_stale_temporaries(path: pathlib.Path) -> None:
    """Removes temporaries of `path` left by processes that no longer run."""
    for temporary in path.parent.glob(f".{path.name}.*.tmp"):
        pid = temporary.name[len(path.name) + 2 :].split(".")[0]
        if pid.isdigit() and not _running(int(pid)):
            shutil.rmtree(temporary, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
