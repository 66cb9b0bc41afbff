"""The one Keras setting that TF-Agents users on TensorFlow 2.16+ must make, said before TF-Agents' own error.

TF-Agents 0.19 builds its networks with Keras 2. From TensorFlow 2.16 on, `tf.keras` is Keras 3 unless
`TF_USE_LEGACY_KERAS=1` is set before Keras is first used (and tf-keras is installed); without it, a
`QNetwork` fails with "Received an invalid value for units, expected a positive integer", which names
neither. tfbuffers' entry points that bring TF-Agents in (`tfbuffers.envs`, `tfbuffers.collect`) warn once.
"""

from __future__ import annotations

import importlib.util
import os
import warnings

import tensorflow as tf

KERAS_3_ACTIVE = (
    "TF-Agents 0.19 builds its networks with Keras 2, but TensorFlow {version} uses Keras 3 here: set "
    "TF_USE_LEGACY_KERAS=1 before Keras is first used (os.environ['TF_USE_LEGACY_KERAS'] = '1' at the top of the "
    "program, or in the shell){install}. Without it, TF-Agents' networks fail with 'Received an invalid value "
    "for units, expected a positive integer'."
)
NO_TF_KERAS = "; and install tf-keras: pip install 'tfbuffers[agents]'"
_LEGACY = ("true", "True", "1")  # the values TensorFlow's own check accepts


def keras_3_active() -> bool:
    """True where `tf.keras` is (or will be, when first used) Keras 3: TensorFlow 2.16+ without the setting."""
    major, minor = (int(part) for part in tf.__version__.split(".")[:2])
    return (major, minor) >= (2, 16) and os.environ.get("TF_USE_LEGACY_KERAS") not in _LEGACY


def warn_if_keras_3(stacklevel: int = 2) -> None:
    """Warns with what to set, where TF-Agents' networks would fail on Keras 3."""
    if keras_3_active():
        install = "" if importlib.util.find_spec("tf_keras") is not None else NO_TF_KERAS
        warnings.warn(KERAS_3_ACTIVE.format(version=tf.__version__, install=install), stacklevel=stacklevel)
