"""Samplers: which windows a sample draws, written once for numpy and TensorFlow.

A sampler turns the add counter into drawn windows: their frame ids, their
storage rows and the exact probability of each draw. It reads nothing but the
counter (and whatever state of its own it keeps), so a buffer swaps its sampler
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


def _tf_uniform_integers(shape: list[int], maxval: Any, after: list[Any]) -> tf.Tensor:
    with tf.control_dependencies(after):
        # The checks guarantee maxval > 0; the maximum keeps the op valid while they are pending.
        return tf.random.uniform(shape, 0, tf.maximum(maxval, 1), dtype=tf.int64)


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


class Sampler(abc.ABC):
    """Draws windows of a segmented ring (see `tfbuffers._ring` for the layout).

    Windows never leave a segment, never read past the newest frame nor into an
    overwritten row: a sampler picks among the windows the counter says are stored.
    """

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

    @abc.abstractmethod
    def sample(self, backend: Backend, added: Any, sample_batch_size: int | None, num_steps: int | None) -> Sample:
        """Draws `sample_batch_size` windows (one, without a batch axis, for None) of `num_steps` frames.

        Raises (numpy) or fails when run (TensorFlow) with `InvalidArgumentError`
        if the ring is empty or holds no window of `num_steps` frames.
        """


class UniformSampler(Sampler):
    """Every stored window equally likely: probability `1 / (windows per segment * batch_size)`."""

    def sample(self, backend: Backend, added: Any, sample_batch_size: int | None, num_steps: int | None) -> Sample:
        """See `Sampler.sample`."""
        shape = [] if sample_batch_size is None else [sample_batch_size]
        windows, checks = self._require_windows(backend, added, num_steps)
        draws = backend.uniform_integers(shape, windows, checks)
        ids, rows = self._windows(backend, draws, added, num_steps)
        return Sample(ids, rows, backend.full_inverse(shape, backend.ops.maximum(windows, 1)))


class PrioritizedSampler(Sampler):
    """Windows drawn with probability proportional to their first frame's weight in a sum tree.

    The tree's leaves are the ring's rows (a frame's weight is `priority ** alpha`,
    0 for priority 0, set by the buffer). Windows of `num_steps` never start in the
    newest `num_steps - 1` adds of a segment (they would run past the newest frame):
    those rows are masked out of each draw, so the probabilities are exact over
    the windows that can be drawn. Rows not written since the last clear weigh 0.
    """

    def __init__(self, buffer_name: str, batch_size: int, max_length: int, tree: Callable[[], Any]) -> None:
        """As `Sampler`; `tree()` returns the buffer's current tree (an array, or a variable in TensorFlow)."""
        super().__init__(buffer_name, batch_size, max_length)
        self._tree = tree

    def sample(self, backend: Backend, added: Any, sample_batch_size: int | None, num_steps: int | None) -> Sample:
        """See `Sampler.sample`. Also fails if every window that can be drawn has priority 0."""
        shape = [] if sample_batch_size is None else [sample_batch_size]
        _, checks = self._require_windows(backend, added, num_steps)
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
        first = _ring.ids_of_rows(backend.ops, rows, added, self._max_length, self._batch_size)
        ids = first[..., None] + backend.ops.arange(num_steps or 1) * self._batch_size
        rows = _ring.rows_of_ids(ids, self._max_length, self._batch_size)
        if num_steps is None:
            ids, rows = ids[..., 0], rows[..., 0]
        return Sample(ids, rows, backend.float32(weights / total), positive > 0, no_priority)
