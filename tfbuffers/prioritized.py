"""Prioritized replay: what the prioritized buffers share, and importance-sampling weights.

A prioritized buffer draws each window with probability proportional to
`priority ** priority_exponent` of its first frame (Schaul et al., 2016,
"Prioritized Experience Replay", proportional variant); `importance_weights` corrects for the draws in training.
The priorities are the prioritized sampler's state: they live in `tfbuffers.sampling.priorities`, whose every
name this module re-exports (the import path users and files know).
"""

from __future__ import annotations

from tfbuffers.sampling.priorities import (
    MAX_PRIORITY,
    NEVER_STORED,
    NOT_A_BETA,
    NOT_A_PRIORITY,
    NOT_AN_EXPONENT,
    NOT_AN_ID,
    PRIORITY,
    SHAPES_DIFFER,
    SUM_TREE,
    Priorities,
    check_exponent,
    check_extras,
    check_update,
    extras,
    importance_weights,
    leaf_weights,
    state_template,
    stored_updates,
)

__all__ = [
    "MAX_PRIORITY",
    "NEVER_STORED",
    "NOT_AN_EXPONENT",
    "NOT_AN_ID",
    "NOT_A_BETA",
    "NOT_A_PRIORITY",
    "PRIORITY",
    "SHAPES_DIFFER",
    "SUM_TREE",
    "Priorities",
    "check_exponent",
    "check_extras",
    "check_update",
    "extras",
    "importance_weights",
    "leaf_weights",
    "state_template",
    "stored_updates",
]
