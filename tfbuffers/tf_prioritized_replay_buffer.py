"""`TFPrioritizedReplayBuffer`: the in-graph buffer, sampled in proportion to priorities."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import tensorflow as tf

from tfbuffers import _ring, _xla, prioritized, sampling
from tfbuffers._arguments import explained
from tfbuffers.storage import GraphStorageFactory
from tfbuffers.tf_uniform_replay_buffer import TFUniformReplayBuffer

GRAPH_NOT_A_PRIORITY = "priorities: expected finite values >= 0, got (value, index):"
GRAPH_NEVER_STORED = "ids: expected ids of frames stored since the last clear (0 <= id < next id), got (id, next id):"


class TFPrioritizedReplayBuffer(TFUniformReplayBuffer):
    """`TFUniformReplayBuffer` whose samples are drawn in proportion to priorities, in the graph.

    Windows are drawn as `tfbuffers.prioritized` says (by their first frame's
    `priority ** priority_exponent`, among the windows a uniform buffer could draw;
    new frames get the largest priority given so far); `BufferInfo.probabilities`
    are the probabilities of the draws (see Threads below).

    The priorities live in a sum tree of `tf.Variable`s beside the rows
    (`tfbuffers.sampling._sum_tree`): a sample of `n` windows and an update of `n`
    priorities each cost `log2(capacity)` vectorised steps, no loop per sample,
    inside `tf.function`, `tf.while_loop` and `tf.data` alike. Everything else is
    the uniform buffer's: `add_batch`, `gather_all`, `clear`, the deterministic
    pass (it ignores priorities), checkpoints and `tfbuffers.files` (both save
    the priorities too, and restore them exactly; a py prioritized buffer's
    state restores here and back).

    Threads: `update_priorities` is a writer like `add_batch` (eager callers take
    turns; a second writer inside a graph is refused). Samples never return a
    torn frame; a sample overlapping an update reads again, so its probabilities
    are exact. A sample overlapping an add may compute its probabilities from a
    total that includes part of that add's new priorities (an error of at most
    the new frames' share); the frames it returns are whole and stored.

    Example:
    >>> spec = tf.TensorSpec([], tf.int32)
    >>> buffer = TFPrioritizedReplayBuffer(spec, batch_size=1, max_length=4, priority_exponent=1.0)
    >>> for value in (10, 11, 12, 13):
    ...     _ = buffer.add_batch(tf.constant([value]))
    >>> int(buffer.update_priorities(tf.constant([0, 1, 2, 3]), tf.constant([0.0, 1.0, 3.0, 0.0])))
    0
    >>> items, info = buffer.get_next(sample_batch_size=100)
    >>> sorted(set(items.numpy().tolist())), sorted(set(info.probabilities.numpy().tolist()))
    ([11, 12], [0.25, 0.75])
    """

    _PRIORITIZED = True

    @explained
    def __init__(
        self,
        data_spec: Any,
        batch_size: int,
        max_length: int = 1000,
        priority_exponent: float = 0.6,
        scope: str = "TFPrioritizedReplayBuffer",
        device: str = "cpu:*",
        dataset_drop_remainder: bool = False,
        dataset_window_shift: int | None = None,
        stateful_dataset: bool = False,
        *,
        episode_boundaries: bool | str = False,
        wait_for_writers: bool = True,
        storage: GraphStorageFactory | None = None,
    ) -> None:
        """Creates the buffer and its variables: `TFUniformReplayBuffer` with a `PrioritizedSampler`.

        Every argument is `TFUniformReplayBuffer`'s but `sampler` (the sampler draws by priority), in its
        place, under its name and default but for `scope` and `wait_for_writers`.

        Args:
          data_spec: As in `TFUniformReplayBuffer`.
          batch_size: As in `TFUniformReplayBuffer`.
          max_length: As in `TFUniformReplayBuffer`.
          priority_exponent: Alpha: how strongly priorities skew the draws (0: uniform over frames of
            priority above 0, 1: proportional).
          scope: As in `TFUniformReplayBuffer`.
          device: As in `TFUniformReplayBuffer`.
          dataset_drop_remainder: As in `TFUniformReplayBuffer`.
          dataset_window_shift: As in `TFUniformReplayBuffer`.
          stateful_dataset: As in `TFUniformReplayBuffer`.
          episode_boundaries: As in `TFUniformReplayBuffer`.
          wait_for_writers: On by default here: a learner's `update_priorities` inside a `tf.function`
            is a second graph writer beside a driver's adds, and waits its turn (as the adds wait for it).
          storage: As in `TFUniformReplayBuffer`.

        Raises:
          TypeError, ValueError: As `TFUniformReplayBuffer`, and for a `priority_exponent`
            that is not a finite number >= 0.
        """
        sampler = sampling.PrioritizedSampler.factory(priority_exponent)  # checked first
        uniform_options = (dataset_drop_remainder, dataset_window_shift, stateful_dataset)
        super().__init__(
            data_spec,
            batch_size,
            max_length,
            scope,
            device,
            *uniform_options,
            episode_boundaries=episode_boundaries,
            wait_for_writers=wait_for_writers,
            sampler=sampler,
            storage=storage,
        )

    @property
    def priority_exponent(self) -> float:
        """Alpha: draws are proportional to `priority ** priority_exponent` (its sampler's)."""
        return self.sampler.priority_exponent  # type: ignore[attr-defined]

    def update_priorities(self, ids: Any, priorities: Any) -> tf.Tensor:
        """Sets the priorities of the frames `ids` (as `BufferInfo.ids` returns them).

        Works eagerly and inside `tf.function`. Windows are drawn by their first
        frame's priority, so pass the first id of each window (`info.ids[:, 0]` for
        `num_steps` windows). An id given twice takes its last priority. An id whose
        frame was overwritten since it was sampled (normal when collecting while
        training) is skipped, not an error; the return value says how many were.

        Args:
          ids: Integer frame ids, any shape.
          priorities: One priority per id, finite and >= 0, the same shape.

        Returns:
          An int64 scalar tensor: how many ids were skipped because their frames
          are no longer stored. Inside `tf.function(jit_compile=True)`, where XLA
          runs no check that fails, -1 says the update was refused (a priority
          negative or not finite, or an id never stored) and no priority
          changed (`tfbuffers._xla`).

        Raises:
          TypeError: If `ids` are not integers.
          ValueError: (eagerly, or `InvalidArgumentError` when a graph runs) If the
            shapes differ, a priority is negative, NaN or infinite, or an id was never
            stored (at or past the next id, or negative). Nothing is changed then.
        """
        self._check_open()
        ids = tf.convert_to_tensor(ids)
        if not ids.dtype.is_integer:
            raise TypeError(prioritized.NOT_AN_ID.format(dtype=ids.dtype.name))
        priorities = tf.cast(tf.convert_to_tensor(priorities), tf.float64)
        if ids.shape.is_fully_defined() and priorities.shape.is_fully_defined() and ids.shape != priorities.shape:
            raise ValueError(
                prioritized.SHAPES_DIFFER.format(expected=ids.shape.as_list(), received=priorities.shape.as_list())
            )
        ids = tf.cast(ids, tf.int64)
        if tf.executing_eagerly():
            with self._concurrency.eager_lock:
                # Exact messages first; the graph checks them again, and a clear racing from a graph is handled there.
                prioritized.check_update(ids.numpy(), priorities.numpy(), int(self._added.numpy()) * self._batch_size)
                return self._calls.compiled(self._update_tensors)(ids, priorities)
        return self._update_tensors(ids, priorities)

    def _update_tensors(self, ids: tf.Tensor, priorities: tf.Tensor) -> tf.Tensor:
        with tf.device(self._device), tf.name_scope(self._scope):
            same_shape = tf.debugging.assert_equal(
                tf.shape(ids), tf.shape(priorities), message="priorities: expected the shape of ids"
            )
            with tf.control_dependencies([same_shape]):
                ids, priorities = tf.reshape(ids, [-1]), tf.reshape(priorities, [-1])
            bad = tf.math.logical_not(tf.math.is_finite(priorities) & (priorities >= 0))
            first_bad = tf.argmax(tf.cast(bad, tf.int32), output_type=tf.int64)
            valid_priorities = tf.debugging.Assert(
                tf.logical_not(tf.reduce_any(bad)),
                [GRAPH_NOT_A_PRIORITY, tf.gather(priorities, first_bad), first_bad],
            )
            # Ids only grow between here and the lock (a clear racing from a graph is filtered inside it).
            next_id = self._added.read_value() * self._batch_size
            never = (ids < 0) | (ids >= next_id)
            first_never = tf.argmax(tf.cast(never, tf.int32), output_type=tf.int64)
            stored_before = tf.debugging.Assert(
                tf.logical_not(tf.reduce_any(never)), [GRAPH_NEVER_STORED, tf.gather(ids, first_never), next_id]
            )

            refused = tf.reduce_any(bad) | tf.reduce_any(never)  # what the assertions check (XLA runs none)

            def write() -> tuple[list[Any], tf.Tensor]:
                added = self._added.read_value()
                if _xla.compiling():
                    write_all, skipped = _compiled_update(self, ids, priorities, added, refused)
                    return self._concurrency.rewrite(write_all), skipped
                rows, values, skipped = prioritized.stored_updates(
                    sampling.TENSORFLOW, ids, priorities, added, self._max_length, self._batch_size
                )
                return self._concurrency.rewrite(lambda: self._sampler.on_update_priorities(rows, values)), skipped

            return self._concurrency.exclusive(
                [same_shape, valid_priorities, stored_before, ids, priorities], write, "update_priorities"
            )


def _compiled_update(
    buffer: TFUniformReplayBuffer, ids: tf.Tensor, priorities: tf.Tensor, added: tf.Tensor, refused: tf.Tensor
) -> tuple[Callable[[], list[Any]], tf.Tensor]:
    """`update_priorities`' write in an XLA program (`tfbuffers._xla`): one id at a time, of static shapes.

    XLA compiles neither the plain write's selection of the ids still stored (a data-dependent count) nor, on
    newer TensorFlow, its `tf.unique`; a loop over the ids gives each its row's update in order, so an id given
    twice takes its last priority, and an id overwritten since (or every id of a refused update) writes its
    row's own priority back, read in that step: nothing changes for it.
    """
    sampler = cast(sampling.PrioritizedSampler, buffer.sampler)
    stored = sampler.priorities
    assert stored is not None  # bound when the buffer was made
    rows = _ring.rows_of_ids(ids, buffer.max_length, buffer.batch_size)
    kept = _ring.ids_stored(_ring.TENSORFLOW, ids, added, buffer.max_length, buffer.batch_size)
    kept = kept & tf.logical_not(refused)
    count = tf.size(ids)

    def update_one(i: tf.Tensor) -> tf.Tensor:
        row = tf.reshape(tf.gather(rows, i), [1])  # of static shape [1] (a slice at `i` would be dynamic to XLA)
        own = tf.cast(tf.gather(stored.values, row), priorities.dtype)
        value = tf.where(tf.reshape(tf.gather(kept, i), [1]), tf.reshape(tf.gather(priorities, i), [1]), own)
        with tf.control_dependencies(sampler.on_update_priorities(row, value)):
            return i + 1

    def write_all() -> list[Any]:
        return [tf.while_loop(lambda i: i < count, update_one, [tf.constant(0)])]

    skipped = tf.cast(count, tf.int64) - tf.reduce_sum(tf.cast(kept, tf.int64))
    return write_all, tf.where(refused, tf.constant(_xla.INVALID_ID, tf.int64), skipped)
