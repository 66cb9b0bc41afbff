"""The peers tfbuffers is measured against: TF-Agents' buffers and its Reverb path, and cpprb."""

from __future__ import annotations

import pathlib
import shutil
import tempfile
from typing import Any

import numpy as np
import tensorflow as tf
from tf_agents.replay_buffers import py_uniform_replay_buffer, tf_uniform_replay_buffer
from tf_agents.specs import tensor_spec

from _bench.measure import System, TFBuffer, _calls, _iterate, _numbered_calls, _reverb_checkpoint, block_seconds
from _bench.workloads import PRIORITY_BETA, REVERB_FRAMES, Workload, _mid_episode, _priority_batches
from tfbuffers import specs


class TFAgentsTF(TFBuffer):
    """tf_agents TFUniformReplayBuffer."""

    name = "TF-Agents TF"
    own_process = True

    def __init__(self, workload: Workload) -> None:
        buffer = tf_uniform_replay_buffer.TFUniformReplayBuffer(workload.spec, workload.num_envs, workload.max_length)
        super().__init__(workload, buffer)


class TFAgentsPy(System):
    """tf_agents PyUniformReplayBuffer: batches of one only, so one add per environment per step."""

    name = "TF-Agents py"
    own_process = True

    def __init__(self, workload: Workload) -> None:
        super().__init__(workload)
        spec = tensor_spec.to_nest_array_spec(workload.spec)
        self.buffer = py_uniform_replay_buffer.PyUniformReplayBuffer(spec, workload.frames)

    def add(self, batch: Any) -> None:
        for env in range(self.workload.num_envs):
            self.buffer.add_batch(tf.nest.map_structure(lambda x, e=env: x[e : e + 1], batch))

    def fill(self, batches: list[Any], bar: Any) -> None:
        """The state `System.fill`'s adds leave, written into its storage in place (`fill_storage`)."""
        fill_storage(self.buffer, batches, self.workload.max_length)
        bar.update(self.workload.frames)

    def sample_dataset(self, num_batches: int) -> float:
        w = self.workload
        return _iterate(
            self.buffer.as_dataset(w.sample_batch_size, w.num_steps).prefetch(tf.data.AUTOTUNE), num_batches
        )

    def get_next(self, num_batches: int) -> float:
        w = self.workload
        return _calls(lambda: self.buffer.get_next(w.sample_batch_size, w.num_steps), num_batches)

    save_load = TFBuffer.save_load

    def stored_bytes(self) -> int:
        # Its storage is one `[capacity, *shape]` array per field of the spec (tf_agents NumpyStorage); it shows
        # no size of its own.
        fields = tf.nest.flatten(self.workload.spec)
        return self.workload.frames * sum(spec.shape.num_elements() * spec.dtype.size for spec in fields)


def fill_storage(buffer: py_uniform_replay_buffer.PyUniformReplayBuffer, batches: list[Any], steps: int) -> None:
    """Leaves `buffer` as `steps` adds of `batches[t % len(batches)]`, one `add_batch` per environment, would.

    Into its storage's arrays (tf_agents NumpyStorage) and counters directly: it takes one frame per call, about
    7,800 a second on control, and the adds to fill it measure nothing its `add_eager` does not (2 of the full
    run's 4.6 minutes on it, 2026-12-02). Item `t * num_envs + env` is `batches[t % len(batches)]`'s row `env`.
    """
    storage, capacity = buffer._storage, buffer._capacity  # its private layout (tf_agents 0.19)
    frames = steps * len(tf.nest.flatten(batches[0])[0])
    cycle = [np.concatenate(leaves) for leaves in zip(*(tf.nest.flatten(batch) for batch in batches))]
    chunk = len(cycle[0])
    for index, rows in enumerate(cycle):
        array = storage._array(index)
        for start in range(max(0, frames - capacity), frames, chunk):  # the newest `capacity` frames
            stop = min(start + chunk, frames)
            array[np.arange(start, stop) % capacity] = rows[np.arange(start, stop) % chunk]
    state = buffer._np_state
    state.size = np.int64(min(frames, capacity))
    state.cur_id = np.int64(frames % capacity)
    state.item_count = np.int64(frames)


class TFAgentsReverb(System):
    """TF-Agents' Reverb path: ReverbAddTrajectoryObserver per environment, ReverbReplayBuffer."""

    name = "TF-Agents Reverb"
    own_process = True
    requires = ("reverb",)
    max_frames = REVERB_FRAMES

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

    saves_once = True

    def save_load(self, directory: pathlib.Path) -> tuple[float, None, int]:
        return _reverb_checkpoint(self.buffer.py_client)

    def close(self) -> None:
        for observer in self.observers:
            observer.close()
        self.server.stop()
        shutil.rmtree(self._checkpoint_dir, ignore_errors=True)


class Cpprb(System):
    """cpprb's ReplayBuffer: all environments' frames in one add, transitions (frame and next observation) sampled.

    A sample of `sample_batch_size` transitions holds `sample_batch_size * 2` observations, as the other
    systems' windows of 2 frames do (the next observation is stored once, `next_of`).
    """

    name = "cpprb uniform"
    own_process = True
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

    def add_block(self, block: Any) -> float:
        """One `add` of the block's frames, time-major (cpprb takes rows of any count)."""

        def add() -> None:
            leaves = [np.swapaxes(leaf, 0, 1).reshape(-1, *leaf.shape[2:]) for leaf in tf.nest.flatten(block)]
            named = dict(zip(self.paths, leaves))
            self.buffer.add(**named, next_observation=named["observation"])

        return block_seconds(add)

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
        return _numbered_calls(step, num_batches)
