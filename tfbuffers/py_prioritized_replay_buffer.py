"""`PyPrioritizedReplayBuffer`: the numpy buffer, sampled in proportion to priorities."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import tensorflow as tf

from tfbuffers import _episodes, _ring, _sum_tree, host, prioritized, sampling
from tfbuffers import state as state_lib
from tfbuffers._segmented import DerivedSignature
from tfbuffers.py_uniform_replay_buffer import PyUniformReplayBuffer

_SIGNATURE = DerivedSignature(
    PyUniformReplayBuffer.__init__,
    after="max_length",
    added=[inspect.Parameter("priority_exponent", inspect.Parameter.KEYWORD_ONLY, default=0.6, annotation="float")],
    removed=["sampler"],
)


class PyPrioritizedReplayBuffer(PyUniformReplayBuffer):
    """`PyUniformReplayBuffer` whose samples are drawn in proportion to priorities.

    Windows are drawn as `tfbuffers.prioritized` says (by their first frame's
    `priority ** priority_exponent`, among the windows a uniform buffer could draw;
    new frames get the largest priority given so far), with exact
    `BufferInfo.probabilities`.

    The priorities live in a sum tree beside the rows (`tfbuffers._sum_tree`): a
    sample of `n` windows and an update of `n` priorities each cost
    `log2(capacity)` vectorised numpy steps. Everything else is the uniform
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

    @_SIGNATURE
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Creates the buffer: `PyUniformReplayBuffer`'s arguments, and `priority_exponent`.

        `PyPrioritizedReplayBuffer(data_spec, capacity=None, *, batch_size=1, max_length=None,
        priority_exponent=0.6, seed=None, ...)`: every argument of `PyUniformReplayBuffer` but `sampler`
        (the sampler draws by priority), under its name and default.

        Args:
          *args: `data_spec`, `capacity`, as in `PyUniformReplayBuffer`.
          **kwargs: `priority_exponent`, alpha: how strongly priorities skew the draws (0: uniform
            over frames of priority above 0, 1: proportional); the others as in `PyUniformReplayBuffer`.

        Raises:
          TypeError, ValueError: As `PyUniformReplayBuffer`, and for a `priority_exponent`
            that is not a finite number >= 0.
        """
        options = _SIGNATURE.bind(self, *args, **kwargs)
        priority_exponent = prioritized.check_exponent(options.pop("priority_exponent"))
        super().__init__(**options)
        self._priority_exponent = priority_exponent
        self._priorities, self._largest, self._tree = prioritized.extras(self._table)
        self._stale = _StaleBlocks(self._max_length)
        self._set_max_priority(float(self._largest))
        self._use_sampler(
            sampling.PrioritizedSampler(type(self).__name__, self._batch_size, self._max_length, self._current_tree)
        )

    @property
    def priority_exponent(self) -> float:
        """Alpha: draws are proportional to `priority ** priority_exponent`."""
        return self._priority_exponent

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
            rows, values, skipped = prioritized.stored_updates(
                self._backend, ids, priorities, added, self._max_length, self._batch_size
            )
            self._set_locked(rows, values)
            if values.size and values.max() > self._max_priority:
                self._set_max_priority(float(values.max()))
        return np.int64(skipped)

    def _set_locked(self, rows: np.ndarray, priorities: np.ndarray) -> None:
        self._priorities[rows] = priorities
        weights = prioritized.leaf_weights(priorities, self._priority_exponent)
        if self._ends is not None:  # rows near the end of their episode carry their new weight into the record
            distance = self._ends.distance[rows]
            near = distance > 0
            if near.any():
                change = _episodes.columns(np.broadcast_to(weights, rows.shape)[near]) - self._row_columns(rows[near])
                np.add.at(self._ends.near, distance[near], change)
        self._refresh_locked()
        _sum_tree.update_numpy(self._tree, self.capacity, rows, weights, distinct=True)

    def _row_columns(self, rows: np.ndarray) -> np.ndarray:
        return _episodes.columns(self._tree[_sum_tree.leaf_count(self.capacity) + rows, _sum_tree.SUM])

    def _current_tree(self) -> np.ndarray:
        """The tree with every ancestor up to date (the sampler calls it under the lock)."""
        self._refresh_locked()
        return self._tree

    def _refresh_locked(self) -> None:
        # Adds only set their rows' leaves: their ancestors are recomputed here, once for all the
        # adds since the last draw or update, level by level from their children.
        if self._stale.count:
            rows = (self._stale.firsts[: self._stale.count, None] + np.arange(self._batch_size)).ravel()
            _sum_tree.recompute_ancestors_numpy(self._tree, self.capacity, rows)
            self._stale.count = 0

    def _set_max_priority(self, priority: float) -> None:
        # New frames' priority, and its leaf weight, computed once here rather than on every add.
        self._largest[...] = priority
        self._max_priority = priority
        self._max_weight = prioritized.leaf_weights(np.float64(priority), self._priority_exponent)

    # Hooks of PyUniformReplayBuffer, under its lock.

    def _stored_locked(self, added: int) -> None:
        first = int(_ring.block_start(added, self._max_length, self._batch_size))
        rows = slice(first, first + self._batch_size)
        self._priorities[rows] = self._max_priority
        _sum_tree.set_leaves_numpy(self._tree, self.capacity, rows, self._max_weight)
        if self._stale.count == self._max_length:  # a whole ring of stale blocks: recompute now, bounded work
            self._refresh_locked()
        self._stale.firsts[self._stale.count] = first
        self._stale.count += 1

    def _cleared_locked(self) -> None:
        self._priorities[:] = 0.0
        self._tree[:] = 0.0
        self._stale.count = 0
        self._set_max_priority(1.0)

    def _extras_locked(self) -> dict[str, np.ndarray]:
        return {
            prioritized.PRIORITY: self._priorities.copy(),
            prioritized.MAX_PRIORITY: self._largest.copy(),
        }

    def _restore_extras_locked(self, extras: dict[str, np.ndarray]) -> None:
        np.copyto(self._priorities, extras[prioritized.PRIORITY])
        self._stale.count = 0
        weights = prioritized.leaf_weights(self._priorities, self._priority_exponent)
        np.copyto(self._tree, _sum_tree.build(weights, self.capacity))
        self._set_max_priority(float(extras[prioritized.MAX_PRIORITY]))

    def _close(self) -> None:
        super()._close()
        with self._lock:
            self._priorities = np.zeros(0)
            self._tree = np.zeros([0, 2])

    def state_template(self) -> state_lib.BufferState:
        """The uniform buffer's template, in the prioritized format, with the priorities as extras."""
        return prioritized.state_template(super().state_template(), self.capacity)

    def _check_extras(self, extras: dict[str, np.ndarray], source: str) -> None:
        prioritized.check_extras(extras, source)


class _StaleBlocks:
    """The first rows of the blocks added since the tree's ancestors were last recomputed.

    A plain object, not a list or counter attribute of the buffer: tf.Module copies a list
    attribute on every append and intercepts every attribute assignment, on each add.
    """

    __slots__ = ("count", "firsts")

    def __init__(self, max_length: int) -> None:
        self.firsts = np.zeros(max_length, np.int64)
        self.count = 0
