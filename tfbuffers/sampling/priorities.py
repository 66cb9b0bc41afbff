"""Prioritized replay: the priorities a `PrioritizedSampler` keeps, their checks, and importance-sampling weights.

Imported by users as `tfbuffers.prioritized`, which re-exports every name here.

A prioritized buffer draws each window with probability proportional to
`priority ** priority_exponent` of its first frame (Schaul et al., 2016,
"Prioritized Experience Replay", proportional variant), among the windows a
uniform buffer could draw (one segment, consecutive frames, none past the newest,
within one episode with `episode_boundaries`), where a priority of 0 means never
drawn, whatever the exponent. A new frame gets the largest priority
given so far (1.0 after construction or `clear`). `update_priorities(ids,
priorities)` sets the priorities of frames by the ids `BufferInfo.ids` returned.

The draws are corrected for in training by `importance_weights`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import tensorflow as tf

import tfbuffers.sampling._sum_tree as _sum_tree
from tfbuffers import _ring
from tfbuffers import state as state_lib

PRIORITY = "priority"
"""The state's extra array of every row's priority, `[capacity]` float64 (0 for rows never written)."""
MAX_PRIORITY = "max_priority"
"""The state's extra scalar: the priority new frames get."""

NOT_AN_EXPONENT = "priority_exponent: expected a finite number >= 0, got {received}"
SHAPES_DIFFER = "priorities: expected the shape of ids, {expected}, got {received}"
NOT_A_PRIORITY = "priorities: expected finite values >= 0, got {value} at index {index}"
NOT_AN_ID = "ids: expected integer frame ids, got dtype {dtype}"
NEVER_STORED = (
    "ids: expected ids of frames stored since the last clear (0 <= id < {next_id}), got {value} at index {index}"
)
NOT_A_BETA = "beta: expected a number in [0, 1], got {received}"


SUM_TREE = "sum_tree"
"""The storage's extra of the sum tree over every row's `priority ** priority_exponent` (`_sum_tree`)."""


def extras(storage: Any, *, blocked: bool = False) -> tuple[Any, Any, Any]:
    """A new prioritized buffer's priorities, max priority and sum tree, kept in its storage as extras.

    `storage` is one of `tfbuffers.storage`'s: numpy arrays or `tf.Variable`s come back. The max
    priority is a scalar (`[]` float64), 1.0 at first. `blocked`: the tree in the TF buffer's layout
    (`tfbuffers.sampling._sum_tree.blocked`), else `[2P, 2]`.
    """
    tree = _sum_tree.empty(storage.num_rows)
    return (
        storage.extra(PRIORITY, np.zeros([storage.num_rows], np.float64)),
        storage.extra(MAX_PRIORITY, np.array(1.0, np.float64)),
        storage.extra(SUM_TREE, _sum_tree.blocked(tree, storage.num_rows) if blocked else tree),
    )


class Priorities:
    """A buffer's priorities and their sum tree: a part of its `PrioritizedSampler`, over extras of its storage.

    One interface for both execution modes, the sampler's events (`on_add`, `on_update`, `on_clear`,
    `on_restore` with `restore_targets`) and the reads (`weights`, `tree`, `state`). On the host (numpy extras)
    each event changes them in place under the buffer's lock and returns []; in the graph (variables) each
    returns the ops, which the buffer runs in its writers' lock, in the same step as the rows and counter.

    An add has one kernel per mode, measured. On the host it sets its rows' leaves alone; their ancestors are
    recomputed once for all the adds since the last draw or update (`tree()`), level by level from their
    children. In the graph the block's leaves and every ancestor change in three ops
    (`tfbuffers.sampling._sum_tree.add_block_variable`, the tree kept blocked): one op per level costs more there.
    """

    def __init__(self, storage: Any, batch_size: int, max_length: int, priority_exponent: float, graph: bool) -> None:
        """Keeps the priorities in `storage` (a `Storage`, or a `GraphStorage` when `graph`) as extras (`extras`)."""
        self.capacity = storage.num_rows
        self.priority_exponent = priority_exponent
        self.values, self.largest, self._tree = extras(storage, blocked=graph)
        self._batch_size = batch_size
        self._graph = graph
        if not graph:
            # The first rows of the blocks added since the ancestors were last recomputed: at most a ring of them.
            self._stale = np.zeros(max_length, np.int64)
            self._stale_count = 0
            self._largest_changed(float(self.largest))
            _sum_tree.compiled()  # the tree's compiled loops loaded now, not in the first draw

    def on_add(self, rows: Any) -> list[Any]:
        """The block of `batch_size` `rows` (a slice on the host, int64 in the graph) gets the largest priority.

        On the host, a slice of several adds' rows too (`extend`): their ancestors recomputed at once.
        """
        if self._graph:
            priorities = tf.fill([self._batch_size], self.largest.read_value())
            stored = self.values.scatter_nd_update(rows[:, None], priorities)
            weights = leaf_weights(priorities, self.priority_exponent)
            # One op for all ancestors rather than one per level: adds are a driver loop's hot path.
            return [stored, _sum_tree.add_block_variable(self._tree, self.capacity, rows, weights)]
        self.values[rows] = self._max_priority
        _sum_tree.set_leaves_numpy(self._tree, self.capacity, rows, self._max_weight)
        if rows.stop - rows.start != self._batch_size:  # a block of adds: every ancestor now
            self._refresh()
            _sum_tree.recompute_ancestors_numpy(self._tree, self.capacity, np.arange(rows.start, rows.stop))
            return []
        if self._stale_count == len(self._stale):  # a whole ring of stale blocks: recompute now, bounded work
            self._refresh()
        self._stale[self._stale_count] = rows.start
        self._stale_count += 1
        return []

    def on_update(self, rows: Any, priorities: Any, weights: Any) -> list[Any]:
        """Sets the priorities of distinct `rows`, their leaf `weights` (`leaf_weights`) and the largest priority."""
        if self._graph:
            return [
                self.values.scatter_nd_update(rows[:, None], priorities),
                _sum_tree.update_variable(self._tree, self.capacity, rows, weights, distinct=True),
                self.largest.assign(tf.maximum(self.largest, tf.reduce_max(tf.concat([priorities, [0.0]], 0)))),
            ]
        self.values[rows] = priorities
        self._refresh()
        _sum_tree.update_numpy(self._tree, self.capacity, rows, weights, distinct=True)
        if priorities.size and priorities.max() > self._max_priority:
            self._largest_changed(float(priorities.max()))
        return []

    def update_stored(
        self, kernels: Any, ids: np.ndarray, priorities: np.ndarray, weights: np.ndarray, first_add: int
    ) -> int:
        """Host: `on_update` of checked frame `ids` in one compiled call; returns how many were skipped.

        The ids from add `first_add` on (still stored) get their `priorities` and leaf `weights` in order (an id
        given twice takes its last), and their ancestors are recomputed.
        """
        self._refresh()
        skipped, largest = kernels.update_stored(
            self._tree,
            _sum_tree.depth(self.capacity),
            self.values,
            ids,
            priorities,
            weights,
            first_add,
            self.capacity // self._batch_size,
            self._batch_size,
        )
        if largest > self._max_priority:
            self._largest_changed(float(largest))
        return int(skipped)

    def raise_largest(self, priority: float) -> None:
        """Host: new frames get `priority` if it is larger than the largest so far (several rings share it)."""
        if priority > self._max_priority:
            self._largest_changed(priority)

    def weights(self, rows: Any) -> Any:
        """The rows' weights in draws: their leaves in the tree."""
        leaves = _sum_tree.leaf_count(self.capacity) + rows
        if self._graph:
            return _sum_tree.TENSORFLOW.nodes(self._tree, leaves)[:, _sum_tree.SUM]
        return self._tree[leaves, _sum_tree.SUM]

    def tree(self) -> Any:
        """What the sampler draws from: the host's tree with every ancestor up to date, or the graph's variable."""
        if not self._graph:
            self._refresh()
        return self._tree

    def on_clear(self) -> list[Any]:
        """No frame is stored: every priority and weight is 0, new frames get 1.0."""
        if self._graph:
            return [
                self.values.assign(tf.zeros_like(self.values), read_value=False),
                self._tree.assign(tf.zeros_like(self._tree), read_value=False),
                self.largest.assign(tf.constant(1.0, tf.float64), read_value=False),
            ]
        self.values[:] = 0.0
        self._tree[:] = 0.0
        self._stale_count = 0
        self._largest_changed(1.0)
        return []

    def state(self) -> dict[str, Any]:
        """The state's extras, by name: the priorities and the largest one (host copies, graph variables)."""
        if self._graph:
            return {PRIORITY: self.values, MAX_PRIORITY: self.largest}
        return {PRIORITY: self.values.copy(), MAX_PRIORITY: self.largest.copy()}

    def restore_targets(self) -> list[Any]:
        """Graph: the variables a restore assigns, as `on_restore` orders its values: priorities, largest, tree."""
        return [self.values, self.largest, self._tree]

    def on_restore(self, extras: dict[str, np.ndarray]) -> list[Any]:
        """Sets the priorities to a checked state's `extras` and rebuilds the tree from them.

        Host: in place, []. Graph: the values of `restore_targets()`, which the buffer assigns with the rows.
        """
        tree = _sum_tree.build(leaf_weights(extras[PRIORITY], self.priority_exponent), self.capacity)
        if self._graph:
            return [extras[PRIORITY], extras[MAX_PRIORITY], _sum_tree.blocked(tree, self.capacity)]
        np.copyto(self.values, extras[PRIORITY])
        self._stale_count = 0
        np.copyto(self._tree, tree)
        self._largest_changed(float(extras[MAX_PRIORITY]))
        return []

    def close(self) -> None:
        """Lets the arrays or variables go (the buffer's storage was closed)."""
        if self._graph:
            self.largest = np.zeros(())
        self.values, self._tree = np.zeros(0), np.zeros([0, 2])

    def _refresh(self) -> None:
        if self._stale_count:
            firsts = self._stale[: self._stale_count]
            rows = (firsts[:, None] + np.arange(self._batch_size)).ravel()
            _sum_tree.recompute_ancestors_numpy(self._tree, self.capacity, rows)
            self._stale_count = 0

    def _largest_changed(self, priority: float) -> None:
        # New frames' priority, and its leaf weight, computed once here rather than on every add.
        self.largest[...] = priority
        self._max_priority = priority
        self._max_weight = leaf_weights(np.float64(priority), self.priority_exponent)


def check_exponent(priority_exponent: Any) -> float:
    """`priority_exponent` as a float, if it is a finite number >= 0; else a TypeError or ValueError."""
    if isinstance(priority_exponent, bool) or not isinstance(priority_exponent, int | float | np.floating):
        received = f"{type(priority_exponent).__name__} {priority_exponent!r}"
        raise TypeError(NOT_AN_EXPONENT.format(received=received))
    if not np.isfinite(priority_exponent) or priority_exponent < 0:
        raise ValueError(NOT_AN_EXPONENT.format(received=priority_exponent))
    return float(priority_exponent)


def leaf_weights(priorities: Any, priority_exponent: float) -> Any:
    """`priorities ** priority_exponent`, and 0 where a priority is 0 (never drawn, even for exponent 0)."""
    if isinstance(priorities, np.ndarray | np.floating | float):
        priorities = np.asarray(priorities, np.float64)
        return np.where(priorities > 0, priorities**priority_exponent, 0.0)
    return tf.where(priorities > 0, tf.pow(priorities, priority_exponent), tf.zeros_like(priorities))


def state_template(uniform: state_lib.BufferState, capacity: int) -> state_lib.BufferState:
    """A uniform buffer's state template made prioritized: format `PRIORITIZED`, the priorities as extras."""
    return dataclasses.replace(
        uniform,
        format=state_lib.PRIORITIZED,
        extras={
            PRIORITY: np.broadcast_to(np.float64(0), (capacity,)),
            MAX_PRIORITY: np.array(1.0, np.float64),
        },
    )


def check_extras(extras: dict[str, np.ndarray], source: str) -> None:
    """Raises a ValueError unless a state's priorities are finite and >= 0, and its max_priority >= all of them."""
    priorities, largest = extras[PRIORITY], extras[MAX_PRIORITY]
    bad = np.flatnonzero(~np.isfinite(priorities) | (priorities < 0))
    if bad.size:
        raise ValueError(
            f"{source}: {PRIORITY}: expected finite values >= 0, got {priorities[bad[0]]} at index {int(bad[0])}"
        )
    if not (np.isfinite(largest) and largest >= priorities.max(initial=0.0)):
        raise ValueError(f"{source}: {MAX_PRIORITY}: expected a finite value >= every priority, got {largest}")


def check_update(ids: Any, priorities: Any, next_id: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The arguments of `update_priorities` as int64 and float64 arrays, or an error naming what is wrong.

    Args:
      ids: Frame ids, any shape, as `BufferInfo.ids` returns them.
      priorities: One priority per id, the same shape.
      next_id: The id the next stored frame gets (`added * batch_size`): ids at or above it were never stored.
        None for ids that cannot be checked so (a Reverb table's item keys).

    Raises:
      TypeError: If `ids` are not integers.
      ValueError: If the shapes differ, a priority is negative, NaN or infinite, or an id was never stored.
    """
    ids, priorities = np.asarray(ids), np.asarray(priorities)
    if ids.dtype.kind not in "iu":
        raise TypeError(NOT_AN_ID.format(dtype=ids.dtype))
    if ids.shape != priorities.shape:
        raise ValueError(SHAPES_DIFFER.format(expected=list(ids.shape), received=list(priorities.shape)))
    ids, priorities = ids.reshape(-1).astype(np.int64), priorities.reshape(-1).astype(np.float64)
    if not ids.size:
        return ids, priorities
    # Two reductions each where all is well (a NaN makes the smallest NaN, which fails the comparison); the first
    # bad one found only where one is.
    if not (priorities.min() >= 0 and priorities.max() < np.inf):
        bad = np.flatnonzero(~np.isfinite(priorities) | (priorities < 0))
        raise ValueError(NOT_A_PRIORITY.format(value=priorities[bad[0]], index=int(bad[0])))
    if next_id is not None and not (ids.min() >= 0 and ids.max() < next_id):
        bad = np.flatnonzero((ids < 0) | (ids >= next_id))
        raise ValueError(NEVER_STORED.format(next_id=next_id, value=ids[bad[0]], index=int(bad[0])))
    return ids, priorities


def stored_updates(
    backend: Any, ids: Any, priorities: Any, added: Any, max_length: int, batch_size: int
) -> tuple[Any, Any, Any]:
    """What `update_priorities` sets, once its arguments are checked: numpy, or tensors in the graph.

    Args:
      backend: A `tfbuffers.sampling.Backend` (numpy or TensorFlow).
      ids: Checked frame ids, 1-D int64, each below `added * batch_size`.
      priorities: Their priorities, 1-D float64.
      added: The add counter, read in the writers' lock.
      max_length: Frames per segment.
      batch_size: Segments.

    Returns:
      `(rows, values, skipped)`: the storage rows of the frames still stored, each once with its last
      priority (an id given twice takes its last), and how many ids were skipped (overwritten since).
    """
    stored = _ring.ids_stored(backend.ops, ids, added, max_length, batch_size)
    kept = backend.boolean_mask(ids, stored)
    rows, values = backend.tree.last_of_each(
        _ring.rows_of_ids(kept, max_length, batch_size), backend.boolean_mask(priorities, stored)
    )
    return rows, values, backend.size(ids) - backend.size(kept)


def importance_weights(probabilities: Any, num_frames: Any, beta: float | tf.Tensor) -> Any:
    """Importance-sampling weights of drawn windows, as the PER paper defines them.

    `w_i = (num_frames * P(i)) ** -beta`, divided by the largest `w_i` of the batch,
    so the weights lie in (0, 1] and only scale the update downwards (the paper's
    normalisation by `max_i w_i`, taken over the sampled batch as its Algorithm 1
    does).

    Args:
      probabilities: `BufferInfo.probabilities` of a sample (numpy or a tensor), each > 0.
      num_frames: The buffer's `num_frames()` when the sample was drawn (N in the paper).
      beta: The correction's strength in [0, 1]: 0 is none, 1 corrects fully. Anneal it to 1 over training.
        A scalar float tensor too, with tensor probabilities (a train step's argument, so that annealing it
        traces the step once), its range then checked when the graph runs (not under XLA, which runs no
        check that fails).

    Returns:
      float32 weights shaped like `probabilities`: a tensor for a tensor, else a numpy array.

    Raises:
      ValueError: If `beta` is not a number in [0, 1] (`InvalidArgumentError` when a graph runs, for a tensor).

    >>> importance_weights(np.array([0.5, 0.25, 0.25], np.float32), 3, beta=1.0).tolist()
    [0.5, 1.0, 1.0]
    """
    scalar = isinstance(beta, tf.Tensor) and beta.dtype.is_floating and beta.shape.rank == 0
    if scalar and tf.executing_eagerly():
        beta = float(beta)  # checked at once, as a number
        scalar = False
    if scalar and tf.is_tensor(probabilities):
        in_range = (beta >= 0.0) & (beta <= 1.0)
        with tf.control_dependencies([tf.debugging.Assert(in_range, [NOT_A_BETA.format(received="<tensor>"), beta])]):
            beta = tf.cast(beta, tf.float64)
    elif isinstance(beta, bool) or not isinstance(beta, int | float) or not 0.0 <= beta <= 1.0:
        raise ValueError(NOT_A_BETA.format(received=beta))
    if tf.is_tensor(probabilities):
        scaled = tf.cast(num_frames, tf.float64) * tf.cast(probabilities, tf.float64)
        weights = tf.pow(scaled, -beta)
        return tf.cast(weights / tf.reduce_max(weights), tf.float32)
    weights = (float(num_frames) * np.asarray(probabilities, np.float64)) ** -beta
    return (weights / weights.max()).astype(np.float32)
