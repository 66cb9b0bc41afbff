"""warm(): filling buffers through real drivers, TF and py environments alike."""

from __future__ import annotations

import io

import numpy as np
import pytest
import tensorflow as tf
from conftest import make_buffer, underlying
from tf_agents.policies import random_py_policy, random_tf_policy

from tfbuffers.collect import NOT_AN_ENVIRONMENT, warm
from tfbuffers.envs import load_gymnasium


def test_tf_environment_batched(kind):
    env = load_gymnasium("CartPole-v1", num_envs=2, seed=0, tf_environment=True)
    policy = random_tf_policy.RandomTFPolicy(env.time_step_spec(), env.action_spec())
    buffer = underlying(make_buffer(kind, batch_size=2, max_length=500, spec=policy.trajectory_spec))
    added = warm(buffer, env, policy, num_frames=120, frames_per_call=50)
    assert added >= 120 and added % 2 == 0
    assert int(buffer.num_frames()) == added
    steps = np.asarray(buffer.gather_all().step_type)
    assert steps.shape == (2, added // 2) and np.all(steps[:, 0] == 0)  # reset first: each segment starts an episode


def test_py_environment_with_a_tf_policy(kind):
    env = load_gymnasium("CartPole-v1", seed=1)
    tf_env = load_gymnasium("CartPole-v1", tf_environment=True)
    policy = random_tf_policy.RandomTFPolicy(tf_env.time_step_spec(), tf_env.action_spec())
    buffer = underlying(make_buffer(kind, batch_size=1, max_length=500, spec=policy.trajectory_spec))
    added = warm(buffer, env, policy, num_frames=60)
    assert added >= 60 and int(buffer.num_frames()) == added


def test_py_policy_and_a_progress_bar_the_caller_owns():
    from tqdm import tqdm

    env = load_gymnasium("Pendulum-v1", seed=2)
    policy = random_py_policy.RandomPyPolicy(env.time_step_spec(), env.action_spec(), seed=2)
    spec = tf.nest.map_structure(lambda s: tf.TensorSpec(s.shape, s.dtype), policy.trajectory_spec)
    buffer = underlying(make_buffer("py_eager", batch_size=1, max_length=100, spec=spec))
    with tqdm(total=30, file=io.StringIO()) as bar:
        added = warm(buffer, env, policy, num_frames=30, progress=bar)
        assert bar.n == added == 30  # no episode ends within 30 Pendulum steps


def test_refuses_what_is_not_an_environment():
    with pytest.raises(TypeError) as raised:
        warm(None, object(), None, num_frames=1)
    assert str(raised.value) == NOT_AN_ENVIRONMENT.format(received="object")
