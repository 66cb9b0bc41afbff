"""tfbuffers: replay buffers for TensorFlow and TF-Agents.

Drop-in replacements for `tf_agents.replay_buffers` that check their input,
keep every sampled window inside one environment's segment, and share one API
across an in-graph buffer and a numpy buffer.
"""

import os
from collections.abc import Mapping
from typing import Any

from tfbuffers import _noise

_noise.import_tensorflow()  # first, where tfbuffers brings TensorFlow in: its absent-hardware lines kept off
_noise.ignore_autograph_repeats()

from tfbuffers import kinds
from tfbuffers.frames import FrameBuffer
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
from tfbuffers.tf_prioritized_replay_buffer import TFPrioritizedReplayBuffer
from tfbuffers.tf_uniform_replay_buffer import TFUniformReplayBuffer


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

    See `PyUniformReplayBuffer.open` and `tfbuffers.memmap` for what it holds after a crash.

    Raises:
      FileNotFoundError: If `directory` holds no buffer header.
      ValueError: Naming the file and what differs, if the header is of another version or names a
        class that is not a py buffer, or a file does not match it.
      tfbuffers.memmap.DirectoryInUseError: If another process holds it open, naming that process.
    """
    from tfbuffers import memmap

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
    "relabel_windows",
    "sharded_dataset",
]

__version__ = "0.1.0"
