"""Writes this folder's buffers with the tfbuffers on the path: kept as made by commit cbb61de.

What the code before the composition (issue 49: storages, samplers and remote buffers as parts) writes, so that
the code after it is tested to read it (tests/compat_test.py): each kind's file (`<kind>.tfb`) and
`tf.train.Checkpoint` (`<kind>.ckpt*`) as `tests/data/before_storage_seam/` has them for issue 30, the
memory-mapped directories (`<kind>_memmap/`, reopened with `tfbuffers.open`; `py_frame_stacks_memmap/` holds its
stacks whole, as directories did before frame stacks composed with any storage), and a Ray buffer's save and
memory-mapped directory (`ray_saved/`, `ray_memmap/`). Every buffer holds the adds that folder's `make.py` writes
(frame `t` of segment `b` has `action = 100 * t + b`; five adds into segments of three frames) and the
prioritized buffers' priorities of ids 4, 7 and 9 are 0.5, 2 and 3. Made by

    git worktree add /tmp/before cbb61de
    PYTHONPATH=/tmp/before .venv/bin/python tests/data/before_composition/make.py
"""

import importlib.util
import pathlib
import shutil
import sys

import numpy as np
import tensorflow as tf

import tfbuffers

HERE = pathlib.Path(__file__).parent
_spec = importlib.util.spec_from_file_location("storage_seam", HERE.parent / "before_storage_seam" / "make.py")
assert _spec is not None and _spec.loader is not None
seam = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(seam)
SIZE = {"batch_size": seam.BATCH_SIZE, "max_length": seam.MAX_LENGTH}
PRIORITIES = (np.array([4, 7, 9]), np.array([0.5, 2.0, 3.0]))


def fill(buffer, make=seam.frames):
    for t in range(seam.ADDS):
        buffer.add_batch(make(t))
    if buffer.prioritized:
        buffer.update_priorities(*PRIORITIES)
    return buffer


def main() -> None:
    print("tfbuffers from", tfbuffers.__file__, file=sys.stderr)
    spec = seam.SPEC
    buffers = {
        "py_uniform": (tfbuffers.PyUniformReplayBuffer(spec, **SIZE, seed=0), seam.frames),
        "py_episodes": (tfbuffers.PyUniformReplayBuffer(spec, **SIZE, seed=0, episode_boundaries=True), seam.frames),
        "py_prioritized": (tfbuffers.PyPrioritizedReplayBuffer(spec, **SIZE, seed=0), seam.frames),
        "py_frame_stacks": (
            tfbuffers.PyUniformReplayBuffer(seam.STACK_SPEC, **SIZE, seed=0, frame_stacks="pixels"),
            seam.stacked,
        ),
        "tf_uniform": (tfbuffers.TFUniformReplayBuffer(spec, **SIZE), seam.frames),
        "tf_episodes": (tfbuffers.TFUniformReplayBuffer(spec, **SIZE, episode_boundaries=True), seam.frames),
        "tf_prioritized": (tfbuffers.TFPrioritizedReplayBuffer(spec, **SIZE), seam.frames),
    }
    for name, (buffer, make) in buffers.items():
        fill(buffer, make)
        buffer.save(HERE / f"{name}.tfb", progress=False)
        tf.train.Checkpoint(buffer=buffer).write(str(HERE / f"{name}.ckpt"))
    mapped = {
        "py_uniform_memmap": (tfbuffers.PyUniformReplayBuffer, {}),
        "py_episodes_memmap": (tfbuffers.PyUniformReplayBuffer, {"episode_boundaries": True}),
        "py_prioritized_memmap": (tfbuffers.PyPrioritizedReplayBuffer, {}),
    }
    for name, (cls, options) in mapped.items():
        shutil.rmtree(HERE / name, ignore_errors=True)
        fill(cls(spec, **SIZE, **options, seed=0, directory=HERE / name)).close()
    make_frame_stacks_directory()
    for name in ("ray_saved", "ray_memmap"):
        shutil.rmtree(HERE / name, ignore_errors=True)
    ray = tfbuffers.RayReplayBuffer(spec, **SIZE, sampler="prioritized", seed=0)
    fill(ray).save(HERE / "ray_saved")
    ray.close()
    fill(tfbuffers.RayReplayBuffer(spec, **SIZE, seed=0, directory=HERE / "ray_memmap")).close()


def make_frame_stacks_directory() -> None:
    """`py_frame_stacks_memmap/`: a directory whose header (version 1) records `frame_stacks`, stacks stored whole."""
    name = "py_frame_stacks_memmap"
    shutil.rmtree(HERE / name, ignore_errors=True)
    options = {"seed": 0, "frame_stacks": "pixels", "directory": HERE / name}
    fill(tfbuffers.PyUniformReplayBuffer(seam.STACK_SPEC, **SIZE, **options), seam.stacked).close()


if __name__ == "__main__":
    main()
