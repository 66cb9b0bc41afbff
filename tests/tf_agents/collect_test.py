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


@pytest.mark.parametrize("tf_env", [True, False])
def test_a_refused_warm_changes_neither_the_buffer_nor_the_environment(tf_env):
    # Issue 50: every bulk path is all or nothing. The policy's trajectories and the environment's batch are
    # checked against the buffer before the environment is reset; the buffer's next calls work.
    from tfbuffers import PyUniformReplayBuffer, TFUniformReplayBuffer

    env = load_gymnasium("CartPole-v1", num_envs=2, seed=0, tf_environment=tf_env)
    policy = random_tf_policy.RandomTFPolicy(env.time_step_spec(), env.action_spec())
    spec = policy.trajectory_spec
    buffer_class = TFUniformReplayBuffer if tf_env else PyUniformReplayBuffer
    wrong_reward = buffer_class(spec._replace(reward=tf.TensorSpec([], tf.float64)), batch_size=2, max_length=50)
    one_segment = buffer_class(spec, batch_size=1, max_length=50)
    time_step = env.current_time_step() if tf_env else env.reset()
    for buffer, error, message in [
        (wrong_reward, ValueError, "reward: expected dtype float64, got float32"),
        (
            one_segment,
            ValueError,
            "warm: the driver's trajectories have batch size 2 but the buffer has batch_size=1 (one segment per "
            "environment): create the buffer with batch_size=env.batch_size",
        ),
    ]:
        frame = tf.nest.map_structure(
            lambda s, n=buffer.batch_size: np.ones((n, *s.shape), s.dtype.as_numpy_dtype), buffer.data_spec
        )
        buffer.add_batch(frame)
        before = buffer.state()
        with pytest.raises(error) as raised:
            warm(buffer, env, policy, num_frames=20)
        assert str(raised.value) == message
        after = buffer.state()
        assert after.counters == before.counters
        for name, array in before.arrays.items():
            np.testing.assert_array_equal(after.arrays[name], array)
        # The environment was not reset or stepped.
        now = env.current_time_step()
        np.testing.assert_array_equal(np.asarray(now.observation), np.asarray(time_step.observation))
        # The next add, sample, gather_all and clear work, eagerly and inside tf.function.
        tf.function(buffer.add_batch)(frame)
        buffer.add_batch(frame)
        sample = tf.function(lambda b=buffer: b.get_next(sample_batch_size=3)[0].reward)()
        np.testing.assert_array_equal(np.asarray(sample), np.ones(3))
        np.testing.assert_array_equal(np.asarray(buffer.get_next(sample_batch_size=2)[0].reward), np.ones(2))
        assert np.asarray(tf.function(buffer.gather_all)().reward).shape == (buffer.batch_size, 3)
        tf.function(buffer.clear)()
        assert int(buffer.num_frames()) == 0
        buffer.add_batch(frame)
        buffer.clear()
        assert int(buffer.num_frames()) == 0
