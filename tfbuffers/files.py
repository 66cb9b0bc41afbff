"""Buffer files: one safetensors file per buffer, written so that a crash never leaves a bad one.

`save(buffer, path)` writes the buffer's contents and counter, with a JSON
description and your metadata in the file's header, to a temporary file beside
`path` (in a private directory), flushes it to disk, then renames it over `path` (atomic on POSIX) and
flushes the directory. A process killed at any moment leaves either the previous
file or the new one at `path`, never a partial one; temporaries left by killed
processes are removed by the next save to the same path.

The file holds the segmented layout that `TFUniformReplayBuffer` and
`PyUniformReplayBuffer` share, so a file saved from one loads into the other.

    >>> import tempfile
    >>> import numpy as np
    >>> import tfbuffers
    >>> from tfbuffers import files
    >>> spec = {"step": tf.TensorSpec([], tf.int64)}
    >>> buffer = tfbuffers.PyUniformReplayBuffer(spec, batch_size=2, max_length=3)
    >>> _ = buffer.add_batch({"step": np.array([7, 8])})
    >>> path = tempfile.mkdtemp() + "/buffer.safetensors"
    >>> _ = files.save(buffer, path, {"policy": "random"})
    >>> other = tfbuffers.TFUniformReplayBuffer(spec, batch_size=2, max_length=3)
    >>> files.load(path, other)
    {'policy': 'random'}
    >>> other.gather_all()["step"].numpy().tolist()
    [[7], [8]]
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import uuid
from typing import Any

import numpy as np
import tensorflow as tf  # noqa: F401 (the doctest uses it)

from tfbuffers import state

try:
    import safetensors
    import safetensors.numpy
except ImportError as error:  # pragma: no cover - depends on the installed extras
    raise ImportError(f"tfbuffers.files needs safetensors ({error}): pip install 'tfbuffers[files]'") from error

FORMAT = "tfbuffers.segmented/1"
ADDED = "added"
FIELD_PREFIX = "field/"
EXTRA_PREFIX = "extra/"

NOT_A_BUFFER_FILE = "{path}: expected a tfbuffers buffer file ({format}), got {received}"
NOT_JSON = "metadata: expected a JSON-serialisable dict, got {received}"


def save(buffer: Any, path: str | os.PathLike, metadata: dict[str, Any] | None = None) -> pathlib.Path:
    """Saves `buffer`'s contents to `path` atomically; returns the path.

    Safe while other threads use the buffer: it saves one consistent snapshot
    (the py buffer's arrays copied under its lock; the TF buffer's variables read
    until no add overlapped the read).

    Args:
      buffer: A local tfbuffers buffer (uniform or prioritized, TF or py).
      path: The file to write; its directory is created if needed.
      metadata: A JSON-serialisable dict stored in the header, returned by `load`.

    Returns:
      `path` as a `pathlib.Path`.

    Raises:
      TypeError: If `metadata` is not a JSON-serialisable dict.
    """
    path = pathlib.Path(path)
    if not isinstance(metadata, dict | None):
        raise TypeError(NOT_JSON.format(received=type(metadata).__name__))
    try:
        user = json.dumps(metadata or {})
    except (TypeError, ValueError) as error:
        raise TypeError(NOT_JSON.format(received=error)) from None
    buffer_state = buffer.state()
    added = buffer_state.counters[ADDED]
    tensors = {ADDED: np.array([added], np.int64)}
    tensors.update({FIELD_PREFIX + path: np.asarray(a, order="C") for path, a in buffer_state.arrays.items()})
    tensors.update({EXTRA_PREFIX + name: np.asarray(a, order="C") for name, a in buffer_state.extras.items()})
    header = {
        "format": FORMAT,
        "state": buffer_state.format,
        "buffer": type(buffer).__name__,
        "batch_size": str(buffer.batch_size),
        "max_length": str(buffer.max_length),
        # From the snapshot's counter: num_frames() now could count adds made since.
        "frames": str(min(added, buffer_state.layout["max_length"]) * buffer_state.layout["batch_size"]),
        "fields": json.dumps(buffer_state.describe()["fields"]),
        "metadata": user,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(path)
    # A private directory beside `path` holds the file being written (and whatever
    # temporaries safetensors makes itself), so that one rmtree removes all of them.
    workspace = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    workspace.mkdir()
    try:
        written = workspace / path.name
        safetensors.numpy.save_file(tensors, written, metadata=header)
        with open(written, "rb") as handle:
            os.fsync(handle.fileno())
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
    """The description `save` wrote: buffer kind, state format, batch_size, max_length, frames, fields, metadata.

    Raises:
      FileNotFoundError: If there is no file at `path`.
      ValueError: If the file is not a tfbuffers buffer file.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such buffer file")
    try:
        with safetensors.safe_open(str(path), framework="np") as opened:
            header = opened.metadata() or {}
    except Exception as error:  # safetensors raises its own error type for a damaged file
        raise ValueError(NOT_A_BUFFER_FILE.format(path=path, format=FORMAT, received=error)) from None
    if header.get("format") != FORMAT:
        received = f"format {header.get('format')!r}"
        raise ValueError(NOT_A_BUFFER_FILE.format(path=path, format=FORMAT, received=received))
    return {
        "buffer": header["buffer"],
        # Files written before prioritized buffers existed hold uniform buffers' states.
        "state": header.get("state", state.SEGMENTED),
        "batch_size": int(header["batch_size"]),
        "max_length": int(header["max_length"]),
        "frames": int(header["frames"]),
        "fields": json.loads(header["fields"]),
        "metadata": json.loads(header["metadata"]),
    }


def load(path: str | os.PathLike, buffer: Any) -> dict[str, Any]:
    """Replaces `buffer`'s contents with the file's; returns the metadata given to `save`.

    The buffer must have the file's state format (uniform or prioritized: a
    prioritized buffer's file holds its priorities), batch_size, max_length and
    fields (paths, dtypes, shapes); its kind (TF or py) may differ. Nothing is
    changed if they do not match.

    Raises:
      FileNotFoundError: If there is no file at `path`.
      ValueError: If the file is not a buffer file, or its layout differs from the buffer's.
    """
    path = pathlib.Path(path)
    header = read_header(path)
    template = buffer.state_template()
    received = {
        "format": header["state"],
        "layout": {"batch_size": header["batch_size"], "max_length": header["max_length"]},
        "fields": header["fields"],
    }
    state.check_compatible(received, template.describe(), str(path), type(buffer).__name__)
    with safetensors.safe_open(str(path), framework="np") as opened:
        added = int(opened.get_tensor(ADDED)[0])
        arrays = {field.path: opened.get_tensor(FIELD_PREFIX + field.path) for field in buffer.fields}
        extras = {name: opened.get_tensor(EXTRA_PREFIX + name) for name in template.extras}
    restored = dataclasses.replace(template, counters={ADDED: added}, arrays=arrays, extras=extras)
    buffer.restore_state(restored, source=str(path))
    return header["metadata"]


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
