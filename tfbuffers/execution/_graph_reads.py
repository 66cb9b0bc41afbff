"""A TF buffer's reads: samples, gathers and whole reads of its storage, checked against concurrent writers.

Reads take no lock: each is checked by the seqlock of `tfbuffers.execution._tf_concurrency` (a read an add overlapped is
made again, or, for a dataset's element, dropped), and a draw whose sampler state an add changed before the
counter moved is read again too (`tfbuffers.sampling.Sampler.read_guard`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from tfbuffers import _ring, _xla, sampling
from tfbuffers.execution._tf_concurrency import Concurrency
from tfbuffers.replay_buffer import FRAMES_GONE
from tfbuffers.storage import GraphStorage

_OPS = _ring.TENSORFLOW


class GraphReads:
    """The reads of a TF buffer's `storage`, drawn by its `sampler`, checked by its `concurrency`."""

    def __init__(
        self,
        storage: GraphStorage,
        concurrency: Concurrency,
        sampler: sampling.Sampler,
        sizes: tuple[int, int],
        placement: tuple[str, str],
    ) -> None:
        """Reads of `storage` (`sizes`: batch_size, max_length), their ops placed at `(device, name scope)`."""
        self._storage = storage
        self._added = storage.added
        self._concurrency = concurrency
        self._sampler = sampler
        self._batch_size, self._max_length = sizes
        self._device, self._scope = placement

    def _rows(self, ids: tf.Tensor) -> tf.Tensor:
        return _ring.rows_of_ids(ids, self._max_length, self._batch_size)

    def gather(self, ids: tf.Tensor, fields: Sequence[int] | None = None) -> list[tf.Tensor]:
        """The leaves of the frames `ids` (of `fields` when given); fails if one is gone or overwritten meanwhile."""
        with tf.device(self._device), tf.name_scope(self._scope):
            # Planned ids must still be stored, and not overwritten while they were read.
            stored = _ring.are_stored(_OPS, ids, self._added.read_value(), self._max_length, self._batch_size)
            with tf.control_dependencies([tf.debugging.Assert(stored, [FRAMES_GONE])]):
                leaves = self._storage.read(self._rows(ids), fields)
            with tf.control_dependencies(leaves):
                writing = self._concurrency.writing()
            with tf.control_dependencies([writing]):
                added = self._added.read_value()
            oldest_whole = added + writing - self._max_length
            whole = tf.reduce_min(ids) // self._batch_size >= oldest_whole
            with tf.control_dependencies([tf.debugging.Assert(whole, [FRAMES_GONE])]):
                return [tf.identity(leaf) for leaf in leaves]

    def gather_all(self) -> list[tf.Tensor]:
        """Every stored frame, `[batch_size, frames per segment, ...]` per leaf, of one moment."""
        with tf.device(self._device), tf.name_scope(self._scope):

            def gather_all() -> tuple[list[tf.Tensor], tf.Tensor]:
                added = self._added.read_value()
                ids = _ring.chronological_ids(_OPS, added, self._max_length, self._batch_size)
                return self._storage.read(self._rows(ids)), _ring.oldest_add(_OPS, added, self._max_length)

            return self._concurrency.read_whole(gather_all, self._added, self._max_length)

    def sample(
        self, sample_batch_size: int | None, num_steps: int | None
    ) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]:
        """A sample by the sampler, as tensors: (leaves, ids, probabilities); a torn read is read again."""
        with tf.device(self._device), tf.name_scope(self._scope):
            if _xla.compiling():
                return self._compiled_sample(sample_batch_size, num_steps)
            draw, checked = self.draw(sample_batch_size, num_steps)
            outputs = self._concurrency.read_whole(draw, self._added, self._max_length)
            if checked[0]:  # asserted on a whole read only: a torn one was read again
                with tf.control_dependencies([tf.debugging.Assert(outputs[-2], [outputs[-1]])]):
                    outputs = [tf.identity(output) for output in outputs[:-2]]
            return outputs[:-2], outputs[-2], outputs[-1]

    def _compiled_sample(
        self, sample_batch_size: int | None, num_steps: int | None
    ) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]:
        """`sample` in an XLA program (`tfbuffers._xla`): one read, a refused or torn one blank.

        The program holds the variables' locks, so a read again would read the same; a sample the graph would
        refuse, or torn by another thread's writer, returns ids `INVALID_ID`, probabilities 0 and zero items.
        """
        draw, _ = self.draw(sample_batch_size, num_steps, compiled=True)
        whole, outputs = self._concurrency.checked_read(draw, self._added, self._max_length)
        valid = tf.logical_and(whole, outputs[-1])
        leaves, ids, probabilities = outputs[:-3], outputs[-3], outputs[-2]
        return (
            [tf.where(valid, leaf, tf.zeros_like(leaf)) for leaf in leaves],
            tf.where(valid, ids, tf.constant(_xla.INVALID_ID, ids.dtype)),
            tf.where(valid, probabilities, tf.zeros_like(probabilities)),
        )

    def attempt(
        self, sample_batch_size: int | None, num_steps: int | None
    ) -> tuple[tf.Tensor, list[tf.Tensor], tf.Tensor, tf.Tensor]:
        """One attempt of `sample`, not read again: whether it is whole, then what it read.

        What a dataset's element computes (see `tfbuffers.execution._tf_concurrency`): a torn one is dropped.
        """
        with tf.device(self._device), tf.name_scope(self._scope):
            draw, checked = self.draw(sample_batch_size, num_steps)
            whole, outputs = self._concurrency.checked_read(draw, self._added, self._max_length)
            if checked[0]:  # asserted on a whole read only
                valid = tf.debugging.Assert(outputs[-2] | tf.logical_not(whole), [outputs[-1]])
                with tf.control_dependencies([valid]):
                    whole = tf.identity(whole)
                outputs = outputs[:-2]
            return self._concurrency.count_torn(whole), outputs[:-2], outputs[-2], outputs[-1]

    def draw(
        self, sample_batch_size: int | None, num_steps: int | None, *, compiled: bool = False
    ) -> tuple[Callable[[], tuple[list[tf.Tensor], tf.Tensor]], list[bool]]:
        """A sample's read for the seqlock, and (once traced) whether its tensors end with validity.

        A uniform sample is always valid; a prioritized or episode-aware one says whether any window can be
        drawn, and its message why not (a tensor: it is computed inside the read). `compiled` (an XLA program,
        which runs no assertion): the tensors always end with one boolean, whether the sample is valid, the
        stored windows' checks included.
        """
        checked: list[bool] = []

        def draw() -> tuple[list[tf.Tensor], tf.Tensor]:
            added = self._added.read_value()
            with tf.control_dependencies([added]):  # what the sampler reads is at least as new
                sample = self._sampler.sample(sampling.TENSORFLOW, added, sample_batch_size, num_steps)
            leaves = self._storage.read(sample.rows)
            checked[:] = [sample.valid is not True]
            validity = [sample.valid, sample.invalid_message] if checked[0] else []
            if compiled:
                _, windows = _ring.stored_windows(_OPS, added, self._max_length, self._batch_size, num_steps or 1)
                validity = [tf.logical_and(windows > 0, sample.valid)]
            oldest = tf.reduce_min(sample.ids) // self._batch_size
            # What the sampler read of its state beside a concurrent add may be ahead of the counter: read again.
            whole: Any = self._sampler.read_guard(sample, leaves, added, num_steps)
            if whole is not None:
                whole = whole | tf.logical_not(sample.valid)
                oldest = tf.where(whole, oldest, tf.constant(-1 - self._max_length, tf.int64))
            return [*leaves, sample.ids, sample.probabilities, *map(tf.convert_to_tensor, validity)], oldest

        return draw, checked
