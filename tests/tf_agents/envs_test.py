"""Gymnasium environments through TF-Agents drivers into buffers, checked step by step."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import tensorflow as tf
from gymnasium.utils.env_checker import check_env
from tf_agents.drivers import dynamic_step_driver, py_driver
from tf_agents.environments import batched_py_environment, tf_py_environment
from tf_agents.policies import fixed_policy, random_py_policy
from tf_agents.specs import array_spec
from tf_agents.trajectories import time_step as ts

import tfbuffers
from tfbuffers.envs import BIT_FLIPPING_ID, BitFlippingEnv, GymnasiumEnvironment, load_gymnasium, spec_from_space
from tfbuffers.observers import PyObserver, TFObserver

FIRST, MID, LAST = int(ts.StepType.FIRST), int(ts.StepType.MID), int(ts.StepType.LAST)


def test_specs_from_spaces():
    env = load_gymnasium("CartPole-v1")
    assert env.observation_spec().shape == (4,) and env.observation_spec().dtype == np.float32
    assert env.action_spec() == array_spec.BoundedArraySpec((), np.int64, 0, 1)
    pendulum = load_gymnasium("Pendulum-v1")
    assert pendulum.action_spec() == array_spec.BoundedArraySpec((1,), np.float32, -2.0, 2.0)
    nested = spec_from_space(
        gymnasium.spaces.Dict(
            {
                "a": gymnasium.spaces.Discrete(3, start=1),
                "b": gymnasium.spaces.Tuple([gymnasium.spaces.Box(0, 1, (2,))]),
            }
        )
    )
    assert nested["a"] == array_spec.BoundedArraySpec((), np.int64, 1, 3)
    assert nested["b"][0].shape == (2,)
    with pytest.raises(TypeError) as raised:
        spec_from_space(gymnasium.spaces.MultiBinary(3))
    assert str(raised.value) == "<root>: expected a Box, Discrete, Dict or Tuple space, got MultiBinary"


def gymnasium_rollout(seed: int, actions: list[int], max_episode_steps: int | None = None):
    """Observations, rewards and ends of one episode played directly in gymnasium."""
    env = gymnasium.make("CartPole-v1", max_episode_steps=max_episode_steps)
    observation, _ = env.reset(seed=seed)
    observations, rewards = [observation], []
    for action in actions:
        observation, reward, terminated, truncated, _ = env.step(action)
        observations.append(observation)
        rewards.append(reward)
        if terminated or truncated:
            return np.array(observations), np.array(rewards, np.float32), terminated, truncated
    raise AssertionError("the episode did not end")


def test_termination_through_a_tf_driver_into_a_buffer():
    # Always pushing right topples the pole: the episode terminates (discount 0).
    observations, rewards, terminated, _ = gymnasium_rollout(seed=3, actions=[1] * 100)
    assert terminated
    length = len(rewards)
    env = load_gymnasium("CartPole-v1", seed=3, tf_environment=True)
    policy = fixed_policy.FixedPolicy(np.int64(1), env.time_step_spec(), env.action_spec())
    buffer = tfbuffers.TFUniformReplayBuffer(policy.trajectory_spec, batch_size=1, max_length=100)
    driver = dynamic_step_driver.DynamicStepDriver(env, policy, [TFObserver(buffer)], num_steps=length + 1)
    # Pass the first time step: without it TF-Agents' driver may step before it resets.
    tf.function(driver.run)(env.reset())
    frames = tf.nest.map_structure(lambda x: x.numpy()[0], buffer.gather_all())
    # Row t holds time step t, the action taken and what followed: reward, discount, next step type.
    assert frames.step_type.tolist() == [FIRST] + [MID] * (length - 1) + [LAST, FIRST]
    assert frames.next_step_type.tolist() == [MID] * (length - 1) + [LAST, FIRST, MID]
    np.testing.assert_array_equal(frames.observation[: length + 1], observations)
    np.testing.assert_array_equal(frames.reward[:length], rewards)
    assert frames.discount[:length].tolist() == [1.0] * (length - 1) + [0.0]
    assert frames.action.dtype == np.int64 and frames.observation.dtype == np.float32
    assert frames.reward.dtype == np.float32 and frames.discount.dtype == np.float32
    assert frames.step_type.dtype == np.int32


def test_truncation_keeps_the_discount():
    actions = [0, 1, 0, 1, 0]
    observations, rewards, terminated, truncated = gymnasium_rollout(seed=5, actions=actions, max_episode_steps=5)
    assert truncated and not terminated
    env = GymnasiumEnvironment(gymnasium.make("CartPole-v1", max_episode_steps=5), seed=5, discount=0.99)
    steps = [env.reset()] + [env.step(np.int64(a)) for a in actions]
    assert [int(s.step_type) for s in steps] == [FIRST, MID, MID, MID, MID, LAST]
    np.testing.assert_allclose([float(s.discount) for s in steps[1:]], [0.99] * 5)
    np.testing.assert_array_equal(np.stack([s.observation for s in steps]), observations)
    assert [float(s.reward) for s in steps[1:]] == rewards.tolist()
    assert int(env.step(np.int64(0)).step_type) == FIRST  # the next step starts a new episode


def test_batched_copies_are_seeded_apart():
    env = load_gymnasium("CartPole-v1", num_envs=3, seed=10)
    assert isinstance(env, batched_py_environment.BatchedPyEnvironment) and env.batch_size == 3
    first = env.reset().observation
    for i in range(3):
        np.testing.assert_array_equal(first[i], gymnasium.make("CartPole-v1").reset(seed=10 + i)[0])
    assert isinstance(load_gymnasium("CartPole-v1", num_envs=2, tf_environment=True), tf_py_environment.TFPyEnvironment)


def test_a_batched_environment_steps_on_a_tf_policy_s_tensors_through_a_py_driver():
    from tf_agents.policies import py_tf_eager_policy, random_tf_policy
    from tf_agents.specs import tensor_spec

    env = load_gymnasium("CartPole-v1", num_envs=2, seed=4)
    time_step_spec = tensor_spec.from_spec(env.time_step_spec())
    policy = random_tf_policy.RandomTFPolicy(time_step_spec, tensor_spec.from_spec(env.action_spec()))
    # Without batch_time_steps the policy returns tensors, which the environment steps on as arrays.
    actor = py_tf_eager_policy.PyTFEagerPolicy(policy, use_tf_function=True, batch_time_steps=False)
    buffer = tfbuffers.PyUniformReplayBuffer(policy.trajectory_spec, batch_size=2, max_length=50)
    py_driver.PyDriver(env, actor, [PyObserver(buffer)], max_steps=30).run(env.reset())
    frames = buffer.gather_all()
    reference = load_gymnasium("CartPole-v1", num_envs=2, seed=4)
    first = reference.reset()
    np.testing.assert_array_equal(frames.observation[:, 0], first.observation)
    after = reference.step(frames.action[:, 0])  # the recorded actions replayed on a fresh copy
    np.testing.assert_array_equal(frames.observation[:, 1], after.observation)


def test_continuous_environment_through_a_py_driver():
    env = load_gymnasium("Pendulum-v1", seed=0)  # truncated at 200 steps
    policy = random_py_policy.RandomPyPolicy(env.time_step_spec(), env.action_spec(), seed=0)
    spec = tf.nest.map_structure(lambda s: tf.TensorSpec(s.shape, s.dtype), policy.trajectory_spec)
    buffer = tfbuffers.PyUniformReplayBuffer(spec, capacity=300)
    py_driver.PyDriver(env, policy, [PyObserver(buffer)], max_steps=210).run(env.reset())
    frames = tf.nest.map_structure(lambda x: x[0], buffer.gather_all())
    assert len(frames.step_type) == 211  # 210 steps plus the boundary, which drivers do not count
    assert frames.step_type.tolist()[:201] == [FIRST] + [MID] * 199 + [LAST]
    assert frames.step_type[201] == FIRST
    assert frames.discount[199] == 1.0 and frames.next_step_type[199] == LAST  # truncation: discount kept
    assert frames.action.dtype == np.float32 and frames.action.shape == (211, 1)
    assert np.all(np.abs(frames.action) <= 2.0)
    assert frames.observation.shape == (211, 3)


@pytest.mark.parametrize(
    ("num_envs", "error", "message"),
    [
        (0, ValueError, "num_envs: expected a positive int, got int 0"),
        (1.0, TypeError, "num_envs: expected a positive int, got float 1.0"),
    ],
)
def test_bad_num_envs(num_envs, error, message):
    with pytest.raises(error) as raised:
        load_gymnasium("CartPole-v1", num_envs=num_envs)
    assert str(raised.value) == message


def test_bit_flipping_reaches_its_goal_by_flipping_the_bits_that_differ():
    env = BitFlippingEnv(num_bits=6)
    observation, info = env.reset(seed=1)
    state, goal = observation["observation"], observation["desired_goal"]
    assert state.dtype == np.float32 and state.shape == (6,) and set(state.tolist()) <= {0.0, 1.0}
    np.testing.assert_array_equal(observation["achieved_goal"], state)
    assert not info["is_success"] and not np.array_equal(state, goal)
    differ = np.flatnonzero(state != goal).tolist()
    rewards, ends = [], []
    for bit in differ:
        observation, reward, terminated, truncated, info = env.step(bit)
        rewards.append(reward)
        ends.append((terminated, truncated))
    assert rewards == [-1.0] * (len(differ) - 1) + [0.0]
    assert ends == [(False, False)] * (len(differ) - 1) + [(True, False)]
    assert info["is_success"]
    np.testing.assert_array_equal(observation["observation"], goal)
    np.testing.assert_array_equal(observation["achieved_goal"], goal)
    np.testing.assert_array_equal(observation["desired_goal"], goal)


def test_bit_flipping_is_truncated_after_num_bits_steps():
    env = BitFlippingEnv(num_bits=3)
    observation, _ = env.reset(seed=2)
    assert observation["observation"].tolist() == [1.0, 0.0, 0.0] and observation["desired_goal"].tolist() == [0, 0, 1]
    same = 1  # a bit the state shares with the goal
    steps = [env.step(same) for _ in range(3)]  # away from the goal, back, away: never there
    assert [(reward, terminated, truncated) for _, reward, terminated, truncated, _ in steps] == [
        (-1.0, False, False),
        (-1.0, False, False),
        (-1.0, False, True),
    ]
    longer = BitFlippingEnv(num_bits=3, max_steps=5)
    longer.reset(seed=2)
    assert [longer.step(same)[3] for _ in range(5)] == [False] * 4 + [True]


def test_bit_flipping_never_starts_at_its_goal():
    env = BitFlippingEnv(num_bits=1)
    for seed in range(50):
        observation, _ = env.reset(seed=seed)
        assert observation["desired_goal"][0] == 1.0 - observation["observation"][0]
        assert env.step(0)[1:4] == (0.0, True, False)


def test_bit_flipping_rewards_any_goals_vectorized():
    env = BitFlippingEnv(num_bits=3)
    achieved = np.array([[[0, 1, 1], [1, 1, 1]], [[0, 0, 0], [1, 0, 1]]], np.float32)
    desired = np.array([[[0, 1, 1], [1, 1, 0]], [[0, 0, 0], [0, 0, 0]]], np.float32)
    rewards = env.compute_reward(achieved, desired, None)
    assert rewards.dtype == np.float32
    assert rewards.tolist() == [[0.0, -1.0], [0.0, -1.0]]


def test_bit_flipping_through_gymnasium_and_tf_agents():
    check_env(gymnasium.make(BIT_FLIPPING_ID, num_bits=5).unwrapped)
    env = load_gymnasium(BIT_FLIPPING_ID, seed=2, num_bits=5)
    spec = env.observation_spec()
    assert sorted(spec) == ["achieved_goal", "desired_goal", "observation"]
    assert spec["desired_goal"] == array_spec.BoundedArraySpec((5,), np.float32, 0.0, 1.0)
    assert env.action_spec() == array_spec.BoundedArraySpec((), np.int64, 0, 4)
    first = env.reset()
    differ = np.flatnonzero(first.observation["observation"] != first.observation["desired_goal"]).tolist()
    steps = [env.step(np.int64(bit)) for bit in differ]
    assert [int(s.step_type) for s in steps] == [MID] * (len(differ) - 1) + [LAST]
    assert [float(s.discount) for s in steps] == [1.0] * (len(differ) - 1) + [0.0]  # terminated: nothing beyond
    # Flipping a bit the state shares with the goal, back and forth, never reaches it: truncated after 5 steps.
    env = load_gymnasium(BIT_FLIPPING_ID, seed=3, num_bits=5)
    first = env.reset()
    same = int(np.flatnonzero(first.observation["observation"] == first.observation["desired_goal"])[0])
    steps = [env.step(np.int64(same)) for _ in range(5)]
    assert [int(s.step_type) for s in steps] == [MID] * 4 + [LAST]
    assert [float(s.discount) for s in steps] == [1.0] * 5  # truncated: the state still has a value
    assert [float(s.reward) for s in steps] == [-1.0] * 5


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"num_bits": 0}, ValueError, "num_bits: expected a positive int, got int 0"),
        ({"num_bits": 2.0}, TypeError, "num_bits: expected a positive int, got float 2.0"),
        ({"num_bits": 3, "max_steps": 0}, ValueError, "max_steps: expected a positive int, got int 0"),
    ],
)
def test_bit_flipping_refuses_bad_sizes(kwargs, error, message):
    with pytest.raises(error) as raised:
        BitFlippingEnv(**kwargs)
    assert str(raised.value) == message


@pytest.mark.parametrize("action", [3, -1, 1.5])
def test_bit_flipping_refuses_a_bit_it_does_not_have_and_goes_on(action):
    env = BitFlippingEnv(num_bits=3)
    observation, _ = env.reset(seed=0)
    with pytest.raises(ValueError) as raised:
        env.step(action)
    assert str(raised.value) == f"action: expected a bit index in [0, 3), got {action!r}"
    after = env.step(0)[0]  # the state is unchanged by the refused step
    expected = observation["observation"].copy()
    expected[0] = 1.0 - expected[0]
    np.testing.assert_array_equal(after["observation"], expected)
