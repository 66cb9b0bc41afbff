"""The Ray buffer's configuration: its constructor's and `connect`'s arguments checked, as the actor takes them.

Every check runs in the caller's process, before an actor starts or a handle is made, and names the argument
(the segments' own options by a py buffer of one frame, as each segment will be).
"""

from __future__ import annotations

import os
import pathlib
import uuid
from typing import Any

from tfbuffers import prioritized, specs
from tfbuffers import state as state_lib
from tfbuffers.remote.options import check_ratio, check_sampler, optional_seconds, sampler_record
from tfbuffers.remote.ray.checkpoints import CHECKPOINT_SECONDS
from tfbuffers.remote.ray.cluster import NAMESPACE
from tfbuffers.remote.ray.elastic import LAYOUTS
from tfbuffers.remote.ray.manifest import Source
from tfbuffers.replay_buffer import optional_positive_int

NO_ACTOR = (
    "RayReplayBuffer.connect: no buffer named {name!r} in Ray namespace {namespace!r} of the cluster at {address}"
)
OTHER_FRAMES = (
    "data_spec: expected RayReplayBuffer {name!r} to hold frames of the data_spec given, got a buffer whose "
    "{differences}"
)
NOT_EMPTY = (
    "directory: expected a new or empty directory, got {directory!r}, which holds files "
    "(RayReplayBuffer.open reopens a buffer's directory)"
)


WRITER_LEASE = 30.0
"""Seconds a writer's claim lasts without a renewal, by default (`RayReplayBuffer(writer_lease=)`)."""


def actor_config(
    data_spec: Any,
    capacity: int | None,
    *,
    batch_size: int,
    max_length: int | None,
    sampler: Any,
    priority_exponent: float,
    episode_boundaries: bool | str,
    frame_stacks: Any,
    directory: str | os.PathLike | Source | None,
    min_size_to_sample: int | None,
    samples_per_insert: float | None,
    error_buffer: float | None,
    seed: int | None,
    name: str | None,
    writer_lease: float | None = None,
    max_restarts: int = 0,
    actor_options: dict[str, Any] | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    checkpoint_frames: int | None = None,
    checkpoint_seconds: float | None = None,
    layout: str | None = None,
) -> dict[str, Any]:
    """The actor's configuration (`RayHost(config)`) from `RayReplayBuffer`'s arguments, each checked.

    `directory` is a `Source` when `RayReplayBuffer.open` or `load` makes the buffer.

    Raises:
      TypeError, ValueError: Naming the argument, what was expected and what was received.
    """
    from tfbuffers.py_uniform_replay_buffer import PyUniformReplayBuffer, segment_sizes

    batch_size, max_length = segment_sizes(capacity, batch_size, max_length)
    sampler = check_sampler(sampler)
    priority_exponent = prioritized.check_exponent(priority_exponent)
    min_size_to_sample = optional_positive_int("min_size_to_sample", min_size_to_sample)
    ratio = check_ratio(min_size_to_sample or 1, samples_per_insert, error_buffer)
    if ratio is not None and min_size_to_sample is None:
        min_size_to_sample = 1
    writer_lease = optional_seconds("writer_lease", writer_lease)
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < -1:
        raise ValueError(f"max_restarts: expected an int >= -1 (-1: without end), got {max_restarts!r}")
    if actor_options is not None:
        if not isinstance(actor_options, dict):
            raise TypeError(f"actor_options: expected a dict of Ray actor options or None, got {actor_options!r}")
        taken = sorted(set(actor_options) & {"name", "namespace", "max_restarts", "max_task_retries"})
        if taken:
            raise ValueError(
                f"actor_options: expected Ray's placement options (resources, scheduling_strategy, ...), got "
                f"{taken}, which the buffer sets itself (name=, max_restarts=)"
            )
    checkpoint_frames = optional_positive_int("checkpoint_frames", checkpoint_frames)
    checkpoint_seconds = optional_seconds("checkpoint_seconds", checkpoint_seconds)
    if checkpoint_dir is None and (checkpoint_frames is not None or checkpoint_seconds is not None):
        raise ValueError(
            f"checkpoint_dir: expected a directory with checkpoint_frames={checkpoint_frames} and "
            f"checkpoint_seconds={checkpoint_seconds}, got None"
        )
    mapped = directory.directory if isinstance(directory, Source) else directory  # None: in RAM (load too)
    if checkpoint_dir is not None:
        if mapped is not None:
            raise ValueError(
                f"checkpoint_dir: expected None with directory= (memory-mapped segments keep every add that "
                f"returned: nothing to checkpoint), got {str(checkpoint_dir)!r}"
            )
        checkpoint_dir = pathlib.Path(checkpoint_dir).absolute()
        if checkpoint_dir.exists() and any(checkpoint_dir.iterdir()):
            raise ValueError(
                f"checkpoint_dir: expected a new or empty directory, got {str(checkpoint_dir)!r}, which holds files "
                f"(RayReplayBuffer.load(checkpoint_dir) loads its last checkpoint)"
            )
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        if checkpoint_frames is None and checkpoint_seconds is None:
            checkpoint_seconds = CHECKPOINT_SECONDS
    if max_restarts and mapped is None and checkpoint_dir is None:
        raise ValueError(
            f"max_restarts: expected 0 without directory= or checkpoint_dir= (a restarted actor reopens its "
            f"directory, which holds every add that returned, or loads its last checkpoint), got {max_restarts}"
        )
    layout = check_layout(layout, sampler, frame_stacks)
    if name is not None and (not isinstance(name, str) or not name):
        raise TypeError(f"name: expected a non-empty string or None, got {name!r}")
    source: Source | None = None
    target: str | os.PathLike | None = None
    if isinstance(directory, Source):  # from open() or load()
        source, target = directory, directory.directory
    else:
        target = directory
    path = None if target is None else pathlib.Path(target)
    if path is not None and (source is None or source.kind == "load"):
        path = path.absolute()
        if path.exists() and any(path.iterdir()):
            raise ValueError(NOT_EMPTY.format(directory=str(path)))
    # The manifest records the sampler: by name, or a factory by its import path, found here in the driver (a
    # factory pickled to the actor or to another driver is a copy). None: not recordable, so no directory= or save.
    try:
        record = sampler_record(sampler, "directory=" if checkpoint_dir is None else "checkpoint_dir=")
    except ValueError:
        if path is not None or checkpoint_dir is not None:
            raise
        record = None
    # The segments' options checked by a buffer of one frame in RAM: refused before an actor starts.
    probe = PyUniformReplayBuffer(
        data_spec,
        batch_size=1,
        max_length=1,
        sampler=None if sampler == "prioritized" else sampler,
        episode_boundaries=episode_boundaries,
        frame_stacks=frame_stacks,
    )
    probe.close()
    return {
        "data_spec": specs.unwrap(data_spec),
        "batch_size": batch_size,
        "max_length": max_length,
        "sampler": sampler,
        "sampler_record": record,
        "priority_exponent": priority_exponent,
        "episode_boundaries": episode_boundaries,
        "frame_stacks": frame_stacks,
        "directory": None if path is None else str(path),
        "min_size_to_sample": min_size_to_sample,
        "ratio": ratio,
        "seed": seed,
        "writer_lease": writer_lease,
        "max_restarts": max_restarts,
        "actor_options": dict(actor_options or {}),
        "checkpoint_dir": None if checkpoint_dir is None else str(checkpoint_dir),
        "checkpoint_frames": checkpoint_frames,
        "checkpoint_seconds": checkpoint_seconds,
        "layout": layout,
        "name": name or f"buffer-{uuid.uuid4().hex[:12]}",
        "source": None if source is None else [source.kind, str(source.path)],
    }


def check_layout(layout: Any, sampler: Any, frame_stacks: Any) -> str:
    """`layout` checked, or chosen (None): "elastic" unless an option it does not take yet is given.

    Raises:
      ValueError: For a layout other than `LAYOUTS`, or "elastic" with such an option, naming it.
    """
    if layout is not None and layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {list(LAYOUTS)} or None, got {layout!r}")
    refused = {
        "sampler": (sampler not in ("uniform", "prioritized"), "'uniform' or 'prioritized'", sampler),
        "frame_stacks": (frame_stacks is not None, "None", frame_stacks),
    }
    for name, (wrong, expected, received) in refused.items():
        if wrong and layout == "elastic":
            raise ValueError(f"{name}: expected {expected} with layout='elastic', got {received!r}")
        if wrong:
            return "segments"
    return layout or "elastic"


def found_actor(ray: Any, name: str, wanted: list[specs.Field] | None) -> tuple[Any, dict[str, Any]]:
    """The actor named `name` in the cluster and its configuration, holding frames of the fields `wanted` (None: any).

    Raises:
      ValueError: If there is no such actor, or it holds other frames, naming each field that differs.
    """
    try:
        actor = ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        address = ray.get_runtime_context().gcs_address
        raise ValueError(NO_ACTOR.format(name=name, namespace=NAMESPACE, address=address)) from None
    config = ray.get(actor.config.remote())
    if wanted is not None:
        differences = state_lib.field_differences(
            state_lib.field_list(specs.flatten_spec(config["data_spec"])),
            state_lib.field_list(wanted),
            extra="{path} is not in the data_spec given",
            missing="{path} is missing",
            differs="{path} holds {received}, the data_spec given {expected}",
        )
        if differences:
            raise ValueError(OTHER_FRAMES.format(name=name, differences="; ".join(differences)))
    return actor, config
