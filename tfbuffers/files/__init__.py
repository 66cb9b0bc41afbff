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
import inspect
import json
import os
import pathlib
import shutil
import uuid
from typing import Any

import numpy as np
import tensorflow as tf  # noqa: F401 (the doctest uses it)

from tfbuffers import kinds, specs, state
from tfbuffers.files._format import (
    BAD_HEADER,
    CHUNK_BYTES,
    CORRUPTED,
    EXTRA_PREFIX,
    FIELD_PREFIX,
    FORMAT,
    FORMAT_NAME,
    HEADER_TAMPERED,
    LEGACY_FORMAT,
    NEWER_VERSION,
    NO_SAFETENSORS_DTYPE,
    NO_SPEC,
    NOT_A_BUFFER_FILE,
    NOT_JSON,
    PRIORITIES_DROPPED,
    PROGRESS_DELAY_SECONDS,
    SAFETENSORS_DTYPES,
    SAVE_ATTEMPTS,
    TRAILING,
    TRUNCATED,
    UNKNOWN_CLASS,
    V1_COUNTER,
    VERSION,
    Progress,
)
from tfbuffers.files._reading import check_fits, read_file_header, read_frames
from tfbuffers.files._writing import remove_stale_temporaries, write_file

__all__ = [
    "BAD_HEADER",
    "CHUNK_BYTES",
    "CORRUPTED",
    "EXTRA_PREFIX",
    "FIELD_PREFIX",
    "FORMAT",
    "FORMAT_NAME",
    "HEADER_TAMPERED",
    "LEGACY_FORMAT",
    "NEWER_VERSION",
    "NOT_A_BUFFER_FILE",
    "NOT_JSON",
    "NO_SAFETENSORS_DTYPE",
    "NO_SPEC",
    "PRIORITIES_DROPPED",
    "PROGRESS_DELAY_SECONDS",
    "SAVE_ATTEMPTS",
    "TRAILING",
    "TRUNCATED",
    "UNKNOWN_CLASS",
    "V1_COUNTER",
    "VERSION",
    "load",
    "load_buffer",
    "read_header",
    "save",
]


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
        if np.dtype(field.spec.dtype.as_numpy_dtype) not in SAFETENSORS_DTYPES:
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
    remove_stale_temporaries(path)
    # A private directory beside `path` holds the file being written, so that one rmtree removes it.
    workspace = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    workspace.mkdir()
    try:
        written = workspace / path.name
        with Progress(f"saving {path.name}", progress) as bar:
            for _ in range(SAVE_ATTEMPTS):
                if write_file(written, buffer, buffer.row_source(), description, bar):
                    break
            else:  # writers kept changing what was read: the state, copied at one moment
                write_file(written, buffer, state.Rows.of_state(buffer.state()), description, bar)
        os.replace(written, path)
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return path


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
    header = read_file_header(pathlib.Path(path))
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


def aligned_zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Zeros of `shape` whose memory starts at a multiple of 64 bytes.

    A TF buffer restores from such arrays without a copy (`tfbuffers.execution._states.shared_tensor`: TensorFlow's
    kernels need 64-byte alignment, and a large numpy array is 16 bytes past a page).
    """
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    raw = np.zeros(count * dtype.itemsize + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start : start + count * dtype.itemsize].view(dtype).reshape(shape)


def load(path: str | os.PathLike, buffer: Any, *, progress: bool | None = None) -> dict[str, Any]:
    """Replaces `buffer`'s contents with the file's; returns the metadata given to `save`.

    The buffer must have the file's batch_size and fields (paths, dtypes,
    shapes); its kind (TF or py) and `max_length` may differ (a shorter one keeps
    the newest frames). A uniform buffer's file loads into a prioritized buffer
    (priorities 1.0), not the reverse. The whole file is read and verified before
    the buffer changes: on any error it is left as it was. That takes one copy of
    the frames in memory beside the buffer (a TF buffer's restore reads it where
    it is); `load_buffer`, which builds the buffer, needs none.

    Args:
      path: The file.
      buffer: A local buffer.
      progress: As in `save`.

    Raises:
      FileNotFoundError: If there is no file at `path`.
      ValueError: If the file is not a buffer file, is damaged, or does not fit the buffer.
    """
    header = read_file_header(pathlib.Path(path))
    template = buffer.state_template()
    check_fits(header, buffer, template)
    arrays = {name: aligned_zeros(like.shape, like.dtype) for name, like in template.arrays.items()}
    extras = {name: aligned_zeros(like.shape, like.dtype) for name, like in template.extras.items()}

    def write_rows(index: int, first_row: int, rows: np.ndarray) -> None:
        arrays[buffer.fields[index].path][first_row : first_row + len(rows)] = rows

    added = read_frames(header, buffer, write_rows, extras, progress)
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
    header = read_file_header(pathlib.Path(path))
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
        check_fits(header, buffer, buffer.state_template())
        extras = {name: np.zeros(like.shape, like.dtype) for name, like in buffer.state_template().extras.items()}
        sink = buffer.row_sink()
        added = read_frames(header, buffer, sink.write, extras, progress)
        sink.commit(added, extras, str(header.path))
    except BaseException:
        buffer.close()
        raise
    return buffer
