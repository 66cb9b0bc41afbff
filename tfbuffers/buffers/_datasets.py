"""A segmented buffer's datasets: sampled, the single deterministic pass and shuffled epochs.

A part of the buffer (`SegmentedDatasets`): it builds the `tf.data` pipelines from the
buffer's reads as tensors (`Reads`, the buffer's methods held weakly, asked for each time
a dataset is made), and nothing else of the buffer. The buffer checks the arguments and
makes every dataset hold it (`tfbuffers.replay_buffer.keep_alive`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from tfbuffers import _ring
from tfbuffers.replay_buffer import BufferInfo

# The options of a dataset whose elements are read when `next` asks, by the caller's thread (a `prefetch` or
# `num_parallel_calls` the user asks for reads ahead, as the user chose):
# - tf.data would otherwise run a last, stateless map in parallel and prefetch after it (the TF buffer's
#   sampled datasets end with one): elements read before `next` asks, holding frames older than the buffer's;
# - its automatic prefetch would make a host buffer's elements in a thread of its own: an iterator dropped
#   while that thread waits for the GIL to run the host call (at the latest when the interpreter exits,
#   holding the GIL while it frees the iterator, which waits for the thread) never finishes, and the program
#   hangs at exit. TF-Agents' py buffer does (tests/project/hygiene_test.py).
READ_WHEN_ASKED = tf.data.Options()
READ_WHEN_ASKED.experimental_optimization.map_parallelization = False
READ_WHEN_ASKED.experimental_optimization.inject_prefetch = False


class Reads(NamedTuple):
    """A buffer's reads as tensors, which its datasets' functions call (inside `tf.data`'s graphs)."""

    added: Callable[[], tf.Tensor]
    """The add counter, a scalar int64 tensor."""
    gather: Callable[..., list[tf.Tensor]]
    """`(ids, fields=None) -> leaves`: the frames `ids` (stored ids), each leaf `ids.shape + spec.shape`."""
    sample: Callable[[int | None, int | None], tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]]
    """`(sample_batch_size, num_steps) -> (leaves, ids, probabilities)`: a draw of the buffer's sampler."""
    pack: Callable[[Sequence[tf.Tensor]], Any]
    """Leaves as the data spec's nest, in a dataset's form (lists as tuples)."""
    sampler: Any
    """The buffer's `tfbuffers.sampling.Sampler`: which windows the datasets that draw nothing yield (`pass_ids`,
    `narrows_windows`, `keeps_windows`)."""
    attempt: Callable[[int | None, int | None], tuple[tf.Tensor, list[tf.Tensor], tf.Tensor, tf.Tensor]] | None = None
    """A draw that may be torn by a concurrent write, `(whole, leaves, ids, probabilities)`: a sampled dataset
    then drops a torn element and draws the next (the TF buffer, see `tfbuffers.execution._tf_concurrency`). None:
    `sample` never tears (it reads under a lock)."""


class SegmentedDatasets:
    """The datasets of a buffer of `batch_size` segments of `max_length` frames (`tfbuffers._ring`)."""

    def __init__(
        self,
        reads: Callable[[], Reads],
        *,
        batch_size: int,
        max_length: int,
        window_shift: int | None,
        drop_remainder: bool,
        host_reads: bool,
    ) -> None:
        """The datasets of a buffer with these reads and options.

        Args:
          reads: Gives the buffer's reads as tensors, when a dataset is made (its methods as they are then).
          batch_size: Segments.
          max_length: Frames per segment.
          window_shift: The buffer's `dataset_window_shift` (the deterministic pass).
          drop_remainder: The buffer's `dataset_drop_remainder` (the deterministic pass).
          host_reads: Whether the reads are host calls: then every dataset reads when asked
            (`READ_WHEN_ASKED`), not the sampled ones only.
        """
        self._reads = reads
        self._batch_size = batch_size
        self._max_length = max_length
        self._window_shift = window_shift
        self._drop_remainder = drop_remainder
        self._host_reads = host_reads

    def sampled(
        self, sample_batch_size: int | None, num_steps: int | None, num_parallel_calls: int | None
    ) -> tf.data.Dataset:
        """Endless draws, each element read when `next` asks (`READ_WHEN_ASKED`)."""
        reads = self._reads()
        if reads.attempt is not None:
            attempt = reads.attempt

            # An element is one read; a torn one (a write overlapped it) is dropped and the next one drawn, as
            # a retry would: no loop in the element's function.
            @tf.autograph.experimental.do_not_convert
            def attempted(_: tf.Tensor) -> tuple[tf.Tensor, Any, BufferInfo]:
                whole, leaves, ids, probabilities = attempt(sample_batch_size, num_steps)
                return whole, reads.pack(leaves), BufferInfo(ids, probabilities)

            attempts = tf.data.Dataset.counter().map(attempted, num_parallel_calls=num_parallel_calls)
            return attempts.filter(_whole).map(_read).with_options(READ_WHEN_ASKED)

        @tf.autograph.experimental.do_not_convert
        def sample(_: tf.Tensor) -> tuple[Any, BufferInfo]:
            leaves, ids, probabilities = reads.sample(sample_batch_size, num_steps)
            return reads.pack(leaves), BufferInfo(ids, probabilities)

        dataset = tf.data.Dataset.counter().map(sample, num_parallel_calls=num_parallel_calls)
        return dataset.with_options(READ_WHEN_ASKED)

    def deterministic_pass(
        self, sample_batch_size: int | None, num_steps: int | None, num_parallel_calls: int | None
    ) -> tf.data.Dataset:
        """The single deterministic pass: the windows the sampler's `pass_ids` gives, in its order, read."""
        reads = self._reads()
        ids = reads.sampler.pass_ids(
            reads.added,
            reads.gather,
            sample_batch_size,
            num_steps,
            window_shift=self._window_shift,
            drop_remainder=self._drop_remainder,
        )

        @tf.autograph.experimental.do_not_convert
        def gather(frame_ids: tf.Tensor) -> tuple[Any, BufferInfo]:
            return reads.pack(reads.gather(frame_ids)), BufferInfo(frame_ids, ())

        dataset = ids.map(gather, num_parallel_calls=num_parallel_calls)
        return dataset.with_options(READ_WHEN_ASKED) if self._host_reads else dataset

    def epoch(
        self,
        sample_batch_size: int,
        num_steps: int | None,
        *,
        drop_remainder: bool,
        seed: int | None,
        num_parallel_calls: int | None,
    ) -> tf.data.Dataset:
        """One shuffled epoch of every stored window the sampler keeps (`epoch_dataset`, arguments checked).

        Read when asked for a host buffer (`READ_WHEN_ASKED`), as its other datasets are.
        """
        steps = num_steps or 1
        ops = _ring.TENSORFLOW
        reads = self._reads()
        sampler = reads.sampler
        narrowed = sampler.narrows_windows(steps)

        @tf.autograph.experimental.do_not_convert
        def windows(_: tf.Tensor) -> tf.data.Dataset:
            added = reads.added()
            first, count = _ring.stored_windows(ops, added, self._max_length, self._batch_size, steps)
            firsts = first + ops.arange(count)
            ids, _ = _ring.window_ids_and_rows(ops, firsts, self._max_length, self._batch_size, steps)
            if narrowed:
                ids = tf.boolean_mask(ids, sampler.keeps_windows(reads.gather, ids))
            return tf.data.Dataset.from_tensor_slices(ids)

        @tf.autograph.experimental.do_not_convert
        def gather(ids: tf.Tensor) -> tuple[Any, BufferInfo]:
            if num_steps is None:
                ids = ids[:, 0]
            return reads.pack(reads.gather(ids)), BufferInfo(ids, ())

        # A shuffle buffer as large as the buffer's capacity holds every window: a uniform permutation. It
        # fills as far as the windows go (8 bytes per frame and step).
        ids = (
            tf.data.Dataset.range(1)
            .flat_map(windows)
            .shuffle(self._batch_size * self._max_length, seed=seed)
            .batch(sample_batch_size, drop_remainder=drop_remainder)
        )
        dataset = ids.map(gather, num_parallel_calls=num_parallel_calls)
        return dataset.with_options(READ_WHEN_ASKED) if self._host_reads else dataset

    def full_batches_per_epoch(self, sample_batch_size: int, num_steps: int | None) -> int:
        """How many full batches `epoch` yields now (eager only, arguments checked)."""
        steps = num_steps or 1
        reads = self._reads()
        added = int(reads.added())
        per_segment = int(_ring.frames_per_segment(_ring.NUMPY, added, self._max_length))
        if reads.sampler.narrows_windows(steps) and per_segment >= steps:
            # Every stored window, oldest first, as [batch_size, windows per segment, steps].
            ids = _ring.chronological_ids(_ring.NUMPY, added, self._max_length, self._batch_size)
            windows = np.lib.stride_tricks.sliding_window_view(ids, steps, axis=1)
            kept = reads.sampler.keeps_windows(reads.gather, tf.constant(windows))
            return int(np.count_nonzero(np.asarray(kept))) // sample_batch_size
        return max(per_segment - steps + 1, 0) * self._batch_size // sample_batch_size


@tf.autograph.experimental.do_not_convert
def _whole(whole: tf.Tensor, items: Any, info: BufferInfo) -> tf.Tensor:
    return whole


@tf.autograph.experimental.do_not_convert
def _read(whole: tf.Tensor, items: Any, info: BufferInfo) -> tuple[Any, BufferInfo]:
    return items, info
