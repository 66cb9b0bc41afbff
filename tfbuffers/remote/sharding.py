"""`sharded_dataset`: several remote buffers (shards on other servers or actors) sampled through one dataset."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from tfbuffers.remote.base import RemoteReplayBuffer
from tfbuffers.replay_buffer import BufferInfo, positive_int


def sharded_dataset(
    buffers: Any,
    sample_batch_size: int,
    num_steps: int | None = None,
    *,
    weights: Any = None,
    num_parallel_calls: int | None = None,
    seed: int | None = None,
) -> tf.data.Dataset:
    """Samples several Reverb or Ray buffers (shards on other servers or actors) through one dataset.

    Each element of a batch comes from shard `i` with probability `weights[i]`
    (equal by default), then from that shard's table as its sampler draws.
    `BufferInfo.probabilities` are the probabilities of the draws in the mixture,
    `weights[i]` times the shard's, so importance weights stay exact. Sampling is
    uniform over all items when the weights are proportional to the shards' sizes,
    as when each shard is fed by the same number of actors. An item's key is its
    shard's; `update_priorities` on every shard with the same ids updates each item
    once, since a table ignores keys it does not hold. A `RayReplayBuffer`'s ids are its own
    (`add_number * batch_size + segment`): update each shard with the ids it gave. Several shards
    are mixed window by window from each shard's batched `as_dataset(sample_batch_size, num_steps)` (fetched
    a batch at a time, as one shard alone is sampled); one shard is its own batched dataset.

    Args:
      buffers: `ReverbReplayBuffer`s or `RayReplayBuffer`s of one data spec, one per server or actor.
      sample_batch_size: Windows per batch.
      num_steps: Frames per window, as `as_dataset`'s.
      weights: One number > 0 per shard; None for equal weights.
      num_parallel_calls: Passed to each shard's `as_dataset`.
      seed: The shard choice's seed.

    Raises:
      ValueError: If there are no buffers, their specs differ, or the weights do not fit.
    """
    sample_batch_size = positive_int("sample_batch_size", sample_batch_size)
    buffers = list(buffers)
    if not buffers or not all(isinstance(buffer, RemoteReplayBuffer) for buffer in buffers):
        raise ValueError(f"buffers: expected one or more ReverbReplayBuffer or RayReplayBuffer, got {buffers!r}")
    for index, buffer in enumerate(buffers[1:], 1):
        if buffer.fields != buffers[0].fields:
            raise ValueError(f"buffers[{index}]: expected the data spec of buffers[0], got another one")
    shares = np.full(len(buffers), 1.0 / len(buffers)) if weights is None else np.asarray(weights, np.float64)
    if shares.shape != (len(buffers),) or not np.all(np.isfinite(shares)) or not np.all(shares > 0):
        raise ValueError(f"weights: expected {len(buffers)} finite numbers > 0, got {weights!r}")
    shares = shares / shares.sum()
    if len(buffers) == 1:  # the same draws, in batches: one host call per batch, not one per window
        return buffers[0].as_dataset(sample_batch_size, num_steps, num_parallel_calls=num_parallel_calls)

    def scaled(share: float) -> Any:
        def scale(items: Any, info: BufferInfo) -> tuple[Any, BufferInfo]:
            return items, BufferInfo(info.ids, info.probabilities * np.float32(share))

        return scale

    # Each shard's windows fetched in batches (one host call a batch, not a window), then mixed one by one: the
    # batch's windows are independent draws, so the mix draws each window as a shard's unbatched dataset would.
    shards = [
        buffer.as_dataset(sample_batch_size, num_steps, num_parallel_calls=num_parallel_calls)
        .map(scaled(share))
        .unbatch()
        for buffer, share in zip(buffers, shares)
    ]
    mixed = tf.data.Dataset.sample_from_datasets(shards, weights=shares.tolist(), seed=seed)
    return mixed.batch(sample_batch_size, drop_remainder=True)
