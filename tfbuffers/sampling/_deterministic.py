"""The frame ids of a single deterministic pass over a segmented ring, and of the windows it keeps.

Shared by every segmented buffer: the plan is built in `tf.data` from the add
counter read when iteration starts, so the same dataset sees the buffer as it is
each time it is iterated. Every window comes from one segment and is consecutive
in time (TF-Agents 0.19 lets windows spill into the next segment once a ring has
wrapped); with the default window shift every stored frame is visited once.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from tfbuffers import _ring

ALL_DATA_DROPPED = (
    "sample_batch_size: expected at most batch_size={batch_size} with dataset_drop_remainder=True, got "
    "{sample_batch_size}: no group of segments is full, so ALL data will be dropped by the deterministic pass"
)


def ids_dataset(
    read_added: Callable[[], tf.Tensor],
    *,
    max_length: int,
    batch_size: int,
    sample_batch_size: int | None,
    num_steps: int | None,
    window_shift: int | None,
    drop_remainder: bool,
) -> tf.data.Dataset:
    """A dataset of frame-id tensors, one per element of the pass.

    Segments are taken in groups of `sample_batch_size` (one at a time when it is
    None); for each group, windows of `num_steps` frames (one frame when None)
    start every `window_shift` frames (default: `num_steps`, so windows do not
    overlap), oldest first. Element shapes: `[group, window]`, dropping the
    group axis when `sample_batch_size` is None and the window axis when
    `num_steps` is None. Without `drop_remainder`, the last group of segments
    and the windows at a segment's end may be shorter; with it they are skipped
    and every element has the full static shape.

    Args:
      read_added: Returns the buffer's add counter as a scalar int64 tensor.
      max_length: Ring length of a segment.
      batch_size: Number of segments.
      sample_batch_size: Segments per element, or None.
      num_steps: Frames per window, or None.
      window_shift: Frames between window starts, or None for `num_steps`.
      drop_remainder: Skip partial groups and partial windows.

    Returns:
      A `tf.data.Dataset` of int64 frame ids.

    Raises:
      ValueError: If `drop_remainder` is set and `sample_batch_size > batch_size`.
    """
    if drop_remainder and sample_batch_size is not None and sample_batch_size > batch_size:
        raise ValueError(ALL_DATA_DROPPED.format(sample_batch_size=sample_batch_size, batch_size=batch_size))
    group = sample_batch_size or 1
    window = num_steps or 1
    shift = window_shift if (window_shift is not None and num_steps is not None) else window
    ops = _ring.TENSORFLOW

    @tf.autograph.experimental.do_not_convert
    def plan(_: tf.Tensor) -> tf.data.Dataset:
        added = tf.cast(read_added(), tf.int64)
        frames = _ring.frames_per_segment(ops, added, max_length)
        if drop_remainder:
            num_groups = tf.constant(batch_size // group, tf.int64)
            num_windows = tf.where(frames >= window, (frames - window) // shift + 1, 0)
        else:
            num_groups = tf.constant(-(-batch_size // group), tf.int64)
            num_windows = (frames + shift - 1) // shift
        state = tf.data.Dataset.from_tensors(tf.stack([added, num_windows])).repeat()
        return tf.data.Dataset.zip((tf.data.Dataset.range(num_groups * num_windows), state))

    @tf.autograph.experimental.do_not_convert
    def ids_of(index: tf.Tensor, state: tf.Tensor) -> tf.Tensor:
        added, num_windows = state[0], state[1]
        first_segment = (index // num_windows) * group
        segments = first_segment + ops.arange(ops.minimum(group, batch_size - first_segment))
        start = _ring.oldest_add(ops, added, max_length) + (index % num_windows) * shift
        adds = start + ops.arange(ops.minimum(window, added - start))
        ids = adds[None, :] * batch_size + segments[:, None]
        if drop_remainder:
            ids = tf.ensure_shape(ids, [group, window])
        if num_steps is None:
            ids = ids[:, 0]
        if sample_batch_size is None:
            ids = ids[0]
        return ids

    return tf.data.Dataset.range(1).flat_map(plan).map(ids_of)


def kept(
    ids: tf.data.Dataset, keeps: Callable[[tf.Tensor], tf.Tensor], sample_batch_size: int | None
) -> tf.data.Dataset:
    """The pass `ids` (windows `[..., num_steps]`) less the windows `keeps` says no to; empty elements skipped.

    `keeps(frame_ids)` gives a `[...]` bool tensor, one per window of an element.
    """
    if sample_batch_size is None:  # one window per element
        return ids.filter(tf.autograph.experimental.do_not_convert(keeps))

    @tf.autograph.experimental.do_not_convert
    def keep_within(frame_ids: tf.Tensor) -> tf.Tensor:
        return tf.boolean_mask(frame_ids, keeps(frame_ids))

    return ids.map(keep_within).filter(lambda frame_ids: tf.shape(frame_ids)[0] > 0)
