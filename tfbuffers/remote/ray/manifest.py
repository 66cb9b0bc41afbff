"""The Ray-hosted buffer's manifest (`ray_buffer.json`): its configuration, for `load` and `open`."""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any, NamedTuple

from tfbuffers import specs
from tfbuffers.remote.options import recorded_sampler

MANIFEST = "ray_buffer.json"


MANIFEST_FORMAT = 1


SEGMENT_DIRECTORY = "segment-{:04d}"


class Source(NamedTuple):
    """`directory=` as `RayReplayBuffer.open` and `load` pass it: segments reopened or loaded, not made empty."""

    kind: str  # "open" or "load"
    path: pathlib.Path  # the directory to reopen, or the one `save` wrote
    directory: pathlib.Path | None  # where the segments are memory-mapped


def write_manifest(directory: pathlib.Path, config: dict[str, Any], sampler: str) -> None:
    """`ray_buffer.json` under `directory`: the buffer's configuration, for `load` and `open`.

    `sampler` is the sampler as `tfbuffers.remote.options.sampler_record` records it, made by the driver (which
    can import a factory by its name; the actor may hold a copy pickled by value).
    """
    skipped = ("data_spec", "directory", "source", "sampler_record", "actor_options")  # where it ran: not kept
    manifest = {key: value for key, value in config.items() if key not in skipped}
    manifest.update(format=MANIFEST_FORMAT, spec=specs.spec_to_json(config["data_spec"]), sampler=sampler)
    directory.mkdir(parents=True, exist_ok=True)
    temporary = directory / f".{MANIFEST}.{os.getpid()}"
    temporary.write_text(json.dumps(manifest, indent=1))
    temporary.replace(directory / MANIFEST)


def save_segments(segments: list[Any], directory: pathlib.Path, config: dict[str, Any], sampler: str) -> None:
    """Each segment's file under `directory`, and the manifest (`sampler` as `write_manifest` records it).

    The elastic layout's segments share one store (`tfbuffers.remote.ray.elastic`): its files instead.
    """
    directory.mkdir(parents=True, exist_ok=True)
    if config.get("layout") == "elastic":
        segments[0].store.save(directory)
    else:
        for s, segment in enumerate(segments):
            segment.save(directory / f"{SEGMENT_DIRECTORY.format(s)}.tfb", progress=False)
    write_manifest(directory, config, sampler)


def read_manifest(directory: pathlib.Path) -> tuple[Any, dict[str, Any]]:
    """The data spec and the constructor's arguments `write_manifest` wrote under `directory`."""
    path = directory / MANIFEST
    if not path.exists():
        raise FileNotFoundError(f"{path}: no RayReplayBuffer here (RayReplayBuffer.save or directory= write it)")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"{path}: format: expected {MANIFEST_FORMAT}, got {manifest.get('format')!r}")
    return specs.spec_from_json(manifest["spec"]), _arguments(manifest)


def _arguments(manifest: dict[str, Any]) -> dict[str, Any]:
    ratio = manifest.get("ratio")
    return {
        "batch_size": manifest["batch_size"],
        "max_length": manifest["max_length"],
        "sampler": recorded_sampler(manifest["sampler"]),
        "priority_exponent": manifest["priority_exponent"],
        "episode_boundaries": manifest["episode_boundaries"],
        "frame_stacks": manifest["frame_stacks"],
        "min_size_to_sample": manifest["min_size_to_sample"],
        "samples_per_insert": None if ratio is None else ratio[0],
        "error_buffer": None if ratio is None else ratio[1],
        "seed": manifest["seed"],
        "layout": manifest.get("layout", "segments"),  # a manifest from before the elastic layout: segments
        **{key: manifest[key] for key in ("writer_lease", "max_restarts") if key in manifest},
    }
