"""Sampling a memory-mapped py buffer larger than the page cache: `benchmark.py --beyond-cache`.

The buffer holds Atari frames (u8[84, 84, 4], 28,224 bytes, and an int64 stamp: the frame's own id, so that every
sampled window is checked against the frame it should be) in files at least `factor` times this machine's free
memory (`MemAvailable`: all the page cache the kernel could give them), filled by `extend` blocks. Its pages are
then dropped from the cache (`posix_fadvise(DONTNEED)` after a flush), and three reads are timed from cold, each
for the same seconds:

- `get_next(32, 2)` of the buffer (uniform windows of 2 frames: random reads of the files);
- the limit of those random reads: a plain numpy gather of the same rows from `numpy.load(mmap_mode="r")` of the
  observation file, at random windows;
- a sequential read of the observation file from its start (`readinto` of 16 MiB, to its end at most): the bytes
  the disk gives when nothing is random.

Rates are frames/s and payload MB/s (the observation bytes of the frames returned), each second's rate kept to
show the cache warming. Nothing here is a timing assertion: the test runs `--quick` (a 64 MiB buffer, inside the
cache) for the mechanics and the checks.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

OBSERVATION = (84, 84, 4)  # the atari workload's stacked frames
NUM_ENVS = 4
BATCH, NUM_STEPS = 32, 2  # the atari workload's sample
BLOCK = 256  # frames per segment of one `extend` (4 segments: 1,024 frames, 29 MB)
CHUNK = 16 << 20  # bytes of one sequential read
QUICK_BYTES = 64 << 20
FACTOR = 2.0  # the buffer's bytes against the free page cache (issue 51: at least 2x)
SECONDS = 20.0  # each read, from cold (quick: 1 s)
MEASURES = ("tfbuffers py memmap get_next", "numpy memmap gather", "sequential read")


def meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes, by name (`MemAvailable`, `Cached`, `Dirty`, ...)."""
    entries = {}
    for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
        name, value = line.split(":", 1)
        words = value.split()
        entries[name] = int(words[0]) * (1024 if words[1:] == ["kB"] else 1)
    return entries


def drop_cached(directory: pathlib.Path) -> None:
    """Every file under `directory` flushed and dropped from the page cache (what was written is on disk first)."""
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _per_second(step: Callable[[], float | None], seconds: float) -> tuple[list[float], float, float]:
    """Calls `step` (the frames it read; None: no more) for `seconds`: each second's frame rate, all frames, seconds."""
    started = time.perf_counter()
    mark, frames, in_second, rates = started, 0.0, 0.0, []
    while True:
        read = step()
        now = time.perf_counter()
        done = read is None or now - started >= seconds
        frames, in_second = frames + (read or 0), in_second + (read or 0)
        if now - mark >= 1.0 or done:
            rates.append(in_second / (now - mark))
            mark, in_second = now, 0.0
        if done:
            return rates, frames, now - started


def run(directory: pathlib.Path | None, factor: float, seconds: float, quick: bool, progress: Any) -> dict[str, Any]:
    """The three reads of one buffer of `factor` times the free page cache (quick: 64 MiB), made in `directory`."""
    import tensorflow as tf

    import tfbuffers

    spec = {"observation": tf.TensorSpec(OBSERVATION, tf.uint8), "stamp": tf.TensorSpec([], tf.int64)}
    frame_bytes = math.prod(OBSERVATION) + 8
    memory = meminfo()
    target = QUICK_BYTES if quick else int(factor * memory["MemAvailable"])
    max_length = max(BLOCK, math.ceil(target / (frame_bytes * NUM_ENVS) / BLOCK) * BLOCK)
    frames = max_length * NUM_ENVS
    root = pathlib.Path(tempfile.mkdtemp(prefix="tfbuffers-beyond-cache-", dir=directory))
    try:
        free = shutil.disk_usage(root).free
        if frames * frame_bytes > 0.9 * free:
            raise SystemExit(
                f"--beyond-cache: the buffer takes {frames * frame_bytes / 1e9:.1f} GB and {root} has "
                f"{free / 1e9:.1f} GB free; give --beyond-cache-dir on a larger disk or a smaller --beyond-cache-factor"
            )
        buffer = tfbuffers.PyUniformReplayBuffer(
            spec, batch_size=NUM_ENVS, max_length=max_length, seed=0, directory=root / "buffer"
        )
        rng = np.random.default_rng(0)
        observations = rng.integers(0, 256, (NUM_ENVS, BLOCK, *OBSERVATION), np.uint8)  # one block's, reused
        started = time.perf_counter()
        with progress(max_length // BLOCK, "fill (extend blocks)") as bar:
            for first in range(0, max_length, BLOCK):
                ids = buffer.extend({"observation": observations, "stamp": _stamps(first)})
                if first == 0:  # the stamp is the frame's id, as the buffer numbers it
                    np.testing.assert_array_equal(ids, _stamps(0))
                bar.update(1)
            buffer.flush()
        fill_seconds = time.perf_counter() - started
        written = sum(path.stat().st_size for path in root.rglob("*") if path.is_file())
        observation_file = _observation_file(root / "buffer")
        results: dict[str, Any] = {
            "frames": frames,
            "frame_bytes": frame_bytes,
            "file_bytes": written,
            "mem_available_bytes": memory["MemAvailable"],
            "mem_total_bytes": memory["MemTotal"],
            "times_free_page_cache": written / memory["MemAvailable"],
            "fill_seconds": fill_seconds,
            "fill_bytes_per_second": frames * frame_bytes / fill_seconds,
            "seconds": seconds,
            "batch": BATCH,
            "num_steps": NUM_STEPS,
            "measures": {},
        }
        # Closed and reopened: the fill's mappings of the files go, so that their pages can leave the cache.
        buffer.close()
        drop_cached(root)
        started = time.perf_counter()
        buffer = tfbuffers.open(root / "buffer", seed=0)
        results["open_seconds"] = time.perf_counter() - started
        reads = {
            MEASURES[0]: lambda: _buffer_step(buffer),
            MEASURES[1]: _gather_step(observation_file, rng),
            MEASURES[2]: _sequential_step(observation_file),
        }
        with progress(len(MEASURES), "reads from cold") as bar:
            for name, step in reads.items():
                drop_cached(root)
                cached_before = meminfo()["Cached"]
                rates, read, spent = _per_second(step, seconds)
                results["measures"][name] = _rates(rates, read, spent, math.prod(OBSERVATION), cached_before)
                bar.update(1)
        buffer.close()
        sequential = results["measures"][MEASURES[2]]["bytes_per_second"]
        results["ratios"] = {
            f"{name} / sequential read": results["measures"][name]["bytes_per_second"] / sequential
            for name in MEASURES[:2]
        }
        results["ratios"][f"{MEASURES[0]} / {MEASURES[1]}"] = (
            results["measures"][MEASURES[0]]["bytes_per_second"] / results["measures"][MEASURES[1]]["bytes_per_second"]
        )
        return results
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _stamps(first: int) -> np.ndarray:
    """The ids of the block whose first time step is `first`: step t of segment b is t * NUM_ENVS + b."""
    steps = np.arange(first, first + BLOCK, dtype=np.int64)
    return steps[None, :] * NUM_ENVS + np.arange(NUM_ENVS, dtype=np.int64)[:, None]


def _buffer_step(buffer: Any) -> int:
    items, info = buffer.get_next(BATCH, NUM_STEPS)
    if not np.array_equal(items["stamp"], info.ids):  # a window of other frames than its ids say: never
        raise AssertionError("a sampled window holds other frames than its ids")
    return BATCH * NUM_STEPS


def _observation_file(directory: pathlib.Path) -> pathlib.Path:
    """The observation field's file (`fields/<index>.npy`, by the spec's flattened order: observation first)."""
    return directory / "fields" / "0.npy"


def _gather_step(path: pathlib.Path, rng: np.random.Generator) -> Callable[[], int]:
    rows = np.load(path, mmap_mode="r")
    # The buffer's windows: the segments' frames interleave (step t of segment b at row t * NUM_ENVS + b), so a
    # window's rows are NUM_ENVS apart.
    length = rows.shape[0] // NUM_ENVS

    def step() -> int:
        segments = rng.integers(0, NUM_ENVS, BATCH)
        starts = rng.integers(0, length - NUM_STEPS + 1, BATCH)
        index = (starts * NUM_ENVS + segments)[:, None] + np.arange(NUM_STEPS) * NUM_ENVS
        np.take(rows, index.ravel(), axis=0)
        return BATCH * NUM_STEPS

    return step


def _sequential_step(path: pathlib.Path) -> Callable[[], float | None]:
    """`readinto` of `CHUNK`s from the file's start, in frames (of the observation's bytes); None at its end."""
    frame = math.prod(OBSERVATION)
    chunk = bytearray(CHUNK)
    file = open(path, "rb", buffering=0)  # noqa: SIM115 (closed at its end, or with the step)

    def step() -> float | None:
        read = file.readinto(chunk)
        if not read:
            file.close()
            return None
        return read / frame

    return step


def _rates(rates: list[float], frames: float, spent: float, frame_bytes: int, cached_before: int) -> dict[str, Any]:
    return {
        "frames_per_second": frames / spent,
        "bytes_per_second": frames * frame_bytes / spent,
        "bytes_read": int(frames * frame_bytes),
        "per_second_frames": rates,
        "cached_bytes_before": cached_before,
    }


def markdown(results: dict[str, Any]) -> str:
    """The results as a table."""
    lines = [
        f"A py buffer over memory-mapped files of {results['file_bytes'] / 1e9:.1f} GB "
        f"({results['frames']:,} frames of {results['frame_bytes']:,} bytes): "
        f"{results['times_free_page_cache']:.2f}x the free page cache ({results['mem_available_bytes'] / 1e9:.1f} GB "
        f"available of {results['mem_total_bytes'] / 1e9:.1f} GB), filled by `extend` blocks in "
        f"{results['fill_seconds']:.0f} s ({results['fill_bytes_per_second'] / 1e6:,.0f} MB/s). Each read from cold, "
        f"for {results['seconds']:g} s; batches of {results['batch']} windows of {results['num_steps']} frames.",
        "",
        "| read | frames/s | MB/s (observations) | first second | last second | against the sequential read |",
        "|---|---|---|---|---|---|",
    ]
    sequential = results["measures"][MEASURES[2]]["bytes_per_second"]
    for name in MEASURES:
        entry = results["measures"][name]
        first, last = entry["per_second_frames"][0], entry["per_second_frames"][-1]
        lines.append(
            f"| {name} | {entry['frames_per_second']:,.0f} | {entry['bytes_per_second'] / 1e6:,.0f} | "
            f"{first:,.0f} | {last:,.0f} | {entry['bytes_per_second'] / sequential:.2f}x |"
        )
    ratio = results["ratios"][f"{MEASURES[0]} / {MEASURES[1]}"]
    lines += ["", f"tfbuffers' `get_next` against the plain numpy gather of the same files: {ratio:.2f}x."]
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: pathlib.Path) -> None:
    """Each read's frames per second, second by second from cold."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for name in MEASURES:
        rates = results["measures"][name]["per_second_frames"]
        axis.plot(np.arange(1, len(rates) + 1), rates, marker="o", markersize=3, label=name)
    axis.set_yscale("log")
    axis.set_xlabel("seconds from cold")
    axis.set_ylabel("frames/s (28,224-byte observations)")
    axis.set_title(
        f"Reads of {results['file_bytes'] / 1e9:.0f} GB of files, "
        f"{results['times_free_page_cache']:.1f}x the free page cache"
    )
    axis.legend()
    axis.grid(True, which="both", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write(results: dict[str, Any], output_dir: pathlib.Path) -> str:
    """beyond_cache.{json,md,png} in `output_dir`; the table returned."""
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "beyond_cache.json").write_text(json.dumps(results, indent=2) + "\n")
    table = markdown(results)
    (output_dir / "beyond_cache.md").write_text(table)
    plot(results, output_dir / "beyond_cache.png")
    return table
