"""Gymnasium environments for TF-Agents drivers.

TF-Agents 0.19 wraps only the old `gym<=0.23`. `load_gymnasium` wraps a
`gymnasium` environment as a TF-Agents `PyEnvironment` (or a `TFPyEnvironment`),
so that drivers, agents and tfbuffers' observers work with maintained
environments:

>>> env = load_gymnasium("CartPole-v1", seed=0)
>>> env.action_spec().maximum.item(), env.time_step_spec().observation.shape
(1, (4,))
>>> env.reset().step_type.item()
0

Episode ends follow TF-Agents' conventions: `terminated` ends the episode with
discount 0 (no value beyond it), `truncated` (a time limit) with discount 1 (the
episode was cut, the state still has a value). The step after a last step starts
a new episode, ignoring its action, as in TF-Agents.

`BitFlippingEnv` (registered as `BIT_FLIPPING_ID`) is the goal-conditioned task
of the hindsight experience replay paper (Andrychowicz et al., 2017):

>>> env = load_gymnasium(BIT_FLIPPING_ID, seed=0, num_bits=4)
>>> sorted(env.observation_spec())
['achieved_goal', 'desired_goal', 'observation']

Needs the `gymnasium` and `agents` extras (`pip install tfbuffers[gymnasium,agents]`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tfbuffers import _keras

try:
    import gymnasium
    from tf_agents.environments import batched_py_environment, py_environment, tf_py_environment
    from tf_agents.specs import array_spec
    from tf_agents.trajectories import time_step as ts
except ImportError as error:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        f"tfbuffers.envs needs gymnasium and tf-agents ({error}): pip install 'tfbuffers[gymnasium,agents]'"
    ) from error

_keras.warn_if_keras_3()

BIT_FLIPPING_ID = "tfbuffers/BitFlipping-v0"
"""The gymnasium id of `BitFlippingEnv`: `gymnasium.make(BIT_FLIPPING_ID, num_bits=15)`."""

UNSUPPORTED_SPACE = "{path}: expected a Box, Discrete, Dict or Tuple space, got {received}"
NOT_A_POSITIVE_INT = "{name}: expected a positive int, got {received}"
BAD_ACTION = "action: expected a bit index in [0, {num_bits}), got {received}"


def spec_from_space(space: gymnasium.Space, path: str = "<root>") -> Any:
    """A TF-Agents `BoundedArraySpec` nest describing a gymnasium space.

    Args:
      space: A `Box`, `Discrete`, or a `Dict` or `Tuple` of those.
      path: The space's name in error messages.

    Returns:
      `Box` becomes a spec of its shape, dtype and bounds; `Discrete(n, start)`
      a scalar int64 spec over `[start, start + n - 1]`; `Dict` a dict and
      `Tuple` a tuple of specs.

    Raises:
      TypeError: For any other space.
    """
    if isinstance(space, gymnasium.spaces.Box):
        return array_spec.BoundedArraySpec(space.shape, space.dtype, minimum=space.low, maximum=space.high)
    if isinstance(space, gymnasium.spaces.Discrete):
        start, n = int(np.asarray(space.start)), int(np.asarray(space.n))
        return array_spec.BoundedArraySpec((), np.int64, minimum=start, maximum=start + n - 1)
    if isinstance(space, gymnasium.spaces.Dict):
        return {key: spec_from_space(sub, f"{path}/{key}" if path != "<root>" else key) for key, sub in space.items()}
    if isinstance(space, gymnasium.spaces.Tuple):
        return tuple(spec_from_space(sub, f"{path}/{i}" if path != "<root>" else str(i)) for i, sub in enumerate(space))
    raise TypeError(UNSUPPORTED_SPACE.format(path=path, received=type(space).__name__))


def _cast(value: Any, spec: Any) -> Any:
    """Gymnasium values with the spec's dtype (e.g. Discrete actions arrive as Python ints)."""
    if isinstance(spec, Mapping):
        return {key: _cast(value[key], sub) for key, sub in spec.items()}
    if isinstance(spec, tuple):
        return tuple(_cast(v, sub) for v, sub in zip(value, spec))
    return np.asarray(value, dtype=spec.dtype)


class GymnasiumEnvironment(py_environment.PyEnvironment):
    """A TF-Agents `PyEnvironment` running one gymnasium environment."""

    def __init__(self, env: gymnasium.Env, *, seed: int | None = None, discount: float = 1.0) -> None:
        """Wraps `env`.

        Args:
          env: The gymnasium environment (its time limit, if any, gives truncations).
          seed: Seeds the first reset and the action space; later resets continue
            the environment's own random stream.
          discount: The discount of every step that does not terminate.
        """
        super().__init__(handle_auto_reset=True)
        self._env = env
        self._seed = seed
        self._discount = np.float32(discount)
        self._observation_spec = spec_from_space(env.observation_space)
        self._action_spec = spec_from_space(env.action_space)
        if seed is not None:
            env.action_space.seed(seed)

    @property
    def gymnasium_env(self) -> gymnasium.Env:
        """The wrapped gymnasium environment."""
        return self._env

    def observation_spec(self) -> Any:
        """The observation spec, from the observation space."""
        return self._observation_spec

    def action_spec(self) -> Any:
        """The action spec, from the action space."""
        return self._action_spec

    def _reset(self) -> ts.TimeStep:
        observation, _ = self._env.reset(seed=self._seed)
        self._seed = None  # seed once; later episodes continue the stream
        return ts.restart(_cast(observation, self._observation_spec))

    def _step(self, action: Any) -> ts.TimeStep:
        action = np.asarray(action)  # numpy, or a tensor (PyTFEagerPolicy(batch_time_steps=False) returns those)
        action = action.item() if isinstance(self._env.action_space, gymnasium.spaces.Discrete) else action
        observation, reward, terminated, truncated, _ = self._env.step(action)
        observation = _cast(observation, self._observation_spec)
        reward = np.float32(reward)
        if terminated:
            return ts.termination(observation, reward)
        if truncated:
            return ts.truncation(observation, reward, self._discount)
        return ts.transition(observation, reward, self._discount)

    def render(self, mode: str = "rgb_array") -> Any:
        """Renders with the gymnasium environment's own `render_mode`."""
        return self._env.render()

    def close(self) -> None:
        """Closes the gymnasium environment."""
        self._env.close()


def load_gymnasium(
    env_id: str,
    *,
    num_envs: int = 1,
    seed: int | None = None,
    discount: float = 1.0,
    max_episode_steps: int | None = None,
    tf_environment: bool = False,
    **make_kwargs: Any,
) -> Any:
    """Makes gymnasium environments for TF-Agents.

    Args:
      env_id: A registered gymnasium id, e.g. `'CartPole-v1'`.
      num_envs: With more than one, a `BatchedPyEnvironment` of that many copies
        (observations and actions get a leading batch dimension); copy `i` is
        seeded with `seed + i`.
      seed: Seed of the first reset and of the action space.
      discount: Discount of non-terminating steps.
      max_episode_steps: Overrides the registered time limit.
      tf_environment: Return a `TFPyEnvironment` (for TF drivers) instead of the
        py environment.
      **make_kwargs: Passed to `gymnasium.make`.

    Returns:
      A `GymnasiumEnvironment`, a `BatchedPyEnvironment`, or a `TFPyEnvironment`
      around either.

    Raises:
      TypeError: If `num_envs` is not an int, or a space is not supported.
      ValueError: If `num_envs` is not positive.
    """
    _check_positive_int("num_envs", num_envs)

    def make(index: int) -> GymnasiumEnvironment:
        env = gymnasium.make(env_id, max_episode_steps=max_episode_steps, **make_kwargs)
        return GymnasiumEnvironment(env, seed=None if seed is None else seed + index, discount=discount)

    env: py_environment.PyEnvironment
    if num_envs == 1:
        env = make(0)
    else:
        env = batched_py_environment.BatchedPyEnvironment([make(i) for i in range(num_envs)], multithreading=False)
    return tf_py_environment.TFPyEnvironment(env) if tf_environment else env


class BitFlippingEnv(gymnasium.Env):
    """The bit-flipping task of the hindsight experience replay paper (Andrychowicz et al., 2017).

    The state is `num_bits` bits; each action flips one of them; an episode starts
    from random bits and a random goal (never the start itself) and ends, terminated,
    on the step that makes the state the goal, or truncated after `max_steps` steps
    (`num_bits` by default, as in the paper: enough to reach any goal). The reward is
    0 on reaching the goal and -1 on every other step, so without relabeling a random
    policy sees a reward of 0 about once in `2**num_bits` episodes.

    Observations follow gymnasium-robotics' goal-conditioned convention: a dict of
    `observation` (the bits), `achieved_goal` (the bits again: the goal a step
    achieved) and `desired_goal`, each float32 `[num_bits]` of 0s and 1s.
    `compute_reward` recomputes rewards for any goals, vectorized, as hindsight
    relabeling needs.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, num_bits: int = 10, max_steps: int | None = None) -> None:
        """Makes the task.

        Args:
          num_bits: The length of the bit string (the paper: 5 to 50).
          max_steps: Steps before the episode is truncated; default `num_bits`.

        Raises:
          TypeError: If `num_bits` or `max_steps` is not an int.
          ValueError: If either is below 1.
        """
        _check_positive_int("num_bits", num_bits)
        if max_steps is not None:
            _check_positive_int("max_steps", max_steps)
        self.num_bits = num_bits
        self.max_steps = num_bits if max_steps is None else max_steps
        bits = gymnasium.spaces.Box(0.0, 1.0, (num_bits,), np.float32)
        self.observation_space = gymnasium.spaces.Dict(
            {"observation": bits, "achieved_goal": bits, "desired_goal": bits}
        )
        self.action_space = gymnasium.spaces.Discrete(num_bits)
        self._state = np.zeros(num_bits, np.float32)
        self._goal = np.zeros(num_bits, np.float32)
        self._steps = 0

    def compute_reward(self, achieved_goal: Any, desired_goal: Any, info: Any = None) -> np.ndarray:
        """Rewards of reaching `desired_goal` with `achieved_goal`: 0 where they are equal, else -1.

        Args:
          achieved_goal: Bits `[..., num_bits]`.
          desired_goal: Bits of the same shape.
          info: Unused (gymnasium-robotics' signature).

        Returns:
          float32 rewards `[...]`.
        """
        differ = np.any(np.asarray(achieved_goal) != np.asarray(desired_goal), axis=-1)
        return -differ.astype(np.float32)

    def _observation(self) -> dict[str, np.ndarray]:
        return {
            "observation": self._state.copy(),
            "achieved_goal": self._state.copy(),
            "desired_goal": self._goal.copy(),
        }

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Random bits and a random goal that differs from them."""
        super().reset(seed=seed)
        self._state = self.np_random.integers(0, 2, self.num_bits).astype(np.float32)
        self._goal = self._state
        while np.array_equal(self._goal, self._state):
            self._goal = self.np_random.integers(0, 2, self.num_bits).astype(np.float32)
        self._steps = 0
        return self._observation(), {"is_success": False}

    def step(self, action: Any) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        """Flips bit `action`; terminated on reaching the goal, truncated after `max_steps` steps."""
        if not self.action_space.contains(action):
            raise ValueError(BAD_ACTION.format(num_bits=self.num_bits, received=repr(action)))
        self._state = self._state.copy()
        self._state[int(action)] = 1.0 - self._state[int(action)]
        self._steps += 1
        reward = float(self.compute_reward(self._state, self._goal))
        success = reward == 0.0
        return (
            self._observation(),
            reward,
            success,
            not success and self._steps >= self.max_steps,
            {"is_success": success},
        )


def _check_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(NOT_A_POSITIVE_INT.format(name=name, received=f"{type(value).__name__} {value!r}"))
    if value < 1:
        raise ValueError(NOT_A_POSITIVE_INT.format(name=name, received=f"int {value}"))


gymnasium.register(BIT_FLIPPING_ID, entry_point="tfbuffers.envs:BitFlippingEnv")
