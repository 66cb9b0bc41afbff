"""n-step transitions, checked against a plain-Python reference on random episodes, through real buffers."""

from __future__ import annotations

import conftest
import numpy as np
import pytest
import tensorflow as tf
from tf_agents.trajectories import trajectory as trajectory_lib

import tfbuffers

FIRST, MID, LAST = 0, 1, 2
GAMMA = 0.9


def random_episodes(rng: np.random.Generator, num_frames: int) -> tuple[dict[str, np.ndarray], list[dict]]:
    """Frames as a TF-Agents driver records them, and per frame what the n-step reference needs.

    An episode of L transitions gives frames 0..L-1 (FIRST/MID, the last with next_step_type LAST and
    discount 0 if it terminated, 1 if truncated), then its boundary frame (LAST -> FIRST, reward 0, discount 1).
    Observations are distinct codes.
    """
    frames: dict[str, list] = {key: [] for key in ("step_type", "next_step_type", "reward", "discount", "obs")}
    where: list[dict] = []  # per frame: its episode's rewards and discounts, its step, whether a boundary
    while len(frames["obs"]) < num_frames:
        length = int(rng.integers(1, 7))
        terminated = bool(rng.integers(0, 2))
        rewards = rng.normal(size=length).round(3)
        discounts = np.ones(length)
        if terminated:
            discounts[-1] = 0.0
        base = len(frames["obs"])
        for i in range(length):
            frames["step_type"].append(FIRST if i == 0 else MID)
            frames["next_step_type"].append(LAST if i == length - 1 else MID)
            frames["reward"].append(rewards[i])
            frames["discount"].append(discounts[i])
            frames["obs"].append(base + i)
            where.append({"rewards": rewards, "discounts": discounts, "step": i, "boundary": False, "base": base})
        frames["step_type"].append(LAST)
        frames["next_step_type"].append(FIRST)
        frames["reward"].append(0.0)
        frames["discount"].append(1.0)
        frames["obs"].append(base + length)
        where.append({"boundary": True, "base": base + length})
    arrays = {key: np.asarray(value[:num_frames]) for key, value in frames.items()}
    return arrays, where[:num_frames]


def reference(frame: dict, n: int) -> tuple[float, float, int]:
    """(n-step return, discount for the agent, observation ahead) by the definitions, from the episode alone."""
    if frame["boundary"]:  # LAST -> FIRST: a one-step transition into the next episode's first observation
        return 0.0, 1.0, frame["base"] + 1
    rewards, discounts, i = frame["rewards"], frame["discounts"], frame["step"]
    m = min(n, len(rewards) - i)
    total, product = 0.0, 1.0
    for k in range(m):
        total += GAMMA**k * product * rewards[i + k]
        product *= discounts[i + k]
    return total, GAMMA ** (m - 1) * product, frame["base"] + i + m


def trajectory_of(frames: dict[str, np.ndarray]) -> trajectory_lib.Trajectory:
    return trajectory_lib.Trajectory(
        step_type=frames["step_type"].astype(np.int32),
        observation={"code": frames["obs"].astype(np.int64), "pixels": np.repeat(frames["obs"][..., None], 3, -1)},
        action=(frames["obs"] % 2).astype(np.int64),
        policy_info=(),
        next_step_type=frames["next_step_type"].astype(np.int32),
        reward=frames["reward"].astype(np.float32),
        discount=frames["discount"].astype(np.float32),
    )


SPEC = trajectory_lib.Trajectory(
    step_type=tf.TensorSpec([], tf.int32),
    observation={"code": tf.TensorSpec([], tf.int64), "pixels": tf.TensorSpec([3], tf.int64)},
    action=tf.TensorSpec([], tf.int64),
    policy_info=(),
    next_step_type=tf.TensorSpec([], tf.int32),
    reward=tf.TensorSpec([], tf.float32),
    discount=tf.TensorSpec([], tf.float32),
)


def check_against_reference(out: trajectory_lib.Trajectory, where: list[dict], n: int) -> None:
    firsts = np.asarray(out.observation["code"])[..., 0].ravel()
    expected = np.array([reference(where[code], n) for code in firsts])
    np.testing.assert_allclose(np.asarray(out.reward)[..., 0].ravel(), expected[:, 0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out.discount)[..., 0].ravel(), expected[:, 1], rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(out.observation["code"])[..., 1].ravel(), expected[:, 2])
    np.testing.assert_array_equal(np.asarray(out.observation["pixels"])[..., 1, 0].ravel(), expected[:, 2])
    # The first frame is the window's own; the agent masks boundary windows by their LAST step type.
    np.testing.assert_array_equal(np.asarray(out.action)[..., 0].ravel(), firsts % 2)
    boundaries = np.array([where[code]["boundary"] for code in firsts])
    np.testing.assert_array_equal(np.asarray(out.step_type)[..., 0].ravel() == LAST, boundaries)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("seed", range(3))
def test_every_window_matches_the_reference(n, seed):
    rng = np.random.default_rng(seed)
    frames, where = random_episodes(rng, 200)
    # Every window of n + 1 consecutive frames, crossing episode boundaries included.
    starts = np.arange(len(where) - n)
    windows = {key: value[starts[:, None] + np.arange(n + 1)] for key, value in frames.items()}
    out = tfbuffers.n_step_transitions(trajectory_of(windows), GAMMA)
    assert out.step_type.shape == (starts.size, 2) and out.observation["pixels"].shape == (starts.size, 2, 3)
    check_against_reference(out, where, n)
    # One window without a batch axis, and inside a graph.
    single = tf.function(lambda t: tfbuffers.n_step_transitions(t, GAMMA))(
        tf.nest.map_structure(lambda x: x[7], trajectory_of(windows))
    )
    assert single.reward.shape == (2,)
    check_against_reference(tf.nest.map_structure(lambda x: x[None], single), where, n)


@pytest.mark.parametrize("kind_name", list(conftest.BUFFER_KINDS))
def test_a_buffer_dataset_gives_n_step_transitions(kind_name):
    rng = np.random.default_rng(5)
    frames, where = random_episodes(rng, 120)
    buffer = conftest.make(kind_name, SPEC, 2, 60)
    for t in range(60):  # segment b holds frames b*60 .. b*60 + 59
        batch = {key: value[[t, 60 + t]] for key, value in frames.items()}
        buffer.add_batch(trajectory_of(batch))
    dataset = tfbuffers.n_step_dataset(buffer.as_dataset(sample_batch_size=32, num_steps=4), GAMMA)
    for out, info in dataset.take(3):
        assert out.reward.shape == (32, 2) and info.ids.shape == (32, 4)
        check_against_reference(out, where, 3)


def test_a_dqn_agent_trains_on_n_step_transitions():
    from tf_agents.agents.dqn import dqn_agent
    from tf_agents.networks import q_network
    from tf_agents.specs import tensor_spec
    from tf_agents.trajectories import time_step as ts

    observation_spec = tf.TensorSpec([2], tf.float32)
    action_spec = tensor_spec.BoundedTensorSpec([], tf.int64, 0, 1)
    agent = dqn_agent.DqnAgent(
        ts.time_step_spec(observation_spec),
        action_spec,
        q_network=q_network.QNetwork(observation_spec, action_spec, fc_layer_params=(8,)),
        optimizer=tf.keras.optimizers.SGD(0.01),
        gamma=GAMMA,
    )
    agent.initialize()
    buffer = tfbuffers.TFUniformReplayBuffer(agent.collect_data_spec, batch_size=1, max_length=20)
    rng = np.random.default_rng(0)
    frames, _ = random_episodes(rng, 20)
    for t in range(20):
        buffer.add_batch(
            trajectory_lib.Trajectory(
                step_type=frames["step_type"][t : t + 1].astype(np.int32),
                observation=np.full([1, 2], frames["obs"][t], np.float32),
                action=frames["obs"][t : t + 1] % 2,
                policy_info=(),
                next_step_type=frames["next_step_type"][t : t + 1].astype(np.int32),
                reward=frames["reward"][t : t + 1].astype(np.float32),
                discount=frames["discount"][t : t + 1].astype(np.float32),
            )
        )
    experience, _ = next(iter(tfbuffers.n_step_dataset(buffer.as_dataset(8, num_steps=4), GAMMA)))
    loss = agent.train(experience).loss
    assert np.isfinite(float(loss))


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="trajectory: expected a tf_agents Trajectory .* got dict"):
        tfbuffers.n_step_transitions({"reward": np.zeros([2, 3])}, GAMMA)
    frames, _ = random_episodes(np.random.default_rng(0), 4)
    one_frame = trajectory_of({key: value[:, None][:, :1] for key, value in frames.items()})
    with pytest.raises(ValueError, match=r"windows of n \+ 1 >= 2 frames .* got step_type shape \(4, 1\)"):
        tfbuffers.n_step_transitions(one_frame, GAMMA)
    with pytest.raises(ValueError, match=r"gamma: expected a number in \[0, 1\], got 1.5"):
        tfbuffers.n_step_transitions(trajectory_of(frames), 1.5)
