"""Benchmark tfbuffers beside TF-Agents, Reverb and a plain numpy ring, in one run.

Workloads (as in the project's design):
  control: observation f32[17], action f32[6], reward/discount f32, step types i32; 8 envs;
           1M frames; sample batch 256, num_steps 2.
  atari:   observation u8[84,84,4], action i32, reward/discount f32, step types i32; 4 envs;
           40k frames; sample batch 32, num_steps 2.
  flashbax: observation u8[32,32,3] (Flashbax's published CPU workload), action i32; 8 envs;
           500k frames; sample batch 256, num_steps 2 (not run unless asked: --workloads).
Items are TF-Agents `Trajectory`s, so TF-Agents' Reverb observer can write them.

Systems: tfbuffers' TF and py uniform buffers, TF-Agents' TFUniformReplayBuffer and
PyUniformReplayBuffer, TF-Agents' Reverb path (ReverbReplayBuffer + ReverbAddTrajectoryObserver
on a local server), and three references that store or check nothing more than they must: a
plain numpy ring write + fancy-index gather of the same bytes (the memory-bandwidth limit), bare
`tf.Variable`s written and sampled with no bookkeeping (the floor of an in-graph buffer), and a
tf.data pipeline of `tf.fill`s (the ceiling of any `as_dataset`). Each measure runs on every
system in turn, several times (interleaved), after a warm-up; the median and the range are
reported, and ratios are tfbuffers / peer from the same run. Sampling is measured through the
Python iterator, inside a learner's compiled loop, and by direct `get_next`; for the TF systems,
the ops one in-graph sample and add run are counted too. Then --actors processes add to one
shared buffer at once, a Reverb server and a Ray-hosted buffer (--actor-backends), and a learner
samples each through `as_dataset`. Flashbax's uniform and prioritized trajectory buffers (JAX on the
CPU) run in a process of their own environment (--flashbax-env, made by --flashbax-setup), on the
same workload, and join the tables. Outputs: a markdown table, JSON and a bar chart in
--output-dir.

    python scripts/benchmark.py            # full: 1M frames, 5 repetitions (see docs/benchmarks.md)
    python scripts/benchmark.py --quick    # small frames, 2 repetitions: about three minutes on 2 cores
    python scripts/benchmark.py --sweep    # how each local buffer's costs grow with capacity and batch size
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import _args  # noqa: E402
import _sweep  # noqa: E402 (no TensorFlow at import: the arguments are checked with its names first)


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = _args.new_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="small frames and repetitions: a smoke run")
    parser.add_argument(
        "--workloads",
        default="control,atari",
        help="comma-separated: control, atari, flashbax (Flashbax's published one: 500k frames of uint8[32, 32, 3], "
        "batch 256)",
    )
    parser.add_argument(
        "--systems",
        default=None,
        help="comma-separated system names to run (None: every one installed), e.g. 'tfbuffers py,cpprb PER'",
    )
    parser.add_argument("--repetitions", type=int, default=None, help="runs of each measure (None: 5, quick 2)")
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
        "--actor-seconds", type=float, default=None, help="seconds each actor adds for (None: 10, quick 2)"
    )
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="instead of the workloads: the scaling sweep, every local buffer kind's add, sample and sample + update "
        "at capacities 10k to 10M frames and batch sizes 32 to 4096 (quick: 1k and 10k, batches 32 and 256), "
        "written to sweep.md/.json and one log-log figure per measure",
    )
    parser.add_argument(
        "--flashbax-env",
        default=str(REPOSITORY / ".venv-flashbax"),
        help="the virtual environment Flashbax (JAX) is measured in, in its own process (default: .venv-flashbax in "
        "the repository); where it is missing, Flashbax is left out",
    )
    parser.add_argument(
        "--flashbax-setup",
        action="store_true",
        help="create --flashbax-env first if it is missing, from scripts/flashbax-requirements.txt (a few minutes)",
    )
    parser.add_argument("--output-dir", default="out/benchmark", help="where results.md/.json/.png go")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


SYSTEM_NAMES = (
    "tfbuffers TF", "TF-Agents TF", "tfbuffers py", "TF-Agents py", "tfbuffers TF prioritized",
    "tfbuffers py prioritized", "tfbuffers TF episodes", "tfbuffers py episodes",
    "tfbuffers TF prioritized episodes", "tfbuffers py prioritized episodes", "tfbuffers py frame stacks",
    "tfbuffers py memmap", "tfbuffers py prioritized memmap",
    "cpprb uniform", "cpprb PER", "tfbuffers Reverb", "TF-Agents Reverb", "numpy limit", "bare tf.Variable",
    "tf.data ceiling",
)  # fmt: skip


WORKLOAD_NAMES = ("control", "atari", "flashbax")
# Systems measured in processes of their own environment, not in this one (`scripts/_flashbax_peer.py`).
OUT_OF_PROCESS = ("Flashbax uniform", "Flashbax prioritized")
REPOSITORY = pathlib.Path(__file__).resolve().parent.parent
# The buffers actor processes add to (--actor-backends), each with the module it needs.
ACTOR_BACKENDS = {"tfbuffers Reverb": "reverb", "tfbuffers Ray": "ray"}


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
    args.repetitions_given = args.repetitions is not None
    args.repetitions = args.repetitions or (2 if args.quick else 5)
    actors_text = args.actors or ("1" if args.quick else "1,2,4")
    try:
        counts = [int(count) for count in actors_text.split(",")]
    except ValueError:
        counts = [-1]
    if min(counts) < 0:
        parser.error(f"argument --actors: expected process counts separated by commas, e.g. 1,2,4, got {actors_text!r}")
    args.actors = [count for count in counts if count > 0]
    args.actor_seconds = args.actor_seconds if args.actor_seconds is not None else (2.0 if args.quick else 10.0)
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
import numpy as np  # noqa: E402
import psutil  # noqa: E402
import tensorflow as tf  # noqa: E402

# isort: split
from tf_agents.replay_buffers import py_uniform_replay_buffer, tf_uniform_replay_buffer  # noqa: E402
from tf_agents.specs import tensor_spec  # noqa: E402
from tf_agents.trajectories import trajectory  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

import tfbuffers  # noqa: E402
from tfbuffers import files, specs  # noqa: E402

MEASURES = {
    "add_eager": "add, eager call per step (frames/s)",
    "add_graph": "add, inside one tf.function loop (frames/s)",
    "sample_dataset": "sample, as_dataset + prefetch (frames/s)",
    "sample_dataset_graph": "sample, as_dataset consumed in a tf.function loop (frames/s)",
    "get_next": "sample, direct get_next (frames/s)",
    "sample_update": "sample + update_priorities, direct (frames/s)",
    "deterministic_pass": "deterministic pass (frames/s)",
    "save": "save (MB/s)",
    "load": "load (MB/s)",
}
OURS = {
    "tfbuffers TF": "TF-Agents TF",
    "tfbuffers py": "TF-Agents py",
    "tfbuffers TF prioritized": "tfbuffers TF",  # what prioritizing costs, against the uniform buffer
    "tfbuffers py prioritized": "cpprb PER",
    "tfbuffers Reverb": "TF-Agents Reverb",
    # What each option costs, against the same buffer without it.
    "tfbuffers TF episodes": "tfbuffers TF",
    "tfbuffers py episodes": "tfbuffers py",
    "tfbuffers TF prioritized episodes": "tfbuffers TF prioritized",
    "tfbuffers py prioritized episodes": "tfbuffers py prioritized",
    "tfbuffers py frame stacks": "tfbuffers py",
    "tfbuffers py memmap": "tfbuffers py",  # memory-mapped files against the same buffer in RAM
    "tfbuffers py prioritized memmap": "tfbuffers py prioritized",
}
# The references each of ours is also compared with: peers, and limits that store or check nothing.
REFERENCES = {
    "tfbuffers TF": ("TF-Agents Reverb", "numpy limit", "bare tf.Variable", "tf.data ceiling", "Flashbax uniform"),
    "tfbuffers py": ("TF-Agents Reverb", "cpprb uniform", "numpy limit", "tf.data ceiling", "Flashbax uniform"),
    "tfbuffers TF prioritized": ("TF-Agents TF", "cpprb PER", "Flashbax prioritized"),
    "tfbuffers py prioritized": ("tfbuffers py", "cpprb uniform", "Flashbax prioritized"),
    "tfbuffers Reverb": ("tfbuffers py",),
    "tfbuffers TF episodes": (),
    "tfbuffers py episodes": (),
    "tfbuffers TF prioritized episodes": (),
    "tfbuffers py prioritized episodes": (),
    "tfbuffers py frame stacks": (),
    "tfbuffers py memmap": (),
    "tfbuffers py prioritized memmap": (),
}
FIRST, MID, LAST = 0, 1, 2  # TF-Agents' StepType values
EPISODE = 32  # frames per episode of the episode-aware systems (divides the 64 batches the benchmark cycles)
STACK_EPISODE = 1_000  # adds between resets of the frame-stack system's stacks
PRIORITY_BETA = 0.4  # cpprb's importance weights are made with every sample; beta is theirs to take


@dataclasses.dataclass(frozen=True)
class Workload:
    """One benchmark workload."""

    name: str
    observation: tf.TensorSpec
    action: tf.TensorSpec
    num_envs: int
    frames: int
    sample_batch_size: int
    num_steps: int = 2

    @property
    def spec(self) -> trajectory.Trajectory:
        """The stored item: a TF-Agents Trajectory."""
        step_type = tf.TensorSpec([], tf.int32, "step_type")
        scalar = tf.TensorSpec([], tf.float32)
        return trajectory.Trajectory(
            step_type=step_type,
            observation=self.observation,
            action=self.action,
            policy_info=(),
            next_step_type=tf.TensorSpec([], tf.int32, "next_step_type"),
            reward=scalar,
            discount=scalar,
        )

    @property
    def payload_bytes(self) -> int:
        """Bytes of one frame's fields."""
        return sum(s.shape.num_elements() * s.dtype.size for s in tf.nest.flatten(self.spec))

    @property
    def max_length(self) -> int:
        """Frames per segment."""
        return self.frames // self.num_envs


WORKLOADS = {
    "control": Workload("control", tf.TensorSpec([17], tf.float32), tf.TensorSpec([6], tf.float32), 8, 1_000_000, 256),
    "atari": Workload("atari", tf.TensorSpec([84, 84, 4], tf.uint8), tf.TensorSpec([], tf.int32), 4, 40_000, 32),
    # The workload Flashbax publishes its CPU sampling times on: 500k items, batch 256, uint8[32, 32, 3].
    "flashbax": Workload(
        "flashbax", tf.TensorSpec([32, 32, 3], tf.uint8), tf.TensorSpec([], tf.int32), 8, 500_000, 256
    ),
}
QUICK_FRAMES = {"control": 16_000, "atari": 2_000, "flashbax": 16_000}


def numpy_batches(workload: Workload, count: int, seed: int = 0) -> list[Any]:
    """`count` distinct batches of `num_envs` random frames, made before any timing."""
    rng = np.random.default_rng(seed)

    def leaf(spec: tf.TensorSpec) -> np.ndarray:
        shape = (workload.num_envs, *spec.shape.as_list())
        if spec.dtype == tf.uint8:
            return rng.integers(0, 256, shape, dtype=np.uint8)
        if spec.dtype.is_integer:
            return rng.integers(0, 3, shape).astype(spec.dtype.as_numpy_dtype)
        return rng.standard_normal(shape).astype(spec.dtype.as_numpy_dtype)

    return [tf.nest.map_structure(leaf, workload.spec) for _ in range(count)]


class System:
    """A buffer implementation under test; unsupported measures return None."""

    requires: tuple[str, ...] = ()  # modules it imports beyond the benchmark's own
    name = ""
    adds = True  # whether it stores anything (the tf.data ceiling does not)
    variant = False  # an option's cost against the same buffer without it: the deterministic pass and files not run

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.frames_added = 0

    @classmethod
    def applies(cls, workload: Workload) -> bool:
        """Whether the system runs on `workload` (frame stacks need stacked observations)."""
        return True

    def prepare(self, batches: list[Any]) -> list[Any]:
        """The batches this system is given (made before any timing): the benchmark's own by default."""
        return batches

    def add(self, batch: Any) -> None:
        """Adds one batch (one frame per environment) the way this system is called eagerly."""
        raise NotImplementedError

    def fill(self, batches: list[Any], bar: Any) -> None:
        """Fills the buffer to capacity, its fastest way."""
        steps = self.workload.max_length
        for t in range(steps):
            self.add(batches[t % len(batches)])
            if t % 1000 == 999:
                bar.update(1000 * self.workload.num_envs)
        bar.update((steps % 1000) * self.workload.num_envs)

    def add_graph(self, num_adds: int) -> float | None:
        """Seconds for `num_adds` adds in one tf.function loop, or None."""
        return None

    def sample_dataset(self, num_batches: int) -> float | None:
        """Seconds for `num_batches` batches from the training dataset, or None."""
        return None

    def sample_dataset_graph(self, num_batches: int) -> float | None:
        """Seconds for `num_batches` batches of the training dataset taken inside one tf.function, or None."""
        return None

    def get_next(self, num_batches: int) -> float | None:
        """Seconds for `num_batches` direct samples, or None."""
        return None

    def graph_ops(self) -> dict[str, int] | None:
        """Ops one in-graph sample and one in-graph add run, and their graphs' nodes (`executed_ops`, `graph_ops`)."""
        return None

    def sample_update(self, num_batches: int) -> float | None:
        """Seconds for `num_batches` direct samples, each followed by new priorities for it, or None."""
        return None

    def deterministic_pass(self, num_elements: int) -> tuple[float, int] | None:
        """(Seconds, frames) of the first `num_elements` elements of the deterministic pass, or None."""
        return None

    def save_load(self, directory: pathlib.Path) -> tuple[float, float | None, int] | None:
        """(save seconds, load seconds or None, bytes written), or None."""
        return None

    def stored_bytes(self) -> int | None:
        """Bytes of storage the system allocated, when it can be read off."""
        return None

    def file_memory(self, directory: pathlib.Path) -> dict[str, float] | None:
        """Bytes per frame of its file and peak resident bytes added by saving and loading it, or None."""
        return None

    def open_times(self, batches: list[Any]) -> dict[str, float] | None:
        """Seconds `tfbuffers.open` takes on a directory of this system, by frames stored, or None."""
        return None

    def close(self) -> None:
        """Releases servers and files."""


def _time(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _calls(fn: Callable[[], Any], count: int) -> float:
    """Seconds for `count` calls of `fn`, each result dropped before the next call, as a training loop does.

    Keeping every result (a list of them) would time the allocator handing out fresh pages for each: on
    atari 1.8 MB a batch, which made `get_next` measure 3x slower than the same calls dropped.
    """

    def run() -> None:
        for _ in range(count):
            fn()

    return _time(run)


def _repeat(step: Callable[[int], None], count: int) -> None:
    for i in range(count):
        step(i)


def _add_steps(system: System, batches: list[Any], num_adds: int) -> None:
    for t in range(num_adds):
        system.add(batches[t % len(batches)])


def _iterate(dataset: tf.data.Dataset, num_batches: int) -> float:
    iterator = iter(dataset)
    for _ in range(20):
        next(iterator)  # warm-up: tracing, the prefetch buffer, AUTOTUNE's first choices
    return _calls(lambda: next(iterator), num_batches)


def _consume_in_graph(dataset: tf.data.Dataset, num_batches: int) -> float:
    """Seconds for `num_batches` elements taken from an iterator inside one tf.function loop, as a learner does.

    TF-Agents' `Learner` (and most training loops) pass the dataset's iterator into a compiled loop that
    calls `next` once per train step; the loop keeps one value of each element, so nothing is pruned.
    """
    iterator = iter(dataset)
    consume = traced_once(_consume)
    consume(iterator, tf.constant(20))  # warm-up: tracing, the prefetch buffer, AUTOTUNE's first choices
    return _time(lambda: consume(iterator, tf.constant(num_batches)))


def traced_once(fn: Callable[..., Any]) -> Any:
    """`tf.function(fn)` for one system and workload, which traces it once.

    TensorFlow counts traces by the Python code a `tf.function` wraps and warns of frequent retracing when
    many are traced; each system's own function is expected to trace once. A `functools.partial` is counted
    as itself.
    """
    return tf.function(functools.partial(fn))


def _consume(iterator: Any, count: tf.Tensor) -> tf.Tensor:
    total = tf.constant(0.0)
    for _ in tf.range(count):
        items, _ = next(iterator)
        first = tf.nest.flatten(items)[0]
        total += tf.cast(tf.reshape(first, [-1])[0], tf.float32)
    return total


def graph_ops(fn: Callable[[], Any]) -> int:
    """Nodes in the graph `tf.function(fn)` traces, counting the functions it calls (cond branches, loop bodies).

    A static count: both branches of a `tf.cond` and a loop body once, whatever runs (`executed_ops` counts
    what one call runs).
    """
    graph_def = traced_once(fn).get_concrete_function().graph.as_graph_def()
    return len(graph_def.node) + sum(len(function.node_def) for function in graph_def.library.function)


def executed_ops(fn: Callable[[], Any]) -> int:
    """Ops that compute, run by one call of `tf.function(fn)` in its graph and the functions it calls.

    As TensorFlow's debugger records them (`tf.debugging.experimental.enable_dump_debug_info`), which is what
    a call costs on a small batch: a cond runs one branch, a loop its condition once per turn and its body per
    iteration. Constants and arguments are left out (Grappler folds most constants away), and the debugger
    sees only ops that return a tensor: the writes of an add (a scatter per field, the counter's assignment)
    are not counted. The function is traced and run once with the debugger on, which is then turned off.
    """
    from tensorflow.python.debug.lib import debug_events_reader

    with tempfile.TemporaryDirectory() as directory:
        tf.debugging.experimental.enable_dump_debug_info(
            directory, tensor_debug_mode="NO_TENSOR", circular_buffer_size=-1
        )
        try:
            traced_once(fn)()
        finally:
            tf.debugging.experimental.disable_dump_debug_info()
        with debug_events_reader.DebugDataReader(directory) as reader:
            reader.update()
            return sum(trace.op_type not in ("Const", "Placeholder") for trace in reader.graph_execution_traces())


def _checkpoint_save_load(buffer: Any, directory: pathlib.Path) -> tuple[float, float, int]:
    checkpoint = tf.train.Checkpoint(buffer=buffer)
    prefix = str(directory / "ckpt")
    save = _time(lambda: checkpoint.write(prefix))
    size = sum(f.stat().st_size for f in directory.iterdir())
    load = _time(lambda: checkpoint.read(prefix).assert_consumed())
    return save, load, size


class _TFBuffer(System):
    """Shared by tfbuffers' and TF-Agents' TF buffers: same constructor, same API."""

    def __init__(self, workload: Workload, buffer: Any) -> None:
        super().__init__(workload)
        self.buffer = buffer
        # One batch, held as constants: the loop then times the add alone, not making data.
        self._graph_batch = tf.nest.map_structure(tf.constant, numpy_batches(workload, 1, seed=1)[0])
        self._loop = traced_once(self._loop_fn)

    def _loop_fn(self, num_adds: tf.Tensor) -> None:
        for _ in tf.range(num_adds):
            self.buffer.add_batch(self._graph_batch)

    def add(self, batch: Any) -> None:
        self.buffer.add_batch(batch)

    def fill(self, batches: list[Any], bar: Any) -> None:
        self._loop(tf.constant(self.workload.max_length))
        bar.update(self.workload.frames)

    def add_graph(self, num_adds: int) -> float:
        self._loop(tf.constant(2))
        return _time(lambda: self._loop(tf.constant(num_adds)))

    def dataset(self) -> tf.data.Dataset:
        w = self.workload
        dataset = self.buffer.as_dataset(w.sample_batch_size, w.num_steps, num_parallel_calls=tf.data.AUTOTUNE)
        return dataset.prefetch(tf.data.AUTOTUNE)

    def sample_dataset(self, num_batches: int) -> float:
        return _iterate(self.dataset(), num_batches)

    def sample_dataset_graph(self, num_batches: int) -> float:
        return _consume_in_graph(self.dataset(), num_batches)

    def get_next(self, num_batches: int) -> float:
        w = self.workload
        self.buffer.get_next(w.sample_batch_size, w.num_steps)
        return _calls(lambda: self.buffer.get_next(w.sample_batch_size, w.num_steps), num_batches)

    def _sample_call(self) -> Any:
        """One sample, as a learner's graph makes it (traced afresh on each call: see `executed_ops`)."""
        return self.buffer.get_next(self.workload.sample_batch_size, self.workload.num_steps)

    def _add_call(self) -> None:
        """One add, as a driver's graph makes it (TF-Agents' returns an Operation, which a tf.function cannot)."""
        self.buffer.add_batch(self._graph_batch)

    def graph_ops(self) -> dict[str, int]:
        # The static counts first: a function traced under the debugger keeps its instrumentation.
        nodes = {"sample_nodes": graph_ops(self._sample_call), "add_nodes": graph_ops(self._add_call)}
        return {"sample": executed_ops(self._sample_call), "add": executed_ops(self._add_call), **nodes}

    def deterministic_pass(self, num_elements: int) -> tuple[float, int]:
        w = self.workload
        dataset = self.buffer.as_dataset(w.num_envs, w.num_steps, single_deterministic_pass=True)
        dataset = dataset.take(num_elements).prefetch(tf.data.AUTOTUNE)
        seconds = _time(lambda: [None for _ in dataset])
        return seconds, num_elements * w.num_envs * w.num_steps

    def save_load(self, directory: pathlib.Path) -> tuple[float, float, int]:
        return _checkpoint_save_load(self.buffer, directory)

    def stored_bytes(self) -> int:
        return sum(v.shape.num_elements() * v.dtype.size for v in self.buffer.variables())


SCRIPTS = pathlib.Path(__file__).resolve().parent
_LOAD_IN_A_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[4])
import _common, tfbuffers
from tfbuffers import files

path, name, how = sys.argv[1:4]
kind = getattr(tfbuffers, name)

def load():
    if how == "new":
        return kind.load(path, progress=False)
    header = files.read_header(path)
    buffer = kind(header["data_spec"], batch_size=header["batch_size"], max_length=header["max_length"])
    files.load(path, buffer, progress=False)
    return buffer

_, peak = _common.peak_rss(load)
print(json.dumps(peak))
"""


def _files_memory(buffer: Any, stored: int, directory: pathlib.Path) -> dict[str, float]:
    """File size per frame, and the peak resident bytes beyond the buffer's own storage of a save and two loads.

    The loads run in fresh processes (an allocator keeps what an earlier call freed): `<class>.load`, and
    `files.load` into a buffer built empty; the buffer's own storage is subtracted from both.
    """
    import _common

    path = directory / "buffer.safetensors"
    frames = int(buffer.num_frames())
    _, save = _common.peak_rss(lambda: buffer.save(path, progress=False))
    loads = {}
    for how in ("new", "into"):
        argv = [sys.executable, "-c", _LOAD_IN_A_CHILD, str(path), type(buffer).__name__, how, str(SCRIPTS)]
        completed = subprocess.run(argv, capture_output=True, text=True, check=True)
        loads[how] = json.loads(completed.stdout.strip().splitlines()[-1]) - stored
    return {
        "stored_bytes": stored,
        "file_bytes_per_frame": path.stat().st_size / frames,
        "save_peak_bytes": save,
        "load_new_peak_bytes": loads["new"],
        "load_into_peak_bytes": loads["into"],
    }


def _files_save_load(buffer: Any, directory: pathlib.Path) -> tuple[float, float, int]:
    """Saves and loads with tfbuffers.files: one safetensors file, fsynced and renamed into place."""
    path = directory / "buffer.safetensors"
    save = _time(lambda: files.save(buffer, path, progress=False))
    load = _time(lambda: files.load(path, buffer, progress=False))
    return save, load, path.stat().st_size


class TFBuffersTF(_TFBuffer):
    """tfbuffers.TFUniformReplayBuffer."""

    name = "tfbuffers TF"

    def save_load(self, directory: pathlib.Path) -> tuple[float, float, int]:
        return _files_save_load(self.buffer, directory)

    def file_memory(self, directory: pathlib.Path) -> dict[str, float]:
        return _files_memory(self.buffer, self.stored_bytes(), directory)

    def __init__(self, workload: Workload) -> None:
        buffer = tfbuffers.TFUniformReplayBuffer(workload.spec, workload.num_envs, workload.max_length)
        super().__init__(workload, buffer)


class TFAgentsTF(_TFBuffer):
    """tf_agents TFUniformReplayBuffer."""

    name = "TF-Agents TF"

    def __init__(self, workload: Workload) -> None:
        buffer = tf_uniform_replay_buffer.TFUniformReplayBuffer(workload.spec, workload.num_envs, workload.max_length)
        super().__init__(workload, buffer)


class TFBuffersPy(System):
    """tfbuffers.PyUniformReplayBuffer: one add per step for all environments."""

    name = "tfbuffers py"

    def __init__(self, workload: Workload) -> None:
        super().__init__(workload)
        self.buffer = tfbuffers.PyUniformReplayBuffer(
            workload.spec, batch_size=workload.num_envs, max_length=workload.max_length
        )

    # The same API as the TF buffer, measured the same way.
    add = _TFBuffer.add
    dataset = _TFBuffer.dataset
    sample_dataset = _TFBuffer.sample_dataset
    get_next = _TFBuffer.get_next
    deterministic_pass = _TFBuffer.deterministic_pass
    save_load = TFBuffersTF.save_load
    file_memory = TFBuffersTF.file_memory

    def stored_bytes(self) -> int:
        return self.buffer.nbytes  # rows, counter and (episode-aware) the record of episode ends


def _priority_batches(workload: Workload) -> list[np.ndarray]:
    """16 batches of new priorities, made before any timing, that every prioritized system is given."""
    rng = np.random.default_rng(0)
    return [rng.uniform(0.1, 2.0, workload.sample_batch_size) for _ in range(16)]


def _sample_update(buffer: Any, workload: Workload, num_batches: int) -> float:
    """`get_next`, then `update_priorities` of the windows' first frames, as a learner does after a step."""
    priorities = _priority_batches(workload)

    def step(i: int) -> None:
        _, info = buffer.get_next(workload.sample_batch_size, workload.num_steps)
        buffer.update_priorities(info.ids[:, 0], priorities[i % len(priorities)])

    step(0)
    return _time(lambda: _repeat(step, num_batches))


class TFBuffersTFPrioritized(TFBuffersTF):
    """tfbuffers.TFPrioritizedReplayBuffer (alpha 0.6)."""

    name = "tfbuffers TF prioritized"

    def __init__(self, workload: Workload) -> None:
        buffer = tfbuffers.TFPrioritizedReplayBuffer(workload.spec, workload.num_envs, workload.max_length)
        _TFBuffer.__init__(self, workload, buffer)

    def sample_update(self, num_batches: int) -> float:
        return _sample_update(self.buffer, self.workload, num_batches)

    # The uniform buffer's paths, priorities aside: measured once, on it.
    deterministic_pass = System.deterministic_pass  # type: ignore[assignment]
    save_load = System.save_load  # type: ignore[assignment]


class TFBuffersPyPrioritized(TFBuffersPy):
    """tfbuffers.PyPrioritizedReplayBuffer (alpha 0.6)."""

    name = "tfbuffers py prioritized"

    def __init__(self, workload: Workload) -> None:
        System.__init__(self, workload)
        self.buffer = tfbuffers.PyPrioritizedReplayBuffer(
            workload.spec, batch_size=workload.num_envs, max_length=workload.max_length
        )

    def sample_update(self, num_batches: int) -> float:
        return _sample_update(self.buffer, self.workload, num_batches)

    def stored_bytes(self) -> int:
        return self.buffer.nbytes  # rows, counter, priorities and their tree

    deterministic_pass = System.deterministic_pass  # type: ignore[assignment]
    save_load = System.save_load  # type: ignore[assignment]


def _step_types(t: Any, ops: Any = np) -> tuple[Any, Any]:
    """(step_type, next_step_type) of add number `t` in episodes of `EPISODE` frames (numpy ints or tensors)."""
    position = t % EPISODE
    step_type = ops.where(position == 0, FIRST, ops.where(position == EPISODE - 1, LAST, MID))
    next_step_type = ops.where(position == EPISODE - 1, FIRST, ops.where(position == EPISODE - 2, LAST, MID))
    return step_type, next_step_type


def _in_episodes(batches: list[Any]) -> list[Any]:
    """The batches with the step types of episodes of `EPISODE` frames (the batches cycle: 64 is a multiple)."""
    episodes = []
    for t, batch in enumerate(batches):
        step_type, next_step_type = (np.full_like(batch.step_type, value) for value in _step_types(t))
        episodes.append(batch._replace(step_type=step_type, next_step_type=next_step_type))
    return episodes


class _Episodes:
    """Mixin: the buffer built with `episode_boundaries=True`, fed episodes of `EPISODE` frames."""

    buffer: Any
    _graph_batch: Any

    def prepare(self, batches: list[Any]) -> list[Any]:
        return _in_episodes(batches)

    def _loop_fn(self, num_adds: tf.Tensor) -> None:  # the TF buffers' fill and in-graph adds
        for t in tf.range(num_adds):
            step_type, next_step_type = _step_types(t, tf)
            batch = self._graph_batch._replace(
                step_type=tf.fill(tf.shape(self._graph_batch.step_type), tf.cast(step_type, tf.int32)),
                next_step_type=tf.fill(tf.shape(self._graph_batch.step_type), tf.cast(next_step_type, tf.int32)),
            )
            self.buffer.add_batch(batch)

    variant = True


class TFBuffersTFEpisodes(_Episodes, TFBuffersTF):
    """tfbuffers.TFUniformReplayBuffer(episode_boundaries=True)."""

    name = "tfbuffers TF episodes"

    def __init__(self, workload: Workload) -> None:
        buffer = tfbuffers.TFUniformReplayBuffer(
            workload.spec, workload.num_envs, workload.max_length, episode_boundaries=True
        )
        _TFBuffer.__init__(self, workload, buffer)


class TFBuffersPyEpisodes(_Episodes, TFBuffersPy):
    """tfbuffers.PyUniformReplayBuffer(episode_boundaries=True)."""

    name = "tfbuffers py episodes"

    def __init__(self, workload: Workload) -> None:
        System.__init__(self, workload)
        self.buffer = tfbuffers.PyUniformReplayBuffer(
            workload.spec, batch_size=workload.num_envs, max_length=workload.max_length, episode_boundaries=True
        )


class TFBuffersTFPrioritizedEpisodes(_Episodes, TFBuffersTFPrioritized):
    """tfbuffers.TFPrioritizedReplayBuffer(episode_boundaries=True)."""

    name = "tfbuffers TF prioritized episodes"

    def __init__(self, workload: Workload) -> None:
        buffer = tfbuffers.TFPrioritizedReplayBuffer(
            workload.spec, workload.num_envs, workload.max_length, episode_boundaries=True
        )
        _TFBuffer.__init__(self, workload, buffer)


class TFBuffersPyPrioritizedEpisodes(_Episodes, TFBuffersPyPrioritized):
    """tfbuffers.PyPrioritizedReplayBuffer(episode_boundaries=True)."""

    name = "tfbuffers py prioritized episodes"

    def __init__(self, workload: Workload) -> None:
        System.__init__(self, workload)
        self.buffer = tfbuffers.PyPrioritizedReplayBuffer(
            workload.spec, batch_size=workload.num_envs, max_length=workload.max_length, episode_boundaries=True
        )


class TFBuffersPyFrameStacks(TFBuffersPy):
    """tfbuffers.PyUniformReplayBuffer(frame_stacks="observation"), fed real stacks.

    Each add's observation is each environment's newest 4 frames: the previous add's
    last 3 and a new one (a batch's random frame stamped with the add number, so that
    no two frames are alike), reset to a new frame repeated every `STACK_EPISODE` adds.
    """

    name = "tfbuffers py frame stacks"

    def __init__(self, workload: Workload) -> None:
        System.__init__(self, workload)
        self.buffer = tfbuffers.PyUniformReplayBuffer(
            workload.spec,
            batch_size=workload.num_envs,
            max_length=workload.max_length,
            frame_stacks="observation",
        )
        self._stacks: np.ndarray | None = None
        self._adds = 0

    @classmethod
    def applies(cls, workload: Workload) -> bool:
        return workload.observation.shape.rank == 3  # [height, width, stacked frames]

    def add(self, batch: Any) -> None:  # type: ignore[override]
        frames = batch.observation[..., -1].copy()  # [envs, height, width]
        frames.reshape(len(frames), -1)[:, :8] = np.frombuffer(np.int64(self._adds).tobytes(), np.uint8)
        if self._stacks is None or self._adds % STACK_EPISODE == 0:
            self._stacks = np.repeat(frames[..., None], batch.observation.shape[-1], axis=-1)
        else:
            self._stacks = np.concatenate([self._stacks[..., 1:], frames[..., None]], axis=-1)
        self._adds += 1
        self.buffer.add_batch(batch._replace(observation=self._stacks))

    variant = True

    def stored_bytes(self) -> int:
        return self.buffer.nbytes  # rows, counter and (episode-aware) the record of episode ends


class TFAgentsPy(System):
    """tf_agents PyUniformReplayBuffer: batches of one only, so one add per environment per step."""

    name = "TF-Agents py"

    def __init__(self, workload: Workload) -> None:
        super().__init__(workload)
        spec = tensor_spec.to_nest_array_spec(workload.spec)
        self.buffer = py_uniform_replay_buffer.PyUniformReplayBuffer(spec, workload.frames)

    def add(self, batch: Any) -> None:
        for env in range(self.workload.num_envs):
            self.buffer.add_batch(tf.nest.map_structure(lambda x, e=env: x[e : e + 1], batch))

    def sample_dataset(self, num_batches: int) -> float:
        w = self.workload
        return _iterate(
            self.buffer.as_dataset(w.sample_batch_size, w.num_steps).prefetch(tf.data.AUTOTUNE), num_batches
        )

    def get_next(self, num_batches: int) -> float:
        w = self.workload
        return _calls(lambda: self.buffer.get_next(w.sample_batch_size, w.num_steps), num_batches)

    save_load = _TFBuffer.save_load

    def stored_bytes(self) -> int:
        # Its storage is one `[capacity, *shape]` array per field of the spec (tf_agents NumpyStorage); it shows
        # no size of its own.
        fields = tf.nest.flatten(self.workload.spec)
        return self.workload.frames * sum(spec.shape.num_elements() * spec.dtype.size for spec in fields)


def _mid_episode(batches: list[Any]) -> list[Any]:
    """The batches with every step type MID: one long episode per environment, as Reverb writers see most frames.

    Random step types would end an episode at a third of the frames; both Reverb paths flush or reset there.
    """

    def mid(batch: Any) -> Any:
        middle = np.full_like(batch.step_type, MID)
        return batch._replace(step_type=middle, next_step_type=middle)

    return [mid(batch) for batch in batches]


def _reverb_checkpoint(client: Any) -> tuple[float, None, int]:
    """(Seconds of a Reverb checkpoint, no load measure, bytes written)."""
    start = time.perf_counter()
    path = pathlib.Path(client.checkpoint())
    seconds = time.perf_counter() - start
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return seconds, None, size


class TFBuffersReverb(System):
    """tfbuffers.ReverbReplayBuffer on its embedded server: one add_batch per step for all environments."""

    name = "tfbuffers Reverb"
    requires = ("reverb",)

    def __init__(self, workload: Workload) -> None:
        super().__init__(workload)
        self._checkpoint_dir = tempfile.mkdtemp(prefix="reverb-benchmark-")
        self.buffer = tfbuffers.ReverbReplayBuffer(
            workload.spec,
            workload.num_steps,
            batch_size=workload.num_envs,
            capacity=workload.frames,
            checkpoint_dir=self._checkpoint_dir,
        )

    def prepare(self, batches: list[Any]) -> list[Any]:
        return _mid_episode(batches)

    add = _TFBuffer.add
    dataset = _TFBuffer.dataset
    sample_dataset = _TFBuffer.sample_dataset
    get_next = _TFBuffer.get_next

    def save_load(self, directory: pathlib.Path) -> tuple[float, None, int]:
        return _reverb_checkpoint(self.buffer.py_client)

    def close(self) -> None:
        self.buffer.close()
        shutil.rmtree(self._checkpoint_dir, ignore_errors=True)


class TFAgentsReverb(System):
    """TF-Agents' Reverb path: ReverbAddTrajectoryObserver per environment, ReverbReplayBuffer."""

    name = "TF-Agents Reverb"
    requires = ("reverb",)

    def __init__(self, workload: Workload) -> None:
        super().__init__(workload)
        import reverb
        from tf_agents.replay_buffers import reverb_replay_buffer, reverb_utils

        self._checkpoint_dir = tempfile.mkdtemp(prefix="reverb-benchmark-")
        table = reverb.Table(
            "uniform",
            max_size=workload.frames,
            sampler=reverb.selectors.Uniform(),
            remover=reverb.selectors.Fifo(),
            rate_limiter=reverb.rate_limiters.MinSize(1),
        )
        checkpointer = reverb.checkpointers.DefaultCheckpointer(self._checkpoint_dir)
        self.server = reverb.Server([table], port=None, checkpointer=checkpointer)
        self.buffer = reverb_replay_buffer.ReverbReplayBuffer(
            workload.spec, "uniform", sequence_length=workload.num_steps, local_server=self.server
        )
        self.observers = [
            reverb_utils.ReverbAddTrajectoryObserver(self.buffer.py_client, "uniform", workload.num_steps)
            for _ in range(workload.num_envs)
        ]

    def prepare(self, batches: list[Any]) -> list[Any]:
        return _mid_episode(batches)

    def add(self, batch: Any) -> None:
        for env, observer in enumerate(self.observers):
            observer(tf.nest.map_structure(lambda x, e=env: x[e], batch))

    def sample_dataset(self, num_batches: int) -> float:
        w = self.workload
        dataset = self.buffer.as_dataset(w.sample_batch_size, w.num_steps, num_parallel_calls=tf.data.AUTOTUNE)
        return _iterate(dataset.prefetch(tf.data.AUTOTUNE), num_batches)

    def save_load(self, directory: pathlib.Path) -> tuple[float, None, int]:
        return _reverb_checkpoint(self.buffer.py_client)

    def close(self) -> None:
        for observer in self.observers:
            observer.close()
        self.server.stop()
        shutil.rmtree(self._checkpoint_dir, ignore_errors=True)


class TFBuffersPyMemmap(TFBuffersPy):
    """tfbuffers.PyUniformReplayBuffer(directory=...): memory-mapped files in a temporary directory.

    Its pages are the kernel's page cache (file-backed, not the process's anonymous memory): while they
    fit in it, it is measured against the same buffer in RAM.
    """

    name = "tfbuffers py memmap"
    variant = True
    buffer_class: Any = tfbuffers.PyUniformReplayBuffer

    def __init__(self, workload: Workload) -> None:
        System.__init__(self, workload)
        self._root = pathlib.Path(tempfile.mkdtemp(prefix="tfbuffers-benchmark-"))
        self.buffer = self._new(workload.max_length)

    def _new(self, max_length: int) -> Any:
        directory = pathlib.Path(tempfile.mkdtemp(dir=self._root)) / "buffer"
        return self.buffer_class(
            self.workload.spec, batch_size=self.workload.num_envs, max_length=max_length, directory=directory
        )

    def open_times(self, batches: list[Any]) -> dict[str, float]:
        """`tfbuffers.open` (median of 3) on a full buffer of 1/8 the capacity and on this one, by frames stored."""
        small = self._new(max(self.workload.max_length // 8, 1))
        for t in range(small.max_length):
            small.add_batch(batches[t % len(batches)])
        times = {}
        for buffer in (small, self.buffer):
            directory, frames = buffer.directory, int(buffer.num_frames())
            buffer.close()
            runs = []
            for _ in range(3):
                start = time.perf_counter()
                reopened = tfbuffers.open(directory)
                runs.append(time.perf_counter() - start)
                reopened.close()
            times[str(frames)] = statistics.median(runs)
        self.buffer = tfbuffers.open(directory)
        return times

    def close(self) -> None:
        self.buffer.close()
        shutil.rmtree(self._root, ignore_errors=True)


class TFBuffersPyPrioritizedMemmap(TFBuffersPyMemmap):
    """tfbuffers.PyPrioritizedReplayBuffer(directory=...) (alpha 0.6): priorities and sum tree in files too."""

    name = "tfbuffers py prioritized memmap"
    buffer_class = tfbuffers.PyPrioritizedReplayBuffer

    def sample_update(self, num_batches: int) -> float:
        return _sample_update(self.buffer, self.workload, num_batches)


class Cpprb(System):
    """cpprb's ReplayBuffer: all environments' frames in one add, transitions (frame and next observation) sampled.

    A sample of `sample_batch_size` transitions holds `sample_batch_size * 2` observations, as the other
    systems' windows of 2 frames do (the next observation is stored once, `next_of`).
    """

    name = "cpprb uniform"
    requires = ("cpprb",)

    def __init__(self, workload: Workload) -> None:
        super().__init__(workload)
        import cpprb

        fields = specs.flatten_spec(workload.spec)  # in tf.nest's order, named by path
        self.paths = [field.path for field in fields]
        env_dict = {
            field.path: {"shape": field.spec.shape.as_list() or 1, "dtype": field.spec.dtype.as_numpy_dtype}
            for field in fields
        }
        self.buffer = self._make(cpprb, workload.frames, env_dict)

    def _make(self, cpprb: Any, size: int, env_dict: dict[str, Any]) -> Any:
        return cpprb.ReplayBuffer(size, env_dict, next_of=("observation",))

    def add(self, batch: Any) -> None:
        leaves = dict(zip(self.paths, tf.nest.flatten(batch)))
        self.buffer.add(**leaves, next_observation=leaves["observation"])

    def _sample(self) -> Any:
        return self.buffer.sample(self.workload.sample_batch_size)

    def get_next(self, num_batches: int) -> float:
        self._sample()
        return _calls(self._sample, num_batches)

    def stored_bytes(self) -> int:
        return self.buffer.get_buffer_size() * self.workload.payload_bytes  # its arrays hold the payload


class CpprbPER(Cpprb):
    """cpprb's PrioritizedReplayBuffer (alpha 0.6): C++ sum and min trees."""

    name = "cpprb PER"

    def _make(self, cpprb: Any, size: int, env_dict: dict[str, Any]) -> Any:
        return cpprb.PrioritizedReplayBuffer(size, env_dict, alpha=0.6, next_of=("observation",))

    def _sample(self) -> Any:
        return self.buffer.sample(self.workload.sample_batch_size, beta=PRIORITY_BETA)

    def sample_update(self, num_batches: int) -> float:
        priorities = _priority_batches(self.workload)

        def step(i: int) -> None:
            self.buffer.update_priorities(self._sample()["indexes"], priorities[i % len(priorities)])

        step(0)
        return _time(lambda: _repeat(step, num_batches))


class NumpyLimit(System):
    """A plain numpy ring: slice writes and one fancy-index gather per field, no checks, no locks."""

    name = "numpy limit"

    def __init__(self, workload: Workload) -> None:
        super().__init__(workload)
        self.fields = tf.nest.flatten(workload.spec)
        self.arrays = [np.zeros((workload.frames, *s.shape.as_list()), s.dtype.as_numpy_dtype) for s in self.fields]
        self.position = 0
        self.rng = np.random.default_rng(0)

    def add(self, batch: Any) -> None:
        start = (self.position % self.workload.max_length) * self.workload.num_envs
        for array, leaf in zip(self.arrays, tf.nest.flatten(batch)):
            array[start : start + self.workload.num_envs] = leaf
        self.position += 1

    def _gather(self) -> list[np.ndarray]:
        w = self.workload
        starts = self.rng.integers(0, w.max_length - w.num_steps + 1, w.sample_batch_size)
        segments = self.rng.integers(0, w.num_envs, w.sample_batch_size)
        rows = (starts[:, None] + np.arange(w.num_steps)) * w.num_envs + segments[:, None]
        return [np.take(array, rows, axis=0) for array in self.arrays]

    def get_next(self, num_batches: int) -> float:
        return _calls(self._gather, num_batches)

    def save_load(self, directory: pathlib.Path) -> tuple[float, float, int]:
        path = directory / "arrays.npz"
        save = _time(lambda: np.savez(path, *self.arrays))

        def load_arrays() -> None:
            for array, loaded in zip(self.arrays, np.load(path).values()):
                np.copyto(array, loaded)

        load = _time(load_arrays)
        return save, load, path.stat().st_size

    def stored_bytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)


class _BareRing(tf.Module):
    """Variables written by one scatter per field and sampled by uniform draws and gathers, nothing else."""

    def __init__(self, workload: Workload) -> None:
        super().__init__()
        self.workload = workload
        self.fields = [
            tf.Variable(tf.zeros([workload.frames, *s.shape.as_list()], s.dtype), trainable=False)
            for s in tf.nest.flatten(workload.spec)
        ]
        self.added = tf.Variable(tf.constant(0, tf.int64), trainable=False)
        self._compiled_add = tf.function(self.add_uncompiled)
        self._compiled_sample = tf.function(self.sample_uncompiled)

    def variables(self) -> list[tf.Variable]:
        """The storage, as the TF buffers' method of that name (which `_TFBuffer` reads) gives it."""
        return list(self.fields)

    def add_batch(self, batch: Any) -> None:
        self._compiled_add(batch)

    def add_uncompiled(self, batch: Any) -> None:
        w = self.workload
        rows = (self.added % w.max_length) * w.num_envs + tf.range(w.num_envs, dtype=tf.int64)
        writes = [v.scatter_update(tf.IndexedSlices(x, rows)) for v, x in zip(self.fields, tf.nest.flatten(batch))]
        with tf.control_dependencies(writes):
            self.added.assign_add(1, read_value=False)

    def sample_uncompiled(self, _: Any = None) -> Any:
        w = self.workload
        starts = tf.random.uniform([w.sample_batch_size], 0, w.frames - w.num_steps * w.num_envs, dtype=tf.int64)
        rows = starts[:, None] + tf.range(0, w.num_steps * w.num_envs, w.num_envs, dtype=tf.int64)
        items = tf.nest.pack_sequence_as(w.spec, [tf.gather(v, rows) for v in self.fields])
        return items, tfbuffers.BufferInfo(rows, tf.fill([w.sample_batch_size], 1.0 / w.frames))

    def get_next(self, sample_batch_size: int, num_steps: int) -> Any:
        return self._compiled_sample()

    def as_dataset(self, sample_batch_size: int, num_steps: int, num_parallel_calls: Any) -> tf.data.Dataset:
        return tf.data.Dataset.counter().map(self.sample_uncompiled, num_parallel_calls=num_parallel_calls)


class BareVariables(_TFBuffer):
    """`tf.Variable`s of the same size, written and sampled with no bookkeeping: the floor of an in-graph buffer.

    Adds scatter one block and move a counter; samples draw uniform window
    starts and gather. No checks, no lock, no ids, no wrap-around windows: what
    any in-graph buffer must at least do, so that the TF buffers' ratios to it
    show what their bookkeeping and safety cost. Measured as the TF buffers are.
    """

    name = "bare tf.Variable"

    def __init__(self, workload: Workload) -> None:
        super().__init__(workload, _BareRing(workload))

    def _sample_call(self) -> Any:
        return self.buffer.sample_uncompiled()  # not the compiled one, traced earlier without the debugger

    def _add_call(self) -> None:
        self.buffer.add_uncompiled(self._graph_batch)

    # Neither: it has no deterministic pass and nothing to save.
    deterministic_pass = System.deterministic_pass  # type: ignore[assignment]
    save_load = System.save_load  # type: ignore[assignment]


class TFDataCeiling(System):
    """No buffer: a dataset whose elements have the same structure, made by `tf.fill`.

    What tf.data and the Python iterator cost per element on this machine, which
    bounds every `as_dataset` pipeline from above.
    """

    name = "tf.data ceiling"
    adds = False

    def fill(self, batches: list[Any], bar: Any) -> None:
        bar.update(self.workload.frames)

    def dataset(self) -> tf.data.Dataset:
        w = self.workload
        outer = [w.sample_batch_size, w.num_steps]

        def element(_: tf.Tensor) -> Any:
            items = tf.nest.map_structure(lambda s: tf.fill(outer + s.shape.as_list(), tf.cast(1, s.dtype)), w.spec)
            ids = tf.fill(outer, tf.constant(1, tf.int64))
            return items, tfbuffers.BufferInfo(ids, tf.fill(outer[:1], 0.5))

        dataset = tf.data.Dataset.counter().map(element, num_parallel_calls=tf.data.AUTOTUNE)
        return dataset.prefetch(tf.data.AUTOTUNE)

    def sample_dataset(self, num_batches: int) -> float:
        return _iterate(self.dataset(), num_batches)

    def sample_dataset_graph(self, num_batches: int) -> float:
        return _consume_in_graph(self.dataset(), num_batches)


SYSTEMS: list[type[System]] = [
    TFBuffersTF,
    TFAgentsTF,
    TFBuffersPy,
    TFAgentsPy,
    TFBuffersTFPrioritized,
    TFBuffersPyPrioritized,
    TFBuffersTFEpisodes,
    TFBuffersPyEpisodes,
    TFBuffersTFPrioritizedEpisodes,
    TFBuffersPyPrioritizedEpisodes,
    TFBuffersPyFrameStacks,
    TFBuffersPyMemmap,
    TFBuffersPyPrioritizedMemmap,
    Cpprb,
    CpprbPER,
    TFBuffersReverb,
    TFAgentsReverb,
    NumpyLimit,
    BareVariables,
    TFDataCeiling,
]


WHY_MISSING = {
    "reverb": " (dm-reverb has wheels for Python 3.11 and older only)",
    "cpprb": " (the 'all', 'current' and 'scripts' extras install it; cpprb 11.0 has wheels for Python 3.12 and older)",
}


def available_systems() -> tuple[list[type[System]], dict[str, str]]:
    """The systems this environment can run, and why each other one is left out."""
    kept: list[type[System]] = []
    left_out: dict[str, str] = {}
    for cls in SYSTEMS:
        missing = [module for module in cls.requires if importlib.util.find_spec(module) is None]
        if missing:
            why = WHY_MISSING.get(missing[0], "")
            left_out[cls.name] = f"needs {', '.join(missing)}, not installed here{why}"
        else:
            kept.append(cls)
    return kept, left_out


LEARNER_BATCHES = 200  # batches a learner draws through as_dataset for its rate (quick: a fifth)


def _actor(
    backend: str, target: tuple[str, str], workload: Workload, seconds: float, ready: Any, go: Any, results: Any
) -> None:
    """One actor process: adds the workload's batches to the buffer at `target` for `seconds`, then flushes.

    `target`: `(address, name)`: a Reverb server's address, or a Ray cluster's and the buffer's name.
    """
    batches = _mid_episode(numpy_batches(workload, 16, seed=os.getpid()))
    address, name = target
    if backend == "tfbuffers Ray":
        buffer = tfbuffers.RayReplayBuffer.connect(name, address=address)
        writer: Any = buffer.writer(workload.num_envs)  # this process's segments
    else:
        buffer = writer = tfbuffers.ReverbReplayBuffer(
            workload.spec, workload.num_steps, batch_size=workload.num_envs, address=address
        )
    with buffer, writer:
        writer.add_batch(batches[0])  # connected and warm before the clock starts
        writer.flush()
        ready.put(True)
        go.wait()
        start = time.perf_counter()
        steps = 0
        while time.perf_counter() - start < seconds:
            writer.add_batch(batches[steps % len(batches)])
            steps += 1
        writer.flush()
        results.put((steps * workload.num_envs, time.perf_counter() - start))


def learner_rate(buffer: Any, workload: Workload, num_batches: int) -> float:
    """Windows per second a learner draws from `buffer` through `as_dataset` (+ prefetch), as the systems' measure."""
    w = workload
    dataset = buffer.as_dataset(w.sample_batch_size, w.num_steps, num_parallel_calls=tf.data.AUTOTUNE)
    return num_batches * w.sample_batch_size / _iterate(dataset.prefetch(tf.data.AUTOTUNE), num_batches)


def actor_rates(
    backend: str, workload: Workload, counts: list[int], seconds: float, quick: bool, progress: bool
) -> dict[str, Any]:
    """Frames (items) per second into one buffer from 1, 2, 4... actor processes adding at once; the learner's rate.

    `backend` "tfbuffers Reverb": the embedded server of a `tfbuffers.ReverbReplayBuffer` in this process; each
    actor a process with a `ReverbReplayBuffer(..., address=...)`. "tfbuffers Ray": a `RayReplayBuffer` (in a
    local Ray cluster this process starts) of `num_envs` segments per actor of the largest count; each actor a
    process that connects by name and adds through a `RayWriter` of its own segments. Actors add one frame per
    environment per call, as `scripts/collect.py` does once its environment has stepped. Then this process
    samples the buffer through `as_dataset`, as a learner does ("learner", windows/s, the buffer quiet).
    """
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    rates: dict[str, Any] = {"adds": {}}
    ray = None
    if backend == "tfbuffers Ray":
        from tfbuffers.ray_replay_buffer import ensure_ray

        started = not importlib.import_module("ray").is_initialized()
        ray = ensure_ray()
        segments = workload.num_envs * max(counts)
        server: Any = tfbuffers.RayReplayBuffer(
            workload.spec,
            batch_size=segments,
            max_length=max(workload.frames // segments, workload.num_steps),
            name=f"benchmark-{os.getpid()}",
        )
        target = (ray.get_runtime_context().gcs_address, server.name)
    else:
        server = tfbuffers.ReverbReplayBuffer(
            workload.spec, workload.num_steps, batch_size=workload.num_envs, capacity=workload.frames
        )
        target = (server.server_address, "")
    try:
        for count in tqdm(counts, desc=f"{workload.name}: {backend} actors", disable=not progress):
            server.clear()
            ready, results, go = context.Queue(), context.Queue(), context.Event()
            actors = [
                context.Process(target=_actor, args=(backend, target, workload, seconds, ready, go, results))
                for _ in range(count)
            ]
            for actor in actors:
                actor.start()
            for _ in actors:
                ready.get(timeout=300)
            go.set()
            added = [results.get(timeout=300 + seconds) for _ in actors]
            for actor in actors:
                actor.join(timeout=60)
            frames = sum(frames for frames, _ in added)
            elapsed = max(elapsed for _, elapsed in added)
            rates["adds"][str(count)] = {
                "frames_per_second": frames / elapsed,
                "per_actor": [frames / elapsed for frames, elapsed in added],
            }
        batches = LEARNER_BATCHES // 5 if quick else LEARNER_BATCHES
        rates["learner"] = learner_rate(server, workload, batches)
    finally:
        server.close()
        if ray is not None and started:
            ray.shutdown()
    return rates


def local_learner_rate(workload: Workload, quick: bool) -> float:
    """`learner_rate` of a local `PyUniformReplayBuffer` holding the workload's frames: the single-process floor."""
    buffer = tfbuffers.PyUniformReplayBuffer(
        workload.spec, batch_size=workload.num_envs, max_length=workload.frames // workload.num_envs
    )
    for batch in _mid_episode(numpy_batches(workload, 16)) * (workload.frames // workload.num_envs // 16 + 1):
        buffer.add_batch(batch)
    return learner_rate(buffer, workload, LEARNER_BATCHES // 5 if quick else LEARNER_BATCHES)


def _rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def _anonymous() -> int | None:
    """The process's anonymous resident bytes (`RssAnon` of /proc/self/status: not the page cache), or None."""
    try:
        status = pathlib.Path("/proc/self/status").read_text()
    except OSError:
        return None
    return next((int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("RssAnon:")), None)


def run_workload(
    workload: Workload, repetitions: int, quick: bool, progress: bool, classes: list[type[System]]
) -> dict[str, Any]:
    """Builds and fills every system of `classes`, then runs every measure on each in turn, `repetitions` times."""
    batches = numpy_batches(workload, 64)
    classes = [cls for cls in classes if cls.applies(workload)]
    systems: list[System] = []
    given: dict[str, list[Any]] = {}  # each system's batches
    memory: dict[str, dict[str, float | None]] = {}
    total = workload.frames * len(classes)
    with tqdm(total=total, unit="frame", desc=f"{workload.name}: fill", disable=not progress) as bar:
        for cls in classes:
            before, anonymous_before = _rss(), _anonymous()
            system = cls(workload)
            given[system.name] = system.prepare(batches)
            system.fill(given[system.name], bar)
            resident = _rss() - before
            anonymous_after = _anonymous()
            anonymous = (
                None if anonymous_before is None or anonymous_after is None else anonymous_after - anonymous_before
            )
            stored = system.stored_bytes()
            memory[system.name] = {
                "resident_bytes_per_frame": resident / workload.frames if system.adds else None,
                "anonymous_bytes_per_frame": (
                    anonymous / workload.frames if system.adds and anonymous is not None else None
                ),
                "stored_bytes_per_frame": None if stored is None else stored / workload.frames,
            }
            systems.append(system)

    num_adds = 200 if quick else 2_000
    sample_batches = 20 if quick else 500
    pass_elements = 100 if quick else 2_000
    frames_per_sample = workload.sample_batch_size * workload.num_steps
    samples: dict[str, dict[str, list[float]]] = {name: {s.name: [] for s in systems} for name in MEASURES}
    steps = repetitions * len(systems)
    with tqdm(total=steps, desc=f"{workload.name}: measure", disable=not progress) as bar:
        for _ in range(repetitions):
            for system in systems:
                if system.adds:
                    seconds = _time(functools.partial(_add_steps, system, given[system.name], num_adds))
                    samples["add_eager"][system.name].append(num_adds * workload.num_envs / seconds)
                graph = system.add_graph(num_adds * 5)
                if graph is not None:
                    samples["add_graph"][system.name].append(num_adds * 5 * workload.num_envs / graph)
                dataset = system.sample_dataset(sample_batches)
                if dataset is not None:
                    samples["sample_dataset"][system.name].append(sample_batches * frames_per_sample / dataset)
                consumed = system.sample_dataset_graph(sample_batches)
                if consumed is not None:
                    samples["sample_dataset_graph"][system.name].append(sample_batches * frames_per_sample / consumed)
                direct = system.get_next(sample_batches)
                if direct is not None:
                    samples["get_next"][system.name].append(sample_batches * frames_per_sample / direct)
                updated = system.sample_update(sample_batches)
                if updated is not None:
                    samples["sample_update"][system.name].append(sample_batches * frames_per_sample / updated)
                deterministic = None if system.variant else system.deterministic_pass(pass_elements)
                if deterministic is not None:
                    samples["deterministic_pass"][system.name].append(deterministic[1] / deterministic[0])
                with tempfile.TemporaryDirectory() as directory:
                    saved = None if system.variant else system.save_load(pathlib.Path(directory))
                if saved is not None:
                    save, load, size = saved
                    samples["save"][system.name].append(size / save / 1e6)
                    if load is not None:
                        samples["load"][system.name].append(size / load / 1e6)
                bar.update(1)
    ops = {system.name: counted for system in systems if (counted := system.graph_ops()) is not None}
    opened = {system.name: times for system in systems if (times := system.open_times(given[system.name]))}
    file_memory = {}
    for system in systems:
        with tempfile.TemporaryDirectory() as directory:
            measured = None if system.variant else system.file_memory(pathlib.Path(directory))
        if measured is not None:
            file_memory[system.name] = measured
    for system in systems:
        system.close()
    del systems
    gc.collect()
    summary = {
        measure: {name: summarize(values) for name, values in by_system.items() if values}
        for measure, by_system in samples.items()
    }
    return {
        "workload": dataclasses.asdict(workload) | {"payload_bytes": workload.payload_bytes},
        "measures": summary,
        "memory": memory,
        "files": file_memory,
        "ops": ops,
        "open": opened,
    }


def ratios(result: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Ratios of medians, tfbuffers / peer, per measure."""
    table: dict[str, dict[str, float]] = {}
    for measure, by_system in result["measures"].items():
        row = {}
        for ours, theirs in OURS.items():
            if ours in by_system and theirs in by_system:
                row[f"{ours} / {theirs}"] = by_system[ours]["median"] / by_system[theirs]["median"]
            for peer in REFERENCES[ours]:
                if ours in by_system and peer in by_system:
                    row[f"{ours} / {peer}"] = by_system[ours]["median"] / by_system[peer]["median"]
        table[measure] = row
    return table


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _ratio(value: float) -> str:
    """A ratio to two decimals, or to two significant digits below 0.1 (never `0.00x`)."""
    return f"{value:.2f}x" if value >= 0.1 or value == 0 else f"{value:.2g}x"


def markdown(results: dict[str, Any]) -> str:
    """The results as markdown tables: frames/s (median, range) and ratios."""
    names = results["systems"]
    lines = []
    for workload_name, result in results["workloads"].items():
        payload = result["workload"]["payload_bytes"]
        lines += [f"### {workload_name} ({result['workload']['frames']:,} frames, {payload} payload bytes/frame)", ""]
        lines += ["| measure | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for measure, label in MEASURES.items():
            cells = []
            for name in names:
                entry = result["measures"][measure].get(name)
                cells.append(
                    "-" if entry is None else f"{_fmt(entry['median'])} ({_fmt(entry['min'])}–{_fmt(entry['max'])})"
                )
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        for key, label in (
            ("stored_bytes_per_frame", "stored bytes/frame"),
            ("resident_bytes_per_frame", "resident bytes/frame (RSS)"),
            ("anonymous_bytes_per_frame", "anonymous resident bytes/frame (RssAnon)"),
        ):
            cells = [_fmt(result["memory"].get(name, {}).get(key)) for name in names]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        if result.get("ops"):
            lines += [
                "",
                "Ops of one in-graph call: those it runs (`benchmark.executed_ops`), and the nodes of its graph with",
                "the functions they call (`benchmark.graph_ops`: both branches of a cond, a loop body once):",
                "",
                "| system | `get_next` ops run | `add_batch` ops run | `get_next` nodes | `add_batch` nodes |",
                "|---|---|---|---|---|",
            ]
            for name, counted in result["ops"].items():
                cells = [counted[key] for key in ("sample", "add", "sample_nodes", "add_nodes")]
                lines.append(f"| {name} | " + " | ".join(map(str, cells)) + " |")
        if result.get("files"):
            lines += [
                "",
                "Buffer files: bytes per stored frame, and the peak resident memory each call needs beyond the",
                "buffer's own storage, as a multiple of that storage (loads in fresh processes):",
                "",
                "| system | file bytes/frame | save | <class>.load | files.load into an empty buffer |",
                "|---|---|---|---|---|",
            ]
            for name, entry in result["files"].items():
                stored = entry["stored_bytes"]
                peaks = [
                    entry[key] / stored for key in ("save_peak_bytes", "load_new_peak_bytes", "load_into_peak_bytes")
                ]
                cells = [_fmt(entry["file_bytes_per_frame"])] + [f"{peak:.2f}x" for peak in peaks]
                lines.append(f"| {name} | " + " | ".join(cells) + " |")
        if result.get("open"):
            lines += [
                "",
                "Memory-mapped buffers: `tfbuffers.open` (median of 3, page cache warm) on full buffers of two",
                "sizes, and the anonymous resident memory (RssAnon) their fill took, against the bytes they store:",
                "",
                "| system | frames: open seconds | RssAnon / stored bytes |",
                "|---|---|---|",
            ]
            for name, times in result["open"].items():
                opens = ", ".join(f"{int(frames):,}: {seconds * 1e3:.1f} ms" for frames, seconds in times.items())
                entry = result["memory"].get(name, {})
                anonymous, stored = entry.get("anonymous_bytes_per_frame"), entry.get("stored_bytes_per_frame")
                share = "-" if anonymous is None or not stored else _ratio(max(anonymous, 0.0) / stored)
                lines.append(f"| {name} | {opens} | {share} |")
        if result.get("actors"):
            lines += ["", *actor_table(result["actors"])]
        lines += ["", "Ratios (tfbuffers / peer, medians of the same run):", ""]
        lines += ["| measure | ratio | value |", "|---|---|---|"]
        for measure, row in ratios(result).items():
            for pair, value in row.items():
                lines.append(f"| {MEASURES[measure]} | {pair} | {_ratio(value)} |")
        for ours, theirs in OURS.items():
            resident = [result["memory"].get(name, {}).get("resident_bytes_per_frame") for name in (ours, theirs)]
            if all(resident):
                ratio = resident[0] / resident[1]
                lines.append(f"| resident bytes/frame (RSS) | {ours} / {theirs} | {_ratio(ratio)} |")
        lines.append("")
    return "\n".join(lines)


def plot(results: dict[str, Any], path: pathlib.Path) -> None:
    """Small multiples: a panel per workload and measure, a horizontal bar per system (median frames/s, log scale).

    Systems keep one order (`SYSTEM_NAMES`) and one colour in every panel; each bar is labelled with its
    value; a system that did not run a measure has no bar there.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    measures = [m for m in MEASURES if m not in ("save", "load")]
    everyone = SYSTEM_NAMES + OUT_OF_PROCESS
    names = [name for name in everyone if name in results["systems"]]
    palette = [plt.get_cmap("tab20")(i) for i in range(20)] + [plt.get_cmap("tab20b")(i) for i in range(20)]
    colours = {name: palette[i % len(palette)] for i, name in enumerate(everyone)}
    workloads = list(results["workloads"].items())
    shown = [
        [m for m in measures if any(result["measures"].get(m, {}).get(name) for name in names)]
        for _, result in workloads
    ]
    columns = max(3, min(4, max(len(row) for row in shown)))
    rows = sum(-(-len(row) // columns) for row in shown)
    height = 0.22 * len(names) + 1.2
    figure, axes = plt.subplots(rows, columns, figsize=(5.2 * columns, height * rows), squeeze=False)
    for axis in axes.flat:
        axis.set_visible(False)
    row = 0
    for (workload_name, result), workload_measures in zip(workloads, shown):
        for index, measure in enumerate(workload_measures):
            axis = axes[row + index // columns, index % columns]
            axis.set_visible(True)
            entries = result["measures"].get(measure, {})
            values = [entries[name]["median"] if entries.get(name) else 0.0 for name in names]
            positions = np.arange(len(names))
            axis.barh(positions, values, color=[colours[name] for name in names])
            for position, value in zip(positions, values):
                if value > 0:
                    axis.text(value, position, f" {_fmt(value)}", va="center", fontsize=7)
            axis.set_yticks(positions, names if index % columns == 0 else [""] * len(names), fontsize=8)
            axis.invert_yaxis()
            axis.set_xscale("log")
            top = max(values) if max(values) > 0 else 1.0
            axis.set_xlim(right=top * 20)  # room for the labels
            axis.set_title(f"{workload_name}: {MEASURES[measure].replace(' (frames/s)', '')}", fontsize=9)
            axis.tick_params(axis="x", labelsize=7)
            axis.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # decades only: no crowded labels
            axis.grid(axis="x", alpha=0.3)
        row += -(-len(workload_measures) // columns)
    figure.suptitle("Median frames/s (log scale; higher is better)", fontsize=11)
    figure.tight_layout(rect=(0, 0, 1, 0.98))  # the title above the panels' own
    figure.savefig(path, dpi=110)
    plt.close(figure)


def machine() -> str:
    """The machine, in words."""
    memory = psutil.virtual_memory().total / 2**30
    return (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {memory:.0f} GiB; "
        f"Python {platform.python_version()}, " + ", ".join(f"{name} {version}" for name, version in stack())
    )


def stack() -> list[tuple[str, str]]:
    """The installed versions of what the benchmark runs on (the pinned and the current stack differ here)."""
    names = ("tensorflow", "numpy", "tf-agents", "tf-keras", "dm-reverb")
    versions = []
    for name in names:
        try:
            versions.append((name, importlib.metadata.version(name)))
        except importlib.metadata.PackageNotFoundError:
            versions.append((name, "not installed"))
    return versions


def actor_table(actors: dict[str, Any]) -> list[str]:
    """The markdown lines of `actor_rates`' results: items/s by actor count and backend, the learners' rates."""
    backends = [name for name in ACTOR_BACKENDS if name in actors]
    lines = [
        "Actor processes adding to one buffer at once (items/s, all actors; per actor in brackets; an item per "
        "frame), then a learner drawing from it through `as_dataset` (windows/s, the buffer quiet; "
        "tfbuffers py: a local buffer in the learner's process):",
        "",
        "| actors | " + " | ".join(backends) + (" | Ray / Reverb |" if len(backends) == 2 else " |"),
        "|---|" + "---|" * (len(backends) + (len(backends) == 2)),
    ]
    for count in actors[backends[0]]["adds"]:
        cells = []
        for backend in backends:
            entry = actors[backend]["adds"][count]
            each = ", ".join(_fmt(rate) for rate in entry["per_actor"])
            cells.append(f"{_fmt(entry['frames_per_second'])} ({each})")
        if len(backends) == 2:
            pair = [actors[backend]["adds"][count]["frames_per_second"] for backend in backends]
            cells.append(_ratio(pair[1] / pair[0]))
        lines.append(f"| {count} | " + " | ".join(cells) + " |")
    learners = [actors[backend]["learner"] for backend in backends]
    ratio = [_ratio(learners[1] / learners[0])] if len(backends) == 2 else []
    lines.append("| learner | " + " | ".join([*map(_fmt, learners), *ratio]) + " |")
    if "tfbuffers py" in actors and "tfbuffers Ray" in actors:
        local = actors["tfbuffers py"]["learner"]
        lines += [
            "",
            f"Learner's `as_dataset` against a local py buffer's ({_fmt(local)} windows/s): tfbuffers Ray "
            f"{_ratio(actors['tfbuffers Ray']['learner'] / local)}"
            + (
                f", tfbuffers Reverb {_ratio(actors['tfbuffers Reverb']['learner'] / local)}"
                if "tfbuffers Reverb" in actors
                else ""
            )
            + ".",
        ]
    return lines


# The systems by name, in SYSTEMS' order: what --systems accepts, known before TensorFlow is imported.


FLASHBAX_REQUIREMENTS = SCRIPTS / "flashbax-requirements.txt"
FLASHBAX_CALLS = 200  # calls per timed run of each Flashbax measure (quick: a tenth)


def flashbax_python(env: pathlib.Path, setup: bool) -> tuple[pathlib.Path | None, str]:
    """The interpreter of the Flashbax environment `env`, made first if `setup`; or None and why it is left out."""
    python = env / "bin" / "python"
    if not python.exists() and setup:
        print(f"Creating the Flashbax environment {env} from {FLASHBAX_REQUIREMENTS.name} (a few minutes) ...")
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-r", str(FLASHBAX_REQUIREMENTS)], check=True)
    if not python.exists():
        return None, f"needs its own environment {env}, not made here (--flashbax-setup makes it)"
    found = subprocess.run([str(python), "-c", "import flashbax"], capture_output=True, text=True)
    if found.returncode:
        return None, f"flashbax does not import in {env}: {found.stderr.strip().splitlines()[-1]}"
    return python, ""


def flashbax_rates(python: pathlib.Path, workload: Workload, repetitions: int, quick: bool) -> dict[str, Any]:
    """Flashbax's buffers measured on `workload` by `scripts/_flashbax_peer.py` under `python`: rates by system."""
    fields = [
        {"name": field.path, "shape": field.spec.shape.as_list(), "dtype": field.spec.dtype.name}
        for field in specs.flatten_spec(workload.spec)
    ]
    request = dataclasses.asdict(workload) | {"fields": fields, "repetitions": repetitions}
    request |= {"calls": FLASHBAX_CALLS // 10 if quick else FLASHBAX_CALLS}
    for key in ("observation", "action"):
        del request[key]
    done = subprocess.run(
        [str(python), str(SCRIPTS / "_flashbax_peer.py")],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    if done.returncode:
        raise RuntimeError(f"the Flashbax process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarize(values: list[float]) -> dict[str, float]:
    """A measure's runs as the tables show them: median, range, count."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": len(values)}


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


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark and writes its outputs."""
    args = parse_args(argv)
    if args.sweep:
        output_dir = pathlib.Path(args.output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        command = " ".join(["python", "scripts/benchmark.py", *(argv if argv is not None else sys.argv[1:])])
        return sweep(args, command, output_dir)
    repetitions, actor_counts, actor_seconds = args.repetitions, args.actors, args.actor_seconds
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
    flashbax = [name for name in OUT_OF_PROCESS if args.systems is None or name in args.systems]
    python, why = flashbax_python(pathlib.Path(args.flashbax_env), args.flashbax_setup) if flashbax else (None, "")
    if python is None:
        left_out |= {name: why for name in flashbax}
    else:
        results["systems"] += flashbax
    results["left_out"] = left_out
    for name, reason in left_out.items():
        print(f"Left out {name}: {reason}.")
    started = time.perf_counter()
    for name in args.workloads:
        workload = WORKLOADS[name]
        if args.quick:
            workload = dataclasses.replace(workload, frames=QUICK_FRAMES[name])
        results["workloads"][name] = run_workload(workload, repetitions, args.quick, not args.no_progress, classes)
        if python is not None:
            peer = flashbax_rates(python, workload, repetitions, args.quick)
            results["workloads"][name]["flashbax_jax"] = peer["jax"]
            for system in flashbax:
                for measure, values in peer["rates"][system].items():
                    results["workloads"][name]["measures"][measure][system] = summarize(values)
        backends = [backend for backend in args.actor_backends if importlib.util.find_spec(ACTOR_BACKENDS[backend])]
        if actor_counts and backends:
            rates = {
                backend: actor_rates(backend, workload, actor_counts, actor_seconds, args.quick, not args.no_progress)
                for backend in backends
            }
            rates["tfbuffers py"] = {"learner": local_learner_rate(workload, args.quick)}
            results["workloads"][name]["actors"] = rates
        results["workloads"][name]["ratios"] = ratios(results["workloads"][name])
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
