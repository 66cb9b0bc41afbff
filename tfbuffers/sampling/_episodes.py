"""Episode ends kept by the adds, so that a sample finds the windows within episodes without a pass.

A window of `num_steps` frames starting at frame `r` crosses an episode
boundary iff the last frame of `r`'s episode comes before the window's last
frame: iff the *distance* of `r` (1 for an episode's last frame, 2 for the one
before it, ...) is below `num_steps`. A buffer with `episode_boundaries` keeps:

* `distance`: `[capacity + 1]` int8 by storage row: 1 .. `NEAR`, or 0 for a
  frame farther from its episode's end, or whose episode has not ended yet.
  (Row `capacity` takes the writes an add masks out.)
* `near`: `[NEAR + 1, 3]` float64: for each distance, the sum over its rows of
  their weight (1, or `priority ** alpha` in a prioritized buffer), of whether
  that weight is above 0, and of 1 (a count). (Row 0 takes masked-out sums.)
* `last_end`: `[batch_size]` int64: the add number of each segment's newest
  episode end, -1 for none.

An add moves the rows of the frames it overwrites out of `near`, and when the
frame before its own ended an episode (the previous frame is LAST, or its own
is FIRST), gives the last `NEAR` frames of that episode their distances: a few
ops on `batch_size * NEAR` values. A block of adds (`extend`) does the same for
all its frames at once (`EpisodeRecord.leave`, `join_block`). A prioritized buffer moves a row's weight in
`near` when it changes its priority. So for `num_steps - 1 <= NEAR`, the
windows that cross a boundary and their weight are `near[1 : num_steps]`,
less the newest `num_steps - 1` frames of each segment (windows past the newest
frame are not stored windows); a drawn window is checked by one gather of its
first row's distance. Restores and loads rebuild the three from the step types
(`rebuild`).

Like `tfbuffers._ring`, the functions are written once for numpy and
TensorFlow: they take the array functions of one backend (the sum tree's `Ops`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

import tfbuffers.sampling._sum_tree as _sum_tree
from tfbuffers import _ring

FIRST, LAST = 0, 2
"""TF-Agents' `StepType` values: an episode boundary lies between a LAST frame and the next, or before a FIRST."""
NEAR = 16
"""The largest distance kept: windows of up to `NEAR + 1` frames are drawn from `near` (longer: one pass)."""
WEIGHT, POSITIVE, COUNT = 0, 1, 2
"""The columns of `near`."""


class Near(NamedTuple):
    """The distances of the rows near the end of their episode, and their sums (see the module docstring)."""

    distance: Any
    near: Any
    last_end: Any


def empty(capacity: int, batch_size: int) -> Near:
    """No episode ended yet (a new or cleared buffer)."""
    return Near(np.zeros([capacity + 1], np.int8), np.zeros([NEAR + 1, 3]), np.full([batch_size], -1, np.int64))


def extras(storage: Any, batch_size: int) -> Near:
    """The record of a new buffer, kept in its storage (a `tfbuffers.storage` one) as three extras.

    Named `episodes/distance`, `episodes/near` and `episodes/last_end`.
    """
    initial = empty(storage.num_rows, batch_size)
    return Near(*(storage.extra(f"episodes/{name}", value) for name, value in zip(Near._fields, initial)))


def reset(record: Near) -> None:
    """Empties a numpy `record` in place (a cleared buffer)."""
    record.distance[:] = 0
    record.near[:] = 0.0
    record.last_end[:] = -1


def assign(record: Near, values: Near) -> None:
    """Sets a numpy `record` to `values` in place (a restored buffer)."""
    for array, value in zip(record, values):
        np.copyto(array, value)


def is_cut(previous_types: Any, new_types: Any) -> Any:
    """Whether an episode boundary lies between frames of step types `previous_types` and `new_types`."""
    return (previous_types == LAST) | (new_types == FIRST)


def within(xp: Any, types: Any) -> Any:
    """`[...]` bool for step types `[..., num_steps]` (`xp`: numpy or tf): no LAST but last, no FIRST but first."""
    any_ = np.any if xp is np else tf.reduce_any
    return ~any_(is_cut(types[..., :-1], types[..., 1:]), axis=-1)


def columns(weights: Any) -> Any:
    """The `near` columns (`[..., 3]` float64) of rows of `weights`, numpy or a tensor: weight, above 0, 1."""
    if isinstance(weights, np.ndarray):
        return np.stack([weights, np.asarray(weights > 0, np.float64), np.ones_like(weights)], axis=-1)
    return tf.stack([weights, tf.cast(weights > 0, tf.float64), tf.ones_like(weights)], axis=-1)


def reweighted(xp: Any, record: Near, rows: Any, weights: Any, old_columns: Any) -> Any:
    """Moves distinct `rows`' weight in `record` to `weights`, from `old_columns` (`columns` of their old weights).

    A prioritized buffer's update, before the tree changes. Rows farther from their episode's end (distance
    0) move row 0's sums, which nothing reads. `xp`: the array functions (`tfbuffers.sampling._sum_tree.NUMPY` or
    `.TENSORFLOW`); returns TensorFlow's write, or None (numpy arrays change in place).
    """
    distance = xp.int64(xp.gather(record.distance, rows))
    return xp.scatter_add(record.near, distance, columns(weights) - old_columns)


def ending_rows(
    xp: Any, cut: Any, last_end: Any, added: Any, max_length: int, batch_size: int
) -> tuple[Any, Any, Any, Any]:
    """The rows that add number `added` brings near the end of their episode (the TF buffer's add).

    Args:
      xp: The array functions (`tfbuffers.sampling._sum_tree.NUMPY` or `.TENSORFLOW`).
      cut: `[batch_size]` bool: whether an episode ends with each segment's previous frame (`is_cut`; False
        for the first add).
      last_end: `[batch_size]` the record's `last_end` before the add.
      added: The add counter before the add.
      max_length: Frames per segment.
      batch_size: Segments.

    Returns:
      `(rows, distances, kept, last_end)`: `[batch_size, NEAR]` rows of the ended episodes' last frames and
      their distances (1 for the last frame), where `kept` (frames of that episode still stored after the
      add), and the new `last_end`.
    """
    ended = added - 1
    distances = np.broadcast_to(np.arange(1, NEAR + 1), (batch_size, NEAR))  # constants: no ops per add
    adds = ended - distances + 1
    oldest_after = added + 1 - xp.minimum(added + 1, max_length)
    kept = cut[:, None] & (adds > last_end[:, None]) & (adds >= oldest_after)
    rows = (adds % max_length) * batch_size + np.arange(batch_size)[:, None]
    return rows, distances, kept, xp.where(cut, ended, last_end)


def rebuild(step_types: np.ndarray, weights: np.ndarray, added: int, max_length: int, batch_size: int) -> Near:
    """The record of the stored frames, from the step-type column and each row's weight (storage row order)."""
    record = empty(max_length * batch_size, batch_size)
    frames = min(added, max_length)
    if not frames:
        return record
    adds = np.arange(added - frames, added, dtype=np.int64)
    rows = (adds % max_length)[:, None] * batch_size + np.arange(batch_size)  # [frames, batch_size]
    types = np.asarray(step_types)[rows]
    ends = np.zeros(rows.shape, bool)
    ends[:-1] = is_cut(types[:-1], types[1:])  # the newest frame's episode has not ended yet
    # Each frame's distance: from its position to the first end at or after it (none: 0).
    positions = np.arange(frames)[:, None]
    following = np.minimum.accumulate(np.where(ends, positions, frames)[::-1], axis=0)[::-1]
    distance = np.where(following < frames, following - positions + 1, 0)
    distance = np.where(distance <= NEAR, distance, 0)
    record.distance[rows] = distance
    np.add.at(record.near, distance.ravel(), columns(np.asarray(weights, np.float64)[rows.ravel()]))
    record.near[0] = 0.0
    last = frames - 1 - np.argmax(ends[::-1], axis=0)  # each segment's newest end, where it has one
    record.last_end[:] = np.where(ends.any(axis=0), adds[last], -1)
    return record


class EpisodeRecord:
    """A buffer's record of episode ends: a part of its sampler, over extras in the buffer's storage.

    One interface for both execution modes, the sampler's events: `before_add`, `on_add`, `on_clear`,
    `on_restore` (with `restore_targets`), `reweighted` for a priority update, and `read` for the draws. On
    the host (numpy extras) each changes the record in place under the buffer's lock and returns []; in the
    graph (variables) each returns the ops, which the buffer runs in its writers' lock.

    The add-time update has one kernel per mode, measured. The host's is plain loops over the few segments
    whose episode ended (an add's numpy calls cost more than their arithmetic): the graph's vectorised update
    (`ending_rows`), run over numpy with its parts skipped where they change nothing, made these adds 1.35x
    slower (18 to 24 us per add of 4 segments, episodes of about 50 frames; measured 2026-11); a host block
    of adds is one vectorised update of all its episode ends (`join_block`). The graph's is one set of
    scatters (`ending_rows`), made before the block's rows are written.
    """

    def __init__(self, storage: Any, step_field: int, batch_size: int, max_length: int, graph: bool) -> None:
        self.record = extras(storage, batch_size)
        self._storage = storage
        self._step_field = step_field
        self._batch_size = batch_size
        self._max_length = max_length
        self._graph = graph
        self._xp = _sum_tree.TENSORFLOW if graph else _sum_tree.NUMPY
        self._cut: Any = None  # a host add's episode cuts, from `before_add` to `on_add`
        # The rows' weights in draws (`weights(rows)`: the prioritized sampler's priorities); 1 without.
        self.weights: Callable[[Any], Any] | None = None

    def row_columns(self, rows: Any) -> Any:
        """The rows' `near` columns (`columns` of their weights in draws: 1, or their priority's)."""
        if self.weights is not None:
            return columns(self.weights(rows))
        return tf.ones([rows.shape[0], 3], tf.float64) if self._graph else np.ones([len(rows), 3])

    def read(self) -> Near:
        """The record for the sampler (in the graph: inside the sample's checked read, after the counter)."""
        if not self._graph:
            return self.record
        return Near(self.record.distance, self.record.near.read_value(), self.record.last_end)

    def before_add(self, added: Any, new_types: Any) -> list[Any]:
        """Add number `added` of frames of `new_types` is about to write its block.

        Host: whether an episode ends before each segment's new frame, kept for `on_add`. Graph: the writes
        (`ending_rows`), which read the previous frames' step types and the overwritten rows' weights first.
        """
        if self._graph:
            return self._graph_written(added, new_types)
        if not added:
            self._cut = np.zeros([self._batch_size], bool)
        else:
            newest = int(_ring.block_start(added - 1, self._max_length, self._batch_size))
            previous = self._storage.column(self._step_field)[newest : newest + self._batch_size]
            self._cut = is_cut(previous, new_types)
        return []

    def on_add(self, added: int) -> list[Any]:
        """Host: add number `added` was written; its rows leave the record, an ended episode's last frames join it.

        The host's add kernel (the graph's wrote in `before_add`): plain loops over the segments whose episode ended.
        """
        if self._graph:
            return []
        record, cut = self.record, self._cut
        first = int(_ring.block_start(added, self._max_length, self._batch_size))
        self.leave(first, first + self._batch_size)
        if not cut.any():
            return []
        ended = added - 1
        oldest_after = added + 1 - min(added + 1, self._max_length)
        for segment in np.flatnonzero(cut):
            low = max(int(record.last_end[segment]) + 1, oldest_after, ended - NEAR + 1)
            adds = np.arange(low, ended + 1)
            rows = (adds % self._max_length) * self._batch_size + segment
            distances = ended - adds + 1  # distinct: a plain indexed add
            record.distance[rows] = distances
            record.near[distances] += self.row_columns(rows)
            record.last_end[segment] = ended
        return []

    def leave(self, start: int, stop: int) -> None:
        """Host: storage rows `start` to `stop` are overwritten: they leave the record, by their weights now."""
        record = self.record
        left = record.distance[start:stop]
        if left.any():  # the overwritten frames were near the end of their episode
            rows = start + np.flatnonzero(left)
            np.subtract.at(record.near, left[left > 0], self.row_columns(rows))
            left[:] = 0

    def join_block(self, added: int, count: int, step_types: np.ndarray) -> None:
        """Host: adds `added` to `added + count - 1` (one run, not wrapping the ring) were written and have left.

        What their adds one by one leave (`on_add`), at once: the last frames of every episode that ended before
        one of the block's frames join, by their weights now (`leave` first, and a prioritized sampler's new
        priorities). `before_add` was told of the first add; `step_types`: the block's, `[batch_size, count]`.
        One by one, a frame that joins and is overwritten later in the same block leaves again; here it never
        joins (only frames still stored after the block do), so the sums are the same, up to the rounding of
        weights other than 1.
        """
        cuts = np.empty([self._batch_size, count], bool)
        cuts[:, 0] = self._cut
        cuts[:, 1:] = is_cut(step_types[:, :-1], step_types[:, 1:])
        segments, steps = np.nonzero(cuts)  # by segment, then in add order
        if not len(segments):
            return
        record, length, size = self.record, self._max_length, self._batch_size
        ended = added + steps.astype(np.int64) - 1  # each cut's episode's last add
        # Each cut's episode starts after the segment's previous end: the cut before it, or the record's.
        previous = np.where(
            np.r_[True, segments[1:] != segments[:-1]], record.last_end[segments], np.r_[-1, ended[:-1]]
        )
        oldest_after = added + count - min(added + count, length)  # the oldest add still stored after the block
        low = np.maximum(np.maximum(previous + 1, oldest_after), ended - NEAR + 1)
        distances = np.arange(1, NEAR + 1)
        adds = ended[:, None] - distances + 1  # [cuts, NEAR]
        kept = adds >= low[:, None]
        rows = (adds[kept] % length) * size + np.broadcast_to(segments[:, None], adds.shape)[kept]  # distinct
        joined = np.broadcast_to(distances, adds.shape)[kept]
        record.distance[rows] = joined
        np.add.at(record.near, joined, self.row_columns(rows))
        np.maximum.at(record.last_end, segments, ended)

    def on_clear(self) -> list[Any]:
        """The buffer was cleared: no episode ended. Graph: the writes."""
        if not self._graph:
            reset(self.record)
            return []
        distance, near, last_end = self.record
        return [
            distance.assign(tf.zeros_like(distance), read_value=False),
            near.assign(tf.zeros_like(near), read_value=False),
            last_end.assign(tf.fill(tf.shape(last_end), tf.constant(-1, tf.int64)), read_value=False),
        ]

    def restore_targets(self) -> list[Any]:
        """Graph: the record's variables, as `on_restore` orders its values."""
        return list(self.record)

    def on_restore(self, step_types: np.ndarray, weights: np.ndarray, added: int) -> list[Any]:
        """The record of a restore's stored frames (`rebuild`), from its step types and rows' weights.

        Host: assigned in place, []. Graph: the values of `restore_targets()`, which the buffer assigns with the rows.
        """
        rebuilt = rebuild(step_types, weights, added, self._max_length, self._batch_size)
        if self._graph:
            return list(rebuilt)
        assign(self.record, rebuilt)
        return []

    def reweighted(self, rows: Any, weights: Any) -> list[Any]:
        """Moves distinct `rows`' weight to `weights` (`reweighted`), before the priorities change. Graph: the write."""
        moved = reweighted(self._xp, self.record, rows, weights, self.row_columns(rows))
        return [moved] if self._graph else []

    # The graph's add kernel.

    def _graph_written(self, added: tf.Tensor, new_types: tf.Tensor) -> list[Any]:
        record = self.record
        segments = _ring.TENSORFLOW.arange(self._batch_size)
        block = _ring.block_start(added, self._max_length, self._batch_size) + segments
        newest = _ring.block_start(added - 1, self._max_length, self._batch_size) + segments
        cut = (added > 0) & is_cut(self._storage.read(newest, [self._step_field])[0], new_types)
        rows, distances, kept, last_end = ending_rows(
            self._xp, cut, record.last_end.read_value(), added, self._max_length, self._batch_size
        )
        rows, distances, kept = tf.reshape(rows, [-1]), distances.reshape(-1), tf.reshape(kept, [-1])
        # Masked-out entries go to the spare row and the unused distance 0.
        left = tf.cast(tf.gather(record.distance, block), tf.int64)
        joined = tf.where(kept, distances, 0)
        sums = tf.concat([-self.row_columns(block), self.row_columns(rows)], 0)
        with tf.control_dependencies([left, sums]):
            return [
                record.near.scatter_add(tf.IndexedSlices(sums, tf.concat([left, joined], 0))),
                record.distance.scatter_update(
                    tf.IndexedSlices(
                        tf.cast(tf.concat([0 * left, joined], 0), tf.int8),
                        tf.concat([block, tf.where(kept, rows, self._storage.num_rows)], 0),
                    )
                ),
                record.last_end.assign(last_end, read_value=False),
            ]
