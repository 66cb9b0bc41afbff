"""A buffer file's layout: format names, messages, and the helpers both reading and writing use.

The header's bytes and digest, the runs of stored rows, the progress bar (`tfbuffers.files` says what a file
holds).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import tensorflow as tf  # noqa: F401 (the doctest uses it)

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


SAFETENSORS_DTYPES = {
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


ZERO_DIGEST = "0" * 64


HEADER_START = b'{"__metadata__":{"format":"tfbuffers.'  # how every file `save` writes begins


HEADER_DIGEST = "header_sha256"


def header_bytes(meta: Mapping[str, str], entries: Mapping[str, Any]) -> bytes:
    header = json.dumps({"__metadata__": dict(meta), **entries}, separators=(",", ":")).encode()
    return header + b" " * (-len(header) % 8)  # safetensors aligns the data to 8 bytes


def header_digest(meta: Mapping[str, str], entries: Mapping[str, Any]) -> str:
    covered = {key: value for key, value in meta.items() if key != HEADER_DIGEST}
    return hashlib.sha256(json.dumps([covered, dict(entries)], sort_keys=True).encode()).hexdigest()


def stored_runs(oldest: int, count: int, max_length: int) -> list[tuple[int, int]]:
    """The ring positions of adds `[oldest, oldest + count)`: at most two `(first_position, adds)` runs."""
    if count == 0:
        return []
    first = oldest % max_length
    head = min(count, max_length - first)
    return [(first, head)] + ([(0, count - head)] if count > head else [])


def row_chunks(runs: list[tuple[int, int]], batch_size: int, row_bytes: int) -> Iterator[tuple[int, int]]:
    """Storage row ranges covering `runs`, whole adds each, at most `CHUNK_BYTES` (but one add) per range."""
    adds_per_chunk = max(1, CHUNK_BYTES // max(1, row_bytes * batch_size))
    for position, count in runs:
        for start in range(position, position + count, adds_per_chunk):
            stop = min(start + adds_per_chunk, position + count)
            yield start * batch_size, stop * batch_size


class Progress:
    """A tqdm bar of bytes, shown after `PROGRESS_DELAY_SECONDS` (None), at once (True) or never (False)."""

    def __init__(self, description: str, progress: bool | None) -> None:
        self._bar = None
        if progress is not False and tqdm is not None:
            delay = 0.0 if progress else PROGRESS_DELAY_SECONDS
            self._bar = tqdm.tqdm(desc=description, unit="B", unit_scale=True, delay=delay, leave=False)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self._bar is not None:
            self._bar.close()

    def update(self, count: int) -> None:
        if self._bar is not None:
            self._bar.update(count)
