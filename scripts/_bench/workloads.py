"""The benchmark's workloads, their batches, and the step types of the episode-aware systems."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import tensorflow as tf
from tf_agents.trajectories import trajectory

FIRST, MID, LAST = 0, 1, 2  # TF-Agents' StepType values
EPISODE = 32  # frames per episode of the episode-aware systems (divides the 64 batches the benchmark cycles)
STACK_EPISODE = 1_000  # adds between resets of the frame-stack system's stacks
# The Reverb systems' tables hold at most this many frames: their writers send 3,000-6,000 items a second here, so
# filling control's 1M took 190-210 s of each (2026-12-02), and a uniform table's sample does not grow with its size.
REVERB_FRAMES = 100_000
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
    # TorchRL's own replay-buffer benchmark's items (benchmarks/test_replaybuffer_benchmark.py: a float32[5] and a
    # uint8[3, 32, 32] per item, batch 256, buffers of 10k and 100k), as the action and the observation.
    "torchrl": Workload(
        "torchrl", tf.TensorSpec([3, 32, 32], tf.uint8), tf.TensorSpec([5], tf.float32), 8, 100_000, 256
    ),
}
QUICK_FRAMES = {"control": 16_000, "atari": 2_000, "flashbax": 16_000, "torchrl": 16_000}


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


def _priority_batches(workload: Workload) -> list[np.ndarray]:
    """16 batches of new priorities, made before any timing, that every prioritized system is given."""
    rng = np.random.default_rng(0)
    return [rng.uniform(0.1, 2.0, workload.sample_batch_size) for _ in range(16)]


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


def _mid_episode(batches: list[Any]) -> list[Any]:
    """The batches with every step type MID: one long episode per environment, as Reverb writers see most frames.

    Random step types would end an episode at a third of the frames; both Reverb paths flush or reset there.
    """

    def mid(batch: Any) -> Any:
        middle = np.full_like(batch.step_type, MID)
        return batch._replace(step_type=middle, next_step_type=middle)

    return [mid(batch) for batch in batches]
