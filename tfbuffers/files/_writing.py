"""Writing a buffer file: its tensors streamed in chunks into a temporary file, renamed over the path."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import struct
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf  # noqa: F401 (the doctest uses it)

from tfbuffers import state
from tfbuffers.files._format import (
    EXTRA_PREFIX,
    FIELD_PREFIX,
    HEADER_DIGEST,
    SAFETENSORS_DTYPES,
    ZERO_DIGEST,
    header_bytes,
    header_digest,
    row_chunks,
    stored_runs,
)


def write_file(file: pathlib.Path, buffer: Any, source: state.Rows, description: dict[str, str], bar: Any) -> bool:
    """Writes `source` to `file` in safetensors' layout; False if a writer changed what it read meanwhile."""
    batch_size, max_length = buffer.batch_size, buffer.max_length
    added = source.added
    held = min(added, max_length)
    runs = stored_runs(added - held, held, max_length)
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
        entries[name] = {"dtype": SAFETENSORS_DTYPES[dtype], "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    meta = dict(
        description,
        added=str(added),
        frames=str(held * batch_size),
        checksums=json.dumps({name: ZERO_DIGEST for name in entries}),
        **{HEADER_DIGEST: ZERO_DIGEST},
    )
    placeholder = header_bytes(meta, entries)
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
        meta[HEADER_DIGEST] = header_digest(meta, entries)
        header = header_bytes(meta, entries)
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
        for first_row, stop_row in row_chunks(runs, batch_size, row_bytes):
            yield source.read(field, first_row, stop_row)

    return chunks


def remove_stale_temporaries(path: pathlib.Path) -> None:
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
