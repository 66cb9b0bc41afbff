"""Minari datasets: a buffer's episodes written as one (`to_minari`), and one read into a buffer (`from_minari`)."""

from __future__ import annotations

import collections.abc
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import gymnasium
import numpy as np
import tensorflow as tf

from tfbuffers import specs
from tfbuffers.offline._common import (
    BAD_ENDS,
    BAD_INFO,
    MISSING_FIELD,
    NOT_A_SPACE_SPEC,
    NOT_SUPPORTED,
    WRONG_FIELD,
    Converted,
    Episode,
    describe,
    ends_by_termination,
    episode_step_types,
    fill,
    lookup_field,
    progress_bar,
    role_of,
    stored_episodes,
    trajectory_spec,
)


def _space(spec: Any, path: str) -> gymnasium.Space:
    """The gymnasium space of a spec nest; an int64 scalar with bounds is `Discrete`, as `tfbuffers.envs` reads it."""
    if isinstance(spec, collections.abc.Mapping):
        return gymnasium.spaces.Dict({key: _space(value, f"{path}/{key}") for key, value in spec.items()})
    if isinstance(spec, (list, tuple)):
        raise TypeError(NOT_SUPPORTED.format(path=path, what="Minari spaces", received=type(spec).__name__))
    dtype = tf.as_dtype(spec.dtype)
    if not (dtype.is_floating or dtype.is_integer) or dtype.is_complex:
        raise TypeError(NOT_A_SPACE_SPEC.format(path=path, received=dtype.name))
    bounded = hasattr(spec, "minimum") and hasattr(spec, "maximum")
    if bounded and dtype == tf.int64 and tuple(spec.shape) == ():
        start, stop = int(np.asarray(spec.minimum)), int(np.asarray(spec.maximum))
        return gymnasium.spaces.Discrete(stop - start + 1, start=start)
    numpy_dtype = dtype.as_numpy_dtype
    if bounded:
        low, high = np.asarray(spec.minimum), np.asarray(spec.maximum)
    elif dtype.is_floating:
        low, high = np.asarray(-np.inf), np.asarray(np.inf)
    else:
        low, high = np.asarray(np.iinfo(numpy_dtype).min), np.asarray(np.iinfo(numpy_dtype).max)
    shape = tuple(spec.shape)
    low, high = (np.broadcast_to(bound, shape).astype(numpy_dtype) for bound in (low, high))
    return gymnasium.spaces.Box(low, high, shape, numpy_dtype)


def to_minari(
    buffer: Any,
    dataset_id: str,
    *,
    env: Any = None,
    progress: bool | None = None,
    **metadata: Any,
) -> Converted:
    """Writes the buffer's complete episodes as a Minari dataset (see the module docstring).

    `minari.load_dataset(dataset_id)` opens it, from `MINARI_DATASETS_PATH` (or
    `~/.minari/datasets`), as for any Minari dataset.

    Args:
      buffer: Any buffer of `Trajectory` frames.
      dataset_id: Minari's id, `(namespace/)(env_name/)dataset_name-v(version)`.
      env: The environment that collected the frames, recorded for
        `dataset.recover_environment()`: a gymnasium environment, its id or
        `EnvSpec`, or a `tfbuffers.envs.GymnasiumEnvironment` (its gymnasium
        environment, with the keyword arguments it was made with). Without it
        the spaces come from the buffer's spec (a bounded int64 scalar becomes
        `Discrete`, anything else a `Box`).
      progress: A progress bar (see the module docstring).
      **metadata: Passed to `minari.create_dataset_from_buffers`: `author`,
        `author_email`, `algorithm_name`, `code_permalink`, `description`, ...

    Returns:
      The episodes and frames written, and the frames of partial episodes left out.

    Raises:
      TypeError: If the frames are not `Trajectory` frames, or an observation or
        action spec is a tuple or not numeric (no Minari space for it here).
      ValueError: From Minari, if a dataset with that id exists.
    """
    import minari
    from minari.data_collector.episode_buffer import EpisodeBuffer

    spec = trajectory_spec(buffer)
    env = getattr(env, "gymnasium_env", env)
    spaces = {}
    if env is None:
        spaces = {
            "observation_space": _space(spec.observation, "observation"),
            "action_space": _space(spec.action, "action"),
        }
    episodes, left_out = stored_episodes(buffer)
    pack = specs.packer(spec)
    bar = progress_bar(progress, len(episodes), f"writing Minari {dataset_id}")
    written, frames = [], 0
    for index, episode in enumerate(episodes):
        frame = pack(episode)
        length = len(episode[0])
        terminated = ends_by_termination(buffer.fields, episode)
        ends = np.arange(length - 1) == length - 2
        infos = {
            "discount": frame.discount,
            "last_action": tf.nest.map_structure(lambda leaf: leaf[-1:], frame.action),
            "last_reward": frame.reward[-1:],
        }
        if tf.nest.flatten(spec.policy_info):
            infos["policy_info"] = frame.policy_info
        written.append(
            EpisodeBuffer(
                id=index,
                observations=frame.observation,
                actions=tf.nest.map_structure(lambda leaf: leaf[:-1], frame.action),
                rewards=frame.reward[:-1],
                terminations=ends & terminated,
                truncations=ends & (not terminated),
                infos=infos,
            )
        )
        frames += length
        if bar is not None:
            bar.update(1)
    minari.create_dataset_from_buffers(dataset_id, written, env=env, **spaces, **metadata)
    if bar is not None:
        bar.close()
    return Converted(len(episodes), frames, left_out)


def _check_spaces(dataset: Any, fields: Sequence[specs.Field]) -> None:
    from tfbuffers import envs

    space_specs = {
        "observation": envs.spec_from_space(dataset.observation_space, "observation_space"),
        "action": envs.spec_from_space(dataset.action_space, "action_space"),
    }
    for field in fields:
        role = role_of(field.path)
        if role not in space_specs:
            continue
        keys = field.path.split("/")[1:]
        source = lookup_field(space_specs[role], keys) if keys else space_specs[role]
        path = "/".join([f"{role}_space", *keys])
        expected = describe(field.spec.dtype, field.spec.shape)
        if source is None:
            raise ValueError(MISSING_FIELD.format(path=path, field=field.path, expected=expected))
        if not hasattr(source, "dtype") or (tf.as_dtype(source.dtype), tuple(source.shape)) != (
            field.spec.dtype,
            tuple(field.spec.shape),
        ):
            received = describe(source.dtype, source.shape) if hasattr(source, "dtype") else type(source).__name__
            raise ValueError(WRONG_FIELD.format(path=path, field=field.path, expected=expected, received=received))


def _info(index: int, infos: Mapping[str, Any], key: str, keys: Sequence[str], spec: tf.TensorSpec, length: int) -> Any:
    value = lookup_field(infos.get(key), keys) if keys else infos.get(key)
    if value is None:
        return None
    value = np.asarray(value)
    expected = (length, *spec.shape)
    if value.dtype != spec.dtype.as_numpy_dtype or value.shape != expected:
        raise ValueError(
            BAD_INFO.format(
                episode=index, key="/".join([key, *keys]), expected=describe(spec.dtype, expected),
                received=describe(value.dtype, value.shape),
            )
        )  # fmt: skip
    return value


def _minari_frames(episode: Any, fields: Sequence[specs.Field]) -> Episode:
    steps = len(episode.rewards)
    terminations, truncations = np.asarray(episode.terminations, bool), np.asarray(episode.truncations, bool)
    last = steps - 1
    if steps < 1 or terminations[:last].any() or truncations[:last].any():
        raise ValueError(
            BAD_ENDS.format(
                episode=episode.id, last=last, terminations=np.flatnonzero(terminations).tolist(),
                truncations=np.flatnonzero(truncations).tolist(),
            )
        )  # fmt: skip
    length = steps + 1
    step_type, next_step_type = episode_step_types(length)
    infos = episode.infos or {}
    leaves = []
    for field in fields:
        role, keys = role_of(field.path), field.path.split("/")[1:]
        dtype = field.spec.dtype.as_numpy_dtype
        if role == "step_type":
            leaves.append(step_type)
        elif role == "next_step_type":
            leaves.append(next_step_type)
        elif role == "observation":
            leaves.append(np.asarray(lookup_field(episode.observations, keys) if keys else episode.observations))
        elif role == "action":
            actions = np.asarray(lookup_field(episode.actions, keys) if keys else episode.actions)
            last_action = _info(episode.id, infos, "last_action", keys, field.spec, 1)
            leaves.append(np.concatenate([actions, np.zeros_like(actions[:1]) if last_action is None else last_action]))
        elif role == "reward":
            last_reward = _info(episode.id, infos, "last_reward", keys, field.spec, 1)
            rewards = np.asarray(episode.rewards).astype(dtype)  # gymnasium's float64 rewards (module docstring)
            leaves.append(np.concatenate([rewards, np.zeros(1, dtype) if last_reward is None else last_reward]))
        elif role == "discount":
            discount = _info(episode.id, infos, "discount", keys, field.spec, length)
            if discount is None:  # a step both terminated and truncated (gymnasium's TimeLimit) terminated
                discount = np.ones(length, dtype)
                discount[-2] = 0 if terminations[last] else 1
            leaves.append(discount)
        else:  # policy_info
            value = _info(episode.id, infos, "policy_info", keys, field.spec, length)
            if value is None:
                raise ValueError(
                    MISSING_FIELD.format(
                        path=f"episode {episode.id} infos/{field.path}", field=field.path,
                        expected=describe(field.spec.dtype, field.spec.shape),
                    )
                )  # fmt: skip
            leaves.append(value)
    return leaves


def from_minari(buffer: Any, dataset: Any, *, progress: bool | None = None) -> Converted:
    """Adds every episode of a Minari dataset to the buffer (see the module docstring).

    Args:
      buffer: Any buffer of `Trajectory` frames (local or `RayReplayBuffer`).
      dataset: A `minari.MinariDataset` (`minari.load_dataset(id)`) or its id.
      progress: A progress bar (see the module docstring).

    Returns:
      The episodes and frames added, and the frames left out (segments' ends).

    Raises:
      TypeError: If the buffer's frames are not `Trajectory` frames.
      ValueError: Naming the space or the episode, before anything is added
        (every episode is read and checked first, so a refused dataset leaves
        the buffer as it was): if the dataset's observation or action space
        differs from the buffer's spec in structure, dtype or shape, or an
        episode ends before its last step, or its `infos` carry a discount,
        last action, last reward or policy_info of another dtype or shape.
    """
    import minari

    trajectory_spec(buffer)
    if isinstance(dataset, str):
        dataset = minari.load_dataset(dataset)
    _check_spaces(dataset, buffer.fields)

    def read() -> Iterator[Episode]:
        return (_minari_frames(episode, buffer.fields) for episode in dataset.iterate_episodes())

    return fill(buffer, read, dataset.total_episodes, "Minari episodes", progress)
