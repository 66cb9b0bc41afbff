"""tfbuffers' systems: one per buffer kind of `tfbuffers.kinds`, its variants (options), and the Reverb buffer.

A kind's system makes its buffer by `tfbuffers.kinds.make` and is measured as its execution mode is: a graph kind
through `measure.TFBuffer` (adds and samples in `tf.function` loops, op counts), a host kind's calls as a program
makes them. A prioritized kind adds `sample_update`. The variants are the same kinds with one option each, measured
against the kind without it (`variant`): episode boundaries, frame stacks (host kinds on stacked observations) and
memory-mapped files (host kinds). The systems' names are the tables' ("tfbuffers TF", "tfbuffers py prioritized
episodes", ...): `KIND_NAMES` says which kind each name stands for.
"""

from __future__ import annotations

import pathlib
import shutil
import statistics
import tempfile
import time
from typing import Any

import numpy as np
import tensorflow as tf

import tfbuffers
import tfbuffers.kinds
from _bench.measure import (
    BLOCK_BYTES,
    BufferCalls,
    System,
    TFBuffer,
    _files_memory,
    _files_save_load,
    _reverb_checkpoint,
    _sample_update,
    block_of,
)
from _bench.workloads import REVERB_FRAMES, STACK_EPISODE, Workload, _in_episodes, _mid_episode, _step_types

# The tables' name of each kind the benchmark measures (the kinds of any data spec; py_hashed takes trajectories
# of its own layout only).
KIND_NAMES = {
    "tf_uniform": "tfbuffers TF",
    "py_uniform": "tfbuffers py",
    "tf_prioritized": "tfbuffers TF prioritized",
    "py_prioritized": "tfbuffers py prioritized",
}


class OurSystem(System):
    """A tfbuffers buffer of the kind `kind` (`tfbuffers.kinds`), with the constructor options `options`."""

    kind = ""
    options: dict[str, Any] = {}  # set per generated class
    buffer: Any

    def make_buffer(self, max_length: int) -> Any:
        """A new buffer of the kind, `max_length` frames per environment."""
        w = self.workload
        return tfbuffers.kinds.make(self.kind, w.spec, w.num_envs, max_length, **self.options)

    def fill(self, batches: list[Any], bar: Any) -> None:
        """`System.fill`'s adds in blocks: `extend`, which stores exactly what they would, about 8 MB a call."""
        w = self.workload
        cycle = len(batches)
        per_step = w.num_envs * w.payload_bytes * cycle
        block = block_of(w, batches, frames=cycle * max(1, BLOCK_BYTES // per_step))  # `[envs, T, ...]`
        length = int(tf.nest.flatten(block)[0].shape[1])
        for _ in range(w.max_length // length):  # each block starts at a multiple of `cycle`: the same frames
            self.buffer.extend(block)
        if rest := w.max_length % length:
            self.buffer.extend(tf.nest.map_structure(lambda leaf: leaf[:, :rest], block))
        bar.update(w.frames)

    def save_load(self, directory: pathlib.Path) -> tuple[float, float, int]:
        return _files_save_load(self.buffer, directory)

    def file_memory(self, directory: pathlib.Path) -> dict[str, float] | None:
        stored = self.stored_bytes()
        return None if stored is None else _files_memory(self.buffer, stored, directory)


class GraphKind(OurSystem, TFBuffer):
    """A graph kind (TF variables): measured as TF-Agents' TF buffer is, adds and samples in tf.function too."""

    def __init__(self, workload: Workload) -> None:
        System.__init__(self, workload)
        TFBuffer.__init__(self, workload, self.make_buffer(workload.max_length))


class HostKind(OurSystem, BufferCalls):
    """A host kind (numpy arrays): one add per step for all environments, the TF buffer's API measured alike."""

    def __init__(self, workload: Workload) -> None:
        super().__init__(workload)
        self.buffer = self.make_buffer(workload.max_length)

    def stored_bytes(self) -> int | None:
        return self.buffer.nbytes  # rows, counter and what the sampler keeps (priorities, episode ends)


class Prioritized:
    """A prioritized kind: `get_next` then `update_priorities`, as a learner does after a step.

    The deterministic pass and files are the uniform buffer's paths, priorities aside: measured once, on it.
    """

    buffer: Any
    workload: Workload

    def sample_update(self, num_batches: int) -> float:
        return _sample_update(self.buffer, self.workload, num_batches)

    deterministic_pass = System.deterministic_pass
    save_load = System.save_load


class Episodes:
    """The buffer built with `episode_boundaries=True`, fed episodes of `EPISODE` frames."""

    buffer: Any
    _graph_batch: Any
    variant = True
    options = {"episode_boundaries": True}

    def prepare(self, batches: list[Any]) -> list[Any]:
        return _in_episodes(batches)

    def _loop_fn(self, num_adds: tf.Tensor) -> None:  # the graph kinds' fill and in-graph adds
        for t in tf.range(num_adds):
            step_type, next_step_type = _step_types(t, tf)
            batch = self._graph_batch._replace(
                step_type=tf.fill(tf.shape(self._graph_batch.step_type), tf.cast(step_type, tf.int32)),
                next_step_type=tf.fill(tf.shape(self._graph_batch.step_type), tf.cast(next_step_type, tf.int32)),
            )
            self.buffer.add_batch(batch)


class FrameStacks:
    """The buffer built with `frame_stacks="observation"`, fed real stacks.

    Each add's observation is each environment's newest 4 frames: the previous add's
    last 3 and a new one (a batch's random frame stamped with the add number, so that
    no two frames are alike), reset to a new frame repeated every `STACK_EPISODE` adds.
    """

    buffer: Any
    variant = True
    options = {"frame_stacks": "observation"}
    _stacks: np.ndarray | None = None
    _adds = 0

    @classmethod
    def applies(cls, workload: Workload) -> bool:
        return workload.observation.shape.rank == 3  # [height, width, stacked frames]

    def add(self, batch: Any) -> None:
        frames = batch.observation[..., -1].copy()  # [envs, height, width]
        frames.reshape(len(frames), -1)[:, :8] = np.frombuffer(np.int64(self._adds).tobytes(), np.uint8)
        if self._stacks is None or self._adds % STACK_EPISODE == 0:
            self._stacks = np.repeat(frames[..., None], batch.observation.shape[-1], axis=-1)
        else:
            self._stacks = np.concatenate([self._stacks[..., 1:], frames[..., None]], axis=-1)
        self._adds += 1
        self.buffer.add_batch(batch._replace(observation=self._stacks))

    def add_block(self, block: Any) -> None:
        """Not measured: a block of stacks is the stacks of its frames, which this variant makes add by add."""
        return None

    fill = System.fill  # add by add, for the same reason


class Memmap:
    """The buffer built with `directory=`: memory-mapped files in a temporary directory.

    Its pages are the kernel's page cache (file-backed, not the process's anonymous memory): while they
    fit in it, it is measured against the same buffer in RAM.
    """

    buffer: Any
    workload: Workload
    variant = True
    described = "directory=<a temporary directory>"

    def __init__(self, workload: Workload) -> None:
        self._root = pathlib.Path(tempfile.mkdtemp(prefix="tfbuffers-benchmark-"))
        super().__init__(workload)  # type: ignore[call-arg]

    def make_buffer(self, max_length: int) -> Any:
        directory = pathlib.Path(tempfile.mkdtemp(dir=self._root)) / "buffer"
        w = self.workload
        options = {**getattr(self, "options", {}), "directory": directory}  # and another variant's (frame stacks)
        return tfbuffers.kinds.make(self.kind, w.spec, w.num_envs, max_length, **options)  # type: ignore[attr-defined]

    def open_times(self, batches: list[Any]) -> dict[str, float]:
        """`tfbuffers.open` (median of 3) on a full buffer of 1/8 the capacity and on this one, by frames stored."""
        small = self.make_buffer(max(self.workload.max_length // 8, 1))
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


def kind_system(kind: str, *variants: type) -> type[System]:
    """The system of `kind` (`tfbuffers.kinds`), with each variant's option, named as the tables do."""
    found = tfbuffers.kinds.KINDS[kind]
    mode = HostKind if found.host else GraphKind
    bases: tuple[type, ...] = (Prioritized, mode) if found.prioritized else (mode,)
    name = " ".join([KIND_NAMES[kind], *(VARIANT_NAMES[variant] for variant in variants)])
    bases = (*variants, *bases)
    described = [
        getattr(variant, "described", "")
        or ", ".join(f"{key}={value!r}" for key, value in getattr(variant, "options", {}).items())
        for variant in variants
    ]
    option = ", ".join(described)
    doc = f"tfbuffers.{found.class_name}({option or '...'}), made as tfbuffers.kinds' {kind!r} kind."
    words = name.replace("tfbuffers", "TFBuffers").split()
    class_name = "".join(word if word[0].isupper() else word.capitalize() for word in words)  # TFBuffersPyMemmap
    return type(class_name, bases, {"name": name, "kind": kind, "__doc__": doc})


VARIANT_NAMES = {Episodes: "episodes", FrameStacks: "frame stacks", Memmap: "memmap"}


class TFBuffersReverb(BufferCalls):
    """tfbuffers.ReverbReplayBuffer on its embedded server: one add_batch per step for all environments."""

    name = "tfbuffers Reverb"
    requires = ("reverb",)
    max_frames = REVERB_FRAMES

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

    deterministic_pass = System.deterministic_pass  # a Reverb table has no order to read

    saves_once = True

    def save_load(self, directory: pathlib.Path) -> tuple[float, float | None, int] | None:
        return _reverb_checkpoint(self.buffer.py_client)

    def close(self) -> None:
        self.buffer.close()
        shutil.rmtree(self._checkpoint_dir, ignore_errors=True)


# Each kind, then its variants: the tables' order.
KINDS = [kind_system(kind) for kind in KIND_NAMES]
VARIANTS = [
    *(kind_system(kind, Episodes) for kind in KIND_NAMES),
    *(kind_system(kind, FrameStacks) for kind in KIND_NAMES if not tfbuffers.kinds.KINDS[kind].prioritized
      and tfbuffers.kinds.KINDS[kind].host),
    *(kind_system(kind, Memmap) for kind in KIND_NAMES if tfbuffers.kinds.KINDS[kind].host),
    kind_system("py_uniform", FrameStacks, Memmap),  # the two options composed: frame stacks over the files
]  # fmt: skip
