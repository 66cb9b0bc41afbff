"""`Checkpoints`: a Ray-hosted buffer in RAM written under its `checkpoint_dir`, and found there after a restart.

Each checkpoint is a directory `checkpoint-NNNNNNNN` that `RayReplayBuffer.save` would write (every segment's
file and the manifest) plus the rate limiter's counts; `LATEST` names the last whole one (written once the
checkpoint is, by a rename), and the one before is deleted then. A death while writing leaves `LATEST` on the
previous checkpoint.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from tfbuffers.remote.ray.manifest import save_segments

LATEST = "LATEST"
CHECKPOINT = "checkpoint-{:08d}"
LIMITER_FILE = "rate_limiter.npy"
"""The rate limiter's counts (inserts, samples) beside a buffer's memory-mapped segments, or in a checkpoint."""

CHECKPOINT_SECONDS = 60.0
"""Seconds between checkpoints when `checkpoint_dir` is given without `checkpoint_frames` or `checkpoint_seconds`."""


def latest(directory: str | os.PathLike) -> pathlib.Path | None:
    """The last whole checkpoint under `directory`, or None."""
    path = pathlib.Path(directory) / LATEST
    return pathlib.Path(directory) / path.read_text().strip() if path.exists() else None


class Checkpoints:
    """When a buffer in RAM writes its next checkpoint, the writing, and what a restart lost.

    Not thread-safe: `RayHost` calls it under its lock, and so does the thread that writes a checkpoint
    every `seconds` (`start`).
    """

    def __init__(self, directory: str, frames: int | None, seconds: float | None) -> None:
        self.directory = pathlib.Path(directory)
        self.frames = frames
        self.seconds = seconds
        self.restored_from = latest(directory)  # a restarted actor's: what it holds
        self.latest = self.restored_from  # the last checkpoint written (or restored)
        self.number = 0 if self.restored_from is None else int(self.restored_from.name.rsplit("-", 1)[1])
        self.since = 0  # frames stored since the last checkpoint
        self.changed = False  # anything stored, cleared or reprioritized since
        self.restored: dict[int, int] = {}  # segment -> its add count when restored: not yet told what it lost
        self.lost = 0  # frames a restart lost, as the writers' next adds told
        self.error: str | None = None  # the last timed checkpoint's failure
        self._stop = threading.Event()

    def limiter_counts(self) -> np.ndarray:
        """The rate limiter's counts in the checkpoint restored from (there is one)."""
        assert self.restored_from is not None  # noqa: S101 - called only then
        return np.load(self.restored_from / LIMITER_FILE)

    def stored(self, count: int) -> bool:
        """Counts `count` frames stored; whether a checkpoint is due (`frames`)."""
        self.changed = True
        self.since += count
        return self.frames is not None and self.since >= self.frames

    def told(self, segment: int, added: int, expected: int) -> None:
        """A writer's first add to a restored `segment`, numbered `expected` where it holds `added`: the gap is lost."""
        if self.restored.pop(segment, None) is not None:
            self.lost += max(0, expected - added)

    def write(self, segments: list[Any], config: dict[str, Any], counts: tuple[int, int]) -> pathlib.Path:
        """A new checkpoint of `segments` (what `save` writes for `config`) and the limiter's `counts`.

        Raises what writing raised, the half-written checkpoint removed and `LATEST` unchanged.
        """
        path = self.directory / CHECKPOINT.format(self.number + 1)
        try:
            shutil.rmtree(path, ignore_errors=True)  # one half-written before a death
            save_segments(segments, path, config, config["sampler_record"])
            np.save(path / LIMITER_FILE, np.asarray(counts, np.int64))
            temporary = self.directory / f".{LATEST}.{os.getpid()}"
            temporary.write_text(path.name)
            temporary.replace(self.directory / LATEST)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        if self.latest is not None and self.latest != path:
            shutil.rmtree(self.latest, ignore_errors=True)
        self.number, self.latest = self.number + 1, path
        self.since, self.changed = 0, False
        return path

    def attempt(self, checkpoint: Callable[[], Any]) -> None:
        """`checkpoint()`; a failure is kept for `report` and tried again `frames` later (or at the next tick)."""
        try:
            checkpoint()
            self.error = None
        except Exception as error:  # noqa: BLE001 - said by checkpoint_report
            self.error = f"{type(error).__name__}: {error}"
            self.since = 0

    def start(self, lock: threading.Lock, checkpoint: Callable[[], Any]) -> None:
        """Runs `checkpoint()` under `lock` every `seconds` while anything changed, until `stop`."""
        if self.seconds is None:
            return

        def run() -> None:
            while not self._stop.wait(self.seconds):
                with lock:
                    if not self._stop.is_set() and self.changed:
                        self.attempt(checkpoint)

        threading.Thread(target=run, name="checkpoints", daemon=True).start()

    def stop(self) -> None:
        """Ends the timed checkpoints."""
        self._stop.set()

    def report(self) -> dict[str, Any]:
        """`RayReplayBuffer.checkpoint_report`: the checkpoints written, the frames since, what a restart lost."""
        return {
            "latest": None if self.latest is None else str(self.latest),
            "checkpoints": self.number,
            "frames_since": self.since,
            "restored_from": None if self.restored_from is None else str(self.restored_from),
            "lost_frames": self.lost,
            "error": self.error,
        }
