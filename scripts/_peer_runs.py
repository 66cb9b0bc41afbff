"""The timed runs the out-of-process peers share (`scripts/_flashbax_peer.py`, `scripts/_torchrl_peer.py`).

Standard library only: each peer's script imports it in its own environment, beside JAX or PyTorch. A
peer reads one JSON workload on stdin (`read_workload`), gives each buffer's measures as `(name, step,
frames)`, where `step(calls)` makes `calls` calls and waits for their work, and prints one JSON line of its
versions and the rates (`print_result`).
"""

from __future__ import annotations

import json
import resource
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

Measure = tuple[str, Callable[[int], Any], int]  # (the benchmark's measure name, step(calls), frames a call)


def timed(step: Callable[[int], Any], calls: int) -> float:
    """Seconds `step(calls)` took."""
    start = time.perf_counter()
    step(calls)
    return time.perf_counter() - start


def rates(
    measures: Sequence[Measure], calls: int, repetitions: int, warm_ups: int = 1, warm_up_calls: int | None = None
) -> dict[str, list[float]]:
    """Frames per second of each measure in each of `repetitions` runs of `calls` calls, the measures in turn.

    `warm_ups` untimed runs of each go first, of `warm_up_calls` calls (None: `calls`): a process's first runs
    are its slowest (compiles, caches).
    """
    for _ in range(warm_ups):
        for _, step, _ in measures:
            step(calls if warm_up_calls is None else warm_up_calls)
    out: dict[str, list[float]] = {name: [] for name, _, _ in measures}
    for _ in range(repetitions):
        for name, step, frames in measures:
            out[name].append(calls * frames / timed(step, calls))
    return out


def read_workload() -> dict[str, Any]:
    """The workload the benchmark sent on stdin."""
    return json.load(sys.stdin)


def high_water_bytes() -> int:
    """This process's resident high-water mark in bytes: the kernel's `VmHWM` (Linux), else `getrusage`'s.

    Not `getrusage` where `VmHWM` exists: a child's `ru_maxrss` starts from its parent's resident memory at the
    fork (Linux keeps it across the exec), so every peer process of the benchmark reported the benchmark's own
    peak (2026-12-03), and the children's mark (`RUSAGE_CHILDREN`) is the parent's too.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def print_result(versions: dict[str, str], measured: dict[str, dict[str, list[float]]]) -> int:
    """Prints the one JSON line the benchmark reads, and returns 0.

    The line: `versions`, the process's resident high-water mark in bytes and `"rates"` by system.
    """
    print(json.dumps(versions | {"resident_peak_bytes": high_water_bytes(), "rates": measured}))
    return 0
