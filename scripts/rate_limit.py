"""Rate limiting, measured: writer processes and a learner on one Ray-hosted buffer with `samples_per_insert`.

Starts a local Ray cluster (loopback only) and a `RayReplayBuffer` with `min_size_to_sample`,
`samples_per_insert` R and `error_buffer` E (Reverb's `SampleToInsertRatio`). `--writers`
Ray actors each add frames through a `RayWriter` (of `--envs-per-writer` environments, a
frame every `--env-seconds`), while the learner, in this process, samples batches of
`--sample-batch-size` windows (one every `--train-seconds` of simulated training). The
rate limiter's counts are read every `--poll-seconds`, each a consistent snapshot taken
under the actor's lock, for `--seconds`.

The limiter's promise: once the learner has sampled, `inserts * R - samples` stays within
[`min_diff`, `max_diff`] (= `min_size * R` minus and plus E) at every moment, whichever side
is faster: the faster side waits. The outputs say the share of snapshots inside the bounds
(1.0 when the promise holds), the furthest excursion, and the rates; the figure shows the
difference over time against its bounds.

    python scripts/rate_limit.py --writers 3 --seconds 30 --output-dir out/rate_limit
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import threading
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import _args  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = _args.new_parser(__doc__)
    parser.add_argument("--writers", type=_args.positive_int, default=3, help="writer processes (Ray actors)")
    parser.add_argument("--envs-per-writer", type=_args.positive_int, default=2, help="environments per writer")
    parser.add_argument("--seconds", type=_args.positive_float, default=30.0, help="how long to measure")
    parser.add_argument("--samples-per-insert", type=_args.positive_float, default=4.0, help="R: windows per frame")
    parser.add_argument("--error-buffer", type=_args.positive_float, default=256.0, help="E: the ratio's slack")
    parser.add_argument("--min-size", type=_args.positive_int, default=512, help="min_size_to_sample, in frames")
    parser.add_argument("--sample-batch-size", type=_args.positive_int, default=32, help="windows per sample")
    parser.add_argument(
        "--env-seconds", type=_args.non_negative_float, default=0.002, help="a writer's pause per frame"
    )
    parser.add_argument(
        "--train-seconds", type=_args.non_negative_float, default=0.0, help="the learner's pause per batch"
    )
    parser.add_argument("--poll-seconds", type=_args.positive_float, default=0.05, help="time between snapshots")
    parser.add_argument("--output-dir", default="out/rate_limit", help="where rate_limit.{json,png} go")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked."""
    args = build_parser().parse_args(argv)
    if args.poll_seconds >= args.seconds:
        build_parser().error(f"--poll-seconds: expected less than --seconds ({args.seconds}), got {args.poll_seconds}")
    return args


if __name__ == "__main__":
    parse_args()  # --help and bad arguments answered before TensorFlow and Ray are imported

import _quiet  # noqa: E402, F401 (first: TensorFlow imported with its known start-up notices filtered)

# isort: split
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tqdm import tqdm  # noqa: E402

from tfbuffers import RayReplayBuffer  # noqa: E402

SPEC = {"obs": tf.TensorSpec([8], tf.float32), "step": tf.TensorSpec([], tf.int64)}


def _writer_class(ray: Any) -> Any:
    @ray.remote(num_cpus=0)
    class Writer:
        """A process adding its environments' frames through its own `RayWriter` until told to stop."""

        def __init__(self, buffer: RayReplayBuffer, num_envs: int, env_seconds: float) -> None:
            self.writer = buffer.writer(num_envs)
            self.env_seconds = env_seconds
            self.stop = threading.Event()
            self.added = 0

        def run(self, deadline_seconds: float) -> int:
            """Adds until `deadline_seconds` from now; returns the adds that returned."""
            num_envs = self.writer.batch_size
            end = time.monotonic() + deadline_seconds
            step = 0
            while time.monotonic() < end:
                frames = {"obs": np.full([num_envs, 8], step, np.float32), "step": np.full([num_envs], step, np.int64)}
                try:
                    self.writer.add_batch(frames)
                except TimeoutError:  # max_pending adds wait for the learner: this frame was not taken
                    continue
                step += 1
                self.added += num_envs
                if self.env_seconds:
                    time.sleep(self.env_seconds)
            return self.added

        def close(self) -> int:
            """Flushes (while the learner still samples) and releases the claim."""
            while True:
                try:
                    self.writer.close()
                    return self.added
                except TimeoutError:
                    continue

    return Writer


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Runs writers and a learner for `args.seconds`; returns the snapshots and what they show."""
    import ray

    num_envs = args.writers * args.envs_per_writer
    buffer = RayReplayBuffer(
        SPEC,
        capacity=num_envs * 20_000,
        batch_size=num_envs,
        min_size_to_sample=args.min_size,
        samples_per_insert=args.samples_per_insert,
        error_buffer=args.error_buffer,
        timeout=2.0,
        seed=0,
    )
    writers = [_writer_class(ray).remote(buffer, args.envs_per_writer, args.env_seconds) for _ in range(args.writers)]
    ray.get([writer.__ray_ready__.remote() for writer in writers])  # their processes up: the clock starts now
    runs = [writer.run.remote(args.seconds) for writer in writers]
    stop_learning = threading.Event()
    batches = [0]

    def learn() -> None:
        while not stop_learning.is_set():
            try:
                buffer.get_next(sample_batch_size=args.sample_batch_size)
            except TimeoutError:  # waiting for inserts (at the start, or writers done)
                continue
            batches[0] += 1
            if args.train_seconds:
                time.sleep(args.train_seconds)

    learner = threading.Thread(target=learn, name="learner")
    learner.start()
    start = time.monotonic()
    snapshots = []
    bar = None if args.no_progress else tqdm(total=round(args.seconds), unit="s", desc="rate limit", leave=False)
    while (now := time.monotonic() - start) < args.seconds:
        counts = buffer.rate_limiter_counts()
        snapshots.append([now, counts["inserts"], counts["samples"], counts["frames"]])
        if bar is not None:
            bar.update(int(now) - bar.n)
        time.sleep(args.poll_seconds)
    if bar is not None:
        bar.close()
    added = ray.get(runs)
    closed = ray.get([writer.close.remote() for writer in writers])  # the learner samples meanwhile
    stop_learning.set()
    learner.join()
    final = buffer.rate_limiter_counts()
    stored = int(buffer.num_frames())
    buffer.close()
    return summarize(args, snapshots, final, added, closed, stored, batches[0])


def summarize(
    args: argparse.Namespace,
    snapshots: list[list[float]],
    final: dict[str, Any],
    added: list[int],
    closed: list[int],
    stored: int,
    batches: int,
) -> dict[str, Any]:
    """The snapshots' differences against the bounds, and the rates."""
    times, inserts, samples, frames = (np.asarray(column, np.float64) for column in zip(*snapshots))
    difference = inserts * args.samples_per_insert - samples
    sampled = samples > 0  # the promise holds from the first sample on
    inside = (difference >= final["min_diff"]) & (difference <= final["max_diff"])
    span = times[-1] - times[np.argmax(sampled)] if sampled.any() else 0.0
    last, first = len(times) - 1, int(np.argmax(sampled))
    return {
        "config": {key: value for key, value in vars(args).items() if key not in ("output_dir", "no_progress")},
        "bounds": [final["min_diff"], final["max_diff"]],
        "snapshots": len(times),
        "share_inside_bounds": float(inside[sampled].mean()) if sampled.any() else None,
        "lowest_difference": float(difference[sampled].min()) if sampled.any() else None,
        "highest_difference": float(difference[sampled].max()) if sampled.any() else None,
        "inserts_per_second": float((inserts[last] - inserts[first]) / span) if span else None,
        "windows_per_second": float((samples[last] - samples[first]) / span) if span else None,
        "ratio_at_end": float(samples[last] / inserts[last]) if inserts[last] else None,
        "adds_returned": int(sum(added)),
        "adds_at_close": int(sum(closed)),
        "frames_stored": stored,
        "inserts_counted": int(final["inserts"]),
        "learner_batches": batches,
        "series": {
            "seconds": times.round(3).tolist(),
            "inserts": inserts.astype(int).tolist(),
            "samples": samples.astype(int).tolist(),
            "frames": frames.astype(int).tolist(),
        },
    }


def plot(result: dict[str, Any], path: pathlib.Path) -> None:
    """The difference over time against its bounds, and the two counts."""
    series, config = result["series"], result["config"]
    times = np.asarray(series["seconds"])
    inserts, samples = np.asarray(series["inserts"]), np.asarray(series["samples"])
    difference = inserts * config["samples_per_insert"] - samples
    low, high = result["bounds"]
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    top.plot(times, inserts * config["samples_per_insert"], label="inserts x R")
    top.plot(times, samples, label="windows sampled")
    top.set_ylabel("count")
    top.legend()
    bottom.plot(times, difference, color="black", label="inserts x R - samples")
    bottom.axhline(low, color="tab:red", linestyle="--", label="min_diff")
    bottom.axhline(high, color="tab:red", linestyle=":", label="max_diff")
    bottom.set_xlabel("seconds")
    bottom.set_ylabel("difference")
    bottom.legend(loc="lower right")
    figure.suptitle(
        f"{config['writers']} writers x {config['envs_per_writer']} envs, R={config['samples_per_insert']:g}, "
        f"E={config['error_buffer']:g}: {result['share_inside_bounds']:.0%} of snapshots inside the bounds"
        if result["share_inside_bounds"] is not None
        else "no sample made"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    """Measures, writes rate_limit.json and rate_limit.png, and prints what they show."""
    args = parse_args(argv)
    result = measure(args)
    output_dir = pathlib.Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "rate_limit.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, output_dir / "rate_limit.png")
    print(
        f"{result['snapshots']} snapshots: {result['share_inside_bounds']} inside [{result['bounds'][0]:g}, "
        f"{result['bounds'][1]:g}] (lowest {result['lowest_difference']}, highest {result['highest_difference']}); "
        f"{result['inserts_per_second']} frames/s inserted, {result['windows_per_second']} windows/s sampled, "
        f"ratio at the end {result['ratio_at_end']}; {result['adds_returned']} adds returned, "
        f"{result['frames_stored']} frames stored. Outputs in {output_dir}/rate_limit.{{json,png}}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
