"""Specs the script tests share."""

from __future__ import annotations

from typing import Any


def cartpole_trajectory_spec() -> Any:
    """The TF-Agents trajectory spec of CartPole-v1, as scripts/replay_server.py --env CartPole-v1 serves it."""
    from tf_agents.policies import random_tf_policy

    from tfbuffers.envs import load_gymnasium

    env = load_gymnasium("CartPole-v1", tf_environment=True)
    return random_tf_policy.RandomTFPolicy(env.time_step_spec(), env.action_spec()).trajectory_spec
