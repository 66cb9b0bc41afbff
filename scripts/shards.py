"""Shards, measured and modelled: K Ray buffer actors, M writer processes and a learner, on this machine.

Past one buffer actor, a deployment is N shards (`RayReplayBuffer`s, one per machine), M writers each adding
to one of them, and learners sampling them all through `tfbuffers.sharded_dataset`. This script measures the
costs that decide how such a deployment scales, on one machine (a local Ray cluster, loopback only), fits a
model to the runs of one shard, and checks it against the runs of several:

- For each shard count K of `--shards` and writer count M of `--writers`: the M writers (Ray actors, each a
  `RayWriter` of `--envs-per-writer` environments on shard `m % K`) add as fast as they can for `--seconds`
  (the inserts/s), then a learner in this process samples the K shards through `sharded_dataset` for
  `--seconds` (the windows/s). Each process's CPU time is read (the shards' and the writers' from their
  processes, the learner's from this one).
- The fit (K = 1): a writer alone adds `r1` frames/s (it has one call in flight: the round trip bounds it) and
  a learner samples `L` windows/s; a shard spends `s` CPU seconds per frame inserted and `t` per window sampled
  (its calls run under one lock: one core at most); the whole machine (Ray's processes too) `m` per frame and
  `n` per window.
- The model: inserts/s = min(M * r1, K / s, C / m) and windows/s = min(L, K / t, C / n) on C cores: writers
  bounded by their round trips, then the shards, then the machine. On C = 2 cores the machine's
  bound comes first; on a deployment of one machine per shard it does not, and the model tells how many
  shards (and machines) `--total-actors` actors adding `--actor-rate` frames/s each and `--total-frames`
  frames need, and what breaks first: insert calls, sampling, memory or the network.

Outputs: shards.json (every run, the fit, the predictions and the extrapolation), shards.md (predicted against
measured) and shards.png (the same, plotted).

    python scripts/shards.py --shards 1,2,4 --writers 1,2,4,8,16 --output-dir out/shards
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import sys
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import _args  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = _args.new_parser(__doc__)
    parser.add_argument("--shards", type=_args.positive_ints, default=[1, 2, 4], help="shard counts K to run")
    parser.add_argument("--writers", type=_args.positive_ints, default=[1, 2, 4, 8, 16], help="writer counts M")
    parser.add_argument("--envs-per-writer", type=_args.positive_int, default=1, help="environments per writer")
    parser.add_argument("--seconds", type=_args.positive_float, default=4.0, help="each run's adds, then samples")
    parser.add_argument("--obs-floats", type=_args.positive_int, default=64, help="float32s per observation")
    parser.add_argument(
        "--capacity", type=_args.positive_int, default=200_000, help="frames per shard (rounded up to the segments)"
    )
    parser.add_argument("--sample-batch-size", type=_args.positive_int, default=64, help="windows per batch")
    parser.add_argument("--num-steps", type=_args.positive_int, default=2, help="frames per window")
    parser.add_argument("--total-actors", type=_args.positive_int, default=1000, help="the extrapolation's writers")
    parser.add_argument(
        "--actor-rate", type=_args.positive_float, default=100.0, help="frames/s each of those actors adds"
    )
    parser.add_argument("--total-frames", type=_args.positive_float, default=1e9, help="the extrapolation's frames")
    parser.add_argument(
        "--samples-per-insert", type=_args.positive_float, default=8.0, help="windows sampled per frame, at scale"
    )
    parser.add_argument(
        "--machine-gib", type=_args.positive_float, default=None, help="memory per shard machine (None: this one's)"
    )
    parser.add_argument("--output-dir", default="out/shards", help="where shards.{json,md,png} go")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if 1 not in args.shards:
        parser.error(f"--shards: expected 1 among the counts (the model is fitted to one shard), got {args.shards}")
    if args.capacity < args.num_steps:
        parser.error(f"--capacity: expected at least --num-steps ({args.num_steps}), got {args.capacity}")
    return args


if __name__ == "__main__":
    parse_args()  # --help and bad arguments answered before TensorFlow and Ray are imported

import _quiet  # noqa: E402, F401 (first: TensorFlow imported with its known start-up notices filtered)

# isort: split
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import psutil  # noqa: E402
import tensorflow as tf  # noqa: E402
from tqdm import tqdm  # noqa: E402

import tfbuffers  # noqa: E402
from tfbuffers.remote.ray.cluster import NAMESPACE  # noqa: E402

STARTUP_SECONDS = 0.5  # the writers' common start, after the driver has told them all (they are warm: `warm`)


def spec(obs_floats: int) -> dict[str, tf.TensorSpec]:
    """The frames: an observation of `obs_floats` float32s and a step counter."""
    return {"obs": tf.TensorSpec([obs_floats], tf.float32), "step": tf.TensorSpec([], tf.int64)}


def _writer_class(ray: Any) -> Any:
    @ray.remote(num_cpus=0)
    class Writer:
        """A writer process: adds through its own `RayWriter` as fast as it can, from a common start time."""

        def warm(self, buffers: list[Any], num_envs: int, obs_floats: int) -> None:
            """A frame through a writer of each buffer: this process's first connection and add are slow."""
            for buffer in buffers:
                with buffer.writer(num_envs) as writer:
                    writer.add_batch(frame(num_envs, obs_floats, -1))

        def run(self, buffer: Any, num_envs: int, obs_floats: int, start_at: float, seconds: float) -> list[float]:
            """(frames added, seconds, CPU seconds of this process, seconds late) from `start_at` (wall clock)."""
            with buffer.writer(num_envs) as writer:
                writer.add_batch(frame(num_envs, obs_floats, -1))  # connected and warm before the clock starts
                writer.flush()
                late = time.time() - start_at  # > 0: this writer was not ready in time (its rate is still its own)
                time.sleep(max(0.0, -late))
                cpu, start = time.process_time(), time.perf_counter()
                steps = 0
                while time.perf_counter() - start < seconds:
                    writer.add_batch(frame(num_envs, obs_floats, steps))
                    steps += 1
                writer.flush()
                return [steps * num_envs, time.perf_counter() - start, time.process_time() - cpu, max(0.0, late)]

    return Writer


def frame(num_envs: int, obs_floats: int, step: int) -> dict[str, np.ndarray]:
    """One frame per environment."""
    return {
        "obs": np.full([num_envs, obs_floats], step, np.float32),
        "step": np.full([num_envs], step, np.int64),
    }


def actor_pid(ray: Any, buffer: Any) -> int:
    """The process id of a `RayReplayBuffer`'s actor."""
    actor = ray.get_actor(buffer.name, namespace=NAMESPACE)
    return int(ray.get(actor.__ray_call__.remote(lambda _: os.getpid())))


def machine_cpu_seconds() -> float:
    """CPU seconds every process of the machine has spent busy (Ray's own processes too), since boot."""
    times = psutil.cpu_times()  # on Linux `guest` is counted in `user` already
    busy = ("user", "nice", "system", "irq", "softirq", "steal")
    return float(sum(getattr(times, name, 0.0) for name in busy))


def cpu_seconds(pids: list[int]) -> np.ndarray:
    """User and system CPU seconds of each process."""
    times = [psutil.Process(pid).cpu_times() for pid in pids]
    return np.array([t.user + t.system for t in times])


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every (K, M) run: inserts/s and the CPU each process spent; per K, the learner's windows/s and CPU."""
    from tfbuffers.ray_replay_buffer import ensure_ray

    ray = ensure_ray()
    frames_spec = spec(args.obs_floats)
    largest_m, largest_k = max(args.writers), max(args.shards)
    segments = args.envs_per_writer * largest_m  # every writer's environments on one shard at K = 1
    shards = [
        tfbuffers.RayReplayBuffer(
            frames_spec,
            batch_size=segments,
            max_length=math.ceil(args.capacity / segments),  # at least --capacity frames, shared (elastic layout)
            name=f"shard-{k}-{os.getpid()}",
            seed=k,
        )
        for k in range(largest_k)
    ]
    writers = [_writer_class(ray).remote() for _ in range(largest_m)]
    shard_pids = [actor_pid(ray, shard) for shard in shards]
    ray.get([writer.warm.remote(shards, args.envs_per_writer, args.obs_floats) for writer in writers])
    runs, learners = [], []
    steps = len(args.shards) * (len(args.writers) + 1) + 1  # every run, every learner, the mixed one
    bar = tqdm(total=steps, desc="shards", disable=args.no_progress)
    try:
        for k in args.shards:
            for m in args.writers:
                for shard in shards:
                    shard.clear()
                start_at = time.time() + STARTUP_SECONDS
                envs, floats = args.envs_per_writer, args.obs_floats
                running = [writers[i].run.remote(shards[i % k], envs, floats, start_at, args.seconds) for i in range(m)]
                # The shards' and the machine's CPU over the writers' clock: from the common start, for `seconds`.
                time.sleep(max(0.0, start_at - time.time()))
                before, machine = cpu_seconds(shard_pids[:k]), machine_cpu_seconds()
                time.sleep(args.seconds)
                shard_cpu, machine = cpu_seconds(shard_pids[:k]) - before, machine_cpu_seconds() - machine
                done = ray.get(running)
                added = sum(frames for frames, *_ in done)
                runs.append(
                    {
                        "shards": k,
                        "writers": m,
                        "frames": int(added),
                        "inserts_per_second": sum(frames / seconds for frames, seconds, *_ in done),
                        "per_writer": [frames / seconds for frames, seconds, *_ in done],
                        "seconds_late": max(late for *_, late in done),
                        "shard_cpu_seconds": shard_cpu.tolist(),
                        "writer_cpu_seconds": [cpu for _, _, cpu, _ in done],
                        "machine_cpu_seconds": machine,
                        "frames_held": [int(shard.num_frames()) for shard in shards[:k]],
                    }
                )
                bar.update()
            if k == 1:  # the mixing path of several shards, on one: `sharded_dataset` of the shard twice
                learners.append(learn(args, shards[:1] * 2, shard_pids[:1], mixed=True))
                bar.update()
            learners.append(learn(args, shards[:k], shard_pids[:k]))
            bar.update()
        memory = [psutil.Process(pid).memory_info().rss for pid in shard_pids]
    finally:
        bar.close()
        for writer in writers:
            ray.kill(writer)
        for shard in shards:
            shard.close()
    return {"runs": runs, "learners": learners, "shard_rss_bytes": memory}


def learn(args: argparse.Namespace, shards: list[Any], pids: list[int], mixed: bool = False) -> dict[str, Any]:
    """Windows per second a learner in this process samples the shards at, through `sharded_dataset`.

    `mixed`: `shards` names one shard twice, for the cost of mixing shards (window by window) on one.
    """
    dataset = tfbuffers.sharded_dataset(shards, args.sample_batch_size, args.num_steps, seed=0)
    iterator = iter(dataset.prefetch(tf.data.AUTOTUNE))
    next(iterator)  # traced and warm before the clock starts
    before, machine = cpu_seconds(pids), machine_cpu_seconds()
    cpu, start = time.process_time(), time.perf_counter()
    batches = 0
    while time.perf_counter() - start < args.seconds:
        next(iterator)
        batches += 1
    elapsed = time.perf_counter() - start
    windows = batches * args.sample_batch_size
    return {
        "shards": len(pids),
        "mixed": mixed or len(pids) > 1,
        "windows": windows,
        "windows_per_second": windows / elapsed,
        "learner_cpu_seconds": time.process_time() - cpu,
        "shard_cpu_seconds": (cpu_seconds(pids) - before).tolist(),
        "machine_cpu_seconds": machine_cpu_seconds() - machine,
    }


def fit(measured: dict[str, Any], seconds: float) -> dict[str, float]:
    """The model's costs, from the runs of one shard (seconds per frame inserted, or per window sampled).

    r1: one writer's frames/s alone; s, w, m: CPU per frame of the shard, the writers and the whole machine (Ray's
    own processes too), at the busiest run. L: the learner's windows/s on one shard's batched `as_dataset` (its
    threads may use more than a core); t, l, n: CPU per window of the shard, the learner and the machine there;
    L_mix, t_mix, l_mix, n_mix: the same for `sharded_dataset`'s mix of shards.
    """
    one = [run for run in measured["runs"] if run["shards"] == 1]
    alone = min(one, key=lambda run: run["writers"])
    busiest = max(one, key=lambda run: run["writers"])  # the shard at its busiest: its cost per frame, least noise
    costs = {
        "r1": alone["inserts_per_second"] / alone["writers"],
        "s": sum(busiest["shard_cpu_seconds"]) / (busiest["inserts_per_second"] * seconds),  # over the same clock
        "w": sum(busiest["writer_cpu_seconds"]) / busiest["frames"],
        "m": busiest["machine_cpu_seconds"] / (busiest["inserts_per_second"] * seconds),
    }
    for entry in measured["learners"]:
        if entry["shards"] == 1:
            suffix = "_mix" if entry["mixed"] else ""
            costs["L" + suffix] = entry["windows_per_second"]
            costs["t" + suffix] = sum(entry["shard_cpu_seconds"]) / entry["windows"]
            costs["l" + suffix] = entry["learner_cpu_seconds"] / entry["windows"]
            costs["n" + suffix] = entry["machine_cpu_seconds"] / entry["windows"]
    return costs


def per(seconds: float, cost: float) -> float:
    """How many of what costs `cost` CPU seconds fit in `seconds`: no bound (inf) where none was measured.

    A short run can read no CPU time at all from a process (the clock's 10 ms steps).
    """
    return seconds / cost if cost > 0 else math.inf


def predict_inserts(costs: dict[str, float], shards: int, writers: int, cores: float) -> tuple[float, str]:
    """Inserts/s of `writers` writers on `shards` shards, all on `cores` cores, and the bound that sets it."""
    bounds = {
        "writers' round trips": writers * costs["r1"],
        "shards": per(shards, costs["s"]),
        "machine's cores": per(cores, costs["m"]),
    }
    first = min(bounds, key=bounds.__getitem__)
    return bounds[first], first


def predict_windows(costs: dict[str, float], shards: int, mixed: bool, cores: float) -> tuple[float, str]:
    """Windows/s one learner samples `shards` shards at (`mixed`: `sharded_dataset`'s mix), on `cores` cores."""
    suffix = "_mix" if mixed else ""
    bounds = {
        "learner": costs["L" + suffix],
        "shards": per(shards, costs["t" + suffix]),
        "machine's cores": per(cores, costs["n" + suffix]),
    }
    first = min(bounds, key=bounds.__getitem__)
    return bounds[first], first


def extrapolate(args: argparse.Namespace, costs: dict[str, float], bytes_per_frame: float) -> dict[str, Any]:
    """Shards for `--total-actors` actors and `--total-frames` frames, one machine per shard, 70% busy at most.

    Learners sample the shards through `sharded_dataset`'s mix (`t_mix`, `L_mix`); `if_batched`: the shards and
    learners that one shard's batched calls (`t`, `L`) would need.
    """
    busy = 0.7
    inserts = args.total_actors * args.actor_rate
    windows = inserts * args.samples_per_insert
    machine = (args.machine_gib or psutil.virtual_memory().total / 2**30) * 2**30
    needed = {
        "insert calls": math.ceil(inserts * costs["s"] / busy),  # a shard's calls run on one core
        "sampling": math.ceil(windows * costs["t_mix"] / busy),
        "memory": math.ceil(args.total_frames * bytes_per_frame / (busy * machine)),
    }
    shards = max(needed.values())
    return {
        "inserts_per_second": inserts,
        "windows_per_second": windows,
        "shards_needed_for": needed,
        "shards": shards,
        "first_bottleneck": max(needed, key=needed.__getitem__),
        "per_shard": {
            "inserts_per_second": inserts / shards,
            "windows_per_second": windows / shards,
            "memory_gib": args.total_frames * bytes_per_frame / shards / 2**30,
            "network_in_mib_per_second": inserts / shards * bytes_per_frame / 2**20,
            "network_out_mib_per_second": windows / shards * args.num_steps * bytes_per_frame / 2**20,
        },
        "learners_needed": math.ceil(windows / (busy * costs["L_mix"])),
        "if_batched": {
            "shards_for_sampling": math.ceil(windows * costs["t"] / busy),
            "learners_needed": math.ceil(windows / (busy * costs["L"])),
        },
    }


def summarize(args: argparse.Namespace, measured: dict[str, Any]) -> dict[str, Any]:
    """The fit, each run's prediction against its measure, and the extrapolation."""
    costs = fit(measured, args.seconds)
    cores = float(os.cpu_count() or 1)
    for run in measured["runs"]:
        run["predicted"], run["bound"] = predict_inserts(costs, run["shards"], run["writers"], cores)
        run["error"] = run["inserts_per_second"] / run["predicted"] - 1
    for entry in measured["learners"]:
        entry["predicted"], entry["bound"] = predict_windows(costs, entry["shards"], entry["mixed"], cores)
        entry["error"] = entry["windows_per_second"] / entry["predicted"] - 1
    payload = 4 * args.obs_floats + 8  # the observation and the step counter
    bytes_per_frame = payload + 16  # each row's segment and add number in the elastic store
    return {
        "config": {key: value for key, value in vars(args).items() if key not in ("output_dir", "no_progress")},
        "cores": cores,
        "costs": costs,
        "bytes_per_frame": bytes_per_frame,
        **measured,
        "largest_error": max(abs(entry["error"]) for entry in [*measured["runs"], *measured["learners"]]),
        "extrapolation": extrapolate(args, costs, bytes_per_frame),
    }


def table(result: dict[str, Any]) -> str:
    """The runs, predicted against measured, and the extrapolation, as markdown."""
    costs = result["costs"]
    lines = [
        f"Fit (one shard): r1 = {costs['r1']:,.0f} frames/s per writer; a shard {costs['s'] * 1e6:,.0f} us of CPU "
        f"per frame inserted and {costs['t'] * 1e6:,.1f} us per window sampled ({costs['t_mix'] * 1e6:,.0f} us "
        f"mixed); a writer {costs['w'] * 1e6:,.0f} us per frame; the machine {costs['m'] * 1e6:,.0f} us per frame; "
        f"the learner {costs['l'] * 1e6:,.1f} us per window at {costs['L']:,.0f} windows/s "
        f"({costs['l_mix'] * 1e6:,.1f} us at {costs['L_mix']:,.0f} mixed); "
        f"{result['cores']:g} cores.",
        "",
        "| shards | writers | inserts/s measured | predicted | error | bound |",
        "|---|---|---|---|---|---|",
    ]
    for run in result["runs"]:
        lines.append(
            f"| {run['shards']} | {run['writers']} | {run['inserts_per_second']:,.0f} | {run['predicted']:,.0f} | "
            f"{run['error']:+.0%} | {run['bound']} |"
        )
    late = [f"{run['shards']} x {run['writers']}" for run in result["runs"] if run["seconds_late"] > 0.1]
    if late:  # their adds did not all overlap: the run's rate is the sum of windows that overlap only in part
        lines += ["", f"Writers started late (more than 0.1 s) in the runs of shards x writers: {', '.join(late)}."]
    lines += ["", "| shards | path | windows/s measured | predicted | error | bound |", "|---|---|---|---|---|---|"]
    for entry in result["learners"]:
        path = "mixed (`sharded_dataset`)" if entry["mixed"] else "batched (`as_dataset`)"
        lines.append(
            f"| {entry['shards']} | {path} | {entry['windows_per_second']:,.0f} | {entry['predicted']:,.0f} | "
            f"{entry['error']:+.0%} | {entry['bound']} |"
        )
    scale, config = result["extrapolation"], result["config"]
    per = scale["per_shard"]
    lines += [
        "",
        f"At scale: {config['total_actors']:,} actors x {config['actor_rate']:g} frames/s, "
        f"{config['total_frames']:,.0f} frames, {config['samples_per_insert']:g} windows per frame: "
        f"{scale['shards']} shards (insert calls {scale['shards_needed_for']['insert calls']}, sampling "
        f"{scale['shards_needed_for']['sampling']}, memory {scale['shards_needed_for']['memory']}); first "
        f"bottleneck: {scale['first_bottleneck']}. Per shard: {per['inserts_per_second']:,.0f} inserts/s, "
        f"{per['windows_per_second']:,.0f} windows/s, {per['memory_gib']:,.1f} GiB, "
        f"{per['network_in_mib_per_second']:,.1f} MiB/s in, {per['network_out_mib_per_second']:,.1f} MiB/s out; "
        f"{scale['learners_needed']} learner process(es) (with one shard's batched calls: "
        f"{scale['if_batched']['learners_needed']}, and {scale['if_batched']['shards_for_sampling']} shard(s) for "
        "sampling).",
    ]
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: pathlib.Path) -> None:
    """Inserts/s against writers, measured (points) and predicted (lines), one colour per shard count."""
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5), gridspec_kw={"width_ratios": [3, 1]})
    for number, k in enumerate(sorted({run["shards"] for run in result["runs"]})):
        runs = [run for run in result["runs"] if run["shards"] == k]
        writers = [run["writers"] for run in runs]
        style = ("-", "--", ":", "-.")[number % 4]  # the lines may coincide (one machine's bound): told apart
        (line,) = left.plot(writers, [run["predicted"] for run in runs], style, label=f"{k} shard(s): model")
        left.scatter(writers, [run["inserts_per_second"] for run in runs], color=line.get_color(), label="measured")
    left.set_xscale("log", base=2)
    left.set_xticks(sorted({run["writers"] for run in result["runs"]}))
    left.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    left.set_ylim(bottom=0)
    left.set_xlabel("writer processes")
    left.set_ylabel("frames inserted / s")
    left.legend()
    learners = result["learners"]
    positions = np.arange(len(learners))
    right.bar(positions - 0.2, [entry["windows_per_second"] for entry in learners], 0.4, label="measured")
    right.bar(positions + 0.2, [entry["predicted"] for entry in learners], 0.4, label="model")
    right.set_xticks(
        positions, [f"{entry['shards']}\n{'mixed' if entry['mixed'] else 'batched'}" for entry in learners]
    )
    right.set_xlabel("shards")
    right.set_ylabel("windows sampled / s (one learner)")
    right.legend()
    figure.suptitle(f"Shards on one machine of {result['cores']:g} cores: measured (points, bars) and model")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    """Measures, fits, writes shards.json, shards.md and shards.png, and prints the table."""
    args = parse_args(argv)
    result = summarize(args, measure(args))
    output_dir = pathlib.Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "shards.json").write_text(json.dumps(result, indent=1) + "\n")
    (output_dir / "shards.md").write_text(table(result))
    plot(result, output_dir / "shards.png")
    print(table(result) + f"Outputs in {output_dir}/shards.{{json,md,png}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
