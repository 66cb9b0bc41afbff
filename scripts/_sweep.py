"""The scaling sweep of `scripts/benchmark.py --sweep`: how each local buffer's costs grow with its size.

For every local buffer kind (`KINDS`), on the control workload's frames, it measures
the time of one call of each measure:

- `add`: one `add_batch` of the 8 environments' frames (the py buffers called eagerly,
  as a driver does; the TF buffers inside one `tf.function` loop, as a TF driver does);
- `add block`: one `extend` of a block of `BLOCK_FRAMES` frames, 128 per environment (a
  vectorized collect's or a loaded dataset's; the numpy reference's slice assignment of it);
- `sample`: one `get_next` of `batch` windows of 2 frames (py: eager; TF: inside one
  `tf.function` loop, as a learner's graph samples, so the call's fixed cost does not
  hide the draw's);
- `sample + update`: `get_next`, then `update_priorities` of the windows' first frames
  (the prioritized kinds).

first against the capacity (batch 256), then against the batch size (at one capacity),
each buffer filled to capacity first. Each point is the median of `repetitions` runs.
The growth of each is fitted as the slope of log(time) against log(capacity) and set
beside the growth the algorithm should have (`EXPECTED`): O(1) is slope 0, and O(log n)
from 10k to 10M frames is a ratio of log(10M) / log(10k) = 1.75 between the ends, a
slope of about 0.08.
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

CAPACITIES = (10_000, 100_000, 1_000_000, 10_000_000)
BATCH_SIZES = (32, 128, 512, 2048, 4096)
BATCH_CAPACITY = 1_000_000  # the capacity the batch sizes are swept at
QUICK_CAPACITIES = (1_000, 10_000)
QUICK_BATCH_SIZES = (32, 256)
QUICK_BATCH_CAPACITY = 10_000
CAPACITY_BATCH = 256  # the batch the capacities are swept with (the control workload's)

KINDS = (
    "tfbuffers TF",
    "tfbuffers py",
    "tfbuffers TF prioritized",
    "tfbuffers py prioritized",
    "tfbuffers py memmap",  # its files in the page cache: up to 1.1 GB of them at 10M frames
    "numpy limit",
)
# "numpy limit" is the reference: a plain numpy ring, written by slices and read by one fancy-index gather per
# field. It stores and checks nothing more, so what its sample gains in time with the capacity is the memory
# system's (rows that no longer fit in a cache), not a buffer's algorithm.
MEASURES = ("add", "add block", "sample", "sample + update")
BLOCK_FRAMES = 1024  # frames of one `add block`, all environments together (quick: 512, half the smallest buffer)
QUICK_BLOCK_FRAMES = 512
# The growth each measure should have with the capacity, by kind (the sum tree's depth is log2 of it).
EXPECTED = {
    ("add", "tfbuffers TF"): "O(1)",
    ("add", "tfbuffers py"): "O(1)",
    # The TF buffer adds each new leaf's weight to its log2(n) ancestors; the py buffer sets the leaves
    # and recomputes their ancestors once before the next draw (counted in the sample).
    ("add", "tfbuffers TF prioritized"): "O(log n)",
    ("add", "tfbuffers py prioritized"): "O(1)",
    ("add", "tfbuffers py memmap"): "O(1)",
    ("add", "numpy limit"): "O(1)",
    # A block's leaves are contiguous: the TF buffer sums each level's changed nodes once, about
    # block + log2(n) of them, so its block add grows by the log term only.
    ("add block", "tfbuffers TF"): "O(1)",
    ("add block", "tfbuffers py"): "O(1)",
    ("add block", "tfbuffers TF prioritized"): "O(log n)",
    ("add block", "tfbuffers py prioritized"): "O(1)",
    ("add block", "tfbuffers py memmap"): "O(1)",
    ("add block", "numpy limit"): "O(1)",
    ("sample", "numpy limit"): "O(1)",
    ("sample", "tfbuffers TF"): "O(1)",
    ("sample", "tfbuffers py"): "O(1)",
    ("sample", "tfbuffers py memmap"): "O(1)",
    ("sample", "tfbuffers TF prioritized"): "O(log n)",
    ("sample", "tfbuffers py prioritized"): "O(log n)",
    ("sample + update", "tfbuffers TF prioritized"): "O(log n)",
    ("sample + update", "tfbuffers py prioritized"): "O(log n)",
}
CALLS = {"add": 2_000, "sample": 200, "sample + update": 200}  # calls per timed run (quick: a tenth)
# (An `add block` run is the benchmark's own: `BLOCK_CALLS` blocks, `_bench.measure.block_seconds`.)


@dataclasses.dataclass
class Point:
    """One measured point: a kind, a measure, the capacity and batch, and the seconds per call of each run."""

    kind: str
    measure: str
    capacity: int
    batch: int
    seconds: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def on_capacity_line(self) -> bool:
        """Whether the point is on the sweep over capacities (every add, every block; samples of `CAPACITY_BATCH`)."""
        return self.measure in ("add", "add block") or self.batch == CAPACITY_BATCH


def _timed(fn: Callable[[], Any], calls: int, repetitions: int) -> list[float]:
    fn()  # a warm-up: traces, compiles, fills caches
    runs = []
    for _ in range(repetitions):
        start = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - start) / calls)
    return runs


class _Measured:
    """One filled buffer of a kind and the calls that time it (`add`, `sample`, `sample_update`)."""

    def __init__(self, benchmark: Any, kind: str, capacity: int, quick: bool) -> None:
        workload = dataclasses.replace(benchmark.WORKLOADS["control"], frames=capacity)
        self.workload = workload
        self.system = next(cls for cls in benchmark.available_systems()[0] if cls.name == kind)(workload)
        self.buffer: Any = getattr(self.system, "buffer", None)  # none in the numpy reference
        self.graph = "TF" in kind
        self.reference = kind == "numpy limit"
        self.prioritized = "prioritized" in kind
        self.scale = 10 if quick else 1
        batches = self.system.prepare(benchmark.numpy_batches(workload, 64))
        self.batch = batches[0]
        frames = QUICK_BLOCK_FRAMES if quick else BLOCK_FRAMES
        self.block = benchmark.block_of(workload, batches, frames // workload.num_envs)
        self.system.fill(batches, _NoBar())
        self.priorities = np.random.default_rng(0).uniform(0.1, 2.0, max(BATCH_SIZES))

    def add(self, repetitions: int) -> list[float]:
        calls = CALLS["add"] // self.scale
        if self.graph:  # the system's own loop of in-graph adds, warmed up on each call
            return [self.system.add_graph(calls) / calls for _ in range(repetitions)]

        def run() -> None:
            for _ in range(calls):
                self.system.add(self.batch)  # each result dropped, as a collect loop does

        return _timed(run, calls, repetitions)

    def add_block(self, repetitions: int) -> list[float]:
        """Seconds of one block add, each run the system's own (`System.add_block`: warmed up, then timed)."""
        return [self.system.add_block(self.block) for _ in range(repetitions)]

    def _graph_loop(self, batch: int, update: bool) -> Callable[[Any], Any]:
        import tensorflow as tf  # here: the benchmark checks its arguments with this module before TF is imported

        priorities = tf.constant(self.priorities[:batch])

        @tf.function(autograph=True)
        def loop(calls: Any) -> Any:
            total = tf.constant(0, tf.int64)
            for _ in tf.range(calls):
                _, info = self.buffer.get_next(batch, 2)
                total += info.ids[0, 0]  # a value of every sample, so none is left out of the graph
                if update:
                    total += self.buffer.update_priorities(info.ids[:, 0], priorities)
            return total

        return loop

    def sample(self, batch: int, repetitions: int, update: bool = False) -> list[float]:
        calls = CALLS["sample + update" if update else "sample"] // self.scale
        if self.reference:  # its own timed loop of gathers, of the batch asked for
            self.system.workload = dataclasses.replace(self.workload, sample_batch_size=batch)
            self.system.get_next(2)
            return [self.system.get_next(calls) / calls for _ in range(repetitions)]
        if self.graph:
            loop = self._graph_loop(batch, update)
            return _timed(lambda: loop(np.int64(calls)).numpy(), calls, repetitions)
        priorities = self.priorities[:batch]

        def run() -> None:
            for _ in range(calls):
                _, info = self.buffer.get_next(batch, 2)
                if update:
                    self.buffer.update_priorities(info.ids[:, 0], priorities)

        return _timed(run, calls, repetitions)

    def close(self) -> None:
        self.system.close()


class _NoBar:
    def update(self, _: int) -> None:
        pass


def run(benchmark: Any, kinds: list[str], quick: bool, repetitions: int, progress: Any) -> list[Point]:
    """Every point of the sweep, for `kinds` (`KINDS` by default); `progress(total)` gives a bar to update."""
    capacities = QUICK_CAPACITIES if quick else CAPACITIES
    batch_capacity = QUICK_BATCH_CAPACITY if quick else BATCH_CAPACITY
    batch_sizes = QUICK_BATCH_SIZES if quick else BATCH_SIZES
    points: list[Point] = []
    with progress(len(kinds) * len(capacities)) as bar:
        for kind in kinds:
            for capacity in capacities:
                bar.set_description(f"sweep: {kind}, {capacity:,} frames")
                measured = _Measured(benchmark, kind, capacity, quick)
                points.append(Point(kind, "add", capacity, measured.workload.num_envs, measured.add(repetitions)))
                frames = benchmark.block_size(measured.block)
                points.append(Point(kind, "add block", capacity, frames, measured.add_block(repetitions)))
                sizes = [CAPACITY_BATCH]
                if capacity == batch_capacity:
                    sizes += [size for size in batch_sizes if size != CAPACITY_BATCH]
                for batch in sizes:
                    points.append(Point(kind, "sample", capacity, batch, measured.sample(batch, repetitions)))
                    if measured.prioritized:
                        seconds = measured.sample(batch, repetitions, update=True)
                        points.append(Point(kind, "sample + update", capacity, batch, seconds))
                measured.close()
                del measured
                gc.collect()  # the buffer and its traced loops, before the next one is filled
                bar.update(1)
    return points


def slope(xs: list[float], ys: list[float]) -> float:
    """The least-squares slope of log(ys) against log(xs)."""
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def growth(points: list[Point]) -> list[dict[str, Any]]:
    """Per kind and measure, against the capacity at batch 256: the ends, their ratio, the slope, the expectation."""
    rows = []
    for measure in MEASURES:
        for kind in KINDS:
            line = sorted(
                (p for p in points if p.kind == kind and p.measure == measure and p.on_capacity_line),
                key=lambda p: p.capacity,
            )
            if len(line) < 2:
                continue
            first, last = line[0], line[-1]
            log_ratio = np.log(last.capacity) / np.log(first.capacity)
            rows.append(
                {
                    "measure": measure,
                    "kind": kind,
                    "expected": EXPECTED[(measure, kind)],
                    "first": (first.capacity, first.median),
                    "last": (last.capacity, last.median),
                    "ratio": last.median / first.median,
                    "log_ratio": float(log_ratio),
                    "slope": slope([p.capacity for p in line], [p.median for p in line]),
                }
            )
    return rows


def markdown(points: list[Point]) -> str:
    """The sweep's tables: growth against the capacity, then µs per call at every point."""
    lines = [
        "| measure | kind | expected | at the smallest capacity | at the largest | ratio | log(n) ratio | slope |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in growth(points):
        (small, small_s), (large, large_s) = row["first"], row["last"]
        lines.append(
            f"| {row['measure']} | {row['kind']} | {row['expected']} | {small_s * 1e6:,.1f} µs at {small:,} "
            f"| {large_s * 1e6:,.1f} µs at {large:,} | {row['ratio']:.2f}x | {row['log_ratio']:.2f}x "
            f"| {row['slope']:.3f} |"
        )
    lines += ["", "| measure | kind | capacity | batch | µs per call (median) | range |", "|---|---|---|---|---|---|"]
    for p in points:
        lines.append(
            f"| {p.measure} | {p.kind} | {p.capacity:,} | {p.batch:,} | {p.median * 1e6:,.1f} "
            f"| {min(p.seconds) * 1e6:,.1f}–{max(p.seconds) * 1e6:,.1f} |"
        )
    return "\n".join(lines) + "\n"


def plot(points: list[Point], path_for: Callable[[str], Any]) -> list[Any]:
    """One log-log figure per measure (`path_for(measure)`): µs per call against capacity, and against batch size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {kind: plt.get_cmap("tab10")(i) for i, kind in enumerate(KINDS)}
    fits = {(row["measure"], row["kind"]): row for row in growth(points)}
    written = []
    for measure in MEASURES:
        mine = [p for p in points if p.measure == measure]
        if not mine:
            continue
        off_line = [p.capacity for p in mine if not p.on_capacity_line]
        batch_capacity = off_line[0] if off_line else None
        panels = 2 if batch_capacity is not None else 1
        figure, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4.2), squeeze=False)
        for kind in KINDS:
            line = sorted((p for p in mine if p.kind == kind and p.on_capacity_line), key=lambda p: p.capacity)
            if not line:
                continue
            fit = fits.get((measure, kind))
            label = kind if fit is None else f"{kind}: slope {fit['slope']:.2f} (expected {fit['expected']})"
            axes[0, 0].plot(
                [p.capacity for p in line], [p.median * 1e6 for p in line], "o-", color=colours[kind], label=label
            )
            if batch_capacity is not None:
                by_batch = sorted(
                    (p for p in mine if p.kind == kind and p.capacity == batch_capacity), key=lambda p: p.batch
                )
                axes[0, 1].plot(
                    [p.batch for p in by_batch],
                    [p.median * 1e6 for p in by_batch],
                    "o-",
                    color=colours[kind],
                    label=kind,
                )
        block = next((p.batch for p in mine if measure == "add block"), 0)
        unit = {"add": "add of 8 frames", "add block": f"block of {block:,} frames"}.get(
            measure, f"call, batch {CAPACITY_BATCH}"
        )
        axes[0, 0].set(xscale="log", yscale="log", xlabel="capacity (frames)", ylabel=f"µs per {unit}")
        axes[0, 0].set_title(f"{measure}: against capacity", fontsize=10)
        axes[0, 0].legend(fontsize=7)
        if batch_capacity is not None:
            axes[0, 1].set(xscale="log", yscale="log", xlabel="windows per call", ylabel="µs per call")
            axes[0, 1].set_title(f"{measure}: against batch size, {batch_capacity:,} frames", fontsize=10)
            axes[0, 1].legend(fontsize=7)
        for axis in axes.flat:
            axis.grid(which="both", alpha=0.3)
        figure.tight_layout()
        path = path_for(measure)
        figure.savefig(path, dpi=110)
        plt.close(figure)
        written.append(path)
    return written
