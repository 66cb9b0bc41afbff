"""The scripts' first import: selects Keras 2 for TF-Agents and keeps gym's import-time notice off their terminal.

The library never redirects a stream; the scripts, whose output is theirs, do
it once here, before anything imports tf-agents.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import sys

# TF-Agents 0.19 builds its networks with Keras 2: on TensorFlow 2.16+ that is tf-keras, chosen by this
# variable before Keras is first used, where tf-keras is installed (TensorFlow 2.15 has Keras 2 anyway). A value
# set by the user wins.
if importlib.util.find_spec("tf_keras") is not None:  # with TensorFlow 2.15 the variable would break Keras
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


def import_gym_quietly() -> None:
    """Imports `gym` with its import-time notice kept off stderr.

    tf-agents 0.19 imports `gym` 0.23, which prints that gym is unmaintained and
    that users should move to gymnasium. The scripts' environments are gymnasium's
    already, so the notice would only mislead their users.
    """
    if "gym" in sys.modules:
        return
    # Without gym, tf-agents fails to import just after, and says why.
    with contextlib.redirect_stderr(io.StringIO()), contextlib.suppress(ImportError):
        import gym  # noqa: F401


import_gym_quietly()
