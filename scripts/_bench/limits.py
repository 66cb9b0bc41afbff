"""The references that store or check nothing more than they must: numpy, bare variables, tf.data."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import tensorflow as tf

import tfbuffers
from _bench.measure import System, TFBuffer, _calls, _consume_in_graph, _iterate, _time, block_seconds
from _bench.workloads import Workload


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

    def add_block(self, block: Any) -> float:
        """Slice assignments of the block's frames, time-major (two where the ring wraps): the limit of a block add."""
        w = self.workload

        def write() -> None:
            leaves = tf.nest.flatten(block)
            frames = leaves[0].shape[1]
            position = self.position % w.max_length
            first = min(frames, w.max_length - position)
            for array, leaf in zip(self.arrays, leaves):
                view = array.reshape(w.max_length, w.num_envs, *leaf.shape[2:])
                view[position : position + first] = leaf[:, :first].swapaxes(0, 1)
                view[: frames - first] = leaf[:, first:].swapaxes(0, 1)
            self.position += frames

        return block_seconds(write)

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
        """The storage, as the TF buffers' method of that name (which `TFBuffer` reads) gives it."""
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


class BareVariables(TFBuffer):
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
    deterministic_pass = System.deterministic_pass
    save_load = System.save_load


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
