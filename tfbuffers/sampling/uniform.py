"""`UniformSampler`: every window that can be drawn equally likely (the buffers' default sampler)."""

from __future__ import annotations

from typing import Any

import numpy as np

import tfbuffers.sampling._episodes as _episodes
from tfbuffers import _ring
from tfbuffers.sampling.backends import TENSORFLOW, Backend, choose
from tfbuffers.sampling.base import Sample, Sampler


class UniformSampler(Sampler):
    """Every window that can be drawn equally likely: probability `1 / windows`."""

    def sample(self, backend: Backend, added: Any, sample_batch_size: int | None, num_steps: int | None) -> Sample:
        """See `Sampler.sample`."""
        shape = [] if sample_batch_size is None else [sample_batch_size]
        first, windows, checks = self.stored_windows(backend, added, num_steps)
        steps, wanted = num_steps or 1, 1 if sample_batch_size is None else sample_batch_size
        if not self._episodes_apply(num_steps):
            # The windows' first frames drawn as ids, with a time axis unless num_steps is None: a few ops in all.
            ids = backend.uniform_integers(shape + ([] if num_steps is None else [1]), first, first + windows, checks)
            if steps > 1:
                ids = ids + backend.ops.arange(steps, self.batch_size)
            rows = _ring.rows_of_ids(ids, self.max_length, self.batch_size)
            return Sample(ids, rows, backend.full_inverse(shape, windows), mass=windows)  # windows > 0 once checked

        def in_one_pass() -> tuple[Any, Any]:
            running = backend.cumsum(backend.cast(self._valid_starts(backend, added, steps), np.int64))
            if backend is not TENSORFLOW:
                backend.require(running[-1] > 0, self._no_window(num_steps))
            # Validity is asserted later in TensorFlow (a torn read is read again first): the op draws meanwhile.
            draws = backend.uniform_integers([wanted], 0, backend.ops.maximum(running[-1], 1), checks)
            # Draw k lands on the row of the k-th valid window: the first row whose running count exceeds k.
            first_rows = backend.searchsorted(running, draws)
            return backend.ops.minimum(first_rows, self.batch_size * self.max_length - 1), running[-1]

        record = self._record(steps)
        if record is None:
            first_rows, count = in_one_pass()
        else:
            ones = lambda rows: _episodes.columns(backend.cast(rows * 0 + 1, np.float64))  # noqa: E731
            count = windows - backend.cast(
                self._crossing(backend, record, added, steps, ones)[_episodes.COUNT], np.int64
            )
            if backend is not TENSORFLOW:
                backend.require(count > 0, self._no_window(num_steps))
            share = backend.cast(count, np.float64) / backend.cast(backend.ops.maximum(windows, 1), np.float64)
            draws = backend.uniform_integers([self._draw_count(backend, wanted, share)], first, first + windows, checks)
            candidates = _ring.rows_of_ids(draws, self.max_length, self.batch_size)
            kept = self._kept_draws(backend, record, candidates, steps)
            chosen = backend.boolean_mask(candidates, kept)
            enough = backend.sum(backend.cast(kept, np.int64)) >= wanted
            first_rows = choose(backend, enough, lambda: chosen[:wanted], lambda: in_one_pass()[0])
        ids, rows = self._windows_from(backend, backend.reshape(first_rows, shape), added, num_steps)
        probabilities = backend.full_inverse(shape, backend.ops.maximum(count, 1))
        return Sample(ids, rows, probabilities, count > 0, self._no_window(num_steps), count)
