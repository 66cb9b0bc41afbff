"""What the scripts share: the buffer choices and the starter-buffer files."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import pathlib
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import tfbuffers
from tfbuffers import files

BUFFERS = {
    "tf_uniform": lambda spec, batch_size, max_length: tfbuffers.TFUniformReplayBuffer(
        spec, batch_size=batch_size, max_length=max_length
    ),
    "py_uniform": lambda spec, batch_size, max_length: tfbuffers.PyUniformReplayBuffer(
        spec, batch_size=batch_size, max_length=max_length
    ),
    "tf_prioritized": lambda spec, batch_size, max_length: tfbuffers.TFPrioritizedReplayBuffer(
        spec, batch_size=batch_size, max_length=max_length
    ),
    "py_prioritized": lambda spec, batch_size, max_length: tfbuffers.PyPrioritizedReplayBuffer(
        spec, batch_size=batch_size, max_length=max_length
    ),
}
PRIORITIZED = ("tf_prioritized", "py_prioritized")
FILE = "buffer.safetensors"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
ADDRESS = re.compile(r"[^\s:,]+:\d+")  # HOST:PORT of a replay server


def _int_at_least(minimum: int, expected: str) -> Callable[[str], int]:
    """An argparse type: an int >= `minimum`, or a message saying what was expected and what was received."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
        return value

    return parse


positive_int = _int_at_least(1, "a positive int")
non_negative_int = _int_at_least(0, "an int >= 0")


def probability(text: str) -> float:
    """An argparse type: a float in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {value}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite float > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not 0.0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value}")
    return value


def layer_sizes(parser: argparse.ArgumentParser, text: str) -> tuple[int, ...]:
    """--fc-layers: positive sizes separated by commas, or the parser's error."""
    try:
        return tuple(positive_int(size) for size in text.split(","))
    except argparse.ArgumentTypeError as error:
        parser.error(f"argument --fc-layers: {error} (sizes separated by commas, e.g. 100,50)")


def config_values(parser: argparse.ArgumentParser, args: argparse.Namespace, config: Any) -> dict[str, Any]:
    """The parsed flags that are fields of the dataclass `config`, --fc-layers as sizes, --no-progress as progress."""
    fields = {field.name for field in dataclasses.fields(config)}
    values = {key: value for key, value in vars(args).items() if key in fields}
    values["fc_layers"] = layer_sizes(parser, args.fc_layers)
    values["progress"] = not args.no_progress
    return values


def plain_name(text: str) -> str:
    """An argparse type: a file name without directories (letters, digits, `_`, `.`, `-`; not starting with `.`)."""
    if not NAME.match(text):
        raise argparse.ArgumentTypeError(
            f"expected a plain name (letters, digits, '_', '.', '-', no '/', not starting with '.'), got {text!r}"
        )
    return text


def make_buffer(kind: str, spec: Any, batch_size: int, max_length: int) -> tfbuffers.ReplayBuffer:
    """One of `BUFFERS`, by name."""
    if kind not in BUFFERS:
        raise ValueError(f"buffer: expected one of {sorted(BUFFERS)}, got {kind!r}")
    return BUFFERS[kind](spec, batch_size, max_length)


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
    directory: pathlib.Path, spec: Any, max_length: int | None = None
) -> tuple[tfbuffers.ReplayBuffer, dict[str, Any]]:
    """A buffer of the starter buffer's kind and segments for `spec`, holding its frames.

    Of `max_length` (default the starter's): a shorter one holds the newest frames that fit.
    """
    metadata = read_starter_metadata(directory)
    buffer = make_buffer(metadata["buffer"], spec, metadata["batch_size"], max_length or metadata["max_length"])
    files.load(directory / FILE, buffer)
    return buffer, metadata


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
