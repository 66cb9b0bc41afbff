"""What the scripts share: the buffer choices and the starter-buffer files."""

from __future__ import annotations

import json
import pathlib
import time
from typing import Any

import tensorflow as tf

import tfbuffers

BUFFERS = {
    "tf_uniform": lambda spec, batch_size, max_length: tfbuffers.TFUniformReplayBuffer(
        spec, batch_size=batch_size, max_length=max_length
    ),
    "py_uniform": lambda spec, batch_size, max_length: tfbuffers.PyUniformReplayBuffer(
        spec, batch_size=batch_size, max_length=max_length
    ),
}
METADATA = "metadata.json"
CHECKPOINT_PREFIX = "buffer"


def make_buffer(kind: str, spec: Any, batch_size: int, max_length: int) -> tfbuffers.ReplayBuffer:
    """One of `BUFFERS`, by name."""
    if kind not in BUFFERS:
        raise ValueError(f"buffer: expected one of {sorted(BUFFERS)}, got {kind!r}")
    return BUFFERS[kind](spec, batch_size, max_length)


def save_starter_buffer(buffer: Any, directory: pathlib.Path, metadata: dict[str, Any]) -> pathlib.Path:
    """Saves `buffer` with `tf.train.Checkpoint` beside a JSON description; returns the checkpoint path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = tf.train.Checkpoint(buffer=buffer).write(str(directory / CHECKPOINT_PREFIX))
    description = dict(metadata, batch_size=buffer.batch_size, max_length=buffer.max_length)
    description.update(frames=int(buffer.num_frames()), checkpoint=pathlib.Path(path).name, saved=time.time())
    (directory / METADATA).write_text(json.dumps(description, indent=2) + "\n")
    return pathlib.Path(path)


def read_starter_metadata(directory: pathlib.Path) -> dict[str, Any]:
    """The JSON description of a starter buffer saved by `save_starter_buffer`."""
    path = directory / METADATA
    if not path.is_file():
        raise FileNotFoundError(f"starter buffer: no {METADATA} in {directory} (made by populate_starter_buffer.py?)")
    return json.loads(path.read_text())


def load_starter_buffer(directory: pathlib.Path, spec: Any) -> tuple[tfbuffers.ReplayBuffer, dict[str, Any]]:
    """Rebuilds a starter buffer for `spec` and restores its contents."""
    metadata = read_starter_metadata(directory)
    buffer = make_buffer(metadata["buffer"], spec, metadata["batch_size"], metadata["max_length"])
    tf.train.Checkpoint(buffer=buffer).read(str(directory / metadata["checkpoint"])).assert_consumed()
    return buffer, metadata
