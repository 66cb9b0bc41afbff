"""`PrioritizedSampler`: windows drawn in proportion to their first frame's priority, which it keeps.

Its state is the priorities and their sum tree (`tfbuffers.prioritized`), kept in the buffer's storage and
changed by the buffer's events; `TFPrioritizedReplayBuffer` and `PyPrioritizedReplayBuffer` are the uniform
buffers with it.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import tensorflow as tf

import tfbuffers.sampling._episodes as _episodes
import tfbuffers.sampling._sum_tree as _sum_tree
import tfbuffers.sampling.priorities as priorities_lib
from tfbuffers import _ring, _xla
from tfbuffers.sampling.backends import TENSORFLOW, Backend, choose
from tfbuffers.sampling.base import NO_PRIORITY, Sample, Sampler, SamplerFactory

NOT_BOUND = (
    "sampler: expected a {sampler} bound to a buffer's storage (a buffer made with it binds it), got one "
    "never bound: its priorities live in the storage"
)


class PrioritizedSampler(Sampler):
    """Windows drawn with probability proportional to their first frame's weight in a sum tree.

    The tree's leaves are the ring's rows (a frame's weight is `priority ** alpha`,
    0 for priority 0, set by the buffer). Windows of `num_steps` never start in the
    newest `num_steps - 1` adds of a segment (they would run past the newest frame):
    those rows are left out of each draw (in TensorFlow by rejection,
    `_draw_outside`), so the probabilities are exact over the windows that can be
    drawn. Rows not written since the last clear weigh 0. With episode
    boundaries, as `Sampler` says: the weight within episodes is the tree's less
    `near`'s, and draws from the tree are kept where they cross no boundary.
    """

    prioritized = True

    def __init__(self, buffer_name: str, batch_size: int, max_length: int, priority_exponent: float = 0.6) -> None:
        """As `Sampler`; draws are proportional to `priority ** priority_exponent` (alpha, checked).

        Its state (`bind`): the priorities, the largest one and their sum tree (`tfbuffers.prioritized.Priorities`),
        kept in the storage's extras after the record of episode ends. `TFPrioritizedReplayBuffer` and
        `PyPrioritizedReplayBuffer` are the uniform buffers with this sampler (`factory`).
        """
        super().__init__(buffer_name, batch_size, max_length)
        self.priority_exponent = priorities_lib.check_exponent(priority_exponent)
        self.priorities: priorities_lib.Priorities | None = None

    @classmethod
    def factory(cls, priority_exponent: float) -> SamplerFactory:
        """`sampler=` for this sampler of `priority_exponent`: `(buffer_name, batch_size, max_length) -> sampler`."""
        priorities_lib.check_exponent(priority_exponent)
        return functools.partial(cls, priority_exponent=priority_exponent)

    def bind(self, storage: Any, backend: Backend, step_field: int | None) -> None:
        """See `Sampler.bind`; then the priorities, after the record of episode ends, which weighs rows by them."""
        super().bind(storage, backend, step_field)
        size = (self.batch_size, self.max_length)
        priorities = priorities_lib.Priorities(storage, *size, self.priority_exponent, graph=self._graph)
        self.priorities = priorities
        if self._episode_record is not None:
            self._episode_record.weights = priorities.weights

    def _tree(self) -> Any:
        """The current sum tree: the host's with every ancestor up to date, or the graph's variable."""
        return self._priorities().tree()

    def _priorities(self) -> priorities_lib.Priorities:
        if self.priorities is None:
            raise ValueError(NOT_BOUND.format(sampler=type(self).__name__))
        return self.priorities

    def on_add(self, added: Any, rows: Any) -> list[Any]:
        """See `Sampler.on_add`: the block's frames get the largest priority given so far."""
        if self._episode_record is not None:  # the base class's part, inline: a py add's hot path
            self._episode_record.on_add(added)  # host: written now; graph: written in before_add, []
        return self._priorities().on_add(rows)

    def on_add_block(self, added: int, count: int, first_row: int, step_types: Any) -> None:
        """See `Sampler.on_add_block`: the block's frames get the largest priority at once.

        With episode boundaries, the record of episode ends follows the block at once too, as it follows single
        adds: the overwritten rows leave it by their old priorities, then the new frames get theirs, then the
        ended episodes' last frames join it by them.
        """
        rows = slice(first_row, first_row + count * self.batch_size)
        if self._episode_record is None:
            self._priorities().on_add(rows)
            return
        self._episode_record.leave(rows.start, rows.stop)
        self._priorities().on_add(rows)
        self._episode_record.join_block(added, count, step_types)

    def on_clear(self) -> list[Any]:
        """See `Sampler.on_clear`: every priority 0, new frames get 1.0."""
        return [*self._priorities().on_clear(), *super().on_clear()]

    def restore_targets(self) -> list[Any]:
        """See `Sampler.restore_targets`: the priorities, the largest one and the tree, then the record's."""
        return [*self._priorities().restore_targets(), *super().restore_targets()]

    def on_restore(self, added: Any, step_types: Any, extras: dict[str, np.ndarray]) -> list[Any]:
        """See `Sampler.on_restore`: the priorities set, the tree rebuilt from them, then the record."""
        return [*self._priorities().on_restore(extras), *super().on_restore(added, step_types, extras)]

    def _restored_weights(self, extras: dict[str, np.ndarray]) -> np.ndarray:
        return priorities_lib.leaf_weights(extras[priorities_lib.PRIORITY], self.priority_exponent)

    def on_update_priorities(self, rows: Any, priorities: Any) -> list[Any]:
        """Sets the priorities of distinct `rows`, moving their weight in the record of episode ends first."""
        weights = priorities_lib.leaf_weights(priorities, self.priority_exponent)
        # From the rows' old weights, read before the tree changes (host: moved now, []).
        moved = [] if self._episode_record is None else self._episode_record.reweighted(rows, weights)
        if not self._graph:
            return self._priorities().on_update(rows, priorities, weights)
        with tf.control_dependencies(moved):
            return [*moved, *self._priorities().on_update(rows, priorities, weights)]

    def state_extras(self) -> dict[str, Any]:
        """See `Sampler.state_extras`: the priorities and the largest one (`tfbuffers.prioritized`)."""
        return self._priorities().state()

    def state_template(self, template: Any) -> Any:
        """See `Sampler.state_template`: the prioritized format, the priorities as extras."""
        return priorities_lib.state_template(template, self.batch_size * self.max_length)

    def check_extras(self, extras: dict[str, np.ndarray], source: str) -> None:
        """See `Sampler.check_extras`: finite priorities >= 0, and a max priority >= all of them."""
        priorities_lib.check_extras(extras, source)

    def read_guard(self, sample: Sample, leaves: list[Any], added: Any, num_steps: int | None) -> Any:
        """See `Sampler.read_guard`.

        An add gives its rows their priority in the same step as it writes them, before the counter moves: a
        draw by priority can find a row the counter does not count yet, while it is written. Its id is then at
        or past `added` frames (a ring not yet full; in a full one it names the frame being overwritten, which
        the overlap check catches): read again.
        """
        guard = super().read_guard(sample, leaves, added, num_steps)
        return tf.reduce_max(sample.ids) < added * self.batch_size if guard is None else guard

    @property
    def max_priority(self) -> float:
        """The priority new frames get: the largest given so far (1.0 after a clear). Host only."""
        return float(self._priorities().largest)

    def raise_max_priority(self, priority: float) -> None:
        """New frames get `priority` from now on if it is larger than `max_priority`. Host only."""
        self._priorities().raise_largest(float(priority))

    def close(self) -> None:
        """See `Sampler.close`: the priorities let go too."""
        super().close()
        if self.priorities is not None:
            self.priorities.close()

    def sample(self, backend: Backend, added: Any, sample_batch_size: int | None, num_steps: int | None) -> Sample:
        """See `Sampler.sample`. Also fails if every window that can be drawn has priority 0."""
        shape = [] if sample_batch_size is None else [sample_batch_size]
        _, windows, checks = self.stored_windows(backend, added, num_steps)
        tree, capacity = self._tree(), self.batch_size * self.max_length
        newest = backend.ops.minimum((num_steps or 1) - 1, added)  # adds whose windows would run past the newest
        masked_rows = _ring.block_start(added - newest, self.max_length, self.batch_size)
        kernels = None if backend is TENSORFLOW or self._episodes_apply(num_steps) else _sum_tree.compiled()
        if kernels is not None:
            return self._sample_compiled(kernels, backend, tree, added, shape, num_steps, masked_rows, newest)
        leaf_mask = (
            None
            if (num_steps or 1) == 1
            else _sum_tree.mask(backend.tree, tree, capacity, masked_rows, newest * self.batch_size)
        )
        total, positive = _sum_tree.unmasked_total(backend.tree, tree, leaf_mask)
        no_priority = NO_PRIORITY.format(buffer=self.buffer_name)
        if self._episodes_apply(num_steps):
            totals = (total, positive, leaf_mask)
            return self._sample_episodes(backend, added, shape, num_steps or 1, checks, windows, totals)
        if backend is not TENSORFLOW:
            backend.require(positive > 0, no_priority)
        if leaf_mask is not None and backend is TENSORFLOW and not _xla.compiling():  # XLA: no redraws of k rows
            rows = self._draw_outside(backend, tree, shape, checks, total, leaf_mask)
        else:
            rows = self._draw(backend, tree, shape, checks, total, leaf_mask)
        weights = backend.tree.nodes(tree, _sum_tree.leaf_count(capacity) + rows)[..., _sum_tree.SUM]
        ids, rows = self._windows_from(backend, rows, added, num_steps)
        return Sample(ids, rows, backend.float32(weights / total), positive > 0, no_priority, total)

    def _sample_compiled(
        self,
        kernels: Any,
        backend: Backend,
        tree: np.ndarray,
        added: Any,
        shape: list[int],
        num_steps: int | None,
        masked_rows: Any,
        newest: Any,
    ) -> Sample:
        """`sample` on the host in two compiled calls (`tfbuffers.sampling._tree_kernels`), the same draws.

        The same uniforms in the same order as the numpy steps (`_sum_tree.draw_numpy`), the same descent, the
        same windows: the mask's totals, then every descent with its weight, window ids and rows in one call.
        Draws that land in the mask (the newest adds: seldom) are drawn again as `draw_numpy` does.
        """
        capacity, levels = self.batch_size * self.max_length, _sum_tree.depth(self.batch_size * self.max_length)
        start, length = int(masked_rows), int(newest) * self.batch_size
        masked_sum, masked_positive = kernels.masked_totals(tree, levels, start, length, capacity)
        total, positive = tree[1, _sum_tree.SUM] - masked_sum, tree[1, _sum_tree.POSITIVE] - masked_positive
        no_priority = NO_PRIORITY.format(buffer=self.buffer_name)
        backend.require(positive > 0, no_priority)
        count, steps = (shape[0] if shape else 1), num_steps or 1

        def uniforms(size: int) -> np.ndarray:
            return backend.uniform_floats([size], [])

        targets = uniforms(count) * tree[1, _sum_tree.SUM]
        leaves, weights = np.empty(count, np.int64), np.empty(count)
        ids, rows = np.empty([count, steps], np.int64), np.empty([count, steps], np.int64)
        first_add = int(_ring.oldest_add(backend.ops, added, self.max_length))
        sizes = (first_add, self.max_length, self.batch_size)
        if kernels.draw_windows(tree, levels, targets, start, length, *sizes, leaves, weights, ids, rows):
            leaf_mask = _sum_tree.mask(backend.tree, tree, capacity, masked_rows, length)
            _sum_tree.redraw_masked(tree, capacity, uniforms, leaves, leaf_mask)
            leaves = np.minimum(leaves, capacity - 1)
            weights = tree[_sum_tree.leaf_count(capacity) + leaves, _sum_tree.SUM]
            ids, rows = self._windows_from(backend, leaves, added, steps)
        outer = shape + ([] if num_steps is None else [num_steps])
        probabilities = np.asarray(weights.reshape(shape) / total, np.float32)
        return Sample(ids.reshape(outer), rows.reshape(outer), probabilities, positive > 0, no_priority, total)

    def update_stored(self, backend: Backend, ids: np.ndarray, priorities: np.ndarray, added: Any) -> Any:
        """Host: `update_priorities` of checked `ids` and `priorities` (`priorities.check_update`); the ids skipped.

        The frames still stored get their priorities (an id given twice takes its last); in one compiled call
        where it applies (numba, no record of episode ends), else by `priorities.stored_updates` and
        `on_update_priorities`.
        """
        kernels = _sum_tree.compiled() if self._episode_record is None else None
        if kernels is None:
            rows, values, skipped = priorities_lib.stored_updates(
                backend, ids, priorities, added, self.max_length, self.batch_size
            )
            self.on_update_priorities(rows, values)
            return skipped
        weights = priorities_lib.leaf_weights(priorities, self.priority_exponent)
        first_add = int(_ring.oldest_add(backend.ops, added, self.max_length))
        return self._priorities().update_stored(kernels, ids, priorities, weights, first_add)

    def _draw(
        self, backend: Backend, tree: Any, shape: list[int], checks: list[Any], total: Any, leaf_mask: Any
    ) -> Any:
        """Leaves drawn in proportion to their weights, none in `leaf_mask` (a descent that leaves it out)."""
        capacity = self.batch_size * self.max_length
        # Within the leaves even on a torn read (a concurrent clear or update), which is then read again.
        return backend.ops.minimum(backend.draw_leaves(tree, capacity, shape, checks, total, leaf_mask), capacity - 1)

    def _draw_from_whole_tree(
        self, backend: Backend, tree: Any, root: Any, count: Any, checks: list[Any], leaf_mask: _sum_tree.Mask
    ) -> tuple[Any, Any]:
        """`count` leaves drawn over the whole tree (its sum: `root`), and which lie outside `leaf_mask`.

        In TensorFlow a descent that leaves a mask out runs about 2.4 times the ops of a plain one (each
        level subtracts the masked sums below both children): a plain descent of a few more draws, less
        those that land in the mask, costs less. The draws kept follow the unmasked leaves' weights exactly.
        """
        rows = self._draw(backend, tree, [count], checks, root, None)
        return rows, (rows - leaf_mask.start) % leaf_mask.capacity >= leaf_mask.length

    def _draw_outside(
        self, backend: Backend, tree: Any, shape: list[int], checks: list[Any], total: Any, leaf_mask: _sum_tree.Mask
    ) -> tf.Tensor:
        """As `_draw`, in TensorFlow, by rejection (as `_sum_tree.draw_numpy`).

        Draws over the whole tree; those in the mask are drawn again once, and any still there by the descent
        that leaves the mask out. Each draw kept follows the unmasked leaves' weights exactly. The mask (the
        newest adds) seldom holds much weight: the redraws, behind a `tf.cond`, rarely run.
        """
        capacity = self.batch_size * self.max_length
        root = backend.tree.nodes(tree, 1)[_sum_tree.SUM]
        with tf.control_dependencies(checks):
            # Every uniform drawn here, not in the cond's branches: a branch's random op may get the same seed
            # as one outside it (under tf.random.set_seed) and repeat its numbers.
            uniforms = tf.random.uniform([3, shape[0] if shape else 1], dtype=tf.float64)  # draws, redraws, exact ones

        def find(targets: tf.Tensor, mask: _sum_tree.Mask | None = None) -> tf.Tensor:
            if mask is None:
                found = _sum_tree.find_wide(tree, capacity, targets)
            else:
                found = _sum_tree.find(_sum_tree.TENSORFLOW, tree, capacity, targets, mask)
            return tf.minimum(found, capacity - 1)  # within the leaves even on a torn read, then read again

        def outside(rows: tf.Tensor) -> tf.Tensor:
            return (rows - leaf_mask.start) % capacity >= leaf_mask.length

        rows = find(uniforms[0] * root)

        def redraw() -> tf.Tensor:
            masked = tf.where(tf.logical_not(outside(rows)))  # [k, 1]
            again = find(tf.gather_nd(uniforms[1], masked) * root)
            kept = outside(again)
            exact = tf.cond(
                tf.reduce_all(kept), lambda: again, lambda: find(tf.gather_nd(uniforms[2], masked) * total, leaf_mask)
            )
            return tf.tensor_scatter_nd_update(rows, masked, tf.where(kept, again, exact))

        return tf.reshape(tf.cond(tf.reduce_all(outside(rows)), lambda: rows, redraw), shape)

    def _sample_episodes(
        self,
        backend: Backend,
        added: Any,
        shape: list[int],
        steps: int,
        checks: list[Any],
        windows: Any,
        totals: tuple[Any, Any, Any],
    ) -> Sample:
        tree, capacity = self._tree(), self.batch_size * self.max_length
        leaves, wanted = _sum_tree.leaf_count(capacity), shape[0] if shape else 1
        no_window, no_priority = self._no_window(steps), NO_PRIORITY.format(buffer=self.buffer_name)

        def in_one_pass() -> tuple[Any, ...]:
            valid = self._valid_starts(backend, added, steps)
            weights = backend.tree.flat(tree)[leaves : leaves + capacity, _sum_tree.SUM] * backend.cast(
                valid, np.float64
            )
            running = backend.cumsum(weights)
            counts = backend.sum(backend.cast(valid, np.int64)), backend.sum(backend.cast(weights > 0, np.float64))
            if backend is not TENSORFLOW:
                backend.require(counts[0] > 0, no_window)
                backend.require(counts[1] > 0, no_priority)
            last = backend.sum(backend.cast(running < running[-1], np.int64))  # the last row weighing above 0
            targets = backend.uniform_floats([wanted], checks) * running[-1]
            first_rows = backend.ops.minimum(backend.searchsorted(running, targets), last)
            return first_rows, backend.tree.gather(weights, first_rows) / running[-1], *counts, running[-1]

        record = self._record(steps)
        if record is None:
            first_rows, probabilities, window_count, within_positive, mass = in_one_pass()
        else:
            total, positive, leaf_mask = totals
            weights = lambda rows: _episodes.columns(backend.tree.nodes(tree, leaves + rows)[:, _sum_tree.SUM])  # noqa: E731
            crossing = self._crossing(backend, record, added, steps, weights)
            window_count = windows - backend.cast(crossing[_episodes.COUNT], np.int64)
            within_total, within_positive = total - crossing[_episodes.WEIGHT], positive - crossing[_episodes.POSITIVE]
            if backend is not TENSORFLOW:
                backend.require(window_count > 0, no_window)
                backend.require(within_positive > 0, no_priority)
            if backend is TENSORFLOW:  # drawn over the whole tree, masked leaves then left out (`_draw_outside`)
                root = backend.tree.nodes(tree, 1)[_sum_tree.SUM]
                draws = self._draw_count(backend, wanted, within_total / backend.tree.maximum(root, 1e-300))
                candidates, outside = self._draw_from_whole_tree(backend, tree, root, draws, checks, leaf_mask)
                kept = self._kept_draws(backend, record, candidates, steps) & outside
            else:
                draws = self._draw_count(backend, wanted, within_total / backend.tree.maximum(total, 1e-300))
                candidates = self._draw(backend, tree, [draws], checks, total, leaf_mask)
                kept = self._kept_draws(backend, record, candidates, steps)
            chosen = backend.boolean_mask(candidates, kept)

            def from_draws() -> tuple[Any, Any, Any]:
                rows = chosen[:wanted]
                return rows, backend.tree.nodes(tree, leaves + rows)[:, _sum_tree.SUM] / within_total, within_total

            def passed() -> tuple[Any, Any, Any]:
                first_rows, probabilities, _, _, mass = in_one_pass()
                return first_rows, probabilities, mass

            enough = backend.sum(backend.cast(kept, np.int64)) >= wanted
            first_rows, probabilities, mass = choose(backend, enough, from_draws, passed)
        ids, rows = self._windows_from(backend, backend.reshape(first_rows, shape), added, steps)
        valid = (window_count > 0) & (within_positive > 0)
        message = backend.select(window_count > 0, no_priority, no_window)
        return Sample(ids, rows, backend.float32(backend.reshape(probabilities, shape)), valid, message, mass)
