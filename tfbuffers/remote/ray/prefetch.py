"""What `RayReplayBuffer.as_dataset` reads from: samples fetched several batches a remote call, the next one ahead."""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tfbuffers.remote.ray.cluster import cause_of, import_ray, wait_for_restart

# `prefetch_items`' default by sampler: a prioritized learner's priorities move between fetches, so it fetches less.
PREFETCH_ITEMS = {"uniform": 8192, "prioritized": 512}


PREFETCH_BYTES = 32 << 20  # the most one of `as_dataset`'s fetches holds (two are in flight: the next is asked for)


class Prefetch:
    """Samples for one dataset, fetched several batches a call, the next call already asked for while these are read.

    `arguments`: the actor's `sample` arguments, `(sample_batch_size, num_steps, batches, timeout)`.
    """

    def __init__(self, buffer: Any, arguments: tuple[Any, ...]) -> None:
        self._buffer = weakref.ref(buffer)  # to refuse reads once it is closed; the dataset keeps it alive
        self._actor = buffer.actor
        self._restarts = bool(buffer.max_restarts)  # Ray restarts the actor when its process dies
        self._arguments = arguments
        self._ready: deque[Any] = deque()
        self._pending: Any = None
        self._lock = threading.Lock()

    def next(self, sample_batch_size: int | None, num_steps: int | None) -> tuple[Any, ...]:
        """The next sample, `(leaves, ids, probabilities)` (`tfbuffers.execution.host.sample`'s draw)."""
        ray = import_ray()
        with self._lock:
            buffer = self._buffer()
            if buffer is None or buffer.closed:
                raise ValueError("RayReplayBuffer: the buffer is closed")
            while not self._ready:
                pending = self._pending or self._actor.sample.remote(*self._arguments)
                self._pending = None
                try:
                    self._ready.extend(split_samples(ray.get(pending), self._arguments[0]))
                except ray.exceptions.RayTaskError as error:
                    cause = cause_of(error)
                    if isinstance(cause, ValueError):  # an empty buffer: refused as get_next refuses it
                        raise tf.errors.InvalidArgumentError(None, None, str(cause)) from None
                    raise cause from None
                except ray.exceptions.RayActorError:
                    if not self._restarts:
                        raise
                    wait_for_restart(self._actor)  # Ray restarts it: the fetch goes again
                    continue
                self._pending = self._actor.sample.remote(*self._arguments)
            return self._ready.popleft()


def split_samples(
    drawn: tuple[list[np.ndarray], np.ndarray, np.ndarray], sample_batch_size: int | None
) -> list[tuple[list[np.ndarray], np.ndarray, np.ndarray]]:
    """`RayHost.sample`'s stacked windows as its samples: batches of `sample_batch_size`, or single windows."""
    leaves, ids, probabilities = drawn
    if sample_batch_size is None:
        return [([leaf[i] for leaf in leaves], ids[i], probabilities[i]) for i in range(len(ids))]
    return [
        ([leaf[start : start + sample_batch_size] for leaf in leaves], ids[start : start + sample_batch_size],
         probabilities[start : start + sample_batch_size])
        for start in range(0, len(ids), sample_batch_size)
    ]  # fmt: skip


def fetch_batches(fields: Sequence[Any], sample_batch_size: int | None, num_steps: int | None, items: int) -> int:
    """How many batches one of `as_dataset`'s remote calls fetches.

    `items // sample_batch_size` (whole batches of windows), at most `PREFETCH_BYTES` of frames of `fields` (the
    flat data spec), at least one.
    """
    window = (num_steps or 1) * sum(int(np.prod(f.spec.shape)) * f.spec.dtype.size for f in fields)
    batch = sample_batch_size or 1
    return max(1, min(items // batch, PREFETCH_BYTES // (batch * window)))
