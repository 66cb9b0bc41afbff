"""Samplers: which windows a sample draws, written once for numpy and TensorFlow.

A sampler turns the add counter into drawn windows: their frame ids, their storage rows and the exact
probability of each draw. It reads nothing but the counter, the state it keeps and, with episode
boundaries, the step-type column (`Sampler.step_types`), so a buffer swaps its sampler without touching
storage, locking or datasets: the TF buffer calls it inside its lock-free checked read, the py buffer under
its lock, and both buffers' `get_next`, `as_dataset` and tf.function calls through those same reads.

Its state lives in the buffer's storage (`Sampler.bind`) and follows the buffer's events (`before_add`,
`on_add`, `on_clear`, `on_restore`, `on_update_priorities`), made in the same step as the rows and counter
each goes with: every sampler keeps the adds' record of episode ends with episode boundaries
(`Sampler.near`), and `PrioritizedSampler` the priorities and their sum tree.

The datasets that draw nothing ask it too: the single deterministic pass visits the windows of
`Sampler.pass_ids`, in its order, and `epoch_dataset` shuffles those `Sampler.keeps_windows` keeps (every
stored window, less those crossing an episode boundary with episode boundaries), so a sampler that draws among
fewer windows narrows them alike.

The formulas take a `Backend` (`TENSORFLOW`, or `numpy_backend(rng)`), as the ring arithmetic of
`tfbuffers._ring` takes its ops namespace: one definition serves both kinds of buffer.

`TFUniformReplayBuffer` and `PyUniformReplayBuffer` take any sampler: `sampler=` a callable
`(buffer_name, batch_size, max_length) -> Sampler` (a `Sampler` subclass itself, for example; the
default is `UniformSampler`) or a name of `NAMES`. `RayReplayBuffer` and `ReplayBufferManager` take the same
names and callables (Ray pickles a callable to its actor); `ReverbReplayBuffer` takes the names (a Reverb table
draws with Reverb's selectors). The prioritized buffers are the uniform ones with a `PrioritizedSampler`. A
sampler of the newest frames only, for example (docs/development.md goes through it):

>>> import numpy as np, tensorflow as tf
>>> from tfbuffers import PyUniformReplayBuffer, TFUniformReplayBuffer
>>> class NewestAdds(Sampler):  # uniform over the windows that start in each segment's newest 2 adds
...     keeps_episode_boundaries = False
...     def sample(self, backend, added, sample_batch_size, num_steps):
...         shape = [] if sample_batch_size is None else [sample_batch_size]
...         first, windows, checks = self.stored_windows(backend, added, num_steps)
...         low = backend.ops.maximum(first, first + windows - 2 * self.batch_size)
...         count = first + windows - low  # the windows' first ids are low .. first + windows - 1
...         starts = backend.uniform_integers(shape + [1], low, first + windows, checks)
...         ids = starts + backend.ops.arange(num_steps or 1, self.batch_size)
...         ids = ids if num_steps else ids[..., 0]
...         rows = ids % (self.max_length * self.batch_size)  # tfbuffers._ring's layout
...         return Sample(ids, rows, backend.full_inverse(shape, count))
>>> for buffer in (PyUniformReplayBuffer({"x": tf.TensorSpec([], tf.int64)}, batch_size=2, max_length=4,
...                                      sampler=NewestAdds, seed=0),
...                TFUniformReplayBuffer({"x": tf.TensorSpec([], tf.int64)}, batch_size=2, max_length=4,
...                                      sampler=NewestAdds)):
...     for t in range(6):
...         _ = buffer.add_batch({"x": np.array([t, 100 + t])})
...     items, info = buffer.get_next(sample_batch_size=50)
...     print(sorted(set(np.asarray(items["x"]).tolist())), float(np.asarray(info.probabilities)[0]))
[4, 5, 104, 105] 0.25
[4, 5, 104, 105] 0.25
"""

from __future__ import annotations

from tfbuffers._factories import made
from tfbuffers.sampling.backends import TENSORFLOW, Backend, numpy_backend
from tfbuffers.sampling.base import (
    EMPTY,
    NO_EPISODE_WINDOW,
    NO_EPISODES,
    NO_PRIORITY,
    NOT_A_SAMPLER,
    NOT_ENOUGH_FRAMES,
    PRIORITIZED_SAMPLER,
    Sample,
    Sampler,
    SamplerFactory,
    valid_window_starts,
)
from tfbuffers.sampling.prioritized import PrioritizedSampler
from tfbuffers.sampling.uniform import UniformSampler

__all__ = [
    "EMPTY",
    "NAMES",
    "NOT_A_SAMPLER",
    "NOT_A_CHOICE",
    "NOT_ENOUGH_FRAMES",
    "NO_EPISODES",
    "NO_EPISODE_WINDOW",
    "NO_PRIORITY",
    "PRIORITIZED_SAMPLER",
    "TENSORFLOW",
    "Backend",
    "PrioritizedSampler",
    "Sample",
    "Sampler",
    "SamplerFactory",
    "UniformSampler",
    "check_choice",
    "make",
    "numpy_backend",
    "valid_window_starts",
]


NAMES = ("uniform", "prioritized")
"""The samplers every buffer takes by name: `UniformSampler` and `PrioritizedSampler` (the prioritized presets')."""


NOT_A_CHOICE = "sampler: expected one of {expected}{or_callable}, got {received}"
CALLABLE = " or a callable (buffer_name, batch_size, max_length) -> tfbuffers.sampling.Sampler"
NAMES_ONLY = " (a Reverb table draws with Reverb's selectors, so it takes names only)"


def check_choice(sampler: SamplerFactory | str, *, callables: bool = True) -> SamplerFactory | str:
    """`sampler` if it names a sampler of `NAMES` or, with `callables`, is a callable (`make` calls it).

    Raises:
      ValueError: Naming `sampler`, what it takes (the names; a callable, with `callables`) and what was received.
    """
    if (
        isinstance(sampler, str)
        and sampler in NAMES
        or callables
        and callable(sampler)
        and not isinstance(sampler, str)
    ):
        return sampler
    or_callable = CALLABLE if callables else NAMES_ONLY if callable(sampler) else ""
    received = (
        repr(sampler) if isinstance(sampler, str) or callable(sampler) else f"{type(sampler).__name__} {sampler!r}"
    )
    raise ValueError(NOT_A_CHOICE.format(expected=list(NAMES), or_callable=or_callable, received=received))


def make(
    factory: SamplerFactory | str | None,
    buffer_name: str,
    batch_size: int,
    max_length: int,
    *,
    prioritized: bool = False,
) -> Sampler:
    """The sampler `factory` makes (a `UniformSampler` for None or "uniform"), checked; not bound (`Sampler.bind`).

    `factory` may name a sampler of `NAMES`: "prioritized" is a `PrioritizedSampler`, which only the prioritized
    buffers (`update_priorities`) take, with their `priority_exponent`.

    `prioritized`: made for a prioritized buffer (which has `update_priorities`): it must draw by priority.

    Raises:
      TypeError: Naming `sampler`, if `factory` is not callable or makes something else than a `Sampler`.
      ValueError: Naming `sampler`, if it is a string not in `NAMES`, or makes a prioritized one for a uniform
        buffer (which keeps no priorities), or a uniform one for a prioritized buffer.
    """
    if isinstance(factory, str):
        check_choice(factory)
        if factory == "prioritized" and not prioritized:
            raise ValueError(PRIORITIZED_SAMPLER.format(sampler="'prioritized'"))
    if factory is None or factory == "uniform":
        return UniformSampler(buffer_name, batch_size, max_length)
    sampler: Sampler = made(factory, (buffer_name, batch_size, max_length), Sampler, NOT_A_SAMPLER)
    if sampler.prioritized and not prioritized:
        raise ValueError(PRIORITIZED_SAMPLER.format(sampler=type(sampler).__name__))
    if prioritized and not sampler.prioritized:
        raise ValueError(f"sampler: expected a prioritized sampler for {buffer_name}, got {type(sampler).__name__}")
    return sampler
