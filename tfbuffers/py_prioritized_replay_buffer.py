"""`PyPrioritizedReplayBuffer`: the numpy buffer, sampled in proportion to priorities."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
import tensorflow as tf

from tfbuffers import prioritized, sampling
from tfbuffers._arguments import explained
from tfbuffers.execution import host
from tfbuffers.py_uniform_replay_buffer import PyUniformReplayBuffer
from tfbuffers.storage import StorageFactory


class PyPrioritizedReplayBuffer(PyUniformReplayBuffer):
    """`PyUniformReplayBuffer` whose samples are drawn in proportion to priorities.

    Windows are drawn as `tfbuffers.prioritized` says (by their first frame's
    `priority ** priority_exponent`, among the windows a uniform buffer could draw;
    new frames get the largest priority given so far), with exact
    `BufferInfo.probabilities`.

    The priorities live in a sum tree beside the rows (`tfbuffers.sampling._sum_tree`): a
    sample of `n` windows and an update of `n` priorities each visit `n *
    log2(capacity)` nodes, in one call of a loop compiled by numba (or, where numba
    does not import, in `log2(capacity)` vectorised numpy steps). Everything else is the uniform
    buffer's: `add_batch`, `gather_all`, `clear`, the deterministic pass (it
    ignores priorities), `tf.function`, checkpoints and `tfbuffers.files` (both
    save the priorities too, and restore them exactly).

    Example:
    >>> spec = tf.TensorSpec([], tf.int32)
    >>> buffer = PyPrioritizedReplayBuffer(spec, batch_size=1, max_length=4, priority_exponent=1.0, seed=0)
    >>> for value in (10, 11, 12, 13):
    ...     _ = buffer.add_batch(np.array([value], np.int32))
    >>> buffer.update_priorities(np.array([0, 1, 2, 3]), np.array([0.0, 1.0, 3.0, 0.0]))
    0
    >>> items, info = buffer.get_next(sample_batch_size=4)
    >>> sorted(set(items.tolist())), sorted(set(info.probabilities.tolist()))
    ([11, 12], [0.25, 0.75])
    """

    _PRIORITIZED = True

    @explained
    def __init__(
        self,
        data_spec: Any,
        capacity: int | None = None,
        *,
        batch_size: int = 1,
        max_length: int | None = None,
        priority_exponent: float = 0.6,
        seed: int | None = None,
        dataset_drop_remainder: bool = False,
        dataset_window_shift: int | None = None,
        stateful_dataset: bool = False,
        episode_boundaries: bool | str = False,
        frame_stacks: str | Sequence[str] | Mapping[str, int] | None = None,
        storage: StorageFactory | None = None,
        directory: str | os.PathLike | None = None,
    ) -> None:
        """Creates the buffer: `PyUniformReplayBuffer` with a `PrioritizedSampler`.

        Every argument is `PyUniformReplayBuffer`'s but `sampler` (the sampler draws by priority), under
        its name and default.

        Args:
          data_spec: As in `PyUniformReplayBuffer`.
          capacity: As in `PyUniformReplayBuffer`.
          batch_size: As in `PyUniformReplayBuffer`.
          max_length: As in `PyUniformReplayBuffer`.
          priority_exponent: Alpha: how strongly priorities skew the draws (0: uniform over frames of
            priority above 0, 1: proportional).
          seed: As in `PyUniformReplayBuffer`.
          dataset_drop_remainder: As in `PyUniformReplayBuffer`.
          dataset_window_shift: As in `PyUniformReplayBuffer`.
          stateful_dataset: As in `PyUniformReplayBuffer`.
          episode_boundaries: As in `PyUniformReplayBuffer`.
          frame_stacks: As in `PyUniformReplayBuffer`.
          storage: As in `PyUniformReplayBuffer`.
          directory: As in `PyUniformReplayBuffer`.

        Raises:
          TypeError, ValueError: As `PyUniformReplayBuffer`, and for a `priority_exponent`
            that is not a finite number >= 0.
        """
        sampler = sampling.PrioritizedSampler.factory(priority_exponent)  # checked first
        super().__init__(
            data_spec,
            capacity,
            batch_size=batch_size,
            max_length=max_length,
            seed=seed,
            dataset_drop_remainder=dataset_drop_remainder,
            dataset_window_shift=dataset_window_shift,
            stateful_dataset=stateful_dataset,
            episode_boundaries=episode_boundaries,
            frame_stacks=frame_stacks,
            storage=storage,
            sampler=sampler,
            directory=directory,
        )

    @property
    def priority_exponent(self) -> float:
        """Alpha: draws are proportional to `priority ** priority_exponent` (its sampler's)."""
        return self.sampler.priority_exponent  # type: ignore[attr-defined]

    def update_priorities(self, ids: Any, priorities: Any) -> Any:
        """Sets the priorities of the frames `ids` (as `BufferInfo.ids` returns them).

        Windows are drawn by their first frame's priority, so pass the first id of
        each window (`info.ids[:, 0]` for `num_steps` windows). An id given twice
        takes its last priority. An id whose frame was overwritten since it was
        sampled (normal when collecting while training) is skipped, not an error;
        the return value says how many were.

        Args:
          ids: Integer frame ids, any shape (numpy, a tensor, or a list).
          priorities: One priority per id, finite and >= 0, the same shape.

        Returns:
          The number of ids skipped because their frames are no longer stored
          (an int64 tensor inside a graph, else an int).

        Raises:
          TypeError: If `ids` are not integers.
          ValueError: If the shapes differ, a priority is negative, NaN or infinite,
            or an id was never stored (at or past the next id, or negative). Nothing
            is changed then.
        """
        self._check_open()
        if not tf.executing_eagerly():
            inputs = [tf.convert_to_tensor(ids), tf.convert_to_tensor(priorities, tf.float64)]
            return host.call(self._update_value, inputs, tf.int64, [])
        if not isinstance(ids, np.ndarray) or not isinstance(priorities, np.ndarray):
            ids, priorities = np.asarray(ids), np.asarray(priorities)  # lists, or eager tensors
        return int(self._update_value(ids, priorities))

    def _update_value(self, ids: Any, priorities: Any) -> np.int64:
        with self._lock:
            self._check_open()
            added = self._table.added
            ids, priorities = prioritized.check_update(ids, priorities, added * self._batch_size)
            sampler = cast(sampling.PrioritizedSampler, self._sampler)
            skipped = sampler.update_stored(self._backend, ids, priorities, added)
        return np.int64(skipped)
