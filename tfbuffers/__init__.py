"""tfbuffers: replay buffers for TensorFlow and TF-Agents.

Drop-in replacements for `tf_agents.replay_buffers` that check their input,
keep every sampled window inside one environment's segment, and share one API
across an in-graph buffer and a numpy buffer.

`import tfbuffers` changes nothing in the process and imports no TensorFlow: each
name below imports its module when first used (`tfbuffers.TFUniformReplayBuffer`,
`from tfbuffers import PyUniformReplayBuffer`). `quiet_start_up()`, called first,
keeps the start-up lines of TensorFlow and gym about what the machine lacks off the
terminal (the scripts and notebooks call it).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tfbuffers._noise import quiet_start_up

if TYPE_CHECKING:  # what the names are, for type checkers; at run time each is imported when first used
    from tfbuffers.her import her_dataset, relabel_windows
    from tfbuffers.manager import ReplayBufferManager
    from tfbuffers.n_step import n_step_dataset, n_step_transitions
    from tfbuffers.prioritized import importance_weights
    from tfbuffers.py_hashed_replay_buffer import PyHashedReplayBuffer
    from tfbuffers.py_prioritized_replay_buffer import PyPrioritizedReplayBuffer
    from tfbuffers.py_uniform_replay_buffer import PyUniformReplayBuffer
    from tfbuffers.ray_replay_buffer import RayReplayBuffer, RayWriter
    from tfbuffers.remote.sharding import sharded_dataset
    from tfbuffers.replay_buffer import BufferInfo, ReplayBuffer
    from tfbuffers.reverb_replay_buffer import ReverbReplayBuffer
    from tfbuffers.state import BufferState
    from tfbuffers.storage.frames import FrameBuffer
    from tfbuffers.tf_prioritized_replay_buffer import TFPrioritizedReplayBuffer
    from tfbuffers.tf_uniform_replay_buffer import TFUniformReplayBuffer

# Each exported name's module, imported when the name is first asked for (PEP 562).
_HOMES = {
    "BufferInfo": "tfbuffers.replay_buffer",
    "BufferState": "tfbuffers.state",
    "FrameBuffer": "tfbuffers.storage.frames",
    "PyHashedReplayBuffer": "tfbuffers.py_hashed_replay_buffer",
    "PyPrioritizedReplayBuffer": "tfbuffers.py_prioritized_replay_buffer",
    "PyUniformReplayBuffer": "tfbuffers.py_uniform_replay_buffer",
    "RayReplayBuffer": "tfbuffers.ray_replay_buffer",
    "RayWriter": "tfbuffers.ray_replay_buffer",
    "ReplayBuffer": "tfbuffers.replay_buffer",
    "ReplayBufferManager": "tfbuffers.manager",
    "ReverbReplayBuffer": "tfbuffers.reverb_replay_buffer",
    "TFPrioritizedReplayBuffer": "tfbuffers.tf_prioritized_replay_buffer",
    "TFUniformReplayBuffer": "tfbuffers.tf_uniform_replay_buffer",
    "her_dataset": "tfbuffers.her",
    "importance_weights": "tfbuffers.prioritized",
    "n_step_dataset": "tfbuffers.n_step",
    "n_step_transitions": "tfbuffers.n_step",
    "relabel_windows": "tfbuffers.her",
    "sharded_dataset": "tfbuffers.remote.sharding",
}


def __getattr__(name: str) -> Any:
    """An exported name, from its module (imported now); or a submodule (`tfbuffers.files`), imported."""
    if name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name]), name)
    elif not name.startswith("__") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # found once: the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


def load(path: str | os.PathLike, *, progress: bool | None = None, **overrides: Any) -> Any:
    """The buffer a file holds, of the class it was saved from (`buffer.save(path)`; see `tfbuffers.files`).

    `overrides` go to the constructor: `max_length=` another size (a shorter one
    keeps the newest frames), `seed=`, `device=`, ... `<BufferClass>.load(path)`
    picks the class instead. `progress`: a progress bar, None once the load has taken 2 s,
    True from the start, False never. Needs the `files` extra.

    Raises:
      FileNotFoundError: If there is no file at `path`.
      ValueError: If the file is not a buffer file or is damaged (truncated,
        corrupted, changed, or written by a newer tfbuffers).
    """
    from tfbuffers import files

    return files.load_buffer(path, None, progress=progress, **overrides)


def open(directory: str | os.PathLike, *, seed: int | None = None) -> Any:  # noqa: A001 (as io.open, for a directory)
    """The py buffer kept in `directory` (made with `directory=`), of the class its header names, reopened.

    See `PyUniformReplayBuffer.open` and `tfbuffers.storage.memmap` for what it holds after a crash.

    Raises:
      FileNotFoundError: If `directory` holds no buffer header.
      ValueError: Naming the file and what differs, if the header is of another version or names a
        class that is not a py buffer, or a file does not match it.
      tfbuffers.storage.memmap.DirectoryInUseError: If another process holds it open, naming that process.
    """
    from tfbuffers import kinds
    from tfbuffers.storage import memmap

    header = memmap.Header(directory)
    kind = kinds.BY_CLASS.get(header.buffer)
    if kind is None or not kind.host:
        expected = sorted(name for name, kind in kinds.BY_CLASS.items() if kind.host)
        raise ValueError(
            memmap.BAD_HEADER.format(
                file=header.path, what="buffer", expected=f"one of {expected}", received=repr(header.buffer)
            )
        )
    return kind.buffer_class.open(directory, seed=seed)  # type: ignore[attr-defined]


def from_config(config: Mapping[str, Any]) -> Any:
    """A buffer from a plain dict: `config["buffer"]` names the class, the rest is its `from_config`'s.

    >>> buffer = from_config({"buffer": "PyUniformReplayBuffer", "capacity": 100, "names": ["obs"],
    ...                       "shapes": [[4]], "dtypes": ["float32"]})
    >>> buffer.capacity, buffer.data_spec["obs"].shape.as_list()
    (100, [4])

    Raises:
      TypeError, ValueError: Naming the key, what was expected and what was received.
    """
    from tfbuffers import kinds

    rest = dict(config)
    name = rest.pop("buffer", None)
    if name not in kinds.BY_CLASS:
        raise ValueError(f"config: buffer: expected one of {sorted(kinds.BY_CLASS)}, got {name!r}")
    return kinds.BY_CLASS[name].buffer_class.from_config(rest)  # type: ignore[attr-defined]


__all__ = [
    "BufferInfo",
    "BufferState",
    "FrameBuffer",
    "PyHashedReplayBuffer",
    "PyPrioritizedReplayBuffer",
    "PyUniformReplayBuffer",
    "ReplayBuffer",
    "RayReplayBuffer",
    "RayWriter",
    "ReplayBufferManager",
    "ReverbReplayBuffer",
    "TFPrioritizedReplayBuffer",
    "TFUniformReplayBuffer",
    "from_config",
    "her_dataset",
    "importance_weights",
    "load",
    "n_step_dataset",
    "n_step_transitions",
    "open",
    "quiet_start_up",
    "relabel_windows",
    "sharded_dataset",
]

__version__ = "0.1.0"
