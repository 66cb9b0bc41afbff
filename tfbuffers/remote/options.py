"""The options the remote buffers and the manager take alike, checked alike: sampler names and rate limits."""

from __future__ import annotations

from typing import Any

import numpy as np

SAMPLERS = ("uniform", "prioritized")
NOT_A_SAMPLER = "sampler: expected one of {expected}, got {received!r}"
NOT_A_RATIO = "samples_per_insert: expected a finite number > 0 or None, got {received}"
ERROR_BUFFER_TOO_SMALL = (
    "error_buffer: expected at least max(1.0, samples_per_insert) = {minimum:g} (smaller ones can block every "
    "sample or insert), got {received}"
)


def check_sampler(sampler: Any) -> str:
    """`sampler` when it is one of `SAMPLERS`' names.

    Raises:
      ValueError: Naming the argument, the names there are and what was received.
    """
    if not isinstance(sampler, str) or sampler not in SAMPLERS:
        raise ValueError(NOT_A_SAMPLER.format(expected=list(SAMPLERS), received=sampler))
    return sampler


def check_ratio(min_size: int, samples_per_insert: Any, error_buffer: Any) -> tuple[float, float] | None:
    """`(samples_per_insert, error_buffer)` as Reverb's `SampleToInsertRatio` takes them, checked; None for neither.

    `error_buffer` defaults to 10% of `min_size * samples_per_insert`, and no less than
    `max(1.0, samples_per_insert)`, the least Reverb accepts.

    Raises:
      TypeError, ValueError: Naming the argument, what was expected and what was received.
    """
    if samples_per_insert is None:
        return None
    if isinstance(samples_per_insert, bool) or not isinstance(samples_per_insert, int | float):
        raise TypeError(NOT_A_RATIO.format(received=f"{type(samples_per_insert).__name__} {samples_per_insert!r}"))
    if not np.isfinite(samples_per_insert) or samples_per_insert <= 0:
        raise ValueError(NOT_A_RATIO.format(received=samples_per_insert))
    minimum = max(1.0, float(samples_per_insert))
    if error_buffer is None:
        error_buffer = max(0.1 * min_size * samples_per_insert, minimum)
    elif isinstance(error_buffer, bool) or not isinstance(error_buffer, int | float) or not error_buffer >= minimum:
        raise ValueError(ERROR_BUFFER_TOO_SMALL.format(minimum=minimum, received=error_buffer))
    return float(samples_per_insert), float(error_buffer)
