"""Hindsight relabeling (`tfbuffers.her`), checked exactly on hand-built episodes and through buffers."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.trajectories import trajectory

import tfbuffers
from tfbuffers import her
from tfbuffers.envs import BitFlippingEnv

FIRST, MID, LAST = 0, 1, 2
# One environment's frames: episode A is frames 0-3 (LAST at 3), episode B frames 4-8 (LAST at 8), episode C
# from frame 9. Frame f achieves goal 10 * f, and every stored desired goal is -1.
STEP_TYPES = [FIRST, MID, MID, LAST, FIRST, MID, MID, MID, LAST, FIRST, MID, MID]
EPISODE = [0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2]


def reward_fn(achieved, desired):
    return tf.where(tf.reduce_all(achieved == desired, axis=-1), 0.0, -1.0)


def windows(starts, num_steps):
    """The windows of `num_steps` frames starting at `starts`, as a buffer returns them: [batch, num_steps]."""
    frames = np.asarray(starts)[:, None] + np.arange(num_steps)
    goals = (10.0 * frames)[..., None].astype(np.float32)
    return trajectory.Trajectory(
        step_type=np.asarray(STEP_TYPES, np.int32)[frames],
        observation={
            "achieved_goal": goals,
            "desired_goal": np.full_like(goals, -1.0),
            "observation": goals + 0.5,
        },
        action=frames.astype(np.int64),
        policy_info=(),
        next_step_type=np.asarray(STEP_TYPES[1:] + [MID], np.int32)[frames],
        reward=np.full(frames.shape, -1.0, np.float32),
        discount=np.ones(frames.shape, np.float32),
    )


def check_relabeled(windows_in, windows_out, starts, anchor, strategy):
    """Every relabeled window: its goal achieved in its episode where the strategy allows; rewards recomputed."""
    goals = windows_out.observation["desired_goal"][..., 0].numpy()
    rewards = windows_out.reward.numpy()
    chosen = []
    for row, start in enumerate(starts):
        frames = start + np.arange(goals.shape[1])
        t = start + anchor
        same = np.array([EPISODE[f] == EPISODE[t] for f in frames])
        # The window's own episode, cut at its LAST frame (frames after a LAST belong to the next episode).
        last = next(f for f in range(t, len(STEP_TYPES)) if STEP_TYPES[f] == LAST or f == frames[-1])
        same &= frames <= last
        goal = goals[row, anchor]
        assert goal != -1.0, f"window {row} not relabeled"
        source = int(goal) // 10  # the frame that achieved it
        assert EPISODE[source] == EPISODE[t] and source in frames and source <= last
        if strategy == "future":
            assert source > t
        if strategy == "final":
            assert source == min(last, frames[-1])
        chosen.append(source)
        np.testing.assert_array_equal(goals[row], np.where(same, goal, -1.0))
        for j, f in enumerate(frames[:-1]):
            both = same[j] and same[j + 1]
            expected = (0.0 if 10 * (f + 1) == goal else -1.0) if both else -1.0
            assert rewards[row, j] == expected, (row, j)
        assert rewards[row, -1] == -1.0
    # What the relabeling does not touch.
    for field in ("step_type", "action", "next_step_type", "discount"):
        np.testing.assert_array_equal(getattr(windows_out, field), getattr(windows_in, field))
    np.testing.assert_array_equal(windows_out.observation["observation"], windows_in.observation["observation"])
    np.testing.assert_array_equal(windows_out.observation["achieved_goal"], windows_in.observation["achieved_goal"])
    return chosen


@pytest.mark.parametrize("strategy", ["future", "final"])
def test_future_and_final_goals_come_from_later_frames_of_the_same_episode(strategy):
    starts = [0, 1, 2, 4, 5, 6, 7]  # windows of 5 frames whose transition lies in one episode
    given = windows(starts, 5)
    seen = {start: set() for start in starts}
    for seed in range(40):
        out = her.relabel_windows(given, reward_fn, strategy=strategy, relabel_fraction=1.0, seed=[seed, 0])
        for start, source in zip(starts, check_relabeled(given, out, starts, 0, strategy)):
            seen[start].add(source)
    if strategy == "future":  # every later frame of the episode inside the window is drawn
        assert seen == {0: {1, 2, 3}, 1: {2, 3}, 2: {3}, 4: {5, 6, 7, 8}, 5: {6, 7, 8}, 6: {7, 8}, 7: {8}}
    else:
        assert seen == {0: {3}, 1: {3}, 2: {3}, 4: {8}, 5: {8}, 6: {8}, 7: {8}}


def test_episode_goals_come_from_any_frame_of_the_episode_around_the_transition():
    starts = [0, 2, 3, 4]  # transitions at frames 2, 4, 5, 6 (anchor 2 of windows of 5)
    given = windows(starts, 5)
    seen = {start: set() for start in starts}
    for seed in range(60):
        out = her.relabel_windows(
            given, reward_fn, strategy="episode", relabel_fraction=1.0, anchor=2, seed=tf.constant([seed, 1])
        )
        for start, source in zip(starts, check_relabeled(given, out, starts, 2, "episode")):
            seen[start].add(source)
    assert seen == {0: {0, 1, 2, 3}, 2: {4, 5, 6}, 3: {4, 5, 6, 7}, 4: {4, 5, 6, 7, 8}}


def test_a_window_on_an_episode_boundary_is_left_as_stored():
    given = windows([3, 8], 4)  # transitions LAST -> FIRST: no transition within one episode
    out = her.relabel_windows(given, reward_fn, strategy="future", relabel_fraction=1.0, seed=[0, 0])
    for got, expected in zip(tf.nest.flatten(out), tf.nest.flatten(given)):
        np.testing.assert_array_equal(got, expected)


def test_fraction_zero_changes_nothing_and_a_fraction_relabels_about_that_share():
    starts = np.tile([0, 1, 4, 5, 6], 200)
    given = windows(starts, 4)
    out = her.relabel_windows(given, reward_fn, relabel_fraction=0.0, seed=[3, 3])
    for got, expected in zip(tf.nest.flatten(out), tf.nest.flatten(given)):
        np.testing.assert_array_equal(got, expected)
    out = her.relabel_windows(given, reward_fn, relabel_fraction=0.25, seed=[3, 3])
    relabeled = int(np.sum(out.observation["desired_goal"][:, 0, 0].numpy() != -1.0))
    assert 200 <= relabeled <= 300  # 1000 windows at 0.25: 250, with 4.3 standard deviations either side


def test_the_same_seed_draws_the_same_goals_and_windows_without_a_batch_axis_work():
    given = windows([0, 4, 5], 5)
    first = her.relabel_windows(given, reward_fn, seed=[7, 7])
    again = tf.function(lambda: her.relabel_windows(given, reward_fn, seed=tf.constant([7, 7])))()
    np.testing.assert_array_equal(first.observation["desired_goal"], again.observation["desired_goal"])
    np.testing.assert_array_equal(first.reward, again.reward)
    single = tf.nest.map_structure(lambda x: x[1], given)
    out = her.relabel_windows(single, reward_fn, strategy="final", relabel_fraction=1.0)
    assert out.observation["desired_goal"][:, 0].numpy().tolist() == [80.0] * 5
    assert out.reward.numpy().tolist() == [-1.0, -1.0, -1.0, 0.0, -1.0]


def test_numpy_reward_runs_the_environment_s_own_compute_reward():
    env = BitFlippingEnv(num_bits=3)
    reward = her.numpy_reward(env.compute_reward)
    achieved = tf.constant([[0, 1, 1], [1, 1, 1]], tf.float32)
    desired = tf.constant([[0, 1, 1], [1, 1, 0]], tf.float32)
    assert reward(achieved, desired).numpy().tolist() == [0.0, -1.0]
    assert tf.function(reward)(achieved, desired).numpy().tolist() == [0.0, -1.0]


@pytest.mark.parametrize("kind", ["tf", "py"])
def test_her_dataset_relabels_bit_flipping_episodes_from_a_buffer(kind):
    from tf_agents.drivers import py_driver
    from tf_agents.policies import random_py_policy

    from tfbuffers.envs import BIT_FLIPPING_ID, load_gymnasium
    from tfbuffers.observers import PyObserver

    num_bits = 6
    env = load_gymnasium(BIT_FLIPPING_ID, seed=0, num_bits=num_bits)
    policy = random_py_policy.RandomPyPolicy(env.time_step_spec(), env.action_spec(), seed=0)
    spec = tf.nest.map_structure(lambda s: tf.TensorSpec(s.shape, s.dtype), policy.trajectory_spec)
    buffer_class = tfbuffers.TFUniformReplayBuffer if kind == "tf" else tfbuffers.PyUniformReplayBuffer
    seeded = {"seed": 0} if kind == "py" else {}  # the TF buffer draws from TensorFlow's global stream
    buffer = buffer_class(spec, batch_size=1, max_length=200, **seeded)
    py_driver.PyDriver(env, policy, [PyObserver(buffer)], max_steps=150).run(env.reset())
    stored = tf.nest.map_structure(lambda x: np.asarray(x)[0], buffer.gather_all())
    compute_reward = env.gymnasium_env.unwrapped.compute_reward
    reward = her.numpy_reward(compute_reward)
    dataset = her.her_dataset(buffer, 32, horizon=num_bits, reward_fn=reward, relabel_fraction=1.0, seed=0)
    relabeled = 0
    for items, info in dataset.take(8):
        ids = info.ids.numpy()
        np.testing.assert_array_equal(ids[:, 1], ids[:, 0] + 1)
        goals = items.observation["desired_goal"].numpy()
        np.testing.assert_array_equal(items.observation["observation"].numpy(), stored.observation["observation"][ids])
        for row, t in enumerate(ids[:, 0]):
            if stored.step_type[t] == LAST:  # the boundary transition: kept as stored
                np.testing.assert_array_equal(goals[row, 0], stored.observation["desired_goal"][t])
                assert items.reward[row, 0] == stored.reward[t]
                continue
            relabeled += 1
            np.testing.assert_array_equal(goals[row, 0], goals[row, 1])  # one episode, one goal
            # The goal is the achieved goal of a later frame of the same episode, within the horizon.
            ends = [f for f in range(t + 1, len(stored.step_type)) if stored.step_type[f] == LAST]
            end = ends[0] if ends else len(stored.step_type) - 1  # the newest episode may go on
            later = stored.observation["achieved_goal"][t + 1 : min(end, t + num_bits) + 1]
            assert any(np.array_equal(goals[row, 0], goal) for goal in later)
            achieved_next = stored.observation["achieved_goal"][t + 1]
            assert items.reward[row, 0].numpy() == compute_reward(achieved_next, goals[row, 0])
    assert relabeled > 128  # of 256 transitions; the rest start on an episode's LAST frame


def test_her_dataset_refuses_a_buffer_that_keeps_episode_boundaries():
    spec = windows([0], 2)
    spec = tf.nest.map_structure(lambda x: tf.TensorSpec(x.shape[2:], tf.as_dtype(x.dtype)), spec)
    buffer = tfbuffers.PyUniformReplayBuffer(spec, capacity=16, episode_boundaries=True)
    with pytest.raises(ValueError) as raised:
        her.her_dataset(buffer, 4, horizon=3, reward_fn=reward_fn)
    assert str(raised.value) == (
        "buffer: expected a buffer without episode_boundaries (its windows of 4 frames would leave out the "
        "transitions near each episode's end; relabeling cuts windows at episode ends itself), got "
        "episode_boundaries=True"
    )


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"strategy": "random"}, ValueError, "strategy: expected one of ['future', 'final', 'episode'], got 'random'"),
        ({"relabel_fraction": 1.5}, ValueError, "relabel_fraction: expected a number in [0, 1], got 1.5"),
        ({"relabel_fraction": True}, ValueError, "relabel_fraction: expected a number in [0, 1], got True"),
        (
            {"anchor": 3},
            ValueError,
            "anchor: expected an int in [0, 2] (a transition inside windows of 4 frames), got 3",
        ),
        ({"reward_fn": 1.0}, TypeError, "reward_fn: expected a function of (achieved_goal, desired_goal), got float"),
        (
            {"desired_goal": "goal"},
            TypeError,
            "trajectory.observation: expected a dict holding ['goal', 'achieved_goal'], got ['achieved_goal', "
            "'desired_goal', 'observation'] (a goal-conditioned environment's observation, as "
            "tfbuffers.envs.BitFlippingEnv gives)",
        ),
    ],
)
def test_bad_arguments_name_the_field(kwargs, error, message):
    arguments = {"reward_fn": reward_fn} | kwargs
    with pytest.raises(error) as raised:
        her.relabel_windows(windows([0, 4], 4), arguments.pop("reward_fn"), **arguments)
    assert str(raised.value) == message


def test_goals_of_another_shape_are_refused():
    given = windows([0, 4], 4)
    given = given._replace(observation=dict(given.observation, achieved_goal=np.zeros([2, 4, 2], np.float32)))
    with pytest.raises(ValueError) as raised:
        her.relabel_windows(given, reward_fn)
    assert str(raised.value) == (
        "trajectory.observation['achieved_goal']: expected the shape and dtype of 'desired_goal' "
        "(float32 (2, 4, 1)), got float32 (2, 4, 2)"
    )


def test_bad_horizon():
    with pytest.raises(ValueError) as raised:
        her.her_dataset(None, 4, horizon=0, reward_fn=reward_fn)
    assert (
        str(raised.value) == "horizon: expected a positive int (frames after the transition to draw goals from), got 0"
    )
