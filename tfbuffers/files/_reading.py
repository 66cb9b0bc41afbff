"""Reading a buffer file: its header checked, its frames streamed and verified into a buffer's rows."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import struct
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO

import numpy as np
import tensorflow as tf  # noqa: F401 (the doctest uses it)

from tfbuffers import prioritized, state
from tfbuffers.files._format import (
    BAD_HEADER,
    CHUNK_BYTES,
    CORRUPTED,
    EXTRA_PREFIX,
    FIELD_PREFIX,
    FORMAT,
    FORMAT_NAME,
    HEADER_DIGEST,
    HEADER_START,
    HEADER_TAMPERED,
    LEGACY_FORMAT,
    NEWER_VERSION,
    NOT_A_BUFFER_FILE,
    PRIORITIES_DROPPED,
    SAFETENSORS_DTYPES,
    TRAILING,
    TRUNCATED,
    V1_COUNTER,
    VERSION,
    Progress,
    header_digest,
    row_chunks,
    stored_runs,
)


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


def read_file_header(path: pathlib.Path) -> _Header:
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
        if not raw.startswith(HEADER_START):
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
        digest = header_digest(meta, header)
        if digest != meta.get(HEADER_DIGEST):
            raise ValueError(HEADER_TAMPERED.format(path=path, received=digest, expected=meta.get(HEADER_DIGEST)))
    return _Header(path, number, meta, header, 8 + length)


def check_fits(header: _Header, buffer: Any, template: state.BufferState) -> None:
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


def read_frames(
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
    runs = stored_runs(new_added - kept, kept, max_length)
    checksums = json.loads(header.meta.get("checksums", "{}"))
    with open(header.path, "rb") as handle, Progress(f"loading {header.path.name}", progress) as bar:
        for index, field in enumerate(buffer.fields):
            inner = field.spec.shape.as_list()
            dtype = np.dtype(field.spec.dtype.as_numpy_dtype)
            name = FIELD_PREFIX + field.path
            stream = _TensorStream(header, handle, name, dtype, [held, batch_size, *inner], checksums, bar)
            stream.skip_adds(held - kept)
            for first_row, stop_row in row_chunks(runs, batch_size, stream.add_bytes // batch_size):
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
        bar: Progress,
    ) -> None:
        entry = header.entries.get(name)
        if entry is None:
            raise ValueError(BAD_HEADER.format(path=header.path, what=f"{name}: missing"))
        got = (entry.get("dtype"), list(entry.get("shape", [])))
        if got != (SAFETENSORS_DTYPES.get(dtype), shape):
            expected = f"{SAFETENSORS_DTYPES.get(dtype)} {shape}"
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
