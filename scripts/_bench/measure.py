"""What a system under test is (`System`) and how its measures are timed and counted."""

from __future__ import annotations

import functools
import gc
import json
import pathlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import psutil
import tensorflow as tf

from _bench.workloads import Workload, _priority_batches, numpy_batches
from tfbuffers import files


class System:
    """A buffer implementation under test; unsupported measures return None."""

    requires: tuple[str, ...] = ()  # modules it imports beyond the benchmark's own
    name = ""
    adds = True  # whether it stores anything (the tf.data ceiling does not)
    variant = False  # an option's cost against the same buffer without it: the deterministic pass and files not run
    saves_once = False  # its save measured in the first repetition only (a Reverb checkpoint: ~80 s of 1M items)
    max_frames: int | None = None  # the most frames it is filled with, where a workload has more (None: all)
    own_process = False  # measured in a process of its own, with the other such systems (the peers)

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

    def add_block(self, block: Any) -> float | None:
        """Seconds to add `block` (`[num_envs, T, ...]` leaves: `T` frames per environment), its fastest way.

        By default one `add` per frame (a system without a block add: TF-Agents', Reverb's); None if it adds nothing.
        """
        if not self.adds:
            return None
        frames = [tf.nest.map_structure(lambda leaf, t=t: leaf[:, t], block) for t in range(_block_frames(block))]
        self.add(frames[0])

        def adds() -> None:
            for frame in frames:
                self.add(frame)

        return _time(adds)

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


BLOCK_FRAMES = 1024  # frames of one block add, all environments together
BLOCK_CALLS = 10  # block adds timed together by the systems that take a block in one call


BLOCK_BYTES = 8 << 20  # about the bytes of one block of a fill by blocks (`ours.OurSystem.fill`)


def block_of(workload: Workload, batches: list[Any], frames: int | None = None) -> Any:
    """A block of `frames` adds (None: `BLOCK_FRAMES` frames in all) of `batches` (the system's own), in their order.

    `[num_envs, frames, ...]` leaves: add `t` is `batches[t % len(batches)]`. Made before timing.
    """
    frames = frames or max(1, BLOCK_FRAMES // workload.num_envs)
    return tf.nest.map_structure(
        lambda *leaves: np.stack(leaves, axis=1), *[batches[t % len(batches)] for t in range(frames)]
    )


def block_seconds(add: Callable[[], Any]) -> float:
    """Seconds of one block add `add()`, the mean of `BLOCK_CALLS` in a row (one is about a millisecond)."""
    return _time(lambda: [add() for _ in range(BLOCK_CALLS)]) / BLOCK_CALLS


def _block_frames(block: Any) -> int:
    return int(tf.nest.flatten(block)[0].shape[1])


def block_size(block: Any) -> int:
    """The frames of a block, all environments together."""
    return int(np.prod(tf.nest.flatten(block)[0].shape[:2]))


def _time(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


MEASURE_SECONDS = 2.0  # a sampling measure's calls stop once they took this long (and made `MIN_CALLS`)
MIN_CALLS = 50


def _calls(fn: Callable[[], Any], count: int) -> float:
    """Seconds for `count` calls of `fn`, each result dropped before the next call, as a training loop does.

    Keeping every result (a list of them) would time the allocator handing out fresh pages for each: on
    atari 1.8 MB a batch, which made `get_next` measure 3x slower than the same calls dropped. As
    `_numbered_calls`: from the calls made in `MEASURE_SECONDS`.
    """
    return _numbered_calls(lambda i: fn(), count)


def _numbered_calls(step: Callable[[int], Any], count: int) -> float:
    """Seconds `step(0), ..., step(count - 1)` take, from those that run in `MEASURE_SECONDS` (`MIN_CALLS` at least).

    A slow system's calls stop there and their time is scaled to `count` calls (the rate is the calls made): on
    control, 500 of TF-Agents' py `get_next` took 19 s, and the run ten minutes of its 44 on such measures
    (2026-12-02). A fast system makes all `count`.
    """
    start = time.perf_counter()
    done = 0
    while done < count:
        step(done)
        done += 1
        if done >= MIN_CALLS and time.perf_counter() - start > MEASURE_SECONDS:
            break
    return (time.perf_counter() - start) * count / max(done, 1)


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


class BufferCalls(System):
    """The measures of a buffer of tfbuffers' API called as a program calls it: adds, datasets, `get_next`."""

    buffer: Any

    def add(self, batch: Any) -> None:
        self.buffer.add_batch(batch)

    def add_block(self, block: Any) -> float | None:
        if not hasattr(self.buffer, "extend"):
            return super().add_block(block)
        self.buffer.extend(block)  # warm-up: a TF buffer traces its block add once per block length
        return block_seconds(lambda: self.buffer.extend(block))

    def dataset(self) -> tf.data.Dataset:
        w = self.workload
        dataset = self.buffer.as_dataset(w.sample_batch_size, w.num_steps, num_parallel_calls=tf.data.AUTOTUNE)
        return dataset.prefetch(tf.data.AUTOTUNE)

    def sample_dataset(self, num_batches: int) -> float | None:
        return _iterate(self.dataset(), num_batches)

    def get_next(self, num_batches: int) -> float | None:
        w = self.workload
        self.buffer.get_next(w.sample_batch_size, w.num_steps)
        return _calls(lambda: self.buffer.get_next(w.sample_batch_size, w.num_steps), num_batches)

    def deterministic_pass(self, num_elements: int) -> tuple[float, int] | None:
        w = self.workload
        dataset = self.buffer.as_dataset(w.num_envs, w.num_steps, single_deterministic_pass=True)
        dataset = dataset.take(num_elements).prefetch(tf.data.AUTOTUNE)
        seconds = _time(lambda: [None for _ in dataset])
        return seconds, num_elements * w.num_envs * w.num_steps


class TFBuffer(BufferCalls):
    """Shared by tfbuffers' and TF-Agents' TF buffers: same constructor, same API, and calls inside graphs."""

    def __init__(self, workload: Workload, buffer: Any) -> None:
        super().__init__(workload)
        self.buffer = buffer
        # One batch, held as constants: the loop then times the add alone, not making data.
        self._graph_batch = tf.nest.map_structure(tf.constant, numpy_batches(workload, 1, seed=1)[0])
        self._loop = traced_once(self._loop_fn)

    def _loop_fn(self, num_adds: tf.Tensor) -> None:
        for _ in tf.range(num_adds):
            self.buffer.add_batch(self._graph_batch)

    def fill(self, batches: list[Any], bar: Any) -> None:
        self._loop(tf.constant(self.workload.max_length))
        bar.update(self.workload.frames)

    def add_graph(self, num_adds: int) -> float:
        self._loop(tf.constant(2))
        return _time(lambda: self._loop(tf.constant(num_adds)))

    def sample_dataset_graph(self, num_batches: int) -> float:
        return _consume_in_graph(self.dataset(), num_batches)

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

    def save_load(self, directory: pathlib.Path) -> tuple[float, float | None, int] | None:
        return _checkpoint_save_load(self.buffer, directory)

    def stored_bytes(self) -> int | None:
        return sum(v.shape.num_elements() * v.dtype.size for v in self.buffer.variables())


SCRIPTS = pathlib.Path(__file__).resolve().parent.parent  # scripts/
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

    The loads run in fresh processes (an allocator keeps what an earlier call freed), both at once (each
    measures its own high-water mark; most of a child's time is TensorFlow's import): `<class>.load`, and
    `files.load` into a buffer built empty; the buffer's own storage is subtracted from both.
    """
    import _common

    path = directory / "buffer.safetensors"
    frames = int(buffer.num_frames())
    _, save = _common.peak_rss(lambda: buffer.save(path, progress=False))
    children = {
        how: subprocess.Popen(
            [sys.executable, "-c", _LOAD_IN_A_CHILD, str(path), type(buffer).__name__, how, str(SCRIPTS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for how in ("new", "into")
    }
    loads = {}
    for how, child in children.items():
        out, err = child.communicate()
        if child.returncode:
            raise subprocess.CalledProcessError(child.returncode, child.args, out, err)
        loads[how] = json.loads(out.strip().splitlines()[-1]) - stored
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


def _sample_update(buffer: Any, workload: Workload, num_batches: int) -> float:
    """`get_next`, then `update_priorities` of the windows' first frames, as a learner does after a step."""
    priorities = _priority_batches(workload)

    def step(i: int) -> None:
        _, info = buffer.get_next(workload.sample_batch_size, workload.num_steps)
        buffer.update_priorities(info.ids[:, 0], priorities[i % len(priorities)])

    step(0)
    return _numbered_calls(step, num_batches)


def _reverb_checkpoint(client: Any) -> tuple[float, None, int]:
    """(Seconds of a Reverb checkpoint, no load measure, bytes written)."""
    start = time.perf_counter()
    path = pathlib.Path(client.checkpoint())
    seconds = time.perf_counter() - start
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return seconds, None, size


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
