"""Actor processes adding to one shared buffer (Reverb, Ray) while a learner samples it."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import time
from typing import Any

import tensorflow as tf
from tqdm.auto import tqdm

import tfbuffers
from _bench.measure import _iterate
from _bench.workloads import Workload, _mid_episode, numpy_batches

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
