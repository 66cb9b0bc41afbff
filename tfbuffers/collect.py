"""Filling a buffer from an environment and a policy through a TF-Agents driver.

`warm` is the one-liner behind the scripts' initial collection and the starter
buffers; it also serves notebooks:

>>> import tfbuffers
>>> from tf_agents.policies import random_tf_policy
>>> from tfbuffers.envs import load_gymnasium
>>> env = load_gymnasium("CartPole-v1", num_envs=2, seed=0, tf_environment=True)
>>> policy = random_tf_policy.RandomTFPolicy(env.time_step_spec(), env.action_spec())
>>> buffer = tfbuffers.TFUniformReplayBuffer(policy.trajectory_spec, batch_size=2, max_length=100)
>>> added = warm(buffer, env, policy, num_frames=50)
>>> added >= 50 and int(buffer.num_frames()) == added
True
"""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import tensorflow as tf

from tfbuffers import _keras, specs
from tfbuffers.observers import WRONG_BATCH_SIZE, PyObserver, TFObserver
from tfbuffers.replay_buffer import ReplayBuffer, positive_int

try:
    from tf_agents.drivers import dynamic_step_driver, py_driver
    from tf_agents.environments import py_environment, tf_environment
    from tf_agents.policies import py_tf_eager_policy, tf_policy
except ImportError as error:  # pragma: no cover - depends on the installed extras
    raise ImportError(f"tfbuffers.collect needs tf-agents ({error}): pip install 'tfbuffers[agents]'") from error

_keras.warn_if_keras_3()

NOT_AN_ENVIRONMENT = "env: expected a TF-Agents TFEnvironment or PyEnvironment, got {received}"


def _progress_bar(progress: Any, total: int, description: str) -> Any:
    if progress is False or progress is None:
        return None
    if progress is True:
        if importlib.util.find_spec("ipywidgets") is None:
            from tqdm import tqdm  # a text bar where tqdm.auto would warn that notebook widgets are missing
        else:
            from tqdm.auto import tqdm

        return tqdm(total=total, unit="frame", desc=description, leave=False)
    return progress  # a bar the caller made


def warm(
    buffer: ReplayBuffer,
    env: Any,
    policy: Any,
    num_frames: int,
    *,
    reset: bool = True,
    frames_per_call: int = 1000,
    progress: Any = False,
    description: str = "collect",
) -> int:
    """Adds at least `num_frames` frames to `buffer`, collected by `policy` in `env`.

    A TF environment runs a `DynamicStepDriver` (in a `tf.function`) with a
    `TFObserver`; a py environment runs a `PyDriver` with a `PyObserver`, a TF
    policy being wrapped in `PyTFEagerPolicy`. The driver runs about
    `frames_per_call` frames at a time, so that the progress bar moves.

    TF-Agents' drivers do not count the step that starts a new episode after one
    ended (a boundary), but it is observed, so a few more frames than asked may
    be added; the exact number is returned.

    Args:
      buffer: Any tfbuffers buffer whose spec is the policy's trajectory spec.
      env: A `TFEnvironment` or `PyEnvironment`, batched or not.
      policy: A `TFPolicy` or `PyPolicy` for `env`.
      num_frames: Frames to add, at least.
      reset: Reset the environment first, so that this is a run of its own.
      frames_per_call: Frames per driver call.
      progress: True for a tqdm bar, or an open tqdm bar to advance.
      description: The bar's label.

    Returns:
      The number of frames added (driver steps times the environment's batch size).

    Raises:
      TypeError: If `env` is not a TF-Agents environment, or the policy's
        trajectories differ from the buffer's spec in structure.
      ValueError: If `num_frames` or `frames_per_call` is not positive, or the
        policy's trajectories differ from the buffer's spec in a field's dtype or
        shape, or the environment's batch size from the buffer's. These are
        checked before the environment is reset: a refused call changes
        neither the buffer nor the environment. (An error of the environment or
        policy during the run leaves the frames added before it, each whole.)
    """
    num_frames = positive_int("num_frames", num_frames)
    frames_per_call = positive_int("frames_per_call", frames_per_call)
    if isinstance(env, tf_environment.TFEnvironment):
        collect = _tf_collector(buffer, env, policy)
    elif isinstance(env, py_environment.PyEnvironment):
        if isinstance(policy, tf_policy.TFPolicy):
            policy = py_tf_eager_policy.PyTFEagerPolicy(policy, use_tf_function=True)
        collect = _py_collector(buffer, env, policy)
    else:
        raise TypeError(NOT_AN_ENVIRONMENT.format(received=type(env).__name__))
    _check_fits(buffer, env, policy)
    bar = _progress_bar(progress, num_frames, description)
    time_step = env.reset() if reset else env.current_time_step()
    state = policy.get_initial_state(env.batch_size)
    added = 0
    try:
        while added < num_frames:
            time_step, state, frames = collect(time_step, state, min(frames_per_call, num_frames - added))
            added += frames
            if bar is not None:
                bar.update(frames)
    finally:
        if progress is True and bar is not None:
            bar.close()
    return added


def _check_fits(buffer: Any, env: Any, policy: Any) -> None:
    """Refuses, as the first add would, a policy whose frames or an environment whose batch the buffer cannot take."""
    batch_size = env.batch_size or 1
    expected = getattr(buffer, "batch_size", batch_size)
    if batch_size != expected:
        raise ValueError(WRONG_BATCH_SIZE.format(observer="warm", received=batch_size, expected=expected))
    zeros = tf.nest.map_structure(
        lambda spec: np.zeros((batch_size, *spec.shape), tf.as_dtype(spec.dtype).as_numpy_dtype),
        policy.trajectory_spec,
    )
    specs.check_batch(zeros, buffer.data_spec, buffer.fields, (batch_size,))


def _tf_collector(buffer: ReplayBuffer, env: Any, policy: Any) -> Any:
    """`collect(time_step, state, frames) -> (time_step, state, frames added)` with a TF driver."""
    frames = tf.Variable(0, dtype=tf.int64, trainable=False)
    batch_size = env.batch_size or 1

    def count(_: Any) -> tf.Tensor:
        return frames.assign_add(batch_size)

    runs: dict[int, Any] = {}

    def collect(time_step: Any, state: Any, num_frames: int) -> Any:
        if num_frames not in runs:
            observers = [TFObserver(buffer), count]
            driver = dynamic_step_driver.DynamicStepDriver(env, policy, observers=observers, num_steps=num_frames)
            runs[num_frames] = tf.function(driver.run)
        frames.assign(0)
        time_step, state = runs[num_frames](time_step, state)
        return time_step, state, int(frames.numpy())

    return collect


def _py_collector(buffer: ReplayBuffer, env: Any, policy: Any) -> Any:
    """`collect(time_step, state, frames) -> (time_step, state, frames added)` with a py driver."""
    batch_size = env.batch_size or 1
    frames = [0]

    def count(_: Any) -> None:
        frames[0] += batch_size

    observers = [PyObserver(buffer), count]

    def collect(time_step: Any, state: Any, num_frames: int) -> Any:
        frames[0] = 0
        time_step, state = py_driver.PyDriver(env, policy, observers, max_steps=num_frames).run(time_step, state)
        return time_step, state, frames[0]

    return collect
