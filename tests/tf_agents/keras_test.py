"""TF-Agents' Keras 2 requirement, said by tfbuffers' entry points before TF-Agents' own error (issue 29)."""

from __future__ import annotations

import os
import subprocess
import sys

import tensorflow as tf

from tfbuffers import _keras

NEWER_TENSORFLOW = tuple(int(part) for part in tf.__version__.split(".")[:2]) >= (2, 16)

BUILD_A_Q_NETWORK = """
import tensorflow as tf
import tfbuffers.envs
from tf_agents.networks import q_network
from tf_agents.specs import tensor_spec
network = q_network.QNetwork(
    tensor_spec.TensorSpec([4], tf.float32), tensor_spec.BoundedTensorSpec([], tf.int64, 0, 1), fc_layer_params=(2,)
)
network.create_variables()
print("built")
"""


def run(legacy: str | None) -> subprocess.CompletedProcess[str]:
    environment = {key: value for key, value in os.environ.items() if key != "TF_USE_LEGACY_KERAS"}
    if legacy is not None:
        environment["TF_USE_LEGACY_KERAS"] = legacy
    command = [sys.executable, "-c", BUILD_A_Q_NETWORK]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=environment)


def test_without_the_setting_the_entry_point_says_what_to_set_before_tf_agents_fails():
    result = run(None)
    warning = "TF-Agents 0.19 builds its networks with Keras 2, but TensorFlow"
    if NEWER_TENSORFLOW:
        assert result.returncode == 1
        assert warning in result.stderr and "set TF_USE_LEGACY_KERAS=1 before Keras is first used" in result.stderr
        # Said first: TF-Agents' error comes after it.
        assert result.stderr.index(warning) < result.stderr.index("Received an invalid value for units")
    else:  # TensorFlow 2.15: Keras 2 is tf.keras, nothing to set
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[-1] == "built" and warning not in result.stderr


def test_with_the_setting_there_is_no_warning_and_the_network_builds():
    result = run("1" if NEWER_TENSORFLOW else None)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "built"
    assert "builds its networks with Keras 2" not in result.stderr


def test_keras_3_active_follows_the_version_and_the_variable(monkeypatch):
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    assert not _keras.keras_3_active()
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "0")
    assert _keras.keras_3_active() == NEWER_TENSORFLOW
    monkeypatch.setattr(tf, "__version__", "2.15.1")
    assert not _keras.keras_3_active()
    monkeypatch.setattr(tf, "__version__", "2.21.0")
    assert _keras.keras_3_active()
