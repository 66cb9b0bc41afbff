"""TorchRL's replay buffers, measured for `scripts/benchmark.py` in their own process and environment.

Run by the benchmark with the interpreter of the TorchRL environment (PyTorch on the CPU, one thread;
`scripts/benchmark.py --torchrl-setup` makes it from `scripts/torchrl-requirements.txt`), never imported
beside TensorFlow. It reads one JSON workload on stdin, as the Flashbax peer does, and prints one JSON
object: the versions, and the rates (frames per second of each run, for each measure and system asked).

Items are TensorDicts of the workload's fields, laid out as the benchmark's own: storages of `frames`
items over two dimensions (`ndim=2`), time and `num_envs` environments, filled and added to by `extend`
of `[num_envs, T]` TensorDicts. The systems compose one `ReplayBuffer(storage=, sampler=)` each:

    TorchRL uniform      LazyTensorStorage, RandomSampler
    TorchRL memmap       LazyMemmapStorage (files in a temporary directory), RandomSampler
    TorchRL prioritized  PrioritizedReplayBuffer: LazyTensorStorage, alpha 0.6 (the others' exponent), beta 0.4
    TorchRL slices       LazyTensorStorage, SliceSampler of `num_steps` consecutive frames of one episode
                         (an episode key per frame: each environment's frames are one episode)

Measures, as the benchmark names them: `add_block` (one `extend` of `block_frames` frames), `add_eager`
(one `extend` of one frame per environment), `get_next` (one `sample`) and, prioritized, `sample_update`
(a `sample`, then `update_priority` of its indices). Every sample is `sample_batch_size * num_steps` frames, the
frames and bytes of the others' windows: the slices' `sample_batch_size` windows of `num_steps` frames, the
others' as many single items (each given its own priority by the update, as TorchRL's prioritized buffer
keeps one a frame).
"""

from __future__ import annotations

import sys
import tempfile
from typing import Any

import _peer_runs
import numpy as np
import tensordict
import torch
import torchrl
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, PrioritizedReplayBuffer, ReplayBuffer
from torchrl.data.replay_buffers import RandomSampler, SliceSampler

FILL_CHUNK = 1_000  # time steps per extend while filling
EPISODE = "episode"  # the slices' trajectory key, beside the workload's fields


def _items(fields: list[dict[str, Any]], envs: int, steps: int, seed: int) -> tensordict.TensorDict:
    """`[envs, steps]` items of random values, and each environment's index as its episode."""
    rng = np.random.default_rng(seed)
    leaves = {}
    for field in fields:
        shape = [envs, steps, *field["shape"]]
        dtype = np.dtype(field["dtype"])
        values = rng.integers(0, 255, shape) if dtype.kind in "iu" else rng.standard_normal(shape)
        leaves[field["name"]] = torch.from_numpy(values.astype(dtype))
    leaves[EPISODE] = torch.arange(envs).unsqueeze(1).expand(envs, steps).contiguous()
    return tensordict.TensorDict(leaves, batch_size=[envs, steps])


def _buffer(system: str, workload: dict[str, Any], scratch: str) -> ReplayBuffer:
    frames, steps = workload["frames"], workload["num_steps"]
    if system == "TorchRL uniform":
        return ReplayBuffer(storage=LazyTensorStorage(frames, ndim=2), sampler=RandomSampler())
    if system == "TorchRL memmap":
        return ReplayBuffer(storage=LazyMemmapStorage(frames, scratch_dir=scratch, ndim=2), sampler=RandomSampler())
    if system == "TorchRL prioritized":
        return PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(frames, ndim=2))
    if system == "TorchRL slices":
        sampler = SliceSampler(slice_len=steps, traj_key=EPISODE, strict_length=True)
        return ReplayBuffer(storage=LazyTensorStorage(frames, ndim=2), sampler=sampler)
    raise ValueError(f"unknown TorchRL system {system!r}")


def measure(workload: dict[str, Any]) -> dict[str, dict[str, list[float]]]:
    """Frames per second of each run of each measure, by system: each built, filled, measured and freed in turn."""
    envs, rng = workload["num_envs"], np.random.default_rng(0)
    setup = {
        "chunk": _items(workload["fields"], envs, FILL_CHUNK, seed=2),
        "block": _items(workload["fields"], envs, max(1, workload["block_frames"] // envs), seed=3),
        "one_step": _items(workload["fields"], envs, 1, seed=1),
        "priorities": torch.from_numpy(
            rng.uniform(0.1, 2.0, workload["sample_batch_size"] * workload["num_steps"]).astype(np.float32)
        ),
    }
    rates = {}
    for system in workload["systems"]:
        with tempfile.TemporaryDirectory() as scratch:
            rates[system] = _rates(system, _buffer(system, workload, scratch), setup, workload)
    return rates


def _rates(
    system: str, buffer: ReplayBuffer, setup: dict[str, Any], workload: dict[str, Any]
) -> dict[str, list[float]]:
    """One buffer filled, then each measure's frames per second in each of `repetitions` runs."""
    envs, batch, steps = workload["num_envs"], workload["sample_batch_size"], workload["num_steps"]
    length = workload["frames"] // envs
    for _ in range(-(-length // FILL_CHUNK)):
        buffer.extend(setup["chunk"])
    block, one_step = setup["block"], setup["one_step"]
    drawn = batch * steps  # frames: the slices' windows, or as many single items

    def add_blocks(calls: int) -> None:
        for _ in range(calls):
            buffer.extend(block)

    def add_steps(calls: int) -> None:
        for _ in range(calls):
            buffer.extend(one_step)

    def samples(calls: int) -> None:
        for _ in range(calls):
            buffer.sample(drawn)

    measures: list[_peer_runs.Measure] = [
        ("add_block", add_blocks, block.numel()),
        ("add_eager", add_steps, envs),
        ("get_next", samples, drawn),
    ]
    if isinstance(buffer, PrioritizedReplayBuffer):

        def sample_updates(calls: int) -> None:
            for _ in range(calls):
                _, info = buffer.sample(drawn, return_info=True)
                buffer.update_priority(info["index"], setup["priorities"])

        measures.append(("sample_update", sample_updates, drawn))
    return _peer_runs.rates(measures, workload["calls"], workload["repetitions"])


def main() -> int:
    torch.set_num_threads(1)
    versions = {"torch": torch.__version__, "torchrl": torchrl.__version__, "tensordict": tensordict.__version__}
    return _peer_runs.print_result(versions, measure(_peer_runs.read_workload()))


if __name__ == "__main__":
    sys.exit(main())
