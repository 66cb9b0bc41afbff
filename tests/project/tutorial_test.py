"""TF-Agents' replay-buffer tutorial, run against tfbuffers by changing the import.

The code follows the tutorial's buffer section step by step (create, add_batch,
get_next, as_dataset, gather_all, for both buffers, then a driver observer and
a training loop); only `from tf_agents.replay_buffers import ...` changed.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tf_agents.agents.dqn import dqn_agent
from tf_agents.drivers import dynamic_step_driver
from tf_agents.environments import suite_gym, tf_py_environment
from tf_agents.networks import q_network
from tf_agents.specs import tensor_spec

from tfbuffers import PyUniformReplayBuffer, TFUniformReplayBuffer

data_spec = (
    tf.TensorSpec([3], tf.float32, "action"),
    (tf.TensorSpec([5], tf.float32, "lidar"), tf.TensorSpec([3, 2], tf.float32, "camera")),
)


def shapes(structure):
    return tf.nest.map_structure(lambda t: tuple(t.shape), structure)


def tutorial_values(batch_size):
    action = tf.constant(1 * np.ones(data_spec[0].shape.as_list(), dtype=np.float32))
    lidar = tf.constant(2 * np.ones(data_spec[1][0].shape.as_list(), dtype=np.float32))
    camera = tf.constant(3 * np.ones(data_spec[1][1].shape.as_list(), dtype=np.float32))
    values = (action, (lidar, camera))
    return tf.nest.map_structure(lambda t: tf.stack([t] * batch_size), values)


def test_tf_uniform_replay_buffer_section():
    batch_size = 32
    max_length = 1000
    replay_buffer = TFUniformReplayBuffer(data_spec, batch_size=batch_size, max_length=max_length)
    values_batched = tutorial_values(batch_size)
    replay_buffer.add_batch(values_batched)
    for _ in range(5):
        replay_buffer.add_batch(values_batched)

    sample = replay_buffer.get_next(sample_batch_size=10, num_steps=1)
    assert shapes(sample[0]) == ((10, 1, 3), ((10, 1, 5), (10, 1, 3, 2)))

    dataset = replay_buffer.as_dataset(sample_batch_size=4, num_steps=2)
    iterator = iter(dataset)
    trajectories = []
    for _ in range(3):
        t, _ = next(iterator)
        trajectories.append(t)
    assert shapes(trajectories) == [((4, 2, 3), ((4, 2, 5), (4, 2, 3, 2)))] * 3

    trajectories = replay_buffer.gather_all()
    assert shapes(trajectories) == ((32, 6, 3), ((32, 6, 5), (32, 6, 3, 2)))
    np.testing.assert_array_equal(trajectories[1][1].numpy(), np.full([32, 6, 3, 2], 3.0, np.float32))


def test_py_uniform_replay_buffer_section():
    replay_buffer_capacity = 1000 * 32
    py_replay_buffer = PyUniformReplayBuffer(
        capacity=replay_buffer_capacity, data_spec=tensor_spec.to_nest_array_spec(data_spec)
    )
    values_batched = tutorial_values(1)
    for _ in range(6):
        py_replay_buffer.add_batch(values_batched)
    sample, _ = py_replay_buffer.get_next(sample_batch_size=10, num_steps=1)
    assert shapes(sample) == ((10, 1, 3), ((10, 1, 5), (10, 1, 3, 2)))
    t, _ = next(iter(py_replay_buffer.as_dataset(sample_batch_size=4, num_steps=2)))
    assert shapes(t) == ((4, 2, 3), ((4, 2, 5), (4, 2, 3, 2)))
    assert shapes(py_replay_buffer.gather_all()) == ((1, 6, 3), ((1, 6, 5), (1, 6, 3, 2)))


def test_driver_observer_and_training_section():
    env = suite_gym.load("CartPole-v0")
    tf_env = tf_py_environment.TFPyEnvironment(env)
    q_net = q_network.QNetwork(tf_env.time_step_spec().observation, tf_env.action_spec(), fc_layer_params=(100,))
    agent = dqn_agent.DqnAgent(
        tf_env.time_step_spec(),
        tf_env.action_spec(),
        q_network=q_net,
        optimizer=tf.compat.v1.train.AdamOptimizer(0.001),
    )
    replay_buffer_capacity = 1000
    replay_buffer = TFUniformReplayBuffer(
        agent.collect_data_spec, batch_size=tf_env.batch_size, max_length=replay_buffer_capacity
    )
    # (Boundary steps between episodes do not count towards num_steps but are observed:
    # a second observer counts what the buffer should hold.)
    observed = tf.Variable(0, dtype=tf.int64)
    replay_observer = [replay_buffer.add_batch, lambda traj: observed.assign_add(1)]
    collect_steps_per_iteration = 10
    driver = dynamic_step_driver.DynamicStepDriver(
        tf_env, agent.collect_policy, observers=replay_observer, num_steps=collect_steps_per_iteration
    )
    driver.run()
    assert int(observed.numpy()) >= 10
    assert int(replay_buffer.num_frames()) == int(observed.numpy())
    # As the DQN tutorial does: the driver's loop in a graph, the observer inside its while_loop.
    tf.function(driver.run)()
    assert int(observed.numpy()) >= 20
    assert int(replay_buffer.num_frames()) == int(observed.numpy())
    steps = replay_buffer.gather_all()
    assert steps.observation.shape == (1, int(observed.numpy()), 4)

    dataset = replay_buffer.as_dataset(sample_batch_size=4, num_steps=2)
    iterator = iter(dataset)
    num_train_steps = 10
    # The agent counts on TF's global step, which other agents in this process may have moved.
    steps_before = int(agent.train_step_counter.numpy())
    for _ in range(num_train_steps):
        trajectories, _ = next(iterator)
        loss = agent.train(experience=trajectories)
    assert np.isfinite(loss.loss.numpy())
    assert int(agent.train_step_counter.numpy()) - steps_before == num_train_steps
