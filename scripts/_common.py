"""What the scripts share once TensorFlow is imported: the buffers by name and the starter-buffer files."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import pathlib
import threading
import time
from collections.abc import Callable
from typing import Any

import tfbuffers
from tfbuffers import files, kinds

BUFFERS = tuple(sorted(name for name, kind in kinds.KINDS.items() if kind.any_spec))  # those of any data spec
FILE = "buffer.safetensors"


def make_buffer(kind: str, spec: Any, batch_size: int, max_length: int, seed: int | None = None) -> Any:
    """One of `BUFFERS`, by name.

    `seed`: the py buffers' sampler (the TF buffers follow `tf.random.set_seed`, which the scripts call).
    """
    if kind not in BUFFERS:
        raise ValueError(f"buffer: expected one of {list(BUFFERS)}, got {kind!r}")
    return kinds.make(kind, spec, batch_size, max_length, seed if kinds.get(kind).host else None)


def save_starter_buffer(buffer: Any, directory: pathlib.Path, metadata: dict[str, Any]) -> pathlib.Path:
    """Saves `buffer` and `metadata` to `directory/buffer.safetensors` (crash-safe); returns the file."""
    return files.save(buffer, directory / FILE, dict(metadata, saved=time.time()))


def read_starter_metadata(directory: pathlib.Path) -> dict[str, Any]:
    """The metadata of a starter buffer saved by `save_starter_buffer`, with its layout and frame count."""
    path = directory / FILE
    if not path.is_file():
        raise FileNotFoundError(f"starter buffer: no {FILE} in {directory} (made by populate_starter_buffer.py?)")
    header = files.read_header(path)
    return dict(
        header["metadata"], batch_size=header["batch_size"], max_length=header["max_length"], frames=header["frames"]
    )


def load_starter_buffer(
    directory: pathlib.Path, spec: Any, max_length: int | None = None, seed: int | None = None
) -> tuple[tfbuffers.ReplayBuffer, dict[str, Any]]:
    """A buffer of the starter buffer's kind and segments for `spec`, holding its frames.

    Of `max_length` (default the starter's): a shorter one holds the newest frames that fit.
    """
    metadata = read_starter_metadata(directory)
    buffer = make_buffer(metadata["buffer"], spec, metadata["batch_size"], max_length or metadata["max_length"], seed)
    files.load(directory / FILE, buffer)
    return buffer, metadata


def release_free_memory() -> None:
    """Hands freed heap pages back to the system (glibc's `malloc_trim`)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def peak_rss(fn: Callable[[], Any]) -> tuple[Any, int]:
    """(fn()'s result, the peak resident bytes above those before it), the RSS sampled every millisecond."""
    import psutil

    process = psutil.Process()
    gc.collect()
    before = process.memory_info().rss
    peak = before
    done = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, process.memory_info().rss)
            done.wait(0.001)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        result = fn()
    finally:
        done.set()
        watcher.join()
    return result, max(peak, process.memory_info().rss) - before
