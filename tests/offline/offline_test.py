"""Offline datasets (`tfbuffers.offline`): RLDS and Minari written by the tests themselves, read back exactly."""

from __future__ import annotations

import warnings

import gymnasium
import minari
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from minari.data_collector.episode_buffer import EpisodeBuffer
from tf_agents.drivers import py_driver
from tf_agents.policies import random_py_policy
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import trajectory

import tfbuffers
from tfbuffers import offline
from tfbuffers.envs import BIT_FLIPPING_ID, load_gymnasium
from tfbuffers.observers import PyObserver

FIRST, MID, LAST = 0, 1, 2
SPEC = trajectory.Trajectory(
    step_type=tf.TensorSpec([], tf.int32),
    observation={"position": tf.TensorSpec([2], tf.float32), "count": tf.TensorSpec([], tf.int64)},
    action=tensor_spec.BoundedTensorSpec([], tf.int64, 0, 3),
    policy_info={"log_probability": tf.TensorSpec([], tf.float32)},
    next_step_type=tf.TensorSpec([], tf.int32),
    reward=tf.TensorSpec([], tf.float32),
    discount=tf.TensorSpec([], tf.float32),
)
# One environment's frames, as a driver writes them: the tail of an episode whose start is gone (0-1), a terminated
# episode (2-5: discount 0 on its last transition), a truncated one (6-7), and one still running (8-9).
STEP_TYPES = [MID, LAST, FIRST, MID, MID, LAST, FIRST, LAST, FIRST, MID]
DISCOUNTS = [1, 1, 1, 1, 0, 1, 1, 1, 1, 1]
COMPLETE = list(range(2, 8))
TERMINATED, TRUNCATED = [2, 3, 4, 5], [6, 7]


def frame(index, segment=0):
    """Frame `index` of the layout above; another segment's values are offset by 100 * segment."""
    value = index + 100 * segment
    next_type = STEP_TYPES[index + 1] if index + 1 < len(STEP_TYPES) else MID
    return trajectory.Trajectory(
        step_type=np.int32(STEP_TYPES[index]),
        observation={"position": np.float32([value, -value]), "count": np.int64(10 * value)},
        action=np.int64(index % 4),
        policy_info={"log_probability": np.float32(-value / 10)},
        next_step_type=np.int32(next_type),
        reward=np.float32(value + 0.5),
        discount=np.float32(DISCOUNTS[index]),
    )


def stacked(frames):
    return tf.nest.map_structure(lambda *leaves: np.stack(leaves), *frames)


def filled(kind, batch_size=1, max_length=20):
    """A buffer of `kind` holding the layout above (in each of its segments)."""
    buffer = tfbuffers.kinds.make(kind, SPEC, batch_size=batch_size, max_length=max_length)
    for index in range(len(STEP_TYPES)):
        buffer.add_batch(stacked([frame(index, segment) for segment in range(batch_size)]))
    return buffer


def frames_of(buffer):
    return tf.nest.map_structure(lambda leaf: np.asarray(leaf)[0], buffer.gather_all())


def assert_frames_equal(received, expected):
    tf.nest.assert_same_structure(received, expected)
    for got, want in zip(tf.nest.flatten(received), tf.nest.flatten(expected)):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


@pytest.fixture(autouse=True)
def minari_root(tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    warnings.filterwarnings("ignore", message=".*is set to None.*", category=UserWarning)  # Minari's metadata advice
    warnings.filterwarnings("ignore", message=".*env_spec is None.*", category=UserWarning)


KINDS = ["tf_uniform", "py_uniform", "py_prioritized"]


@pytest.mark.parametrize("kind", KINDS)
def test_stored_episodes_are_the_complete_ones_oldest_first(kind):
    buffer = filled(kind)
    episodes, left_out = offline.stored_episodes(buffer)
    assert left_out == 4  # the overwritten start's tail (0-1) and the running episode (8-9)
    expected = [stacked([frame(i) for i in TERMINATED]), stacked([frame(i) for i in TRUNCATED])]
    assert len(episodes) == 2
    pack = tfbuffers.specs.packer(SPEC)
    for episode, want in zip(episodes, expected):
        assert_frames_equal(pack(episode), want)


def test_episodes_of_several_segments_are_ordered_by_their_first_add_then_segment():
    buffer = tfbuffers.PyUniformReplayBuffer(SPEC, batch_size=2, max_length=20)
    # Segment 0 runs the layout above; segment 1 starts its episodes one add earlier.
    for index in range(len(STEP_TYPES)):
        buffer.add_batch(stacked([frame(index), frame(min(index + 1, len(STEP_TYPES) - 1), 1)]))
    episodes, left_out = offline.stored_episodes(buffer)
    firsts = [int(tfbuffers.specs.packer(SPEC)(episode).observation["count"][0]) for episode in episodes]
    assert firsts == [1020, 20, 1060, 60]  # segment 1's episode from add 1, segment 0's from add 2, ...
    assert left_out == 4 + 4  # segment 1: frame 1 (its tail) and frames 8, 9, 9 (its running episode)


def test_rlds_steps_follow_the_rlds_conventions_and_tfds_reads_them(tmp_path):
    buffer = filled("py_uniform")
    result = offline.to_rlds(buffer, tmp_path / "rlds", name="frames")
    assert result == offline.Converted(episodes=2, frames=6, left_out_frames=4)
    builder = tfds.builder_from_directory(str(tmp_path / "rlds"))
    assert builder.info.name == "frames" and builder.info.splits["train"].num_examples == 2
    step_features = builder.info.features["steps"].feature
    assert sorted(step_features.keys()) == [
        "action", "discount", "is_first", "is_last", "is_terminal", "observation", "policy_info", "reward",
    ]  # fmt: skip
    episodes = list(builder.as_dataset(split="train"))
    for episode, indices, terminal in zip(episodes, [TERMINATED, TRUNCATED], [True, False]):
        steps = next(iter(episode["steps"].batch(100)))
        steps = tf.nest.map_structure(lambda leaf: leaf.numpy(), steps)
        length = len(indices)
        assert steps["is_first"].tolist() == [True] + [False] * (length - 1)
        assert steps["is_last"].tolist() == [False] * (length - 1) + [True]
        assert steps["is_terminal"].tolist() == [False] * (length - 1) + [terminal]
        want = stacked([frame(i) for i in indices])
        np.testing.assert_array_equal(steps["observation"]["position"], want.observation["position"])
        np.testing.assert_array_equal(steps["observation"]["count"], want.observation["count"])
        np.testing.assert_array_equal(steps["action"], want.action)
        np.testing.assert_array_equal(steps["reward"], want.reward)
        np.testing.assert_array_equal(steps["discount"], want.discount)
        np.testing.assert_array_equal(steps["policy_info"]["log_probability"], want.policy_info["log_probability"])


@pytest.mark.parametrize("source_kind", KINDS)
@pytest.mark.parametrize("target_kind", ["tf_uniform", "py_uniform"])
def test_round_trips_through_rlds_and_minari_give_the_same_frames(tmp_path, source_kind, target_kind):
    source = filled(source_kind)
    expected = stacked([frame(i) for i in COMPLETE])
    target = tfbuffers.kinds.make(target_kind, SPEC, batch_size=1, max_length=20)
    assert offline.to_rlds(source, tmp_path / "rlds") == offline.Converted(2, 6, 4)
    assert offline.from_rlds(target, tmp_path / "rlds") == offline.Converted(2, 6, 0)
    assert_frames_equal(frames_of(target), expected)
    dataset_id = f"test/{source_kind}-{target_kind}-v0"
    assert offline.to_minari(source, dataset_id) == offline.Converted(2, 6, 4)
    target = tfbuffers.kinds.make(target_kind, SPEC, batch_size=1, max_length=20)
    assert offline.from_minari(target, dataset_id) == offline.Converted(2, 6, 0)
    assert_frames_equal(frames_of(target), expected)


def test_minari_reads_the_episodes_as_gymnasium_steps():
    offline.to_minari(filled("py_uniform"), "test/layout-v0", description="the test's frames")
    dataset = minari.load_dataset("test/layout-v0")
    assert dataset.total_episodes == 2 and dataset.total_steps == 4  # 3 + 1 transitions
    assert dataset.observation_space == gymnasium.spaces.Dict(
        {
            "count": gymnasium.spaces.Box(np.iinfo(np.int64).min, np.iinfo(np.int64).max, (), np.int64),
            "position": gymnasium.spaces.Box(-np.inf, np.inf, (2,), np.float32),
        }
    )
    assert dataset.action_space == gymnasium.spaces.Discrete(4)
    terminated, truncated = dataset.iterate_episodes()
    np.testing.assert_array_equal(terminated.observations["count"], [20, 30, 40, 50])
    np.testing.assert_array_equal(terminated.actions, [2, 3, 0])
    np.testing.assert_array_equal(terminated.rewards, [2.5, 3.5, 4.5])
    assert terminated.terminations.tolist() == [False, False, True]
    assert terminated.truncations.tolist() == [False, False, False]
    np.testing.assert_array_equal(terminated.infos["discount"], [1, 1, 0, 1])
    np.testing.assert_array_equal(terminated.infos["last_action"], [1])
    np.testing.assert_array_equal(truncated.observations["position"], [[6, -6], [7, -7]])
    assert truncated.terminations.tolist() == [False] and truncated.truncations.tolist() == [True]


def rlds_episodes(episodes, discount=True):
    """An in-memory RLDS dataset, as `tfds.load` returns one: episodes of `steps` datasets."""

    def steps(length, terminal, offset):
        step = {
            "observation": {
                "position": np.stack([np.arange(length), -np.arange(length)], 1).astype(np.float32) + offset,
                "count": np.arange(length, dtype=np.int64) + offset,
            },
            "action": np.arange(length, dtype=np.int64) % 4,
            "reward": np.full(length, 1.0, np.float32),
            "policy_info": {"log_probability": np.zeros(length, np.float32)},
            "is_first": np.arange(length) == 0,
            "is_last": np.arange(length) == length - 1,
            "is_terminal": (np.arange(length) == length - 1) & terminal,
            "extra": np.zeros(length, np.int32),  # other step fields are not read
        }
        if discount:
            step["discount"] = np.ones(length, np.float32)
        return tf.data.Dataset.from_tensor_slices(step)

    datasets = [steps(length, terminal, 100 * index) for index, (length, terminal) in enumerate(episodes)]
    dataset = tf.data.Dataset.from_tensors({"steps": datasets[0]})
    for steps_dataset in datasets[1:]:
        dataset = dataset.concatenate(tf.data.Dataset.from_tensors({"steps": steps_dataset}))
    return dataset


@pytest.mark.parametrize("discount", [True, False])
def test_an_rlds_dataset_s_terminal_episode_gets_discount_zero_on_its_last_transition(discount):
    buffer = tfbuffers.PyUniformReplayBuffer(SPEC, batch_size=1, max_length=20)
    result = offline.from_rlds(buffer, rlds_episodes([(3, True), (2, False)], discount=discount))
    assert result == offline.Converted(2, 5, 0)
    frames = frames_of(buffer)
    assert frames.step_type.tolist() == [FIRST, MID, LAST, FIRST, LAST]
    assert frames.next_step_type.tolist() == [MID, LAST, FIRST, LAST, FIRST]
    assert frames.discount.tolist() == [1, 0, 1, 1, 1]
    assert frames.observation["count"].tolist() == [0, 1, 2, 100, 101]


@pytest.mark.parametrize("in_graph", [False, True])
@pytest.mark.parametrize("kind", ["tf_uniform", "py_uniform"])
def test_a_field_of_another_dtype_or_shape_is_refused_before_anything_is_added(in_graph, kind):
    buffer = tfbuffers.kinds.make(kind, SPEC, batch_size=1, max_length=20)
    wrong = rlds_episodes([(3, True)]).map(
        lambda episode: {
            "steps": episode["steps"].map(lambda step: {**step, "reward": tf.cast(step["reward"], tf.float64)})
        }
    )
    with pytest.raises(
        ValueError, match=r"^steps/reward: expected float32 \[\] \(the buffer's reward\), got float64 \[\]$"
    ):
        offline.from_rlds(buffer, wrong)
    missing = rlds_episodes([(3, True)]).map(
        lambda episode: {
            "steps": episode["steps"].map(lambda step: {k: v for k, v in step.items() if k != "policy_info"})
        }
    )
    with pytest.raises(ValueError, match=r"^steps/policy_info/log_probability: expected a field matching the buffer's"):
        offline.from_rlds(buffer, missing)
    assert int(buffer.num_frames()) == 0
    # The buffer goes on: a good dataset fills it, and it adds, samples, gathers and clears.
    offline.from_rlds(buffer, rlds_episodes([(3, False)]))
    buffer.add_batch(stacked([frame(2)]))
    sample = (
        tf.function(lambda: buffer.get_next(sample_batch_size=2)[0].reward)
        if in_graph
        else (lambda: buffer.get_next(sample_batch_size=2)[0].reward)
    )
    assert set(np.asarray(sample()).tolist()) <= {1.0, 2.5}
    assert frames_of(buffer).observation["count"].tolist() == [0, 1, 2, 20]
    buffer.clear()
    assert int(buffer.num_frames()) == 0


def test_steps_without_the_rlds_flags_are_refused_naming_the_flag():
    no_flags = rlds_episodes([(3, True)]).map(
        lambda episode: {"steps": episode["steps"].map(lambda step: {k: v for k, v in step.items() if k != "is_last"})}
    )
    buffer = tfbuffers.PyUniformReplayBuffer(SPEC, batch_size=1, max_length=20)
    with pytest.raises(
        ValueError, match=r"^steps/is_last: expected the RLDS episode flag \(a bool scalar\), got none$"
    ):
        offline.from_rlds(buffer, no_flags)
    assert int(buffer.num_frames()) == 0


@pytest.mark.parametrize(
    ("episodes", "message"),
    [
        (
            {"is_first": [True, True, False], "is_last": [False, False, True], "is_terminal": [False] * 3},
            "episode 0, step 1: expected not is_first, not is_last (RLDS: is_first on the first step only, is_last "
            "on the last only, is_terminal only with is_last), got is_first=True, is_last=False, is_terminal=False",
        ),
        (
            {"is_first": [True, False, False], "is_last": [False, False, False], "is_terminal": [False] * 3},
            "episode 0, step 2: expected not is_first, is_last",
        ),
        (
            {"is_first": [True, False, False], "is_last": [False, False, True], "is_terminal": [False, True, True]},
            "episode 0, step 1: expected not is_first, not is_last",
        ),
        (
            {"is_first": [True], "is_last": [True], "is_terminal": [True]},
            "episode 0: expected at least 2 steps (a first and a last observation), got 1",
        ),
    ],
)
def test_episode_flags_that_do_not_delimit_one_episode_are_refused(episodes, message):
    length = len(episodes["is_first"])
    steps = {
        "observation": {"position": np.zeros((length, 2), np.float32), "count": np.zeros(length, np.int64)},
        "action": np.zeros(length, np.int64),
        "reward": np.zeros(length, np.float32),
        "policy_info": {"log_probability": np.zeros(length, np.float32)},
        **{key: np.asarray(value) for key, value in episodes.items()},
    }
    dataset = tf.data.Dataset.from_tensors({"steps": tf.data.Dataset.from_tensor_slices(steps)})
    buffer = tfbuffers.PyUniformReplayBuffer(SPEC, batch_size=1, max_length=20)
    with pytest.raises(ValueError) as raised:
        offline.from_rlds(buffer, dataset)
    assert str(raised.value).startswith(message)
    assert int(buffer.num_frames()) == 0


def test_an_empty_rlds_episode_is_refused_naming_it():
    steps = rlds_episodes([(2, False)]).element_spec["steps"].element_spec
    empty = tf.data.Dataset.from_tensors(
        {
            "steps": tf.data.Dataset.from_tensors(
                tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), steps)
            ).take(0)
        }
    )
    buffer = tfbuffers.PyUniformReplayBuffer(SPEC, batch_size=1, max_length=20)
    with pytest.raises(ValueError, match=r"^episode 1: expected at least 2 steps .* got 0$"):
        offline.from_rlds(buffer, rlds_episodes([(2, False)]).concatenate(empty))
    assert int(buffer.num_frames()) == 0  # the episode before it was checked, not added


def layout_frames(spec, *indices):
    """Frames of the layout above for a buffer of `spec` (SPEC, or SPEC without its policy_info)."""
    frames = stacked([frame(index) for index in indices])
    return frames if spec.policy_info else frames._replace(policy_info=())


def assert_unchanged_and_working(buffer, in_graph):
    """The buffer holds frames 2 and 3 of the layout, and its next add, sample, gather_all and clear work."""
    assert frames_of(buffer).observation["count"].tolist() == [20, 30]
    add = tf.function(buffer.add_batch) if in_graph else buffer.add_batch
    add(layout_frames(buffer.data_spec, 4))
    sample = buffer.get_next
    if in_graph:
        sample = tf.function(lambda sample_batch_size: buffer.get_next(sample_batch_size=sample_batch_size))
    drawn = np.asarray(sample(sample_batch_size=8)[0].observation["count"])
    assert drawn.shape == (8,) and set(drawn.tolist()) <= {20, 30, 40}
    gather = tf.function(buffer.gather_all) if in_graph else buffer.gather_all
    assert np.asarray(gather().observation["count"])[0].tolist() == [20, 30, 40]
    (tf.function(buffer.clear) if in_graph else buffer.clear)()
    assert int(buffer.num_frames()) == 0


def minari_episode(index, steps, terminations, truncations):
    return EpisodeBuffer(
        id=index,
        observations={
            "position": np.full((steps + 1, 2), index, np.float32),
            "count": np.arange(steps + 1, dtype=np.int64) + 100 * index,
        },
        actions=np.arange(steps) % 4,
        rewards=np.ones(steps),
        terminations=np.asarray(terminations),
        truncations=np.asarray(truncations),
    )


@pytest.mark.parametrize("in_graph", [False, True])
@pytest.mark.parametrize("kind", ["tf_uniform", "py_uniform", "py_prioritized"])
@pytest.mark.parametrize("read_twice", [False, True])
def test_a_refused_dataset_leaves_the_buffer_as_it_was(monkeypatch, kind, in_graph, read_twice):
    # Issue 50, finding 6: the episodes before a refused one were added. Now every episode is checked first;
    # past CHECKED_BYTES the checked episodes are dropped and read again to be added (read_twice).
    if read_twice:
        monkeypatch.setattr(offline._common, "CHECKED_BYTES", 0)
    spec = SPEC._replace(policy_info=())
    good = [minari_episode(index, 3, [False, False, True], [False] * 3) for index in range(3)]
    bad = minari_episode(3, 3, [False, True, False], [False, False, True])  # terminated before its last step
    observation_space = offline.minari_data._space(spec.observation, "observation")
    space = {"observation_space": observation_space, "action_space": gymnasium.spaces.Discrete(4)}
    minari.create_dataset_from_buffers("test/bad-ends-v0", [*good, bad], **space)
    minari.create_dataset_from_buffers("test/good-ends-v0", good, **space)
    rlds_bad = rlds_episodes([(3, True), (4, False)]).concatenate(
        rlds_episodes([(3, True)]).map(
            lambda episode: {"steps": episode["steps"].map(lambda step: {**step, "is_first": tf.constant(True)})}
        )
    )
    for convert, source, message, spec_ in [
        (offline.from_minari, "test/bad-ends-v0", r"^episode 3: expected terminations and truncations only on its "
         r"last step 2, got terminations at \[1\] and truncations at \[2\]$", spec),
        (offline.from_rlds, rlds_bad, r"^episode 2, step 1: expected not is_first, not is_last", SPEC),
    ]:  # fmt: skip
        buffer = tfbuffers.kinds.make(kind, spec_, batch_size=1, max_length=20)
        for index in (2, 3):
            buffer.add_batch(layout_frames(spec_, index))
        before = buffer.state()
        with pytest.raises(ValueError, match=message):
            convert(buffer, source)
        after = buffer.state()
        assert after.counters == before.counters
        for name in before.arrays:
            np.testing.assert_array_equal(after.arrays[name], before.arrays[name])
        for name in before.extras:
            np.testing.assert_array_equal(after.extras[name], before.extras[name])
        assert_unchanged_and_working(buffer, in_graph)
        # And a good dataset fills it: every episode, in order.
        good_source = "test/good-ends-v0" if spec_ is spec else rlds_episodes([(3, True), (4, False)])
        result = convert(buffer, good_source)
        assert result == (offline.Converted(3, 12, 0) if spec_ is spec else offline.Converted(2, 7, 0))
        counts = frames_of(buffer).observation["count"].tolist()
        assert counts == ([0, 1, 2, 3, 100, 101, 102, 103, 200, 201, 202, 203] if spec_ is spec
                          else [0, 1, 2, 100, 101, 102, 103])  # fmt: skip


def test_a_minari_step_both_terminated_and_truncated_terminated_the_episode():
    # Issue 50, finding 6: gymnasium's TimeLimit returns terminated=True, truncated=True when the time limit's last
    # step reaches a terminal state (CartPole with a limit of 14 steps does at seed 144), and Minari records both.
    # It is a termination: discount 0 into the last observation, as tfbuffers.envs stores it.
    env = gymnasium.make("CartPole-v1", max_episode_steps=14)
    episodes, ends = [], []
    for seed in (143, 144):
        env.action_space.seed(seed)
        observations, actions, rewards = [env.reset(seed=seed)[0]], [], []
        while True:
            action = env.action_space.sample()
            observation, reward, terminated, truncated, _ = env.step(action)
            observations.append(observation)
            actions.append(action)
            rewards.append(reward)
            if terminated or truncated:
                break
        steps = len(actions)
        last = np.arange(steps) == steps - 1
        ends.append((terminated, truncated, steps))
        episodes.append(
            EpisodeBuffer(
                id=len(episodes), observations=np.stack(observations), actions=np.asarray(actions),
                rewards=np.asarray(rewards), terminations=last & terminated, truncations=last & truncated,
            )
        )  # fmt: skip
    assert ends[1] == (True, True, 14)
    minari.create_dataset_from_buffers(
        "test/time-limit-v0", episodes, observation_space=env.observation_space, action_space=env.action_space
    )
    dataset = minari.load_dataset("test/time-limit-v0")
    spec = trajectory.Trajectory(
        step_type=tf.TensorSpec([], tf.int32),
        observation=tf.TensorSpec([4], tf.float32),
        action=tf.TensorSpec([], tf.int64),
        policy_info=(),
        next_step_type=tf.TensorSpec([], tf.int32),
        reward=tf.TensorSpec([], tf.float32),
        discount=tf.TensorSpec([], tf.float32),
    )
    buffer = tfbuffers.PyUniformReplayBuffer(spec, batch_size=1, max_length=100)
    first_steps = ends[0][2]
    assert offline.from_minari(buffer, dataset) == offline.Converted(2, first_steps + 1 + 15, 0)
    frames = tf.nest.map_structure(lambda leaf: np.asarray(leaf)[0], buffer.gather_all())
    second = slice(first_steps + 1, None)
    assert frames.discount[second].tolist() == [1.0] * 13 + [0.0, 1.0]
    assert frames.step_type[second].tolist() == [FIRST] + [MID] * 13 + [LAST]
    np.testing.assert_array_equal(frames.observation[second], np.stack(episodes[1].observations))
    np.testing.assert_array_equal(frames.action[second], [*episodes[1].actions, 0])
    # Written back, the episode is a termination only.
    assert offline.to_minari(buffer, "test/time-limit-again-v0") == offline.Converted(2, first_steps + 16, 0)
    _, again = minari.load_dataset("test/time-limit-again-v0").iterate_episodes()
    assert again.terminations[-1] and not again.truncations[-1]


def test_a_minari_dataset_without_tfbuffers_infos_reads_with_the_gymnasium_conventions():
    spec = SPEC._replace(policy_info=())
    steps = 3
    episodes = [
        EpisodeBuffer(
            id=index,
            observations={
                "position": np.arange(2 * (steps + 1), dtype=np.float32).reshape(steps + 1, 2),
                "count": np.arange(steps + 1, dtype=np.int64),
            },
            actions=np.array([1, 2, 3]),
            rewards=np.array([0.1, 0.2, 0.3]),  # float64, as gymnasium gives them
            terminations=np.array([False, False, terminal]),
            truncations=np.array([False, False, not terminal]),
        )
        for index, terminal in enumerate([True, False])
    ]
    observation_space = offline.minari_data._space(spec.observation, "observation")
    minari.create_dataset_from_buffers(
        "test/plain-v0", episodes, observation_space=observation_space, action_space=gymnasium.spaces.Discrete(4)
    )
    buffer = tfbuffers.PyUniformReplayBuffer(spec, batch_size=1, max_length=20)
    assert offline.from_minari(buffer, "test/plain-v0") == offline.Converted(2, 8, 0)
    frames = frames_of(buffer)
    assert frames.step_type.tolist() == [FIRST, MID, MID, LAST] * 2
    assert frames.discount.tolist() == [1, 1, 0, 1] + [1, 1, 1, 1]
    assert frames.action.tolist() == [1, 2, 3, 0] * 2  # no action leaves the last observation
    np.testing.assert_array_equal(frames.reward, np.float32([0.1, 0.2, 0.3, 0.0] * 2))
    # The same dataset into a buffer that stores a policy_info: refused, naming the field.
    with pytest.raises(ValueError, match=r"^episode 0 infos/policy_info/log_probability: expected a field"):
        offline.from_minari(tfbuffers.PyUniformReplayBuffer(SPEC, batch_size=1, max_length=20), "test/plain-v0")


def test_a_minari_space_that_differs_from_the_spec_is_refused_before_anything_is_added():
    offline.to_minari(filled("py_uniform"), "test/spaces-v0")
    other = SPEC._replace(observation={"position": tf.TensorSpec([3], tf.float32), "count": SPEC.observation["count"]})
    buffer = tfbuffers.PyUniformReplayBuffer(other, batch_size=1, max_length=20)
    with pytest.raises(ValueError, match=r"^observation_space/position: expected float32 \[3\] .*, got float32 \[2\]$"):
        offline.from_minari(buffer, "test/spaces-v0")
    assert int(buffer.num_frames()) == 0


def episodes_source(repeats):
    """A buffer of `repeats` x (the terminated episode: 4 frames, the truncated one: 2 frames)."""
    source = tfbuffers.PyUniformReplayBuffer(SPEC, batch_size=1, max_length=50)
    for _ in range(repeats):
        for index in COMPLETE:
            source.add_batch(stacked([frame(index)]))
    return source


def test_several_segments_take_whole_episodes_dealt_to_the_emptier_segment(tmp_path):
    offline.to_rlds(episodes_source(2), tmp_path / "rlds")
    target = tfbuffers.PyUniformReplayBuffer(SPEC, batch_size=2, max_length=50)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert offline.from_rlds(target, tmp_path / "rlds") == offline.Converted(
            episodes=4, frames=12, left_out_frames=0
        )
    # 4 frames to segment 0, 2 to segment 1, 4 to segment 1, 2 to segment 0: 6 frames each.
    counts = np.asarray(target.gather_all().observation["count"])
    assert counts.tolist() == [[20, 30, 40, 50, 60, 70], [60, 70, 20, 30, 40, 50]]


def test_several_segments_count_and_warn_about_the_frames_past_the_last_full_add():
    offline.to_minari(episodes_source(3), "test/uneven-v0")
    target = tfbuffers.PyUniformReplayBuffer(SPEC, batch_size=2, max_length=50)
    with pytest.warns(UserWarning, match=r"^2 frames of 1 episodes were left out: the buffer's 2 segments fill"):
        result = offline.from_minari(target, "test/uneven-v0")
    # Dealt 4 -> 0, 2 -> 1, 4 -> 1, 2 -> 0, 4 -> 0, 2 -> 1: segment 0 holds 10 frames, segment 1 holds 8, so the
    # fifth episode's last 2 frames are left out.
    assert result == offline.Converted(episodes=5, frames=16, left_out_frames=2)
    counts = np.asarray(target.gather_all().observation["count"])
    assert counts.tolist() == [[20, 30, 40, 50, 60, 70, 20, 30], [60, 70, 20, 30, 40, 50, 60, 70]]


def test_bit_flipping_episodes_from_a_driver_round_trip_with_the_environment_recorded(tmp_path):
    env = load_gymnasium(BIT_FLIPPING_ID, seed=4, num_bits=4)
    policy = random_py_policy.RandomPyPolicy(env.time_step_spec(), env.action_spec(), seed=4)
    spec = trajectory.from_transition(env.time_step_spec(), policy.policy_step_spec, env.time_step_spec())
    buffer = tfbuffers.TFUniformReplayBuffer(spec, batch_size=1, max_length=200)
    py_driver.PyDriver(env, policy, [PyObserver(buffer)], max_steps=60).run(env.reset())
    written = offline.to_minari(buffer, "test/BitFlipping-v0", env=env)
    episodes, _ = offline.stored_episodes(buffer)
    assert written.episodes == len(episodes) > 5
    assert written.frames + written.left_out_frames == int(buffer.num_frames())
    dataset = minari.load_dataset("test/BitFlipping-v0")
    assert dataset.spec.env_spec.id == BIT_FLIPPING_ID
    assert dataset.recover_environment().unwrapped.num_bits == 4
    expected = np.concatenate([np.asarray(episode[0]) for episode in episodes])  # the step types, in order
    for source in ("minari", "rlds"):
        target = tfbuffers.PyUniformReplayBuffer(spec, batch_size=1, max_length=200)
        if source == "minari":
            offline.from_minari(target, dataset)
        else:
            offline.to_rlds(buffer, tmp_path / "rlds")
            offline.from_rlds(target, tmp_path / "rlds")
        frames = frames_of(target)
        np.testing.assert_array_equal(frames.step_type, expected)
        stored = tfbuffers.specs.packer(spec)([np.concatenate(parts) for parts in zip(*episodes)])
        assert_frames_equal(frames, tf.nest.map_structure(np.asarray, stored))


def test_tuple_observations_are_refused_naming_the_field(tmp_path):
    spec = SPEC._replace(observation=(tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.float32)))
    buffer = tfbuffers.PyUniformReplayBuffer(spec, batch_size=1, max_length=4)
    with pytest.raises(TypeError, match=r"^observation: expected a tensor spec or a dict of them \(TFDS features\)"):
        offline.to_rlds(buffer, tmp_path / "rlds")
    with pytest.raises(TypeError, match=r"^observation: expected a tensor spec or a dict of them \(Minari spaces\)"):
        offline.to_minari(buffer, "test/tuple-v0")


def test_frames_that_are_not_trajectories_are_refused(tmp_path):
    buffer = tfbuffers.PyUniformReplayBuffer({"x": tf.TensorSpec([], tf.int64)}, batch_size=1, max_length=4)
    message = r"^buffer.data_spec: expected a tf_agents Trajectory spec .*, got dict$"
    with pytest.raises(TypeError, match=message):
        offline.to_rlds(buffer, tmp_path / "rlds")
    with pytest.raises(TypeError, match=message):
        offline.from_minari(buffer, "test/none-v0")
    with pytest.raises(TypeError, match=r"^episodes: expected a tf.data.Dataset of RLDS episodes"):
        offline.from_rlds(tfbuffers.PyUniformReplayBuffer(SPEC, batch_size=1, max_length=4), [1, 2])
    offline.to_rlds(filled("py_uniform"), tmp_path / "written")
    with pytest.raises(FileExistsError, match="directory: expected a directory without a dataset, got '.*written'"):
        offline.to_rlds(filled("py_uniform"), tmp_path / "written")


def test_a_progress_bar_counts_episodes(tmp_path, capsys):
    offline.to_rlds(filled("py_uniform"), tmp_path / "rlds", progress=True)
    assert "writing RLDS tfbuffers_episodes:   0%|          | 0/2 " in capsys.readouterr().err
