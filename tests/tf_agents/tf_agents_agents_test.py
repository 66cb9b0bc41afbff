"""TF-Agents' agents with tfbuffers in place of TF-Agents' buffers, as their example programs use them."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.agents.ppo import ppo_clip_agent
from tf_agents.drivers import dynamic_episode_driver
from tf_agents.networks import actor_distribution_network, value_network

import tfbuffers
from tfbuffers.envs import load_gymnasium
from tfbuffers.observers import TFObserver


@pytest.mark.parametrize("kind", [tfbuffers.TFUniformReplayBuffer, tfbuffers.PyUniformReplayBuffer])
def test_ppo_collects_into_a_buffer_and_trains_on_gather_all(kind):
    # Issue 11, bug 5: PPOAgent.collect_data_spec is a namedtuple holding dicts that tf.Module wraps
    # (TF-Agents' ppo/examples/v2/train_eval_clip_agent.py builds its buffer from it, on a continuous task
    # as here: a discrete one meets TF-Agents' own numpy-2 bug in CategoricalProjectionNetwork).
    tf.random.set_seed(0)
    env = load_gymnasium("Pendulum-v1", num_envs=2, seed=0, max_episode_steps=50, tf_environment=True)
    actor = actor_distribution_network.ActorDistributionNetwork(
        env.observation_spec(), env.action_spec(), fc_layer_params=(16,)
    )
    value = value_network.ValueNetwork(env.observation_spec(), fc_layer_params=(16,))
    agent = ppo_clip_agent.PPOClipAgent(
        env.time_step_spec(),
        env.action_spec(),
        optimizer=tf.keras.optimizers.Adam(1e-3),
        actor_net=actor,
        value_net=value,
        num_epochs=1,
        train_step_counter=tf.Variable(0, dtype=tf.int64),  # not the process-wide global step other tests count
    )
    agent.initialize()
    spec = agent.collect_data_spec
    assert type(spec.policy_info).__name__ == "_DictWrapper"
    buffer = kind(spec, batch_size=env.batch_size, max_length=200)
    driver = dynamic_episode_driver.DynamicEpisodeDriver(
        env, agent.collect_policy, observers=[TFObserver(buffer)], num_episodes=2
    )
    tf.function(driver.run, autograph=False)()
    frames = int(buffer.num_frames())
    assert frames > 0 and frames % 2 == 0
    experience = tf.nest.map_structure(tf.convert_to_tensor, buffer.gather_all())  # the py buffer's are numpy
    assert np.asarray(experience.policy_info["dist_params"]["loc"]).shape == (2, frames // 2, 1)
    loss = agent.train(experience).loss
    assert np.isfinite(float(loss))
