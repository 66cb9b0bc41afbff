"""Samplers: which windows a sample draws, written once for numpy and TensorFlow.

A sampler turns the add counter into drawn windows: their frame ids, their
storage rows and the exact probability of each draw. It reads nothing but the
counter, whatever state of its own it keeps and, with episode boundaries, the
step-type column (`Sampler.step_types`), so a buffer swaps its sampler
without touching storage, locking or datasets: the TF buffer calls it inside its
lock-free checked read, the py buffer under its lock, and both buffers'
`as_dataset` through those same reads.

The formulas take a `Backend` (`TENSORFLOW`, or `numpy_backend(rng)`), as the
ring arithmetic of `tfbuffers._ring` takes its ops namespace; a prioritized or
episode-aware sampler is one more `Sampler` subclass over the same backends.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from tfbuffers import _ring, _sum_tree

EMPTY = "{buffer} is empty. Make sure to add items before sampling the buffer."
NO_PRIORITY = (
    "{buffer}: every window that can be drawn has priority 0. A priority of 0 means never drawn: "
    "give some stored frame a priority above 0 with update_priorities, or add frames."
)
NO_EPISODE_WINDOW = (
    "{buffer}: no stored window of {num_steps} frames lies within one episode (episode_boundaries is on): "
    "add frames, or sample fewer steps"
)
NOT_ENOUGH_FRAMES = (
    "num_steps: expected at most the frames one segment holds, got {num_steps}: {buffer} holds fewer than "
    "{num_steps} frame(s) per segment so far. Add items before sampling windows of {num_steps}."
)


class Backend(NamedTuple):
    """What a sampler needs of an array library, beyond the ring's `ops`."""

    ops: _ring.Ops
    uniform_integers: Callable[[list[int], Any, list[Any]], Any]
    """`(shape, maxval, after)`: integers uniform in `[0, maxval)`, drawn once the `after` checks passed."""
    require: Callable[[Any, Any], Any]
    """`(condition, message)`: raises `InvalidArgumentError(message)` unless `condition`; in TensorFlow it
    returns the check, for `uniform_integers`' `after`."""
    select: Callable[[Any, str, str], Any]
    """`(condition, a, b)`: `a` if `condition` else `b` (a string tensor in TensorFlow)."""
    full_inverse: Callable[[list[int], Any], Any]
    """`(shape, count)`: a float32 array of `1 / count` (computed in float64)."""
    draw_leaves: Callable[[Any, int, list[int], list[Any], Any, Any], Any]
    """`(tree, capacity, shape, after, total, mask)`: sum-tree leaves drawn in proportion to their values, none
    in `mask`, once the `after` checks passed (`total`: the unmasked leaves' sum)."""
    tree: _sum_tree.Ops
    """The sum tree's functions on this backend."""
    float32: Callable[[Any], Any]
    """`(x)`: `x` as float32 (probabilities)."""
    uniform_floats: Callable[[list[int], list[Any]], Any]
    """`(shape, after)`: float64 uniform in `[0, 1)`, drawn once the `after` checks passed."""
    cumsum: Callable[[Any], Any]
    """`(x)`: the running sums along axis 0 (inclusive)."""
    searchsorted: Callable[[Any, Any], Any]
    """`(sorted, values)`: int64 positions of the first entries of the 1-D `sorted` above each value."""
    concat: Callable[[list[Any]], Any]
    """`(arrays)`: concatenated along axis 0."""
    reshape: Callable[[Any, list[int]], Any]
    """`(x, shape)`: `x` reshaped."""
    cast: Callable[[Any, Any], Any]
    """`(x, dtype)`: `x` as the numpy `dtype` (`np.int64`, `np.float64`)."""


def _tf_uniform_integers(shape: list[int], maxval: Any, after: list[Any]) -> tf.Tensor:
    with tf.control_dependencies(after):
        # The checks guarantee maxval > 0; the maximum keeps the op valid while they are pending.
        return tf.random.uniform(shape, 0, tf.maximum(maxval, 1), dtype=tf.int64)


def _tf_uniform_floats(shape: list[int], after: list[Any]) -> tf.Tensor:
    with tf.control_dependencies(after):
        return tf.random.uniform(shape, dtype=tf.float64)


def _tf_require(condition: Any, message: Any) -> Any:
    # A plain Assert with string data needs no tf.cond guard: fewer ops per sample.
    return tf.debugging.Assert(condition, [message])


def _tf_draw_leaves(tree: Any, capacity: int, shape: list[int], after: list[Any], total: Any, mask: Any) -> Any:
    with tf.control_dependencies(after):
        targets = tf.random.uniform(shape, dtype=tf.float64) * total
    return _sum_tree.find(_sum_tree.TENSORFLOW, tree, capacity, targets, mask)


TENSORFLOW = Backend(
    ops=_ring.TENSORFLOW,
    uniform_integers=_tf_uniform_integers,
    require=_tf_require,
    select=lambda condition, a, b: tf.where(condition, a, b),
    full_inverse=lambda shape, count: tf.fill(shape, tf.cast(1.0 / tf.cast(count, tf.float64), tf.float32)),
    draw_leaves=_tf_draw_leaves,
    tree=_sum_tree.TENSORFLOW,
    float32=lambda x: tf.cast(x, tf.float32),
    uniform_floats=_tf_uniform_floats,
    cumsum=lambda x: tf.cumsum(x, axis=0),
    searchsorted=lambda sorted_, values: tf.searchsorted(sorted_, values, side="right", out_type=tf.int64),
    concat=lambda arrays: tf.concat(arrays, 0),
    reshape=tf.reshape,
    cast=lambda x, dtype: tf.cast(x, tf.as_dtype(dtype)),
)


def _np_require(condition: Any, message: Any) -> None:
    if not condition:
        raise tf.errors.InvalidArgumentError(None, None, message)


def numpy_backend(rng: np.random.Generator) -> Backend:
    """The numpy backend, drawing from `rng`."""
    return Backend(
        ops=_ring.NUMPY,
        uniform_integers=lambda shape, maxval, after: np.asarray(rng.integers(0, maxval, size=shape, dtype=np.int64)),
        require=_np_require,
        select=lambda condition, a, b: a if condition else b,
        full_inverse=lambda shape, count: np.full(shape, 1.0 / count, np.float32),
        draw_leaves=lambda tree, capacity, shape, after, total, mask: _sum_tree.draw_numpy(
            tree, capacity, rng.random, shape, mask
        ),
        tree=_sum_tree.NUMPY,
        float32=lambda x: np.asarray(x, np.float32),
        uniform_floats=lambda shape, after: np.asarray(rng.random(shape)),
        cumsum=lambda x: np.cumsum(x, axis=0),
        searchsorted=lambda sorted_, values: np.searchsorted(sorted_, values, side="right").astype(np.int64),
        concat=lambda arrays: np.concatenate(arrays, 0),
        reshape=np.reshape,
        cast=lambda x, dtype: np.asarray(x, dtype),
    )


class Sample(NamedTuple):
    """Drawn windows: frame ids and storage rows `[*batch, num_steps]` (no time axis without num_steps)."""

    ids: Any
    rows: Any
    probabilities: Any
    valid: Any = True
    """Whether the state the draw read allows it (a prioritized buffer: some window weighs more than 0).
    The numpy backend raises at once instead; in TensorFlow the caller asserts it, with `invalid_message`, once
    it knows the read was not torn by a concurrent writer (a torn read is read again)."""
    invalid_message: str = ""


FIRST, LAST = 0, 2
"""TF-Agents' `StepType` values: an episode boundary lies between a LAST frame and the next, or before a FIRST."""


def valid_window_starts(
    backend: Backend, step_types: Any, added: Any, max_length: int, batch_size: int, num_steps: int
) -> Any:
    """`[capacity]` bool by storage row: whether the window of `num_steps` frames starting there can be drawn.

    It can when it is stored (one segment, consecutive frames, none past the newest)
    and crosses no episode boundary: none of its frames but the last is a LAST
    frame, none but the first a FIRST frame. A few vectorised passes over the
    step-type column (`[capacity]`, storage row order), whatever the batch.
    """
    ops = backend.ops
    positions = ops.arange(max_length)
    windows = _ring.windows_per_segment(ops, added, max_length, num_steps)
    # A window starting `j` adds after the oldest frame is stored if j < windows; position p holds add oldest + j.
    stored = (positions - _ring.oldest_add(ops, added, max_length) % max_length) % max_length < windows
    types = backend.reshape(step_types, [max_length, batch_size])
    following = backend.concat([types[1:], types[:1]])  # the next position's frames (the newest's is never read)
    cut = (types == LAST) | (following == FIRST)  # a boundary between position p and p + 1
    if num_steps == 2:
        crossing = cut
    else:
        # Boundaries among positions p .. p + num_steps - 2 (circular), from one running sum.
        cuts = backend.cast(cut, np.int32)
        running = backend.cumsum(backend.concat([cuts[:1] * 0, cuts, cuts[: num_steps - 2]]))
        crossing = running[num_steps - 1 : num_steps - 1 + max_length] - running[:max_length] > 0
    return backend.reshape(stored[:, None] & ~crossing, [-1])


class Sampler(abc.ABC):
    """Draws windows of a segmented ring (see `tfbuffers._ring` for the layout).

    Windows never leave a segment, never read past the newest frame nor into an
    overwritten row: a sampler picks among the windows the counter says are stored.
    With `step_types` set (a buffer's `episode_boundaries`), windows of more than
    one frame never cross an episode boundary either: draws are uniform (or in
    proportion to priority) over the windows within one episode, with exact
    probabilities, from one running sum over the rows (no rejection).
    """

    step_types: Callable[[], Any] | None = None
    """Returns the step-type column (`[capacity]`, storage row order), or None: no episode boundaries."""

    def __init__(self, buffer_name: str, batch_size: int, max_length: int) -> None:
        """A sampler for a ring of `batch_size` segments of `max_length` rows; errors name `buffer_name`."""
        self._buffer_name = buffer_name
        self._batch_size = batch_size
        self._max_length = max_length

    def _require_windows(self, backend: Backend, added: Any, num_steps: int | None) -> tuple[Any, list[Any]]:
        """The number of windows of `num_steps` in the ring, and the checks that there is one."""
        windows = _ring.windows_per_segment(backend.ops, added, self._max_length, num_steps or 1) * self._batch_size
        empty = EMPTY.format(buffer=self._buffer_name)
        if num_steps is None or num_steps == 1:
            return windows, [backend.require(windows > 0, empty)]
        too_few = NOT_ENOUGH_FRAMES.format(buffer=self._buffer_name, num_steps=num_steps)
        return windows, [backend.require(windows > 0, backend.select(added > 0, too_few, empty))]

    def _windows(self, backend: Backend, draws: Any, added: Any, num_steps: int | None) -> tuple[Any, Any]:
        """Ids and rows of the windows numbered `draws` (see `_ring.window_ids_and_rows`)."""
        ids, rows = _ring.window_ids_and_rows(
            backend.ops, draws, added, self._max_length, self._batch_size, num_steps or 1
        )
        if num_steps is None:
            return ids[..., 0], rows[..., 0]
        return ids, rows

    def _windows_from(self, backend: Backend, first_rows: Any, added: Any, num_steps: int | None) -> tuple[Any, Any]:
        """Ids and rows of the windows whose first frames are at storage rows `first_rows`."""
        first = _ring.ids_of_rows(backend.ops, first_rows, added, self._max_length, self._batch_size)
        ids = first[..., None] + backend.ops.arange(num_steps or 1) * self._batch_size
        rows = _ring.rows_of_ids(ids, self._max_length, self._batch_size)
        if num_steps is None:
            return ids[..., 0], rows[..., 0]
        return ids, rows

    def _episode_windows(self, backend: Backend, added: Any, num_steps: int | None) -> Any:
        """`valid_window_starts` when episode boundaries apply to windows of `num_steps`, else None."""
        if self.step_types is None or (num_steps or 1) == 1:
            return None  # a single frame never crosses a boundary
        return valid_window_starts(
            backend, self.step_types(), added, self._max_length, self._batch_size, num_steps or 1
        )

    @abc.abstractmethod
    def sample(self, backend: Backend, added: Any, sample_batch_size: int | None, num_steps: int | None) -> Sample:
        """Draws `sample_batch_size` windows (one, without a batch axis, for None) of `num_steps` frames.

        Raises (numpy) or fails when run (TensorFlow) with `InvalidArgumentError`
        if the ring is empty or holds no window of `num_steps` frames (within one
        episode, with episode boundaries).
        """


class UniformSampler(Sampler):
    """Every window that can be drawn equally likely: probability `1 / windows`."""

    def sample(self, backend: Backend, added: Any, sample_batch_size: int | None, num_steps: int | None) -> Sample:
        """See `Sampler.sample`."""
        shape = [] if sample_batch_size is None else [sample_batch_size]
        windows, checks = self._require_windows(backend, added, num_steps)
        valid = self._episode_windows(backend, added, num_steps)
        if valid is None:
            draws = backend.uniform_integers(shape, windows, checks)
            ids, rows = self._windows(backend, draws, added, num_steps)
            return Sample(ids, rows, backend.full_inverse(shape, backend.ops.maximum(windows, 1)))
        running = backend.cumsum(backend.cast(valid, np.int64))
        count = running[-1]
        no_window = NO_EPISODE_WINDOW.format(buffer=self._buffer_name, num_steps=num_steps)
        if backend is not TENSORFLOW:
            backend.require(count > 0, no_window)
        # Draw k lands on the row of the k-th valid window: the first row whose running count exceeds k.
        first_rows = backend.searchsorted(running, backend.uniform_integers(shape, count, checks))
        first_rows = backend.ops.minimum(first_rows, self._batch_size * self._max_length - 1)  # torn reads only
        ids, rows = self._windows_from(backend, first_rows, added, num_steps)
        return Sample(ids, rows, backend.full_inverse(shape, backend.ops.maximum(count, 1)), count > 0, no_window)


class PrioritizedSampler(Sampler):
    """Windows drawn with probability proportional to their first frame's weight in a sum tree.

    The tree's leaves are the ring's rows (a frame's weight is `priority ** alpha`,
    0 for priority 0, set by the buffer). Windows of `num_steps` never start in the
    newest `num_steps - 1` adds of a segment (they would run past the newest frame):
    those rows are masked out of each draw, so the probabilities are exact over
    the windows that can be drawn. Rows not written since the last clear weigh 0.
    With episode boundaries, the weights of the windows that can be drawn are
    summed in one pass over the leaves and drawn from by a search in that running
    sum (O(capacity) per batch rather than O(log capacity) per draw).
    """

    def __init__(self, buffer_name: str, batch_size: int, max_length: int, tree: Callable[[], Any]) -> None:
        """As `Sampler`; `tree()` returns the buffer's current tree (an array, or a variable in TensorFlow)."""
        super().__init__(buffer_name, batch_size, max_length)
        self._tree = tree

    def sample(self, backend: Backend, added: Any, sample_batch_size: int | None, num_steps: int | None) -> Sample:
        """See `Sampler.sample`. Also fails if every window that can be drawn has priority 0."""
        shape = [] if sample_batch_size is None else [sample_batch_size]
        _, checks = self._require_windows(backend, added, num_steps)
        valid = self._episode_windows(backend, added, num_steps)
        if valid is not None:
            return self._sample_episodes(backend, added, shape, num_steps, checks, valid)
        tree, capacity = self._tree(), self._batch_size * self._max_length
        newest = backend.ops.minimum((num_steps or 1) - 1, added)  # adds whose windows would run past the newest
        masked_rows = _ring.block_start(added - newest, self._max_length, self._batch_size)
        leaf_mask = (
            None
            if (num_steps or 1) == 1
            else _sum_tree.mask(backend.tree, tree, capacity, masked_rows, newest * self._batch_size)
        )
        total, positive = _sum_tree.unmasked_total(backend.tree, tree, leaf_mask)
        no_priority = NO_PRIORITY.format(buffer=self._buffer_name)
        if backend is not TENSORFLOW:
            backend.require(positive > 0, no_priority)
        # Within the leaves even on a torn read (a concurrent clear or update), which is then read again.
        rows = backend.ops.minimum(backend.draw_leaves(tree, capacity, shape, checks, total, leaf_mask), capacity - 1)
        weights = backend.tree.gather(tree, _sum_tree.leaf_count(capacity) + rows)[..., _sum_tree.SUM]
        ids, rows = self._windows_from(backend, rows, added, num_steps)
        return Sample(ids, rows, backend.float32(weights / total), positive > 0, no_priority)

    def _sample_episodes(
        self, backend: Backend, added: Any, shape: list[int], num_steps: int | None, checks: list[Any], valid: Any
    ) -> Sample:
        tree, capacity = self._tree(), self._batch_size * self._max_length
        size = _sum_tree.leaf_count(capacity)
        weights = tree[size : size + capacity, _sum_tree.SUM] * backend.cast(valid, np.float64)
        running = backend.cumsum(weights)
        total = running[-1]
        no_window = NO_EPISODE_WINDOW.format(buffer=self._buffer_name, num_steps=num_steps)
        no_priority = NO_PRIORITY.format(buffer=self._buffer_name)
        window_count = backend.cumsum(backend.cast(valid, np.int64))[-1]
        if backend is not TENSORFLOW:
            backend.require(window_count > 0, no_window)
            backend.require(total > 0, no_priority)
        # The last row of weight above 0: where the running sum first reaches the total.
        last = backend.cumsum(backend.cast(running < total, np.int64))[-1]
        targets = backend.uniform_floats(shape, checks) * total
        first_rows = backend.ops.minimum(backend.searchsorted(running, targets), last)
        ids, rows = self._windows_from(backend, first_rows, added, num_steps)
        probabilities = backend.float32(backend.tree.gather(weights, first_rows) / total)
        message = backend.select(window_count > 0, no_priority, no_window)
        return Sample(ids, rows, probabilities, total > 0, message)
