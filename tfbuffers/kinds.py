"""The buffer kinds: one registry that the package, files, the scripts and the tests read.

A kind is a short name (as the scripts' `--buffer` takes it), the class that makes it, and what it is: where
its frames live (TensorFlow variables in the graph, or numpy arrays on the host, whose sampler takes a
`seed`) and how it samples (uniformly, or by priority). Classes are imported when first asked for, so
reading the registry imports no buffer module (files reads it without an import loop).

`KINDS` are the local buffers (what files, `tfbuffers.open` and configs name: `BY_CLASS`); `REMOTE_KINDS`
the buffers an actor hosts (`RayReplayBuffer`, one kind per sampler), which `get` and `make` know too and
the contract tests run on a local cluster.

>>> import tensorflow as tf
>>> sorted(KINDS)
['py_hashed', 'py_prioritized', 'py_uniform', 'tf_prioritized', 'tf_uniform']
>>> buffer = make("py_prioritized", {"x": tf.TensorSpec([], tf.int64)}, batch_size=2, max_length=4, seed=0)
>>> type(buffer).__name__, buffer.prioritized
('PyPrioritizedReplayBuffer', True)
>>> BY_CLASS["TFUniformReplayBuffer"].name
'tf_uniform'
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

UNKNOWN_KIND = "buffer: expected one of {expected}, got {received!r}"
TF_SEED = (
    "seed: expected None for {kind} (the TF kinds draw from TensorFlow's global generator: "
    "tf.random.set_seed), got {received!r}"
)


@dataclasses.dataclass(frozen=True)
class Kind:
    """A local buffer kind.

    Attributes:
      name: The short name (`"tf_uniform"`).
      module: The module that defines the class.
      class_name: The class's name (`"TFUniformReplayBuffer"`), as files record it.
      host: Whether the frames are numpy arrays on the host (the sampler takes `seed`); else TF variables.
      prioritized: Whether it samples by priority (and has `update_priorities`).
      any_spec: Whether it takes any data spec (not only a `Trajectory`'s): the scripts and the contract
        tests use those.
      local: Whether its frames live in this process (else in an actor's: `REMOTE_KINDS`).
      preset: Constructor options the kind fixes, as `(name, value)` pairs (a Ray kind's `sampler`).
    """

    name: str
    module: str
    class_name: str
    host: bool
    prioritized: bool
    any_spec: bool = True
    local: bool = True
    preset: tuple[tuple[str, Any], ...] = ()

    @property
    def buffer_class(self) -> type:
        """The class, imported on first use."""
        return getattr(importlib.import_module(self.module), self.class_name)


KINDS = {
    kind.name: kind
    for kind in (
        Kind("tf_uniform", "tfbuffers.tf_uniform_replay_buffer", "TFUniformReplayBuffer", False, False),
        Kind("py_uniform", "tfbuffers.py_uniform_replay_buffer", "PyUniformReplayBuffer", True, False),
        Kind("tf_prioritized", "tfbuffers.tf_prioritized_replay_buffer", "TFPrioritizedReplayBuffer", False, True),
        Kind("py_prioritized", "tfbuffers.py_prioritized_replay_buffer", "PyPrioritizedReplayBuffer", True, True),
        Kind("py_hashed", "tfbuffers.py_hashed_replay_buffer", "PyHashedReplayBuffer", True, False, any_spec=False),
    )
}
BY_CLASS = {kind.class_name: kind for kind in KINDS.values()}  # as files and configs name them
_RAY = "tfbuffers.remote.ray.client"
REMOTE_KINDS = {
    kind.name: kind
    for kind in (
        Kind("ray_uniform", _RAY, "RayReplayBuffer", True, False, local=False, preset=(("sampler", "uniform"),)),
        Kind("ray_prioritized", _RAY, "RayReplayBuffer", True, True, local=False, preset=(("sampler", "prioritized"),)),
    )
}


def get(name: str) -> Kind:
    """The kind named `name` (`"py_uniform"`, ..., `"ray_uniform"`), local or remote.

    Raises:
      ValueError: Naming the kinds there are.
    """
    found = KINDS.get(name) or REMOTE_KINDS.get(name)
    if found is None:
        raise ValueError(UNKNOWN_KIND.format(expected=sorted([*KINDS, *REMOTE_KINDS]), received=name))
    return found


def make(name: str, data_spec: Any, batch_size: int, max_length: int, seed: int | None = None, **options: Any) -> Any:
    """A buffer of the kind `name` (a remote kind's starts its actor, and a local Ray cluster if none is connected).

    `seed` seeds a host kind's sampler. The TF kinds draw from TensorFlow's global generator
    (`tf.random.set_seed`): a seed for one of them is refused rather than ignored.

    Raises:
      ValueError: If `name` is not a kind, or `seed` is given for a TF kind.
    """
    kind = get(name)
    if kind.host:
        options["seed"] = seed
    elif seed is not None:
        raise ValueError(TF_SEED.format(kind=name, received=seed))
    options = {**dict(kind.preset), **options}
    return kind.buffer_class(data_spec, batch_size=batch_size, max_length=max_length, **options)
