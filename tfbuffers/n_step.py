"""n-step transitions from a buffer's windows, cut at episode ends.

Sample windows of `n + 1` frames (`as_dataset(num_steps=n + 1)`) from any buffer
and map them through `n_step_dataset` (or `n_step_transitions`): each window
becomes a two-frame `Trajectory` that a one-step agent (`DqnAgent` with
`n_step_update=1`, the default) trains on as an n-step transition:

* frame 0 is the window's first frame, with `reward` the discounted return of its
  first `m` rewards, `sum_k gamma**k * d_0 * ... * d_(k-1) * r_k`, `discount`
  `gamma**(m - 1) * d_0 * ... * d_(m-1)` and `next_step_type` that of step `m - 1`;
* frame 1 is frame `m` of the window: the observation `m` steps ahead.

The agent's target `reward + gamma * discount * Q(observation ahead)` is then the
n-step target `R + gamma**m * d_0 ... d_(m-1) * Q(s_m)`. `m` is `n`, or fewer
where the episode ends inside the window: the sum stops at the transition into
the episode's LAST frame, and the observation ahead is that LAST frame's. A
terminated episode (discount 0 at its end, `tfbuffers.envs`) then bootstraps
nothing; a truncated one (discount 1) bootstraps from its last observation. A
window starting on an episode's LAST frame (the LAST -> FIRST boundary that
drivers record) stays a one-step transition with step type LAST, which agents
mask (DQN leaves transitions from a LAST step out of its loss).

Windows may cross episode boundaries: sample them without `episode_boundaries`
(which would leave out the windows that start in an episode's last `n` frames).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfbuffers.sampling._episodes import FIRST, LAST

TRAJECTORY_FIELDS = ("step_type", "observation", "action", "policy_info", "next_step_type", "reward", "discount")
NOT_A_TRAJECTORY = "trajectory: expected a tf_agents Trajectory of windows [..., n + 1, ...], got {received}"
TOO_SHORT = "trajectory: expected windows of n + 1 >= 2 frames (a static time axis), got step_type shape {received}"
BAD_GAMMA = "gamma: expected a number in [0, 1], got {received}"


def n_step_transitions(trajectory: Any, gamma: float) -> Any:
    """Windows of `n + 1` frames as two-frame n-step transitions (see the module docstring).

    Args:
      trajectory: A `Trajectory` of windows, each field `[*batch, n + 1, ...]`
        (`[n + 1, ...]` without a batch axis), as `as_dataset(num_steps=n + 1)` yields.
      gamma: The agent's discount factor (the same as the agent's `gamma`).

    Returns:
      A `Trajectory` of the same structure and dtypes with a time axis of 2.

    Raises:
      TypeError: If `trajectory` is not a `Trajectory`.
      ValueError: If the windows have fewer than 2 frames or `gamma` is not in [0, 1].
    """
    # Any namedtuple with a Trajectory's fields (tf_agents' own class is not imported: it is an optional extra).
    if getattr(trajectory, "_fields", None) != TRAJECTORY_FIELDS:
        raise TypeError(NOT_A_TRAJECTORY.format(received=type(trajectory).__name__))
    if isinstance(gamma, bool) or not isinstance(gamma, int | float) or not 0.0 <= gamma <= 1.0:
        raise ValueError(BAD_GAMMA.format(received=repr(gamma)))
    step_type = tf.convert_to_tensor(trajectory.step_type)
    rank = step_type.shape.rank
    if rank is None or rank < 1 or step_type.shape[-1] is None or step_type.shape[-1] < 2:
        raise ValueError(TOO_SHORT.format(received=step_type.shape))
    axis, n = rank - 1, step_type.shape[-1] - 1

    # Transition k of the window belongs to its first frame's episode when no frame up to k is LAST and no
    # frame after the first, up to k, is FIRST: a prefix of the window, m transitions long (at least 1).
    ended = tf.cumsum(tf.cast(step_type[..., :n] == LAST, tf.int32), axis=-1)
    started = tf.cumsum(tf.cast(step_type[..., 1:n] == FIRST, tf.int32), axis=-1)
    started = tf.concat([tf.zeros_like(started[..., :1]), started], axis=-1)
    kept = (ended == 0) & (started == 0)
    m = tf.maximum(tf.reduce_sum(tf.cast(kept, tf.int32), axis=-1), 1)

    reward = tf.convert_to_tensor(trajectory.reward)
    discount = tf.convert_to_tensor(trajectory.discount)
    dtype = reward.dtype
    gammas = tf.constant([gamma**k for k in range(n)], dtype)
    within = tf.range(n) < m[..., None]  # transitions 0 .. m - 1
    previous = tf.math.cumprod(tf.cast(discount[..., :n], dtype), axis=-1, exclusive=True)
    weights = tf.where(within, gammas * previous, tf.zeros_like(previous))
    # Rewards may have inner dimensions (several objectives): the weights broadcast over them.
    inner = tf.ones([reward.shape.rank - rank], tf.int32)
    weights = tf.reshape(weights, tf.concat([tf.shape(weights), inner], 0))
    n_step_return = tf.reduce_sum(weights * tf.gather(reward, tf.range(n), axis=axis), axis=axis)
    through = tf.math.cumprod(discount[..., :n], axis=-1)
    last_kept = m - 1
    n_step_discount = tf.gather(tf.cast(gammas, discount.dtype), last_kept) * _at(through, last_kept, axis)

    def frames(first: Any, ahead: Any) -> Any:
        return tf.stack([first, ahead], axis=axis)

    def first_and_ahead(x: Any) -> Any:
        x = tf.convert_to_tensor(x)
        return frames(_at(x, tf.zeros_like(m), axis), _at(x, m, axis))

    return trajectory._replace(
        step_type=first_and_ahead(step_type),
        observation=tf.nest.map_structure(first_and_ahead, trajectory.observation),
        action=tf.nest.map_structure(first_and_ahead, trajectory.action),
        policy_info=tf.nest.map_structure(first_and_ahead, trajectory.policy_info),
        next_step_type=frames(
            _at(tf.convert_to_tensor(trajectory.next_step_type), last_kept, axis),
            _at(tf.convert_to_tensor(trajectory.next_step_type), m, axis),
        ),
        reward=frames(tf.cast(n_step_return, dtype), _at(reward, m, axis)),
        discount=frames(n_step_discount, _at(discount, m, axis)),
    )


def n_step_dataset(dataset: tf.data.Dataset, gamma: float, *, num_parallel_calls: int | None = None) -> tf.data.Dataset:
    """`dataset` (elements `(Trajectory windows, BufferInfo)`, as `as_dataset` yields) with n-step transitions.

    The `BufferInfo` is kept: `ids[..., 0]` is still each window's first frame,
    the one a prioritized buffer's `update_priorities` takes.

    Example (3-step transitions for a DQN agent of `gamma=0.99`)::

        dataset = buffer.as_dataset(sample_batch_size=64, num_steps=4)
        experience = iter(tfbuffers.n_step_dataset(dataset, gamma=0.99))
        agent.train(next(experience)[0])
    """
    return dataset.map(
        lambda items, info: (n_step_transitions(items, gamma), info), num_parallel_calls=num_parallel_calls
    )


def _at(x: tf.Tensor, index: tf.Tensor, axis: int) -> tf.Tensor:
    """`x[..., index, ...]` along `axis`, one index per window (`index` shaped like the batch axes)."""
    return tf.gather(x, index, axis=axis, batch_dims=axis)
