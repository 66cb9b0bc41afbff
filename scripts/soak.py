"""Soak run: writer and reader threads on one buffer for minutes, every frame checked, memory tracked.

Runs `tfbuffers.testing.run` in rounds on one buffer (clearing it between rounds), records
the resident memory after each round, and writes a plot and a JSON summary. Memory
should stay flat after the first rounds: the summary reports the growth from the
end of the first quarter of the run to the end, and that growth per buffer
operation, in resident bytes and in Python heap blocks (`sys.getallocatedblocks`).
Threads share glibc's main heap and it is trimmed after each round, so that the
resident size counts live memory, not glibc's fragments. It first measures what
TensorFlow itself keeps per eager tensor it makes and frees in this process: on
Python 3.11, TensorFlow 2.15 keeps one 16-byte heap block per tensor
(tensorflow/tensorflow#62551; none on Python 3.10), and each TF buffer operation
makes 4 to 6 tensors (its inputs and its results). Blocks per operation
near that count, and no growth on Python 3.10, mean the growth is TensorFlow's.

    python scripts/soak.py --buffer tf_uniform --minutes 10
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import pathlib
import sys
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import _args  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = _args.new_parser(__doc__)
    parser.add_argument(
        "--buffer", default="tf_uniform", choices=["tf_uniform", "py_uniform"], help="the buffer kind under test"
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to run")
    parser.add_argument("--round-seconds", type=float, default=10.0, help="length of one stress round")
    parser.add_argument("--batch-size", type=int, default=4, help="segments")
    parser.add_argument("--max-length", type=int, default=8, help="frames per segment (short: constant overwrites)")
    parser.add_argument("--graph-writer", action="store_true", help="one writer adding through tf.function")
    parser.add_argument("--output-dir", default="out/soak", help="where soak.json and soak.png go")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked."""
    return build_parser().parse_args(argv)


if __name__ == "__main__":
    parse_args()  # --help and bad arguments answered before TensorFlow is imported

import _quiet  # noqa: E402, F401 (first: TensorFlow imported with its known start-up notices filtered)

# isort: split
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import psutil  # noqa: E402
import tensorflow as tf  # noqa: E402
from _common import release_free_memory  # noqa: E402
from tqdm import tqdm  # noqa: E402

import tfbuffers  # noqa: E402
from tfbuffers import kinds  # noqa: E402
from tfbuffers import testing as stress  # noqa: E402

COUNTS = ("seconds", "adds", "samples", "dataset_batches", "gathers", "frames_checked")


def make_buffer(kind: str, batch_size: int, max_length: int) -> tfbuffers.ReplayBuffer:
    """The buffer under test."""
    return kinds.make(kind, stress.SPEC, batch_size, max_length)


_M_ARENA_MAX = -8  # glibc's mallopt parameter


def one_malloc_arena() -> None:
    """Makes threads started from now on share glibc's main heap, so that RSS counts live memory.

    By default glibc gives threads their own arenas, which keep freed memory in
    fragments: with threads allocating at this rate the resident size creeps up
    while the bytes in use stay flat. (`MALLOC_ARENA_MAX=1` in the environment
    does the same for a whole process.)
    """
    with contextlib.suppress(OSError, AttributeError):  # not glibc: RSS then includes free heap memory
        ctypes.CDLL("libc.so.6").mallopt(_M_ARENA_MAX, 1)


def tensorflow_blocks_per_tensor(count: int = 50_000) -> float:
    """Python heap blocks this process keeps per eager tensor that TensorFlow makes and frees (0 if none)."""
    value = np.zeros(4)
    for _ in range(count // 4):
        tf.convert_to_tensor(value)  # warm-up: TensorFlow's caches
    gc.collect()
    before = sys.getallocatedblocks()
    for _ in range(count):
        tf.convert_to_tensor(value)
    gc.collect()
    return (sys.getallocatedblocks() - before) / count


def soak(
    kind: str,
    minutes: float,
    round_seconds: float,
    batch_size: int,
    max_length: int,
    graph_writer: bool,
    progress: bool,
) -> dict[str, Any]:
    """Runs rounds of `stress.run` for `minutes`; returns totals and the memory series."""
    one_malloc_arena()
    tensorflow_baseline = tensorflow_blocks_per_tensor()
    buffer = make_buffer(kind, batch_size, max_length)
    add = tf.function(buffer.add_batch) if graph_writer else None
    writers = 1 if graph_writer else 2
    totals = dict.fromkeys(COUNTS, 0.0)
    threads = 0
    operations: list[int] = []
    memory: list[tuple[float, float]] = []
    blocks: list[int] = []
    started = time.perf_counter()
    rounds = max(1, round(minutes * 60 / round_seconds))
    for _ in tqdm(range(rounds), desc=f"soak {kind}", unit="round", disable=not progress):
        report = stress.run(buffer, seconds=round_seconds, writers=writers, add=add, min_operations=1)
        for key in COUNTS:
            totals[key] += getattr(report, key)
        threads = report.threads
        operations.append(report.operations)
        buffer.clear()
        gc.collect()
        release_free_memory()
        memory.append((time.perf_counter() - started, psutil.Process().memory_info().rss / 2**20))
        blocks.append(sys.getallocatedblocks())
    quarter_index = max(0, len(memory) // 4 - 1)
    later_operations = sum(operations[quarter_index + 1 :])
    growth = memory[-1][1] - memory[quarter_index][1]
    block_growth = blocks[-1] - blocks[quarter_index]
    return {
        "buffer": kind,
        "rounds": rounds,
        "threads": threads,
        "totals": totals,
        "memory_mb": memory,
        "memory_growth_after_first_quarter_mb": growth,
        "bytes_per_operation_after_first_quarter": growth * 2**20 / later_operations if later_operations else 0.0,
        "python_blocks_per_operation_after_first_quarter": block_growth / later_operations if later_operations else 0.0,
        "tensorflow_blocks_per_tensor": tensorflow_baseline,
    }


def plot(result: dict[str, Any], path: pathlib.Path) -> None:
    """Resident memory over the run."""
    seconds, megabytes = zip(*result["memory_mb"])
    figure, axes = plt.subplots(figsize=(7, 3.5))
    axes.plot(seconds, megabytes, marker=".")
    axes.set_xlabel("seconds")
    axes.set_ylabel("resident memory (MiB)")
    axes.set_title(f"soak: {result['buffer']}, {int(result['totals']['frames_checked']):,} frames checked")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    """Runs the soak and writes its outputs."""
    args = parse_args(argv)
    result = soak(
        args.buffer,
        args.minutes,
        args.round_seconds,
        args.batch_size,
        args.max_length,
        args.graph_writer,
        not args.no_progress,
    )
    output_dir = pathlib.Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "soak.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, output_dir / "soak.png")
    totals = result["totals"]
    print(
        f"{result['buffer']}: {result['threads']} threads, {totals['seconds']:.0f} s, "
        f"{int(totals['adds']):,} adds, {int(totals['samples']):,} samples, "
        f"{int(totals['dataset_batches']):,} dataset batches, {int(totals['gathers']):,} gathers; "
        f"{int(totals['frames_checked']):,} frames checked, none torn. Resident memory "
        f"{result['memory_mb'][0][1]:.0f} -> {result['memory_mb'][-1][1]:.0f} MiB "
        f"({result['memory_growth_after_first_quarter_mb']:+.1f} MiB after the first quarter, "
        f"{result['bytes_per_operation_after_first_quarter']:+.0f} bytes and "
        f"{result['python_blocks_per_operation_after_first_quarter']:+.1f} Python heap blocks per operation; "
        f"TensorFlow itself keeps {result['tensorflow_blocks_per_tensor']:.2f} blocks per tensor it makes here). "
        f"Outputs in {output_dir}/soak.{{json,png}}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
