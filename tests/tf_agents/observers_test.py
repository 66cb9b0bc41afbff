"""Observers with real TF-Agents drivers, an Actor and a DQN agent, for every buffer kind.

The reference is TF-Agents itself: its own buffer, fed by the same driver in the
same run, or the trajectories a recording observer saw.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from conftest import make_buffer, underlying
from tf_agents.agents.dqn import dqn_agent
from tf_agents.drivers import dynamic_episode_driver, dynamic_step_driver, py_driver
from tf_agents.networks import q_network
from tf_agents.policies import py_tf_eager_policy, random_py_policy, random_tf_policy
from tf_agents.replay_buffers import tf_uniform_replay_buffer
from tf_agents.train import actor
from tf_agents.trajectories import time_step as ts

import tfbuffers
from tfbuffers import observers
from tfbuffers.envs import load_gymnasium


def assert_same_frames(actual, expected):
    for a, e in zip(tf.nest.flatten(actual), tf.nest.flatten(expected)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(e))


def buffer_for(kind, spec, batch_size, max_length=200):
    return underlying(make_buffer(kind, batch_size=batch_size, max_length=max_length, spec=spec))


def test_tf_observer_in_a_step_driver_matches_tf_agents(kind):
    env = load_gymnasium("CartPole-v1", num_envs=2, seed=1, tf_environment=True)
    policy = random_tf_policy.RandomTFPolicy(env.time_step_spec(), env.action_spec())
    ours = buffer_for(kind, policy.trajectory_spec, batch_size=2)
    theirs = tf_uniform_replay_buffer.TFUniformReplayBuffer(policy.trajectory_spec, batch_size=2, max_length=200)
    driver = dynamic_step_driver.DynamicStepDriver(
        env, policy, observers=[observers.TFObserver(ours), theirs.add_batch], num_steps=60
    )
    tf.function(driver.run)(env.reset())
    assert int(ours.num_frames()) == int(theirs.num_frames()) >= 60
    assert_same_frames(ours.gather_all(), theirs.gather_all())


def test_tf_observer_in_an_episode_driver(kind):
    env = load_gymnasium("CartPole-v1", seed=2, tf_environment=True)
    policy = random_tf_policy.RandomTFPolicy(env.time_step_spec(), env.action_spec())
    buffer = buffer_for(kind, policy.trajectory_spec, batch_size=1, max_length=500)
    driver = dynamic_episode_driver.DynamicEpisodeDriver(
        env, policy, observers=[observers.TFObserver(buffer)], num_episodes=3
    )
    driver.run(env.reset())
    frames = tf.nest.map_structure(lambda x: np.asarray(x)[0], buffer.gather_all())
    assert int(np.sum(frames.next_step_type == ts.StepType.LAST)) == 3
    assert frames.step_type[0] == ts.StepType.FIRST
    # The driver counts an episode at its boundary frame (step LAST, next FIRST), and stops there.
    assert frames.step_type[-1] == ts.StepType.LAST and frames.next_step_type[-1] == ts.StepType.FIRST


def test_tf_observer_refuses_another_batch_size():
    env = load_gymnasium("CartPole-v1", num_envs=2, tf_environment=True)
    policy = random_tf_policy.RandomTFPolicy(env.time_step_spec(), env.action_spec())
    buffer = tfbuffers.TFUniformReplayBuffer(policy.trajectory_spec, batch_size=3)
    driver = dynamic_step_driver.DynamicStepDriver(env, policy, observers=[observers.TFObserver(buffer)], num_steps=1)
    with pytest.raises(ValueError) as raised:
        tf.function(driver.run)(env.reset())
    # (The driver's own autograph wraps the message in a traceback of the user's code.)
    assert (
        "ValueError: TFObserver: the driver's trajectories have batch size 2 but the buffer has batch_size=3 "
        "(one segment per environment): create the buffer with batch_size=env.batch_size"
    ) in str(raised.value)
    assert int(buffer.num_frames()) == 0


def record(trajectories):
    return lambda trajectory: trajectories.append(trajectory)


def test_py_observer_adds_the_batch_dimension_for_one_environment(kind):
    env = load_gymnasium("CartPole-v1", seed=4)
    policy = random_py_policy.RandomPyPolicy(env.time_step_spec(), env.action_spec(), seed=4)
    buffer = buffer_for(kind, policy.trajectory_spec, batch_size=1)
    seen = []
    py_driver.PyDriver(env, policy, [observers.PyObserver(buffer), record(seen)], max_steps=50).run(env.reset())
    expected = tf.nest.map_structure(lambda *steps: np.stack(steps)[None], *seen)
    assert int(buffer.num_frames()) == len(seen) >= 50
    assert_same_frames(buffer.gather_all(), expected)


def test_py_observer_takes_batched_trajectories(kind):
    env = load_gymnasium("CartPole-v1", num_envs=3, seed=5)
    policy = random_py_policy.RandomPyPolicy(env.time_step_spec(), env.action_spec(), seed=5, outer_dims=(3,))
    buffer = buffer_for(kind, policy.trajectory_spec, batch_size=3)
    seen = []
    py_driver.PyDriver(env, policy, [observers.PyObserver(buffer), record(seen)], max_steps=60).run(env.reset())
    expected = tf.nest.map_structure(lambda *steps: np.stack(steps, axis=1), *seen)
    assert int(buffer.num_frames()) == 3 * len(seen)
    assert_same_frames(buffer.gather_all(), expected)


def test_observers_add_a_block_of_steps_per_environment_in_one_extend(kind):
    env = load_gymnasium("CartPole-v1", num_envs=2, seed=7)
    policy = random_py_policy.RandomPyPolicy(env.time_step_spec(), env.action_spec(), seed=7, outer_dims=(2,))
    seen = []
    py_driver.PyDriver(env, policy, [record(seen)], max_steps=24).run(env.reset())
    rollout = tf.nest.map_structure(lambda *steps: np.stack(steps, axis=1), *seen)  # [2, T, ...]: a rollout
    cut = tf.nest.map_structure(lambda leaf: leaf[:, :5], rollout)
    py_buffer = buffer_for(kind, policy.trajectory_spec, batch_size=2)
    tf_buffer = buffer_for(kind, policy.trajectory_spec, batch_size=2)
    observe = tf.function(observers.TFObserver(tf_buffer))
    observers.PyObserver(py_buffer)(cut)
    observe(tf.nest.map_structure(tf.constant, cut))
    wrong = cut._replace(reward=cut.reward[:, :4])  # one field one step short
    for observer in (observers.PyObserver(py_buffer), observe):
        with pytest.raises((ValueError, tf.errors.InvalidArgumentError)) as raised:
            observer(wrong)
        assert "reward: expected 5 frames along axis 1" in str(raised.value)
    rest = tf.nest.map_structure(lambda leaf: leaf[:, 5:], rollout)
    observers.PyObserver(py_buffer)(rest)  # the refusals changed nothing: the buffers go on
    ids = observe(tf.nest.map_structure(tf.constant, rest))
    np.testing.assert_array_equal(np.asarray(ids), np.arange(5, len(seen))[None, :] * 2 + np.arange(2)[:, None])
    for buffer in (py_buffer, tf_buffer):
        assert int(buffer.num_frames()) == 2 * len(seen)
        assert_same_frames(buffer.gather_all(), rollout)


def test_py_observer_errors():
    spec = {"x": tf.TensorSpec([2], tf.float32)}
    buffer = tfbuffers.PyUniformReplayBuffer(spec, batch_size=2, max_length=3)
    with pytest.raises(ValueError) as raised:
        observers.PyObserver(buffer)({"x": np.zeros(2, np.float32)})
    assert str(raised.value).startswith("PyObserver: the driver's trajectories have batch size 1 but the buffer")
    with pytest.raises(ValueError) as raised:
        observers.PyObserver(buffer)({"x": np.zeros([2, 2, 2, 2], np.float32)})
    assert str(raised.value) == (
        "PyObserver: x: expected rank 1 (one environment), 2 (batched) or 3 (a block of steps, [batch_size, T, ...]), "
        "got 4"
    )
    with pytest.raises(TypeError) as raised:
        observers.PyObserver(object())
    assert str(raised.value) == "PyObserver: expected a tfbuffers.ReplayBuffer or RayWriter, got object"
    assert int(buffer.num_frames()) == 0


def test_actor_with_a_dqn_agent_collects_into_any_buffer(kind):
    env = load_gymnasium("CartPole-v1", seed=6)
    tf_env = load_gymnasium("CartPole-v1", seed=6, tf_environment=True)
    q_net = q_network.QNetwork(tf_env.observation_spec(), tf_env.action_spec(), fc_layer_params=(16,))
    train_step = tf.Variable(0, dtype=tf.int64)
    agent = dqn_agent.DqnAgent(
        tf_env.time_step_spec(),
        tf_env.action_spec(),
        q_network=q_net,
        optimizer=tf.keras.optimizers.Adam(1e-3),
        train_step_counter=train_step,
    )
    agent.initialize()
    buffer = buffer_for(kind, agent.collect_data_spec, batch_size=1)
    seen = []
    collect_policy = py_tf_eager_policy.PyTFEagerPolicy(agent.collect_policy, use_tf_function=True)
    collector = actor.Actor(
        env, collect_policy, train_step, steps_per_run=40, observers=[observers.PyObserver(buffer), record(seen)]
    )
    collector.run()
    assert int(buffer.num_frames()) == len(seen) >= 40
    experience, _ = next(iter(buffer.as_dataset(sample_batch_size=8, num_steps=2)))
    loss = agent.train(experience).loss
    assert np.isfinite(loss.numpy()) and int(train_step.numpy()) == 1
