"""The options the remote buffers and the manager take alike, checked alike: samplers, rate limits, waits."""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from tfbuffers import sampling

SAMPLERS = sampling.NAMES
NOT_RECORDABLE = (
    "sampler: expected a name of {names} or a callable importable by its name (a module-level class or function "
    "of a module other than __main__), since {where} records the sampler in a file; got {received}"
)
NOT_IMPORTABLE = "sampler: the recorded sampler {record!r} does not import here ({error})"
NOT_A_RATIO = "samples_per_insert: expected a finite number > 0 or None, got {received}"
ERROR_BUFFER_TOO_SMALL = (
    "error_buffer: expected at least max(1.0, samples_per_insert) = {minimum:g} (smaller ones can block every "
    "sample or insert), got {received}"
)


def check_sampler(sampler: Any, *, callables: bool = True) -> Any:
    """`sampler` when it is one of `SAMPLERS`' names or, with `callables`, a sampler factory as the local buffers take.

    Raises:
      ValueError: Naming the argument, what it takes and what was received.
    """
    return sampling.check_choice(sampler, callables=callables)


def sampler_record(sampler: Any, where: str) -> str:
    """`sampler` as a file records it: its name, or a factory's import path `module:qualname` (`recorded_sampler`).

    Raises:
      ValueError: Naming `sampler` and `where` (what writes the file), if it is a factory that importing its
        path would not give back (a lambda, a `functools.partial`, a class defined in a function).
    """
    if isinstance(sampler, str):
        return sampler
    module = getattr(sampler, "__module__", None)
    path = f"{module}:{getattr(sampler, '__qualname__', None)}"
    try:
        found = recorded_sampler(path)
    except ValueError:
        found = None
    if found is not sampler or module == "__main__":  # __main__ is another module in the process that reads it
        raise ValueError(NOT_RECORDABLE.format(names=list(SAMPLERS), where=where, received=repr(sampler)))
    return path


def recorded_sampler(record: str) -> Any:
    """The sampler `sampler_record` wrote: the name, or the factory imported from its path.

    Raises:
      ValueError: Naming `sampler` and the record, if it is neither a name nor an import path that imports here.
    """
    if record in SAMPLERS:
        return record
    module, _, qualname = record.partition(":")
    if not module or not qualname or "<" in qualname:
        raise ValueError(
            f"sampler: expected a name of {list(SAMPLERS)} or an import path module:qualname, got {record!r}"
        )
    try:
        found: Any = importlib.import_module(module)
        for name in qualname.split("."):
            found = getattr(found, name)
    except (ImportError, AttributeError) as error:
        raise ValueError(NOT_IMPORTABLE.format(record=record, error=error)) from error
    return found


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


def optional_seconds(name: str, value: Any) -> float | None:
    """`value`, the argument `name`: seconds > 0, or None (forever, never).

    Raises:
      ValueError: Naming it, if it is anything else (NaN included).
    """
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or not value > 0):
        raise ValueError(f"{name}: expected a number of seconds > 0 or None, got {value!r}")
    return value
