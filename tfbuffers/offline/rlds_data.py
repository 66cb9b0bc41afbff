"""RLDS datasets (TFDS): a buffer's episodes written as one (`to_rlds`), and one read into a buffer (`from_rlds`)."""

from __future__ import annotations

import collections.abc
import itertools
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds
from tensorflow_datasets.rlds import rlds_base

from tfbuffers import specs
from tfbuffers.offline._common import (
    NOT_EPISODES,
    NOT_SUPPORTED,
    RLDS_NAME,
    RLDS_SPLIT,
    TOO_SHORT,
    Converted,
    Episode,
    check_flags,
    check_step_spec,
    ends_by_termination,
    episode_step_types,
    fill,
    lookup_field,
    progress_bar,
    role_of,
    stored_episodes,
    trajectory_spec,
)


def _feature(spec: Any, path: str) -> Any:
    if isinstance(spec, collections.abc.Mapping):
        return tfds.features.FeaturesDict({key: _feature(value, f"{path}/{key}") for key, value in spec.items()})
    if isinstance(spec, (list, tuple)):
        raise TypeError(NOT_SUPPORTED.format(path=path, what="TFDS features", received=type(spec).__name__))
    return tfds.features.Tensor(shape=tuple(spec.shape), dtype=tf.as_dtype(spec.dtype).as_numpy_dtype)


def to_rlds(
    buffer: Any,
    directory: str | os.PathLike,
    *,
    name: str = RLDS_NAME,
    episodes_per_shard: int = 1000,
    progress: bool | None = None,
) -> Converted:
    """Writes the buffer's complete episodes as an RLDS dataset in TFDS format (see the module docstring).

    >>> builder = tfds.builder_from_directory(directory)  # doctest: +SKIP
    >>> episodes = builder.as_dataset(split="train")  # doctest: +SKIP

    Args:
      buffer: Any buffer of `Trajectory` frames (`tfbuffers.observers` fill them).
      directory: Where the dataset's files go; it must not hold a dataset yet.
      name: The TFDS dataset name.
      episodes_per_shard: Episodes per TFRecord file.
      progress: A progress bar (see the module docstring).

    Returns:
      The episodes and frames written, and the frames of partial episodes left out.

    Raises:
      TypeError: If the frames are not `Trajectory` frames, or an observation,
        action or policy_info is a tuple (TFDS features are tensors and dicts).
      FileExistsError: If `directory` already holds a dataset.
    """
    spec = trajectory_spec(buffer)
    directory = os.fspath(directory)
    if tf.io.gfile.exists(os.path.join(directory, "dataset_info.json")):
        raise FileExistsError(f"directory: expected a directory without a dataset, got {directory!r}")
    step_metadata = (
        {} if not tf.nest.flatten(spec.policy_info) else {"policy_info": _feature(spec.policy_info, "policy_info")}
    )
    config = rlds_base.DatasetConfig(
        name=name,
        observation_info=_feature(spec.observation, "observation"),
        action_info=_feature(spec.action, "action"),
        reward_info=_feature(spec.reward, "reward"),
        discount_info=_feature(spec.discount, "discount"),
        step_metadata_info=step_metadata,
    )
    identity = tfds.core.dataset_info.DatasetIdentity(
        name=name, version=tfds.core.Version("1.0.0"), data_dir=directory, module_name=__name__
    )
    tf.io.gfile.makedirs(directory)
    writer = tfds.core.SequentialWriter(
        ds_info=rlds_base.build_info(config, identity), max_examples_per_shard=episodes_per_shard
    )
    writer.initialize_splits([RLDS_SPLIT])
    episodes, left_out = stored_episodes(buffer)
    pack = specs.packer(spec)
    bar = progress_bar(progress, len(episodes), f"writing RLDS {name}")
    frames = 0
    for episode in episodes:
        frame = pack(episode)
        length = len(episode[0])
        steps = {
            "observation": frame.observation,
            "action": frame.action,
            "reward": frame.reward,
            "discount": frame.discount,
            "is_first": np.arange(length) == 0,
            "is_last": np.arange(length) == length - 1,
            "is_terminal": (np.arange(length) == length - 1) & ends_by_termination(buffer.fields, episode),
        }
        if step_metadata:
            steps["policy_info"] = frame.policy_info
        writer.add_examples({RLDS_SPLIT: [{"steps": steps}]})
        frames += length
        if bar is not None:
            bar.update(1)
    writer.close_all()
    if bar is not None:
        bar.close()
    return Converted(len(episodes), frames, left_out)


def _rlds_frames(index: int, steps: Mapping[str, Any], fields: Sequence[specs.Field]) -> Episode:
    is_first, is_last = np.asarray(steps["is_first"]), np.asarray(steps["is_last"])
    is_terminal = np.asarray(steps.get("is_terminal", np.zeros_like(is_last)))
    check_flags(index, is_first, is_last, is_terminal)
    length = len(is_first)
    step_type, next_step_type = episode_step_types(length)
    leaves = []
    for field in fields:
        role = role_of(field.path)
        dtype = field.spec.dtype.as_numpy_dtype
        if role == "step_type":
            leaves.append(step_type)
        elif role == "next_step_type":
            leaves.append(next_step_type)
        else:
            value = lookup_field(steps, field.path.split("/"))
            if role == "discount":
                value = np.ones(length, dtype) if value is None else np.array(value)
                if is_terminal[-1]:
                    value[-2] = 0
            leaves.append(np.asarray(value))
    return leaves


def _rlds_episodes(episodes: Any) -> tf.data.Dataset:
    if isinstance(episodes, (str, os.PathLike)):
        return tfds.builder_from_directory(os.fspath(episodes)).as_dataset(split=RLDS_SPLIT)
    if not isinstance(episodes, tf.data.Dataset) or not isinstance(episodes.element_spec, Mapping):
        raise TypeError(NOT_EPISODES.format(received=type(episodes).__name__))
    if "steps" not in episodes.element_spec:
        raise TypeError(NOT_EPISODES.format(received=f"episodes with keys {sorted(episodes.element_spec)}"))
    return episodes


def from_rlds(buffer: Any, episodes: Any, *, progress: bool | None = None) -> Converted:
    """Adds every episode of an RLDS dataset to the buffer (see the module docstring).

    Args:
      buffer: Any buffer of `Trajectory` frames (local or `RayReplayBuffer`).
      episodes: A `tf.data.Dataset` of RLDS episodes, as `tfds.load(...)` or
        `builder.as_dataset(split=...)` return them, or a directory `to_rlds`
        (or any TFDS writer) made, whose `"train"` split is read. Map the dataset
        first to convert fields whose dtype or shape differs from the buffer's:
        nothing is cast here.
      progress: A progress bar (see the module docstring).

    Returns:
      The episodes and frames added, and the frames left out (segments' ends).

    Raises:
      TypeError: If the buffer's frames are not `Trajectory` frames or
        `episodes` is not a dataset of RLDS episodes.
      ValueError: Naming the step field, before anything is added, if a field
        the buffer stores is missing from the steps or has another dtype or shape;
        naming the episode and step, also before anything is added (every
        episode is read and checked first, so a refused dataset leaves the
        buffer as it was), if its `is_first`, `is_last` and `is_terminal` do
        not delimit one episode of at least two steps.
    """
    trajectory_spec(buffer)
    dataset = _rlds_episodes(episodes)
    steps_spec = dataset.element_spec["steps"]
    check_step_spec(steps_spec.element_spec, buffer.fields)
    total = int(dataset.cardinality()) if int(dataset.cardinality()) >= 0 else None
    steps = dataset.map(lambda episode: episode["steps"].batch(2**31 - 1).get_single_element())

    def read() -> Iterator[Episode]:
        episodes = iter(steps)
        for index in itertools.count():
            try:
                episode = next(episodes)
            except StopIteration:
                return
            except tf.errors.InvalidArgumentError as error:  # an episode of no steps: nothing to batch
                raise ValueError(TOO_SHORT.format(episode=index, received=0)) from error
            yield _rlds_frames(index, tf.nest.map_structure(np.asarray, episode), buffer.fields)

    return fill(buffer, read, total, "RLDS episodes", progress)
