"""The frames the Ray tests trace: each to its writer, environment (segment) and step, with its episode's step type."""

from __future__ import annotations

import tensorflow as tf

# FIRST 0, MID 1, LAST 2; `obs` repeats writer * 1e6 + env * 1e3 + step, so a torn frame shows.
TRACED = {
    "writer": tf.TensorSpec([], tf.int64),
    "env": tf.TensorSpec([], tf.int64),
    "step": tf.TensorSpec([], tf.int64),
    "step_type": tf.TensorSpec([], tf.int32),
    "obs": tf.TensorSpec([4], tf.float32),
}
