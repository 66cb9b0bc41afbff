"""Benchmark tfbuffers beside TF-Agents, Reverb and a plain numpy ring, in one run.

Workloads (as in the project's design):
  control: observation f32[17], action f32[6], reward/discount f32, step types i32; 8 envs;
           1M frames; sample batch 256, num_steps 2.
  atari:   observation u8[84,84,4], action i32, reward/discount f32, step types i32; 4 envs;
           40k frames; sample batch 32, num_steps 2.
  flashbax: observation u8[32,32,3] (Flashbax's published CPU workload), action i32; 8 envs;
           500k frames; sample batch 256, num_steps 2 (not run unless asked: --workloads).
  torchrl: observation u8[3,32,32], action f32[5] (TorchRL's own replay-buffer benchmark's items);
           8 envs; 100k frames; sample batch 256, num_steps 2 (not run unless asked).
Items are TF-Agents `Trajectory`s, so TF-Agents' Reverb observer can write them.

Systems: tfbuffers' TF and py uniform buffers, TF-Agents' TFUniformReplayBuffer and
PyUniformReplayBuffer, TF-Agents' Reverb path (ReverbReplayBuffer + ReverbAddTrajectoryObserver
on a local server), and three references that store or check nothing more than they must: a
plain numpy ring write + fancy-index gather of the same bytes (the memory-bandwidth limit), bare
`tf.Variable`s written and sampled with no bookkeeping (the floor of an in-graph buffer), and a
tf.data pipeline of `tf.fill`s (the ceiling of any `as_dataset`). Each system is built, filled and
measured several times after a warm-up (a sampling measure for up to 2 s of calls), then freed
before the next (the run holds one system at a time; the Reverb systems at most 100k frames); each
peer (TF-Agents' buffers, cpprb) runs first, in a new process of its own (--quick: one for them all);
the median and the range are reported, and ratios are tfbuffers / peer from the same run.
Sampling is measured through the Python iterator, inside a learner's compiled loop, and by
direct `get_next`; for the TF systems, the ops one in-graph sample and add run are counted
too. Where the time went is in results.json (`phase_seconds`), and what the run's processes held at
most, summed (`tree_memory_peaks`: by RSS and by PSS, a shared page once). Then --actors processes add to one
shared buffer at once, a Reverb server and a Ray-hosted buffer (--actor-backends), and a learner
samples each through `as_dataset`. Flashbax's uniform and prioritized trajectory buffers (JAX on the
CPU) run in a process of their own environment (--flashbax-env, made by --flashbax-setup), on the
same workload, and join the tables; so do TorchRL's replay buffers (PyTorch on the CPU: uniform,
prioritized, memory-mapped, and slices of episodes; --torchrl-env, made by --torchrl-setup).
Outputs: a markdown table, JSON and a bar chart in --output-dir.

    python scripts/benchmark.py            # full: 1M frames, 3 repetitions, ~20 minutes (docs/benchmarks.md)
    python scripts/benchmark.py --quick    # small frames, 2 repetitions: about three minutes on 2 cores
    python scripts/benchmark.py --sweep    # how each local buffer's costs grow with capacity and batch size
    python scripts/benchmark.py --beyond-cache  # sampling memory-mapped files twice the page cache, from disk
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import importlib.metadata
import importlib.util
import json
import pathlib
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import _args  # noqa: E402
import _beyond_cache  # noqa: E402 (no TensorFlow at import, as _sweep)
import _peer_runs  # noqa: E402 (the standard library only)
import _sweep  # noqa: E402 (no TensorFlow at import: the arguments are checked with its names first)
from _bench.names import ACTOR_BACKENDS, OUT_OF_PROCESS, OWN_ENV_PEERS, SYSTEM_NAMES, WORKLOAD_NAMES  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = _args.new_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="small frames and repetitions: a smoke run")
    parser.add_argument(
        "--frames",
        type=int,
        default=None,
        help="frames each system stores, for every workload (None: the workload's; --quick: 16,000, atari 2,000); "
        "a multiple of 8, at least 512",
    )
    parser.add_argument(
        "--workloads",
        default="control,atari",
        help="comma-separated: control, atari, flashbax (Flashbax's published one: 500k frames of uint8[32, 32, 3], "
        "batch 256), torchrl (TorchRL's benchmark's items: uint8[3, 32, 32] and float32[5], 100k frames, batch 256)",
    )
    parser.add_argument(
        "--systems",
        default=None,
        help="comma-separated system names to run (None: every one installed), e.g. 'tfbuffers py,cpprb PER'",
    )
    parser.add_argument("--repetitions", type=int, default=None, help="runs of each measure (None: 3, quick 2)")
    parser.add_argument(
        "--actors",
        default=None,
        help="actor process counts adding to one buffer (each of --actor-backends), e.g. 1,2,4 (None: 1,2,4; "
        "quick 1; '0' for none)",
    )
    parser.add_argument(
        "--actor-backends",
        default=None,
        help="the buffers actors add to, comma-separated, among 'tfbuffers Reverb' (dm-reverb) and 'tfbuffers Ray' "
        "(the ray extra) (None: each that imports here)",
    )
    parser.add_argument(
        "--actor-seconds", type=float, default=None, help="seconds each actor adds for (None: 5, quick 2)"
    )
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="instead of the workloads: the scaling sweep, every local buffer kind's add, block add, sample and "
        "sample + update at capacities 10k to 10M frames and batch sizes 32 to 4096 (quick: 1k and 10k, batches 32 "
        "and 256), "
        "written to sweep.md/.json and one log-log figure per measure",
    )
    parser.add_argument(
        "--beyond-cache",
        action="store_true",
        help="instead of the workloads: sampling a py buffer over memory-mapped files larger than the page cache "
        "(Atari frames, --beyond-cache-factor times MemAvailable; quick: 64 MiB), from cold, against a plain numpy "
        "gather of the same files and a sequential read of them; written to beyond_cache.md/.json/.png",
    )
    parser.add_argument(
        "--beyond-cache-factor",
        type=float,
        default=_beyond_cache.FACTOR,
        help=f"the buffer's bytes against the free page cache (default {_beyond_cache.FACTOR:g})",
    )
    parser.add_argument(
        "--beyond-cache-seconds",
        type=float,
        default=None,
        help=f"seconds of each read (default {_beyond_cache.SECONDS:g}; quick 1)",
    )
    parser.add_argument(
        "--beyond-cache-dir",
        default=None,
        help="an existing directory on the disk to measure, for the buffer's files (default: the temporary directory)",
    )
    for peer in OWN_ENV_PEERS:
        parser.add_argument(
            f"--{peer.key}-env",
            default=str(REPOSITORY / f".venv-{peer.key}"),
            help=f"the virtual environment {peer.runs_on} is measured in, in its own process (default: "
            f".venv-{peer.key} in the repository); where it is missing, {peer.name} is left out",
        )
        parser.add_argument(
            f"--{peer.key}-setup",
            action="store_true",
            help=f"create --{peer.key}-env first if it is missing, from scripts/{peer.key}-requirements.txt"
            + (f", and build {peer.builds} in it" if peer.builds else "")
            + " (a few minutes)",
        )
    parser.add_argument("--output-dir", default="out/benchmark", help="where results.md/.json/.png go")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


REPOSITORY = pathlib.Path(__file__).resolve().parent.parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked, with the quick run's defaults filled in (nothing here imports TensorFlow)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    workloads = args.workloads.split(",")
    if not workloads or any(name not in WORKLOAD_NAMES for name in workloads):
        parser.error(f"argument --workloads: expected names among {', '.join(WORKLOAD_NAMES)}, got {args.workloads!r}")
    args.workloads = workloads
    if args.repetitions is not None and args.repetitions < 1:
        parser.error(f"argument --repetitions: expected a positive int, got {args.repetitions}")
    if args.frames is not None and (args.frames < 512 or args.frames % 8):
        parser.error(f"argument --frames: expected a multiple of 8, at least 512, got {args.frames}")
    if not 0 < args.beyond_cache_factor < float("inf"):
        parser.error(f"argument --beyond-cache-factor: expected a positive number, got {args.beyond_cache_factor}")
    if args.beyond_cache_seconds is None:
        args.beyond_cache_seconds = 1.0 if args.quick else _beyond_cache.SECONDS
    if not 0 < args.beyond_cache_seconds < float("inf"):
        parser.error(f"argument --beyond-cache-seconds: expected a positive number, got {args.beyond_cache_seconds}")
    if args.beyond_cache_dir is not None and not pathlib.Path(args.beyond_cache_dir).is_dir():
        parser.error(f"argument --beyond-cache-dir: expected an existing directory, got {args.beyond_cache_dir!r}")
    args.repetitions_given = args.repetitions is not None
    args.repetitions = args.repetitions or (2 if args.quick else 3)
    actors_text = args.actors or ("1" if args.quick else "1,2,4")
    try:
        counts = [int(count) for count in actors_text.split(",")]
    except ValueError:
        counts = [-1]
    if min(counts) < 0:
        parser.error(f"argument --actors: expected process counts separated by commas, e.g. 1,2,4, got {actors_text!r}")
    args.actors = [count for count in counts if count > 0]
    args.actor_seconds = args.actor_seconds if args.actor_seconds is not None else (2.0 if args.quick else 5.0)
    if not 0 < args.actor_seconds < float("inf"):
        parser.error(f"argument --actor-seconds: expected a positive number, got {args.actor_seconds}")
    chosen = (args.actor_backends or ",".join(ACTOR_BACKENDS)).split(",")
    if any(name.strip() not in ACTOR_BACKENDS for name in chosen):
        parser.error(
            f"argument --actor-backends: expected names among {', '.join(ACTOR_BACKENDS)}, got {args.actor_backends!r}"
        )
    args.actor_backends = [name.strip() for name in chosen]
    if args.systems is not None:
        wanted = [name.strip() for name in args.systems.split(",") if name.strip()]
        known = SYSTEM_NAMES + OUT_OF_PROCESS
        if not wanted or any(name not in known for name in wanted):
            parser.error(f"argument --systems: expected names among {', '.join(known)}, got {args.systems!r}")
        args.systems = wanted
        if args.sweep and not set(wanted) & set(_sweep.KINDS):
            parser.error(f"argument --systems: --sweep measures {', '.join(_sweep.KINDS)}, got {','.join(wanted)!r}")
    return args


if __name__ == "__main__":
    parse_args()  # --help and bad arguments answered before TensorFlow is imported

import _quiet  # noqa: E402, F401 (first: TensorFlow imported with its known start-up notices filtered)

# isort: split

# isort: split
import _common  # noqa: E402
from _bench.actors import actor_rates, local_learner_rate  # noqa: E402
from _bench.measure import (  # noqa: E402
    System,
    _add_steps,
    _anonymous,
    _rss,
    _time,
    block_of,
    block_size,
    executed_ops,
    graph_ops,
)
from _bench.memory import TreeMemory  # noqa: E402
from _bench.names import OwnEnvPeer  # noqa: E402
from _bench.own_env import peer_python, peer_rates  # noqa: E402
from _bench.report import machine, markdown, plot, ratios, summarize  # noqa: E402
from _bench.systems import MEASURES, SYSTEMS, available_systems  # noqa: E402
from _bench.workloads import QUICK_FRAMES, WORKLOADS, Workload, numpy_batches  # noqa: E402

# What scripts/_sweep.py and the tests reach through this module.
__all__ = [
    "SYSTEMS",
    "SYSTEM_NAMES",
    "WORKLOADS",
    "available_systems",
    "block_of",
    "block_size",
    "executed_ops",
    "graph_ops",
    "main",
    "numpy_batches",
]
from tqdm.auto import tqdm  # noqa: E402


def run_workload(
    workload: Workload,
    repetitions: int,
    quick: bool,
    progress: bool,
    classes: list[type[System]],
    phase: Callable[[str], None] = lambda label: None,
) -> dict[str, Any]:
    """Builds, fills and measures each system of `classes` in turn, `repetitions` times, and frees it before the next.

    One system is held at a time: the run's memory is the largest system's, not the sum of them all (on the atari
    workload each holds about 1.1 GB; holding every system at once grew a full run past 24 GiB on 2026-11-25). The
    repetitions of one system therefore run back to back; the ranges beside the medians say how much they moved.
    tfbuffers' systems and the limits run in this process, each freed (and the heap trimmed) before the next. Each
    peer (`System.own_process`) runs first, in a new process of its own (`_in_a_process`), while this one holds
    little: its memory is its own, measured alone (TF-Agents' py checkpoint of the atari workload took this
    process's high-water mark from 6.1 to 10.7 GB, 2026-12-02), and what it leaves is not left to the next system.
    A `quick` run spawns one process for all the workload's peers, which run there in turn: one TensorFlow import,
    not one a peer (each costs 5 to 10 s here), so a later peer's `own_process_peak_bytes` includes an earlier's.
    `phase(label)` is told which system (or peers' process) runs next (`TreeMemory.phase`).
    """
    classes = [cls for cls in classes if cls.applies(workload)]
    frames = {cls.name: min(workload.frames, cls.max_frames or workload.frames) for cls in classes}
    measured: dict[str, dict[str, Any]] = {}
    peers = [cls.name for cls in classes if cls.own_process]
    with tqdm(total=len(classes) * (1 + repetitions), desc=f"{workload.name}", disable=not progress) as bar:
        for group in [peers] if quick and peers else [[name] for name in peers]:
            bar.set_postfix_str(f"{', '.join(group)}: in a process apart")
            phase(f"{workload.name}: {', '.join(group)}")
            measured |= _in_a_process(group, workload, frames, repetitions, quick)
            for name in group:
                measured[name]["peaks"] |= _resident_peaks()
            bar.update(len(group) * (1 + repetitions))
        batches = numpy_batches(workload, 64)
        for cls in classes:
            if not cls.own_process:
                phase(f"{workload.name}: {cls.name}")
                measured[cls.name] = run_system(cls, workload, frames[cls.name], batches, repetitions, quick, bar)
                measured[cls.name]["peaks"] = _resident_peaks()
        del batches
    order = [name for name in SYSTEM_NAMES if name in measured]
    samples: dict[str, dict[str, list[float]]] = {measure: {} for measure in MEASURES}
    for name in order:
        for measure, values in measured[name]["samples"].items():
            samples[measure][name] = values
    summary = {
        measure: {name: summarize(values) for name, values in by_system.items() if values}
        for measure, by_system in samples.items()
    }

    def by_system(key: str) -> dict[str, Any]:
        return {name: measured[name][key] for name in order if measured[name][key] is not None}

    return {
        "workload": dataclasses.asdict(workload) | {"payload_bytes": workload.payload_bytes},
        "measures": summary,
        "memory": by_system("memory"),
        "files": by_system("files"),
        "ops": by_system("ops"),
        "open": by_system("open"),
        "seconds": by_system("seconds"),  # each system's, from its build to its last measure: where a run's time goes
        "frames": {name: frames[name] for name in order},  # each system's frames: the workload's, or its `max_frames`
        "phase_seconds": by_system("phases"),  # and how its seconds split: build, fill, each measure's repetitions
        # The resident high-water marks after each system: this process's (which system raised it), and a peer's
        # own process's (`own_process_peak_bytes`).
        "peaks_after": by_system("peaks"),
    }


def run_system(
    cls: type[System], workload: Workload, frames: int, batches: list[Any], repetitions: int, quick: bool, bar: Any
) -> dict[str, Any]:
    """One system of `workload`, filled with `frames` of its frames and measured `repetitions` times, then freed.

    What `run_workload` gathers of it: "samples" (each measure's rates), "memory", "files", "ops", "open" (None where
    it has none), "seconds" and "phases" (where they went).
    """
    bar.set_postfix_str(f"{cls.name}: fill")
    started = time.perf_counter()
    before, anonymous_before = _rss(), _anonymous()
    own = workload if frames == workload.frames else dataclasses.replace(workload, frames=frames)
    system = cls(own)
    given = system.prepare(batches)
    block = block_of(workload, given)
    spent = {"build": time.perf_counter() - started}
    mark = time.perf_counter()
    system.fill(given, _Frames())
    spent["fill"] = time.perf_counter() - mark
    resident = _rss() - before
    anonymous_after = _anonymous()
    anonymous = None if anonymous_before is None or anonymous_after is None else anonymous_after - anonymous_before
    stored = system.stored_bytes()
    out: dict[str, Any] = {
        "memory": {
            "resident_bytes_per_frame": resident / frames if system.adds else None,
            "anonymous_bytes_per_frame": anonymous / frames if system.adds and anonymous is not None else None,
            "stored_bytes_per_frame": None if stored is None else stored / frames,
        },
        "samples": {},
    }
    bar.update(1)
    bar.set_postfix_str(f"{cls.name}: measure")
    for repetition in range(repetitions):
        for measure, value in _measures(system, workload, given, block, quick, repetition, spent).items():
            out["samples"].setdefault(measure, []).append(value)
        bar.update(1)
    mark = time.perf_counter()
    out["ops"] = system.graph_ops()
    spent["graph_ops"], mark = time.perf_counter() - mark, time.perf_counter()
    out["open"] = system.open_times(given) or None
    spent["open_times"], mark = time.perf_counter() - mark, time.perf_counter()
    with tempfile.TemporaryDirectory() as directory:
        out["files"] = None if system.variant else system.file_memory(pathlib.Path(directory))
    spent["file_memory"], mark = time.perf_counter() - mark, time.perf_counter()
    system.close()
    del system, given, block
    gc.collect()
    _common.release_free_memory()  # what the system freed goes back to the system: the next one starts from less
    spent["close"] = time.perf_counter() - mark
    out["seconds"] = time.perf_counter() - started
    out["phases"] = spent
    return out


def _in_a_process(
    names: list[str], workload: Workload, frames: dict[str, int], repetitions: int, quick: bool
) -> dict[str, dict[str, Any]]:
    """`run_system` of the systems `names`, in turn, in one new process (spawned: this one's TensorFlow is not forked).

    Each entry gains "peaks": that process's resident high-water mark after it (`own_process_peak_bytes`).
    """
    import concurrent.futures
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        return pool.submit(_run_here, names, workload, frames, repetitions, quick).result()


def _run_here(
    names: list[str], workload: Workload, frames: dict[str, int], repetitions: int, quick: bool
) -> dict[str, dict[str, Any]]:
    """What `_in_a_process` runs in its process."""
    batches, measured = numpy_batches(workload, 64), {}
    for name in names:
        (cls,) = [cls for cls in SYSTEMS if cls.name == name]
        measured[name] = run_system(cls, workload, frames[name], batches, repetitions, quick, _Frames())
        measured[name]["peaks"] = {"own_process_peak_bytes": _peer_runs.high_water_bytes()}
    return measured


def _resident_peaks() -> dict[str, int]:
    """The kernel's resident high-water mark of this process since it started, in bytes (no moment is missed).

    The peers' processes report their own (`own_process_peak_bytes`, `<key>_resident_peak_bytes`); the children's
    mark `getrusage` keeps is not read: it holds this process's resident memory at each fork
    (`_peer_runs.high_water_bytes`).
    """
    return {"resident_peak_bytes": _peer_runs.high_water_bytes()}


class _Frames:
    """A progress bar that shows nothing: a fill reports frames, the run's bar counts systems, peers' runs none."""

    def update(self, count: int) -> None:
        del count

    def set_postfix_str(self, text: str) -> None:
        del text


def _measures(
    system: System,
    workload: Workload,
    given: list[Any],
    block: Any,
    quick: bool,
    repetition: int,
    spent: dict[str, float],
) -> dict[str, float]:
    """Repetition `repetition` of every measure `system` supports, as rates (frames/s, or MB/s for files).

    The files' measures of a system that `saves_once` (Reverb's checkpoints) in the first repetition only. Each
    measure's seconds, its warm-up included, are added to `spent` (where a run's time goes).
    """
    num_adds = 200 if quick else 2_000
    sample_batches = 20 if quick else 500
    pass_elements = 100 if quick else 2_000
    frames_per_sample = workload.sample_batch_size * workload.num_steps

    def run(measure: str, fn: Any, *args: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            spent[measure] = spent.get(measure, 0.0) + time.perf_counter() - start

    rates: dict[str, float] = {}
    if system.adds:
        seconds = run("add_eager", _time, functools.partial(_add_steps, system, given, num_adds))
        rates["add_eager"] = num_adds * workload.num_envs / seconds
    if (blocked := run("add_block", system.add_block, block)) is not None:
        rates["add_block"] = block_size(block) / blocked
    if (graph := run("add_graph", system.add_graph, num_adds * 5)) is not None:
        rates["add_graph"] = num_adds * 5 * workload.num_envs / graph
    if (dataset := run("sample_dataset", system.sample_dataset, sample_batches)) is not None:
        rates["sample_dataset"] = sample_batches * frames_per_sample / dataset
    if (consumed := run("sample_dataset_graph", system.sample_dataset_graph, sample_batches)) is not None:
        rates["sample_dataset_graph"] = sample_batches * frames_per_sample / consumed
    if (direct := run("get_next", system.get_next, sample_batches)) is not None:
        rates["get_next"] = sample_batches * frames_per_sample / direct
    if (updated := run("sample_update", system.sample_update, sample_batches)) is not None:
        rates["sample_update"] = sample_batches * frames_per_sample / updated
    deterministic = None if system.variant else run("deterministic_pass", system.deterministic_pass, pass_elements)
    if deterministic is not None:
        rates["deterministic_pass"] = deterministic[1] / deterministic[0]
    with tempfile.TemporaryDirectory() as directory:
        skipped = system.variant or (system.saves_once and repetition > 0)
        saved = None if skipped else run("save_load", system.save_load, pathlib.Path(directory))
    if saved is not None:
        save, load, size = saved
        rates["save"] = size / save / 1e6
        if load is not None:
            rates["load"] = size / load / 1e6
    return rates


def sweep(args: argparse.Namespace, command: str, output_dir: pathlib.Path) -> int:
    """Runs the scaling sweep (`scripts/_sweep.py`) and writes its table, JSON and figures."""
    available = {cls.name for cls in available_systems()[0]}
    kinds = [kind for kind in _sweep.KINDS if kind in available and (args.systems is None or kind in args.systems)]
    repetitions = args.repetitions if args.repetitions_given else (1 if args.quick else 3)

    def progress(total: int) -> Any:
        return tqdm(total=total, unit="buffer", disable=args.no_progress)

    started = time.perf_counter()
    points = _sweep.run(sys.modules[__name__], kinds, args.quick, repetitions, progress)
    seconds = time.perf_counter() - started
    table = _sweep.markdown(points)
    head = f"{command}\n\n{machine()}; {seconds:.0f} s, {repetitions} repetitions a point\n\n"
    (output_dir / "sweep.md").write_text(head + table)
    data = {"command": command, "machine": machine(), "seconds": seconds, "repetitions": repetitions}
    data |= {"points": [dataclasses.asdict(p) for p in points], "growth": _sweep.growth(points)}
    (output_dir / "sweep.json").write_text(json.dumps(data, indent=2) + "\n")
    figures = _sweep.plot(
        points, lambda measure: output_dir / f"sweep_{measure.replace(' + ', '_').replace(' ', '_')}.png"
    )
    print(table)
    print(f"{seconds:.0f} s. Outputs in {output_dir}/: sweep.md, sweep.json, " + ", ".join(f.name for f in figures))
    return 0


def beyond_cache(args: argparse.Namespace, command: str, output_dir: pathlib.Path) -> int:
    """Samples a memory-mapped buffer larger than the page cache (`scripts/_beyond_cache.py`) and writes its outputs."""
    import contextlib

    @contextlib.contextmanager
    def progress(total: int, what: str) -> Any:
        with tqdm(total=total, desc=what, disable=args.no_progress) as bar:
            yield bar

    directory = None if args.beyond_cache_dir is None else pathlib.Path(args.beyond_cache_dir)
    started = time.perf_counter()
    results = _beyond_cache.run(directory, args.beyond_cache_factor, args.beyond_cache_seconds, args.quick, progress)
    seconds = time.perf_counter() - started
    results |= {"command": command, "machine": machine(), "total_seconds": seconds}
    table = _beyond_cache.write(results, output_dir)
    (output_dir / "beyond_cache.md").write_text(f"{command}\n\n{machine()}; {seconds:.0f} s\n\n{table}")
    print(table)
    print(f"{seconds:.0f} s. Outputs in {output_dir}/: beyond_cache.md, beyond_cache.json, beyond_cache.png")
    return 0


def run_workloads(
    args: argparse.Namespace,
    results: dict[str, Any],
    classes: list[type[System]],
    apart: list[tuple[OwnEnvPeer, pathlib.Path, list[str]]],
    phase: Callable[[str], None],
) -> None:
    """Each workload of `args` in turn: the local systems, the peers in their own environments, the actors."""
    repetitions, actor_counts, actor_seconds = args.repetitions, args.actors, args.actor_seconds
    for name in args.workloads:
        workload = WORKLOADS[name]
        if args.quick or args.frames:
            workload = dataclasses.replace(workload, frames=args.frames or QUICK_FRAMES[name])
        results["workloads"][name] = run_workload(
            workload, repetitions, args.quick, not args.no_progress, classes, phase
        )
        for peer, python, asked in apart:
            phase(f"{name}: {peer.name}")
            mark = time.perf_counter()
            answer = peer_rates(peer, python, workload, asked, repetitions, args.quick)
            results["workloads"][name]["seconds"][peer.name] = time.perf_counter() - mark
            results["workloads"][name]["peaks_after"][peer.name] = _resident_peaks()
            for package, version in answer.items():  # its versions (flashbax_jax, torchrl_torch, ...) and peak memory
                if package != "rates":
                    results["workloads"][name][f"{peer.key}_{package}"] = version
            for system in asked:
                for measure, values in answer["rates"][system].items():
                    results["workloads"][name]["measures"][measure][system] = summarize(values)
        backends = [backend for backend in args.actor_backends if importlib.util.find_spec(ACTOR_BACKENDS[backend])]
        if actor_counts and backends:
            rates = {}
            for backend in backends:
                phase(f"{name}: {backend} actors")
                mark = time.perf_counter()
                progress = not args.no_progress
                rates[backend] = actor_rates(backend, workload, actor_counts, actor_seconds, args.quick, progress)
                results["workloads"][name]["seconds"][f"{backend} actors"] = time.perf_counter() - mark
                results["workloads"][name]["peaks_after"][f"{backend} actors"] = _resident_peaks()
            phase(f"{name}: the local learner")
            rates["tfbuffers py"] = {"learner": local_learner_rate(workload, args.quick)}
            results["workloads"][name]["actors"] = rates
        results["workloads"][name]["ratios"] = ratios(results["workloads"][name])
        results["workloads"][name] |= _resident_peaks()  # after the workload's peers and actors


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark and writes its outputs."""
    args = parse_args(argv)
    if args.beyond_cache:
        output_dir = pathlib.Path(args.output_dir)
        command = " ".join(["python", "scripts/benchmark.py", *(argv if argv is not None else sys.argv[1:])])
        return beyond_cache(args, command, output_dir)
    if args.sweep:
        output_dir = pathlib.Path(args.output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        command = " ".join(["python", "scripts/benchmark.py", *(argv if argv is not None else sys.argv[1:])])
        return sweep(args, command, output_dir)
    repetitions = args.repetitions
    output_dir = pathlib.Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "command": " ".join(["python", "scripts/benchmark.py", *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine(),
        "quick": args.quick,
        "repetitions": repetitions,
        "workloads": {},
    }
    classes, left_out = available_systems()
    if args.systems is not None:
        classes = [cls for cls in classes if cls.name in args.systems]
    results["systems"] = [cls.name for cls in classes]
    apart: list[tuple[OwnEnvPeer, pathlib.Path, list[str]]] = []  # (peer, its interpreter, its systems asked for)
    for peer in OWN_ENV_PEERS:
        env, setup = getattr(args, f"{peer.key}_env"), getattr(args, f"{peer.key}_setup")
        asked = [name for name in peer.systems if args.systems is None or name in args.systems]
        python, why = peer_python(peer, pathlib.Path(env), setup) if asked else (None, "")
        if python is None:
            left_out |= {name: why for name in asked}
        else:
            results["systems"] += asked
            apart.append((peer, python, asked))
    results["left_out"] = left_out
    for name, reason in left_out.items():
        print(f"Left out {name}: {reason}.")
    started = time.perf_counter()
    with TreeMemory() as tree:
        run_workloads(args, results, classes, apart, tree.phase)
    # The run's processes summed (this one, the peers', Ray's, the actors'), sampled every half second.
    results["tree_memory_peaks"] = tree.peaks()
    results["seconds"] = time.perf_counter() - started
    table = markdown(results)
    omitted = "".join(f"Left out {name}: {reason}.\n\n" for name, reason in left_out.items())
    (output_dir / "results.md").write_text(f"{results['command']}\n\n{results['machine']}\n\n{omitted}{table}")
    (output_dir / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    plot(results, output_dir / "results.png")
    print(table)
    print(f"{results['machine']}; {results['seconds']:.0f} s. Outputs in {output_dir}/results.{{md,json,png}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
