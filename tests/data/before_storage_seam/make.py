"""Writes this folder's files and checkpoints with the tfbuffers on the path: kept as made by commit 753026e.

The buffers' files (`<kind>.tfb`) and `tf.train.Checkpoint`s (`<kind>.ckpt*`) of the code before the storage
seam (issue 30), so that the code after it is tested to read them (tests/compat_test.py). Made by

    git worktree add /tmp/before 753026e
    PYTHONPATH=/tmp/before .venv/bin/python tests/data/before_storage_seam/make.py

Every buffer holds the same adds: frame `t` of segment `b` has `action = 100 * t + b`, `obs = [t + b / 10, -t]`
and step types FIRST, MID, LAST, FIRST, ... (`t % 3`); frame stacks hold `pixels[..., k] = t - 3 + k` (clipped
at 0) as a `uint8[2, 2, 4]` stack. Five adds into segments of three frames: the rings have wrapped. The
prioritized buffers' priorities of ids 4, 7 and 9 are set to 0.5, 2 and 3.
"""

import pathlib
import sys

import numpy as np
import tensorflow as tf

import tfbuffers

HERE = pathlib.Path(__file__).parent
SPEC = {
    "obs": tf.TensorSpec([2], tf.float32),
    "action": tf.TensorSpec([], tf.int64),
    "step_type": tf.TensorSpec([], tf.int32),
}
STACK_SPEC = {"pixels": tf.TensorSpec([2, 2, 4], tf.uint8), "step_type": tf.TensorSpec([], tf.int32)}
BATCH_SIZE, MAX_LENGTH, ADDS = 2, 3, 5


def frames(t: int) -> dict[str, np.ndarray]:
    segments = np.arange(BATCH_SIZE)
    return {
        "obs": np.stack([t + segments / 10, np.full(BATCH_SIZE, -t)], axis=1).astype(np.float32),
        "action": 100 * t + segments,
        "step_type": np.full(BATCH_SIZE, t % 3, np.int32),
    }


def stacked(t: int) -> dict[str, np.ndarray]:
    depth = np.maximum(np.arange(t - 3, t + 1), 0).astype(np.uint8)
    return {
        "pixels": np.broadcast_to(depth, [BATCH_SIZE, 2, 2, 4]).copy(),
        "step_type": np.full(BATCH_SIZE, t % 3, np.int32),
    }


def main() -> None:
    print("tfbuffers from", tfbuffers.__file__, file=sys.stderr)
    size = {"batch_size": BATCH_SIZE, "max_length": MAX_LENGTH}
    buffers = {
        "py_uniform": (tfbuffers.PyUniformReplayBuffer(SPEC, **size, seed=0), frames),
        "py_episodes": (tfbuffers.PyUniformReplayBuffer(SPEC, **size, seed=0, episode_boundaries=True), frames),
        "py_prioritized": (tfbuffers.PyPrioritizedReplayBuffer(SPEC, **size, seed=0), frames),
        "py_frame_stacks": (
            tfbuffers.PyUniformReplayBuffer(STACK_SPEC, **size, seed=0, frame_stacks="pixels"),
            stacked,
        ),
        "tf_uniform": (tfbuffers.TFUniformReplayBuffer(SPEC, **size), frames),
        "tf_episodes": (tfbuffers.TFUniformReplayBuffer(SPEC, **size, episode_boundaries=True), frames),
        "tf_prioritized": (tfbuffers.TFPrioritizedReplayBuffer(SPEC, **size), frames),
    }
    for name, (buffer, make) in buffers.items():
        for t in range(ADDS):
            buffer.add_batch(make(t))
        if "prioritized" in name:
            buffer.update_priorities(np.array([4, 7, 9]), np.array([0.5, 2.0, 3.0]))
        buffer.save(HERE / f"{name}.tfb", progress=False)
        tf.train.Checkpoint(buffer=buffer).write(str(HERE / f"{name}.ckpt"))


if __name__ == "__main__":
    main()
