"""Hindsight experience replay (Andrychowicz et al., 2017): goals relabeled when windows are sampled.

A goal-conditioned environment (`tfbuffers.envs.BitFlippingEnv`, gymnasium-robotics'
tasks) observes a dict holding the goal it is asked for (`desired_goal`) and the
goal its state achieves (`achieved_goal`). Its reward is a function of the two,
so a stored episode that missed its goal is also an episode that reached the
goals it passed through. Hindsight relabeling replays some transitions with such
a goal in place of the one asked for, and the reward recomputed for it: a
transition `s_t -> s_(t+1)` relabeled with goal `g` gets
`reward_fn(achieved_goal(s_(t+1)), g)`.

The relabeling reads windows of frames that a buffer returns, so it works on any
buffer (TF, py, prioritized, Ray, a Reverb table of windows), inside the graph
and in `tf.data`, as `tfbuffers.n_step_dataset` does. Each window holds the
transition to train on, at frame `anchor` (and `anchor + 1`), and the frames
around it, from which the new goal is drawn. Only frames of the transition's own
episode are candidates: the episode ends at a frame whose step type is LAST,
or before a frame whose step type is FIRST, as in `tfbuffers.envs` and TF-Agents'
drivers. The strategies of the paper:

* `"future"`: the achieved goal of a frame after the transition's first, in the
  same episode (`anchor + 1` to the episode's last frame in the window), uniformly;
* `"final"`: that of the episode's last frame in the window (its final state when
  the window reaches the episode's end: a horizon of at least the episode length);
* `"episode"`: that of any frame of the episode in the window, before or after.

Each window's transition is relabeled with probability `relabel_fraction` (the
paper's `k = 4` future goals per transition is a fraction of 0.8). A relabeled
window gets the new goal in every frame of its episode and the rewards of those
frames recomputed by `reward_fn`; frames of other episodes, the last frame's
reward (its next state is outside the window), discounts and step types are left
as stored (Stable-Baselines3's `HerReplayBuffer` keeps its stored episode ends too).

Sample windows that may cross episode boundaries (a buffer without
`episode_boundaries`; `her_dataset` refuses one with them): a buffer with
`episode_boundaries=True` returns only windows that fit in one episode, which
would leave out every transition closer than the window's length to its episode's
end.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from tfbuffers.n_step import TRAJECTORY_FIELDS
from tfbuffers.replay_buffer import BufferInfo
from tfbuffers.sampling._episodes import FIRST, LAST

STRATEGIES = ("future", "final", "episode")
"""The relabeling strategies (see the module docstring)."""

NOT_A_TRAJECTORY = "trajectory: expected a tf_agents Trajectory of windows [..., num_steps, ...], got {received}"
NOT_GOAL_CONDITIONED = (
    "trajectory.observation: expected a dict holding {keys}, got {received} (a goal-conditioned environment's "
    "observation, as tfbuffers.envs.BitFlippingEnv gives)"
)
GOALS_DIFFER = (
    "trajectory.observation[{achieved!r}]: expected the shape and dtype of {desired!r} ({expected}), got {received}"
)
BAD_STRATEGY = "strategy: expected one of {expected}, got {received}"
BAD_FRACTION = "relabel_fraction: expected a number in [0, 1], got {received}"
BAD_ANCHOR = (
    "anchor: expected an int in [0, {limit}] (a transition inside windows of {num_steps} frames), got {received}"
)
BAD_HORIZON = "horizon: expected a positive int (frames after the transition to draw goals from), got {received}"
NOT_CALLABLE = "reward_fn: expected a function of (achieved_goal, desired_goal), got {received}"
BOUNDARIES = (
    "buffer: expected a buffer without episode_boundaries (its windows of {num_steps} frames would leave out the "
    "transitions near each episode's end; relabeling cuts windows at episode ends itself), got "
    "episode_boundaries={received!r}"
)


def relabel_windows(
    trajectory: Any,
    reward_fn: Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
    *,
    strategy: str = "future",
    relabel_fraction: float = 0.8,
    anchor: int = 0,
    desired_goal: str = "desired_goal",
    achieved_goal: str = "achieved_goal",
    seed: Any = None,
) -> Any:
    """Windows with the goal of some relabeled, as the module docstring says: same structure and shapes.

    Args:
      trajectory: A `Trajectory` of windows, each field `[batch, num_steps, ...]` (or `[num_steps, ...]`),
        whose `observation` is a dict holding `desired_goal` and `achieved_goal`.
      reward_fn: The environment's reward as a function of tensors `(achieved_goal, desired_goal)`, each
        `[n, *goal_shape]`, returning `n` rewards (`numpy_reward` wraps a numpy one, such as
        `env.compute_reward`).
      strategy: `"future"`, `"final"` or `"episode"`.
      relabel_fraction: The probability that a window's transition is relabeled.
      anchor: The frame of each window where its transition starts.
      desired_goal: The observation's key of the goal asked for.
      achieved_goal: The observation's key of the goal a state achieves.
      seed: A shape `[2]` integer seed for stateless random draws (the same seed, the same choices), or
        None for TensorFlow's global random stream.

    Returns:
      The relabeled `Trajectory`.

    Raises:
      TypeError: If `trajectory` is not a `Trajectory`, its observation not a dict of both goals, or
        `reward_fn` not callable.
      ValueError: If an argument is out of range, or the two goals differ in shape or dtype.
    """
    _check_trajectory(trajectory, desired_goal, achieved_goal)
    strategy, relabel_fraction = _checked_options(strategy, relabel_fraction, reward_fn)
    step_type = tf.convert_to_tensor(trajectory.step_type)
    unbatched = step_type.shape.rank == 1
    if unbatched:
        trajectory = tf.nest.map_structure(lambda x: tf.convert_to_tensor(x)[None], trajectory)
        step_type = step_type[None]
    if step_type.shape.rank != 2 or step_type.shape[1] is None:
        raise ValueError(NOT_A_TRAJECTORY.format(received=f"step_type of shape {step_type.shape}"))
    num_steps = int(step_type.shape[1])
    if isinstance(anchor, bool) or not isinstance(anchor, int | np.integer) or not 0 <= anchor <= num_steps - 2:
        raise ValueError(BAD_ANCHOR.format(limit=num_steps - 2, num_steps=num_steps, received=repr(anchor)))

    in_episode = _in_episode(step_type, int(anchor))  # [batch, num_steps]
    positions = tf.range(num_steps)
    valid = in_episode[:, anchor + 1]  # the transition itself lies in one episode (its first frame is not LAST)
    candidates = in_episode & (positions > anchor) if strategy == "future" else in_episode
    shape = tf.shape(step_type)[:1]
    if seed is None:
        draws = tf.random.uniform(tf.concat([shape, [2]], 0), dtype=tf.float64)
    else:
        draws = tf.random.stateless_uniform(tf.concat([shape, [2]], 0), seed, dtype=tf.float64)
    counts = tf.reduce_sum(tf.cast(candidates, tf.int32), axis=1)
    if strategy == "final":
        chosen = tf.reduce_max(tf.where(candidates, positions, -1), axis=1)
    else:  # the k-th candidate, k uniform in [0, count)
        k = tf.minimum(tf.cast(draws[:, 0] * tf.cast(counts, tf.float64), tf.int32), counts - 1)
        cumulative = tf.cumsum(tf.cast(candidates, tf.int32), axis=1)
        chosen = tf.reduce_sum(tf.cast(cumulative <= k[:, None], tf.int32), axis=1)
    relabeled = valid & (draws[:, 1] < relabel_fraction)
    chosen = tf.where(relabeled, chosen, anchor + 1)  # an index inside the window either way

    observation = dict(trajectory.observation)
    achieved = tf.convert_to_tensor(observation[achieved_goal])
    desired = tf.convert_to_tensor(observation[desired_goal])
    new_goal = tf.gather(achieved, chosen, axis=1, batch_dims=1)  # [batch, *goal_shape]
    changed = in_episode & relabeled[:, None]
    observation[desired_goal] = tf.where(_expand(changed, desired), new_goal[:, None], desired)

    # Frame j's reward is that of the transition to frame j + 1: recomputed where both are in the episode.
    reward = tf.convert_to_tensor(trajectory.reward)
    goal_shape = tf.shape(achieved)[2:]
    flat = tf.concat([[-1], goal_shape], 0)
    recomputed = reward_fn(tf.reshape(achieved[:, 1:], flat), tf.reshape(observation[desired_goal][:, :-1], flat))
    recomputed = tf.reshape(tf.cast(recomputed, reward.dtype), tf.shape(reward[:, :-1]))
    both = changed[:, :-1] & changed[:, 1:]
    reward = tf.concat([tf.where(_expand(both, reward), recomputed, reward[:, :-1]), reward[:, -1:]], axis=1)

    result = trajectory._replace(observation=observation, reward=reward)
    return tf.nest.map_structure(lambda x: x[0], result) if unbatched else result


def her_dataset(
    buffer: Any,
    sample_batch_size: int,
    *,
    horizon: int,
    reward_fn: Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
    strategy: str = "future",
    relabel_fraction: float = 0.8,
    desired_goal: str = "desired_goal",
    achieved_goal: str = "achieved_goal",
    seed: int | None = None,
    num_parallel_calls: int | None = None,
) -> tf.data.Dataset:
    """Transitions of `buffer` with hindsight goals: elements `(Trajectory [batch, 2, ...], BufferInfo)`.

    Samples windows of `horizon + 1` frames (`2 * horizon + 1` for `"episode"`, the transition in the
    middle) with `buffer.as_dataset` and relabels them (`relabel_windows`); each element is the windows'
    transitions, ready for a one-step agent (`DqnAgent`), and their `BufferInfo`, whose `ids[:, 0]` is
    each transition's first frame (the id a prioritized buffer's `update_priorities` takes).

    Goals come from the `horizon` frames after the transition (and before, for `"episode"`): a horizon
    of the episode length (a bit-flipping task's `num_bits`) sees every later state. The newest
    `horizon` frames of each segment are drawn once the frames after them are stored.

    Example (DQN on bit flipping)::

        env = tfbuffers.envs.BitFlippingEnv(num_bits=10)
        dataset = tfbuffers.her.her_dataset(
            buffer, 64, horizon=10, reward_fn=tfbuffers.her.numpy_reward(env.compute_reward), seed=0
        )
        agent.train(next(iter(dataset))[0])

    Args:
      buffer: Any buffer without `episode_boundaries` whose data spec is a goal-conditioned `Trajectory`.
      sample_batch_size: Transitions per element.
      horizon: Frames after each transition that goals are drawn from.
      reward_fn: As in `relabel_windows`.
      strategy: As in `relabel_windows`.
      relabel_fraction: As in `relabel_windows`.
      desired_goal: As in `relabel_windows`.
      achieved_goal: As in `relabel_windows`.
      seed: Seeds the relabeling's draws (element `i` draws with seed `(seed, i)`); None: unseeded.
      num_parallel_calls: As in `as_dataset`, for the sampling and for the relabeling.

    Raises:
      ValueError: If `horizon` is not a positive int, `buffer` keeps episode boundaries, or (from
        `relabel_windows`) an option is out of range.
      TypeError: As `relabel_windows` raises it, when the dataset is made.
    """
    if isinstance(horizon, bool) or not isinstance(horizon, int | np.integer) or horizon < 1:
        raise ValueError(BAD_HORIZON.format(received=repr(horizon)))
    _checked_options(strategy, relabel_fraction, reward_fn)
    anchor = int(horizon) if strategy == "episode" else 0
    num_steps = anchor + int(horizon) + 1
    boundaries = getattr(buffer, "episode_boundaries", False)
    if boundaries:
        raise ValueError(BOUNDARIES.format(num_steps=num_steps, received=boundaries))
    dataset = buffer.as_dataset(sample_batch_size, num_steps, num_parallel_calls=num_parallel_calls)
    if seed is not None:
        dataset = tf.data.Dataset.zip((dataset, tf.data.Dataset.random(seed=seed)))
    else:
        dataset = dataset.map(lambda items, info: ((items, info), tf.constant(0, tf.int64)))

    def transitions(element: Any, draw: tf.Tensor) -> tuple[Any, BufferInfo]:
        items, info = element
        windows = relabel_windows(
            items,
            reward_fn,
            strategy=strategy,
            relabel_fraction=relabel_fraction,
            anchor=anchor,
            desired_goal=desired_goal,
            achieved_goal=achieved_goal,
            seed=None if seed is None else tf.stack([draw, tf.constant(seed, tf.int64)]),
        )
        pair = tf.nest.map_structure(lambda x: x[:, anchor : anchor + 2], windows)
        return pair, BufferInfo(info.ids[:, anchor : anchor + 2], info.probabilities)

    return dataset.map(transitions, num_parallel_calls=num_parallel_calls)


def numpy_reward(compute_reward: Callable[..., Any], dtype: tf.DType = tf.float32) -> Callable[..., tf.Tensor]:
    """A `reward_fn` running a numpy one, as gymnasium-robotics' `env.compute_reward(achieved, desired, info)`.

    The function is called with numpy arrays `[n, *goal_shape]` and `info=None`, inside the graph
    through `tf.numpy_function`; it returns `n` rewards, cast to `dtype`.
    """
    if not callable(compute_reward):
        raise TypeError(NOT_CALLABLE.format(received=type(compute_reward).__name__))

    def reward(achieved: Any, desired: Any) -> np.ndarray:
        return np.asarray(compute_reward(achieved, desired, None), dtype.as_numpy_dtype)

    def reward_fn(achieved: tf.Tensor, desired: tf.Tensor) -> tf.Tensor:
        rewards = tf.numpy_function(reward, [achieved, desired], dtype, stateful=False)
        return tf.ensure_shape(rewards, [None])

    return reward_fn


def _in_episode(step_type: tf.Tensor, anchor: int) -> tf.Tensor:
    """Whether each frame of the windows `[batch, num_steps]` lies in the episode of frame `anchor`.

    Frame j after the anchor does when no frame from the anchor to j - 1 is LAST and none from
    anchor + 1 to j is FIRST; frame j before it when none from j to anchor - 1 is LAST and none from
    j + 1 to the anchor is FIRST. Both read as: the running counts of LAST frames before each frame, and
    of FIRST frames up to it, are the anchor's.
    """
    lasts = tf.cumsum(tf.cast(step_type == LAST, tf.int32), axis=1, exclusive=True)
    firsts = tf.cumsum(tf.cast(step_type == FIRST, tf.int32), axis=1)
    return (lasts == lasts[:, anchor : anchor + 1]) & (firsts == firsts[:, anchor : anchor + 1])


def _expand(mask: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
    """`mask` `[batch, steps]` with axes of size 1 for `like`'s inner dimensions."""
    return tf.reshape(mask, tf.concat([tf.shape(mask), tf.ones([like.shape.rank - 2], tf.int32)], 0))


def _check_trajectory(trajectory: Any, desired_goal: str, achieved_goal: str) -> None:
    # Any namedtuple with a Trajectory's fields (tf_agents' own class is not imported: it is an optional extra).
    if getattr(trajectory, "_fields", None) != TRAJECTORY_FIELDS:
        raise TypeError(NOT_A_TRAJECTORY.format(received=type(trajectory).__name__))
    observation = trajectory.observation
    keys = [desired_goal, achieved_goal]
    if not isinstance(observation, Mapping) or any(key not in observation for key in keys):
        received = sorted(observation) if isinstance(observation, Mapping) else type(observation).__name__
        raise TypeError(NOT_GOAL_CONDITIONED.format(keys=keys, received=received))
    desired, achieved = (
        tf.convert_to_tensor(observation[desired_goal]),
        tf.convert_to_tensor(observation[achieved_goal]),
    )
    if desired.shape != achieved.shape or desired.dtype != achieved.dtype:
        raise ValueError(
            GOALS_DIFFER.format(
                achieved=achieved_goal,
                desired=desired_goal,
                expected=f"{desired.dtype.name} {desired.shape}",
                received=f"{achieved.dtype.name} {achieved.shape}",
            )
        )


def _checked_options(strategy: Any, relabel_fraction: Any, reward_fn: Any) -> tuple[str, float]:
    if strategy not in STRATEGIES:
        raise ValueError(BAD_STRATEGY.format(expected=list(STRATEGIES), received=repr(strategy)))
    if (
        isinstance(relabel_fraction, bool)
        or not isinstance(relabel_fraction, int | float)
        or not 0.0 <= relabel_fraction <= 1.0
    ):
        raise ValueError(BAD_FRACTION.format(received=repr(relabel_fraction)))
    if not callable(reward_fn):
        raise TypeError(NOT_CALLABLE.format(received=type(reward_fn).__name__))
    return strategy, float(relabel_fraction)
