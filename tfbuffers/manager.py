"""`ReplayBufferManager`: create, checkpoint and reload a Reverb-backed buffer, without Reverb's surprises.

Reverb restores the latest checkpoint of a server's checkpoint directory whenever
a server starts on it, keeps only that one, and silently takes the checkpoint's
table options over the ones asked for. The manager does none of that:

- `create_replay_buffer()` refuses a directory that already holds a checkpoint
  (unless `overwrite=True`, which deletes it) instead of restoring it;
- `load_replay_buffer()` restores the newest kept checkpoint (or the one named),
  checks that every checkpointed item came back, and refuses a checkpoint whose
  configuration differs from the manager's, naming both values (unless
  `take_checkpoint_config=True`);
- `checkpoint()` keeps the newest `keep_checkpoints` checkpoints, not one;
- a missing directory, or one with no checkpoint, gets an error saying so.

Layout of `checkpoint_dir`: `tfbuffers_manager.json` (the configuration and the
kept checkpoints, written atomically), `checkpoints/<n>/` (each a whole Reverb
checkpoint), and `reverb/`, the running server's own checkpoint directory, or `ray/`,
the running Ray buffer's own checkpoints, which Ray restarts its actor from when it dies
(`max_restarts`); create and load start either anew.

The backend (`backend=`) is Reverb where dm-reverb imports (Python 3.11), else Ray where
ray imports (`RayReplayBuffer`: its checkpoints are `checkpoints/<n>/`, each what
`RayReplayBuffer.save` writes), else a local `TFUniformReplayBuffer` (a `TFPrioritizedReplayBuffer`
with `sampler="prioritized"`) in this process,
saved and loaded with `tfbuffers.files` (`checkpoints/<n>.safetensors`); one log line
says which at start. Every backend gives the same guarantees.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import shutil
import uuid
from typing import Any

import tensorflow as tf

from tfbuffers import files, observers, prioritized, specs
from tfbuffers.remote.options import check_sampler, recorded_sampler, sampler_record
from tfbuffers.replay_buffer import ReplayBuffer, positive_int
from tfbuffers.reverb_replay_buffer import ReverbReplayBuffer

logger = logging.getLogger(__name__)

FORMAT = "tfbuffers.replay_buffer_manager/1"
METADATA = "tfbuffers_manager.json"

ALREADY_CHECKPOINTED = (
    "create_replay_buffer: {directory} already holds a checkpoint ({count} kept); creating a buffer there would "
    "bury it. Call load_replay_buffer() to restore it, or create_replay_buffer(overwrite=True) to delete it"
)
NO_DIRECTORY = "load_replay_buffer: checkpoint_dir {directory} does not exist: nothing to load"
NO_CHECKPOINT = "load_replay_buffer: {directory} holds no checkpoint: call checkpoint() on a buffer first"
UNKNOWN_CHECKPOINT = "load_replay_buffer: checkpoint: expected one of {kept}, got {received!r}"
CONFIG_DIFFERS = (
    "load_replay_buffer: {name}: the checkpoint in {directory} was made with {saved}, this manager asks for "
    "{requested}; pass take_checkpoint_config=True to use the checkpoint's"
)
FRAMES_DIFFER = (
    "load_replay_buffer: {name}: the checkpoint in {directory} was made with {saved}, this manager asks for "
    "{requested}; it says what the checkpoint's frames are, so a loaded buffer keeps it"
)
SPEC_DIFFERS = (
    "load_replay_buffer: data_spec: the checkpoint in {directory} holds {saved}, this manager's spec is "
    "{requested}; a buffer cannot change what its frames are"
)
ITEMS_LOST = (
    "load_replay_buffer: the checkpoint {checkpoint} held {saved} items, the restored table holds {restored}; "
    "it is damaged or was written by another program"
)
NO_BUFFER = "ReplayBufferManager.{method}: no buffer yet: call create_replay_buffer() or load_replay_buffer() first"
BACKENDS = ("reverb", "ray", "local")
RAY_FRAME_OPTIONS = frozenset({"episode_boundaries", "frame_stacks"})  # what the frames are: a checkpoint's stays
RAY_RUN_OPTIONS = frozenset(
    {"name", "min_size_to_sample", "samples_per_insert", "error_buffer", "timeout", "seed", "address"}
    | {"prefetch_items", "directory", "max_restarts", "checkpoint_frames", "checkpoint_seconds"}
)  # how the buffer runs: a loaded checkpoint takes the manager's
RAY_MAX_RESTARTS = 3  # the manager's Ray buffer survives its actor's deaths, restarted from its last checkpoint
CHOSEN = {
    "reverb": "ReplayBufferManager: backend reverb (a Reverb server in this process)",
    "ray": "ReplayBufferManager: backend ray (a RayReplayBuffer actor; other processes connect by its name){said}",
    "local": "ReplayBufferManager: backend local (a {local} in this process only){said}",
}
# The local backend's buffer, by sampler: what Reverb's and Ray's samplers of the same name draw.
LOCAL_BUFFERS = {"uniform": "TFUniformReplayBuffer", "prioritized": "TFPrioritizedReplayBuffer"}


def _importable(module: str) -> tuple[bool, str]:
    try:
        __import__(module)
    except ImportError as error:
        return False, str(error)
    return True, ""


def _reverb_available() -> tuple[bool, str]:
    return _importable("reverb")


class _CheckpointRecords:
    """A manager's checkpoint directory on the disk: its metadata file (config, checkpoints) and checkpoints."""

    def __init__(self, directory: pathlib.Path) -> None:
        self.directory = directory
        self.path = directory / METADATA
        """The metadata file: the format, the manager's configuration and its checkpoints, newest last."""

    def checkpoint(self, name: str) -> pathlib.Path:
        """Where checkpoint `name` is (a directory; a local buffer's adds `.safetensors`)."""
        return self.directory / "checkpoints" / name

    def read(self) -> dict[str, Any]:
        """The metadata ({} before the first checkpoint); raises naming the file if it is of another format."""
        if not self.path.exists():
            return {}
        metadata: dict[str, Any] = json.loads(self.path.read_text())
        if metadata.get("format") != FORMAT:
            raise ValueError(f"{self.path}: expected format {FORMAT!r}, got {metadata.get('format')!r}")
        return metadata

    def write(self, metadata: dict[str, Any]) -> None:
        """Replaces the metadata at once (a temporary file, flushed, renamed over it)."""
        (self.directory / "checkpoints").mkdir(parents=True, exist_ok=True)
        temporary = self.directory / f".{METADATA}.{uuid.uuid4().hex}"
        with open(temporary, "w") as stream:
            json.dump(metadata, stream, indent=1)
            stream.flush()
            os.fsync(stream.fileno())
        temporary.replace(self.path)

    def remove(self, name: str) -> None:
        """Deletes checkpoint `name` (its directory or file)."""
        shutil.rmtree(self.checkpoint(name), ignore_errors=True)
        self.checkpoint(f"{name}.safetensors").unlink(missing_ok=True)


class ReplayBufferManager:
    """Creates, checkpoints and reloads one replay buffer in `checkpoint_dir`.

    Example:
    >>> import tempfile, numpy as np
    >>> spec = {"x": tf.TensorSpec([], tf.int64)}
    >>> directory = tempfile.mkdtemp() + "/replay"
    >>> with ReplayBufferManager(spec, capacity=100, checkpoint_dir=directory) as manager:
    ...     buffer, observer = manager.create_replay_buffer()
    ...     for step in range(3):
    ...         observer({"x": np.int64(step)})  # one environment's frames, as an Actor gives them
    ...     name = manager.checkpoint()
    >>> with ReplayBufferManager(spec, capacity=100, checkpoint_dir=directory) as manager:
    ...     buffer, observer = manager.load_replay_buffer()
    ...     frames = int(manager.num_frames())
    >>> name, frames  # the first checkpoint; two windows of 2 frames
    ('0', 2)
    """

    def __init__(
        self,
        data_spec: Any,
        capacity: int,
        checkpoint_dir: str | os.PathLike,
        sequence_length: int = 2,
        *,
        batch_size: int = 1,
        sampler: Any = "uniform",
        priority_exponent: float = 0.6,
        stride: int = 1,
        keep_checkpoints: int = 3,
        table_name: str = "tfbuffers",
        use_reverb: bool | None = None,
        backend: str | None = None,
        ray_options: dict[str, Any] | None = None,
    ) -> None:
        """Describes the buffer to create or load; starts nothing.

        Args:
          data_spec: The frames' spec, usually `agent.collect_data_spec`.
          capacity: Items the buffer holds (windows of `sequence_length` frames on Reverb,
            frames on Ray and locally, rounded up to a multiple of `batch_size` there).
          checkpoint_dir: Where checkpoints are kept.
          sequence_length: Frames per item: the `num_steps` datasets sample.
          batch_size: Environments adding through the observer at once.
          sampler: "uniform" or "prioritized" (locally, a `TFUniformReplayBuffer` or a
            `TFPrioritizedReplayBuffer` of `priority_exponent`), or, locally and on Ray, any `sampler=` the
            local buffers take: a callable `(buffer_name, batch_size, max_length) -> Sampler`, importable by
            its name (a module-level class or function: the checkpoints record it by its import path).
            Reverb draws by name only: with a callable and no `backend`, the manager picks Ray or local.
          priority_exponent: Alpha, for the prioritized sampler.
          stride: Frames between consecutive items' starts (Reverb).
          keep_checkpoints: How many checkpoints `checkpoint()` keeps, newest first.
          table_name: The Reverb table's name.
          use_reverb: True for `backend="reverb"`, False for "local" (the earlier form).
          backend: "reverb", "ray" or "local"; None: Reverb where dm-reverb imports, else Ray where
            ray imports, else local.
          ray_options: More `RayReplayBuffer` arguments, for the Ray backend: what the frames are
            (`episode_boundaries`, `frame_stacks`: a loaded checkpoint must have been made with the
            same) and how the buffer runs (`name`, `min_size_to_sample`, `samples_per_insert`,
            `error_buffer`, `timeout`, `seed`, `address`, `prefetch_items`, `directory`, `max_restarts`,
            `checkpoint_frames`, `checkpoint_seconds`: a loaded checkpoint takes these). The manager's Ray
            buffer survives its actor: Ray restarts it (`max_restarts`, default 3; 0 for none) from its
            last checkpoint under `checkpoint_dir/ray` (in RAM: every `checkpoint_seconds`, default 60,
            or `checkpoint_frames`; the frames after it are lost and counted in the buffer's
            `checkpoint_report()`), or, with `directory=`, by reopening its files (nothing lost).

        Raises:
          TypeError, ValueError: If an argument has the wrong type or is out of range.
          ImportError: If the backend asked for cannot be imported.
        """
        self._data_spec = specs.unwrap(data_spec)
        if backend is not None and backend not in BACKENDS:
            raise ValueError(f"backend: expected one of {list(BACKENDS)} or None, got {backend!r}")
        if use_reverb is not None:
            if backend is not None and backend != ("reverb" if use_reverb else "local"):
                raise ValueError(f"use_reverb={use_reverb} and backend={backend!r}: expected one of them")
            backend = "reverb" if use_reverb else "local"
        named = isinstance(sampler, str)
        if not named and backend == "reverb":
            check_sampler(sampler, callables=False)  # raises: Reverb's tables draw by name (before any record)
        self._config: dict[str, Any] = {
            "capacity": positive_int("capacity", capacity),
            "sequence_length": positive_int("sequence_length", sequence_length),
            "batch_size": positive_int("batch_size", batch_size),
            "sampler": sampler_record(check_sampler(sampler), "ReplayBufferManager's checkpoint record"),
            "priority_exponent": prioritized.check_exponent(priority_exponent),
            "stride": positive_int("stride", stride),
            "table_name": table_name,
        }
        self._keep = positive_int("keep_checkpoints", keep_checkpoints)
        self._directory = pathlib.Path(checkpoint_dir)
        self._records = _CheckpointRecords(self._directory)
        reasons = []
        if backend is None:
            if not named:
                reasons.append("reverb: a Reverb table draws by name, and sampler= is a callable")
            for candidate, module in (("reverb", "reverb"), ("ray", "ray"))[0 if named else 1 :]:
                available, reason = _importable(module)
                if available:
                    backend = candidate
                    break
                reasons.append(f"{module}: {reason}")
            backend = backend or "local"
        elif backend != "local":
            available, reason = _importable(backend)
            if not available:
                raise ImportError(f"backend={backend!r}, but {backend} could not be imported ({reason})")
        self._ray_options = _ray_options(ray_options, backend)
        said = f" ({'; '.join(reasons)})" if reasons else ""
        local = LOCAL_BUFFERS[sampler] if named else "TFUniformReplayBuffer"
        logger.warning(CHOSEN[backend].format(said=said, local=local))
        self._backend = backend
        self._use_reverb = backend == "reverb"
        self._buffer: ReplayBuffer | None = None

    # The interface.

    @property
    def buffer(self) -> ReplayBuffer | None:
        """The managed buffer, once created or loaded."""
        return self._buffer

    @property
    def uses_reverb(self) -> bool:
        """Whether the buffer is on a Reverb server."""
        return self._use_reverb

    @property
    def backend(self) -> str:
        """Where the buffer is: "reverb", "ray" or "local"."""
        return self._backend

    def checkpoints(self) -> list[str]:
        """The kept checkpoints' names, oldest first."""
        return [entry["name"] for entry in self._records.read().get("checkpoints", [])]

    def create_replay_buffer(self, *, overwrite: bool = False) -> tuple[ReplayBuffer, observers.PyObserver]:
        """Creates an empty buffer: `(buffer, observer)` (a `PyObserver`, for an Actor or a PyDriver).

        Raises:
          FileExistsError: If `checkpoint_dir` already holds a checkpoint and not `overwrite`.
        """
        self._close_buffer()
        kept = self.checkpoints() if self._records.path.exists() else []
        if kept and not overwrite:
            raise FileExistsError(ALREADY_CHECKPOINTED.format(directory=self._directory, count=len(kept)))
        for name in ("checkpoints", "reverb", "ray"):
            shutil.rmtree(self._directory / name, ignore_errors=True)
        self._directory.mkdir(parents=True, exist_ok=True)
        self._records.write({"format": FORMAT, "config": self._saved_config(), "checkpoints": []})
        self._buffer = self._start(None)
        return self._buffer, observers.PyObserver(self._buffer)

    def load_replay_buffer(
        self, checkpoint: str | None = None, *, take_checkpoint_config: bool = False
    ) -> tuple[ReplayBuffer, observers.PyObserver]:
        """Restores a kept checkpoint (the newest by default): `(buffer, observer)`.

        Args:
          checkpoint: The name of a kept checkpoint (see `checkpoints()`), or None for the newest.
          take_checkpoint_config: Use the checkpoint's capacity, sequence length, sampler,
            stride and batch size where they differ from the manager's, instead of refusing.

        Raises:
          FileNotFoundError: If `checkpoint_dir` does not exist or holds no checkpoint.
          ValueError: If the checkpoint's configuration differs from the manager's (and not
            `take_checkpoint_config`), its data spec differs, or items did not come back.
        """
        self._close_buffer()
        if not self._directory.is_dir():
            raise FileNotFoundError(NO_DIRECTORY.format(directory=self._directory))
        metadata = self._records.read() if self._records.path.exists() else {}
        kept = [entry["name"] for entry in metadata.get("checkpoints", [])]
        if not kept:
            raise FileNotFoundError(NO_CHECKPOINT.format(directory=self._directory))
        if checkpoint is not None and checkpoint not in kept:
            raise ValueError(UNKNOWN_CHECKPOINT.format(kept=kept, received=checkpoint))
        entry = metadata["checkpoints"][kept.index(checkpoint or kept[-1])]
        self._adopt(metadata["config"], take_checkpoint_config)
        self._buffer = self._start(entry["name"])
        restored = int(self._buffer.num_frames())
        if entry["items"] is not None and restored != entry["items"]:
            saved = entry["items"]
            self._close_buffer()
            raise ValueError(ITEMS_LOST.format(checkpoint=entry["name"], saved=saved, restored=restored))
        return self._buffer, observers.PyObserver(self._buffer)

    def get_dataset(self, batch_size: int, num_steps: int | None = None) -> tf.data.Dataset:
        """The buffer's sampling dataset: batches of `batch_size` windows of `num_steps` (default: the items')."""
        buffer = self._require("get_dataset")
        return buffer.as_dataset(batch_size, num_steps or self._config["sequence_length"])

    def num_frames(self) -> Any:
        """The buffer's `num_frames()` (items on Reverb, counting every item this process wrote)."""
        buffer = self._require("num_frames")
        if isinstance(buffer, ReverbReplayBuffer):
            buffer.flush()
        return buffer.num_frames()

    def clear(self) -> None:
        """Empties the buffer; kept checkpoints stay, and nothing is reloaded from them."""
        self._require("clear").clear()

    def checkpoint(self) -> str:
        """Checkpoints the buffer, keeps the newest `keep_checkpoints`, and returns the new one's name."""
        buffer = self._require("checkpoint")
        metadata = self._records.read()
        entries = metadata["checkpoints"]
        name = str(max([int(e["name"]) for e in entries], default=-1) + 1)
        staging = self._records.checkpoint(f".{name}.{uuid.uuid4().hex}")
        if isinstance(buffer, ReverbReplayBuffer):
            buffer.flush()
            before = int(buffer.num_frames())
            written = pathlib.Path(buffer.py_client.checkpoint())
            items = before if int(buffer.num_frames()) == before else None  # writers racing: not checkable
            shutil.copytree(written, staging)
            staging.rename(self._records.checkpoint(name))
        elif self._backend == "ray":
            before = int(buffer.num_frames())
            buffer.save(staging)
            items = before if int(buffer.num_frames()) == before else None  # writers racing: not checkable
            staging.rename(self._records.checkpoint(name))
        else:
            items = int(buffer.num_frames())
            files.save(buffer, self._records.checkpoint(f"{name}.safetensors"))
        entries.append({"name": name, "items": items})
        for old in entries[: -self._keep]:
            self._records.remove(old["name"])
        metadata["checkpoints"] = entries[-self._keep :]
        self._records.write(metadata)
        return name

    def close(self) -> None:
        """Closes the buffer (and stops its embedded server). Kept checkpoints stay."""
        self._close_buffer()

    def __enter__(self) -> ReplayBufferManager:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # Helpers.

    def _start(self, checkpoint: str | None) -> ReplayBuffer:
        config = self._config
        if self._backend == "local":
            return self._start_local(checkpoint)
        if self._backend == "ray":
            return self._start_ray(checkpoint)
        reverb_dir = self._directory / "reverb"
        shutil.rmtree(reverb_dir, ignore_errors=True)  # Reverb would restore what it holds: start it empty
        reverb_dir.mkdir(parents=True)
        fallback = None if checkpoint is None else str(self._records.checkpoint(checkpoint))
        return ReverbReplayBuffer(
            self._data_spec,
            config["sequence_length"],
            batch_size=config["batch_size"],
            capacity=config["capacity"],
            stride=config["stride"],
            table_name=config["table_name"],
            sampler=config["sampler"],
            priority_exponent=config["priority_exponent"],
            checkpoint_dir=str(reverb_dir),
            fallback_checkpoint=fallback,
        )

    def _start_ray(self, checkpoint: str | None) -> ReplayBuffer:
        from tfbuffers.ray_replay_buffer import RayReplayBuffer, read_manifest

        config, options = self._config, _ray_restarts(self._ray_options, self._directory)
        if checkpoint is not None:  # its configuration is the manager's (checked by _adopt)
            path = self._records.checkpoint(checkpoint)
            _, saved = read_manifest(path)
            for name in RAY_FRAME_OPTIONS & options.keys():
                if saved[name] != options[name]:
                    raise ValueError(
                        FRAMES_DIFFER.format(
                            name=f"ray_options[{name!r}]", directory=path, saved=saved[name], requested=options[name]
                        )
                    )
            run = {k: v for k, v in options.items() if k in RAY_RUN_OPTIONS or k == "checkpoint_dir"}
            return RayReplayBuffer.load(path, **run)
        return RayReplayBuffer(
            self._data_spec,
            batch_size=config["batch_size"],
            max_length=-(-config["capacity"] // config["batch_size"]),
            sampler=recorded_sampler(config["sampler"]),
            priority_exponent=config["priority_exponent"],
            **options,
        )

    def _start_local(self, checkpoint: str | None) -> ReplayBuffer:
        from tfbuffers.tf_prioritized_replay_buffer import TFPrioritizedReplayBuffer
        from tfbuffers.tf_uniform_replay_buffer import TFUniformReplayBuffer

        config = self._config
        max_length = -(-config["capacity"] // config["batch_size"])
        buffer: ReplayBuffer
        if config["sampler"] == "prioritized":  # sampled as Reverb's and Ray's prioritized tables are
            buffer = TFPrioritizedReplayBuffer(
                self._data_spec, config["batch_size"], max_length, priority_exponent=config["priority_exponent"]
            )
        else:
            sampler = recorded_sampler(config["sampler"])
            buffer = TFUniformReplayBuffer(self._data_spec, config["batch_size"], max_length, sampler=sampler)
        if checkpoint is not None:
            files.load(self._records.checkpoint(f"{checkpoint}.safetensors"), buffer)
        return buffer

    def _saved_config(self) -> dict[str, Any]:
        fields = [
            {"path": field.path, "shape": field.spec.shape.as_list(), "dtype": field.spec.dtype.name}
            for field in specs.flatten_spec(self._data_spec)
        ]
        return {**self._config, "data_spec": fields, "backend": self._backend}

    def _adopt(self, saved: dict[str, Any], take: bool) -> None:
        mine = self._saved_config()
        if saved["data_spec"] != mine["data_spec"]:
            raise ValueError(
                SPEC_DIFFERS.format(directory=self._directory, saved=saved["data_spec"], requested=mine["data_spec"])
            )
        backend = saved.get("backend") or ("reverb" if saved["reverb"] else "local")  # or an earlier manager's
        if backend != self._backend:
            kinds = {"reverb": "a Reverb table", "ray": "a RayReplayBuffer's files", "local": "a local buffer file"}
            raise ValueError(
                f"load_replay_buffer: the checkpoint in {self._directory} is {kinds[backend]}, this manager "
                f"runs {kinds[self._backend]} (backend={self._backend!r})"
            )
        for name, requested in self._config.items():
            if saved[name] != requested:
                if not take:
                    raise ValueError(
                        CONFIG_DIFFERS.format(
                            name=name, directory=self._directory, saved=saved[name], requested=requested
                        )
                    )
                self._config[name] = saved[name]

    def _require(self, method: str) -> ReplayBuffer:
        if self._buffer is None:
            raise ValueError(NO_BUFFER.format(method=method))
        return self._buffer

    def _close_buffer(self) -> None:
        if self._buffer is not None:
            self._buffer.close()
            self._buffer = None


def _ray_restarts(options: dict[str, Any], directory: pathlib.Path) -> dict[str, Any]:
    """`options` with how Ray restarts the buffer: `max_restarts`, in RAM from checkpoints under `directory/ray`."""
    options = {"max_restarts": RAY_MAX_RESTARTS, **options}
    timed = options.get("checkpoint_frames") is not None or options.get("checkpoint_seconds") is not None
    if options.get("directory") is None and (options["max_restarts"] or timed):
        running = directory / "ray"
        shutil.rmtree(running, ignore_errors=True)  # an earlier buffer's: this one starts from the manager's
        options["checkpoint_dir"] = running
    return options


def _ray_options(options: dict[str, Any] | None, backend: str | None) -> dict[str, Any]:
    """`ray_options`, checked: only `RayReplayBuffer` arguments the manager does not set, only for Ray."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise TypeError(f"ray_options: expected a dict of RayReplayBuffer arguments or None, got {options!r}")
    allowed = RAY_FRAME_OPTIONS | RAY_RUN_OPTIONS
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ValueError(
            f"ray_options: expected keys among {sorted(allowed)} (capacity, batch_size, sampler and "
            f"priority_exponent are the manager's own arguments), got {unknown}"
        )
    if options and backend != "ray":
        raise ValueError(f"ray_options: only for backend='ray', got backend={backend!r}")
    timed = {k: options[k] for k in ("checkpoint_frames", "checkpoint_seconds") if options.get(k) is not None}
    if timed and options.get("directory") is not None:
        raise ValueError(
            f"ray_options: expected no checkpoint_frames or checkpoint_seconds with directory= (memory-mapped "
            f"segments keep every add that returned: nothing to checkpoint), got {timed}"
        )
    return dict(options)
