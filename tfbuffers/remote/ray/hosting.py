"""What a Ray-hosted buffer's handle does beside the `ReplayBuffer` API: its files, and the writers' claims.

`RayHosting` is a base of `RayReplayBuffer`: `save`, `load`, `open` and `flush` (the segments on disk), and
`writer` and `writer_report` (the segments claimed by writer processes).
"""

from __future__ import annotations

import os
import pathlib
import uuid
from typing import TYPE_CHECKING, Any

from tfbuffers.remote.options import sampler_record
from tfbuffers.remote.ray import checkpoints
from tfbuffers.remote.ray.manifest import Source, read_manifest
from tfbuffers.remote.ray.writer import RayWriter
from tfbuffers.replay_buffer import positive_int


class RayHosting:
    """The files and the writers of a `RayReplayBuffer` (a base of it; not used alone)."""

    _config: dict[str, Any]

    if TYPE_CHECKING:  # what RayReplayBuffer gives

        def _remote(self, method: str, *args: Any) -> Any: ...

        def _check_open(self) -> None: ...

        @property
        def sampler(self) -> Any:
            """The buffer's sampler, as given."""

    @classmethod
    def load(cls, path: str | os.PathLike, **overrides: Any) -> Any:
        """A new buffer holding what `save(path)` wrote: its configuration and every segment's frames.

        `path` may also be a buffer's `checkpoint_dir`: its last checkpoint is loaded.

        `overrides` go to the constructor (`directory=`, `name=`, `seed=`, `timeout=`, ...). The actor
        reads the files: `path` is on its machine.

        Raises:
          FileNotFoundError: If `path` holds no buffer saved by `save`.
          ValueError: If a file is damaged or of another format (see `tfbuffers.files`).
        """
        path = pathlib.Path(path).absolute()
        path = checkpoints.latest(path) or path  # a checkpoint_dir: its last checkpoint
        spec, arguments = read_manifest(path)
        directory = overrides.pop("directory", None)
        if directory is None and overrides.get("checkpoint_dir") is None:
            arguments.pop("max_restarts", None)  # restarts need one of them: the saved buffer's are not carried
        mapped = None if directory is None else pathlib.Path(directory).absolute()
        return cls(spec, **{**arguments, **overrides, "directory": Source("load", path, mapped)})  # type: ignore[call-arg]

    @classmethod
    def open(cls, directory: str | os.PathLike, **overrides: Any) -> Any:
        """The buffer kept under `directory` (made with `directory=`) in a new actor, after the last one died.

        It holds every add that returned (`tfbuffers.storage.memmap`: each segment's directory is reopened).
        `overrides`: `name=`, `seed=`, `timeout=`, `address=`, `prefetch_items=`, `writer_lease=`.

        Raises:
          FileNotFoundError: If `directory` holds no RayReplayBuffer.
          tfbuffers.storage.memmap.DirectoryInUseError: If an actor still holds it open.
        """
        directory = pathlib.Path(directory).absolute()
        spec, arguments = read_manifest(directory)
        return cls(spec, **{**arguments, **overrides, "directory": Source("open", directory, directory)})  # type: ignore[call-arg]

    def checkpoint(self) -> pathlib.Path:
        """Writes a checkpoint under the buffer's `checkpoint_dir` now; returns its directory.

        Raises:
          ValueError: If the buffer was made without `checkpoint_dir=`.
        """
        return pathlib.Path(self._remote("checkpoint"))

    def checkpoint_report(self) -> dict[str, Any] | None:
        """The checkpoints of a buffer made with `checkpoint_dir=` (None without one).

        `latest` (its path), `checkpoints` (how many were written), `frames_since` (stored since the
        latest), `restored_from` (the checkpoint a restarted actor loaded), `lost_frames` (the frames
        stored after it that the restart lost, as the writers' next adds told), `error` (the last timed
        checkpoint's failure, retried at the next tick).
        """
        return self._remote("checkpoint_report")

    def flush(self) -> None:
        """Writes every memory-mapped segment back to the disk (`msync`); nothing to do in RAM."""
        self._remote("flush")

    def save(self, path: str | os.PathLike) -> pathlib.Path:
        """Writes every segment's file (`tfbuffers.files`) and the buffer's configuration under the directory `path`.

        The actor writes them: `path` is on the actor's machine. `RayReplayBuffer.load(path)` reads them.

        Raises:
          ValueError: Naming `sampler`, before anything is written, if the manifest cannot record it (a lambda).
        """
        sampler = self._config["sampler_record"] or sampler_record(self.sampler, "RayReplayBuffer.save")  # or raises
        return pathlib.Path(self._remote("save", str(pathlib.Path(path).absolute()), sampler))

    def writer(self, num_envs: int) -> RayWriter:
        """Claims `num_envs` free segments for this process: a `RayWriter` adds to them alone.

        Claims whose lease ran out (`writer_lease`: their process died) are freed first. The free segments
        written longest ago are taken first (never-written ones, the emptiest, before them): a writer that
        joins after another left overwrites the oldest frames, not those the last one wrote. The writer's
        `segments` are in ascending order: environment `i` adds to `segments[i]`.

        Raises:
          ValueError: If fewer segments are free, naming how many are and who holds the others.
        """
        self._check_open()
        num_envs = positive_int("num_envs", num_envs)
        token = f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        claim = self._remote("claim", num_envs, token)
        config = self._config
        restarts = bool(config.get("max_restarts"))
        return RayWriter(self, claim, token, lease=config.get("writer_lease"), restarts=restarts)  # type: ignore[arg-type]

    def writer_report(self) -> dict[str, Any]:
        """The writers' claims now, and how the others ended, for a user accounting for every add.

        Returns:
          `{"claims": {segment: writer}, "closed": n, "dropped": n, "expired": n, "lost_adds": n}`:
          writers that released their segments by `close()`, that were dropped without it (their
          adds stored by the actor), whose lease ran out (their process died, with the adds it had not
          sent), and the adds of dropped writers the actor could not store (the buffer closed).
        """
        return dict(self._remote("writer_report"))
