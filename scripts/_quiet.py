"""The scripts' first heavy import: TensorFlow with its known start-up notices filtered, Keras 2 for TF-Agents.

`tfbuffers.quiet_start_up()` keeps TensorFlow's start-up lines about hardware the machine lacks off (CUDA
factories, drivers, TensorRT, CPU instruction sets, oneDNN) and gym's notice, and ignores autograph's repeated
`SyntaxWarning`s. The scripts,
whose terminal output is theirs, also drop the failed cuInit that looking for devices prints (the lines
`KNOWN_NOISE` matches, while devices are listed and TF-Agents imports; every other line is written on), ignore
third-party deprecation warnings raised inside TensorFlow, TF-Agents and TF Probability (not in tfbuffers or the
scripts; distutils' version classes that they call), and TensorFlow's logged deprecation notice for `foldr`'s
`back_prop`, which TF-Agents calls.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import warnings
from typing import TextIO

# TF-Agents 0.19 builds its networks with Keras 2: on TensorFlow 2.16+ that is tf-keras, chosen by this
# variable before Keras is first used, where tf-keras is installed (TensorFlow 2.15 has Keras 2 anyway). A value
# set by the user wins.
if importlib.util.find_spec("tf_keras") is not None:  # with TensorFlow 2.15 the variable would break Keras
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ INFO and WARNING lines (not its errors)

DEPRECATED_BACK_PROP = re.compile(r"back_prop=False is deprecated")


class _WithoutDeprecatedBackProp(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not DEPRECATED_BACK_PROP.search(record.getMessage())


for _module in ("tensorflow", "tf_agents", "tensorflow_probability", "keras", "tf_keras", "gym"):
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=_module)
_show_warning = warnings.showwarning


def _show_warning_but_distutils(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    # TF-Agents and TF Probability compare versions with distutils' classes, whose shim re-enables its own
    # warning around each call: no filter reaches it, so it is dropped where it would be shown.
    if category is DeprecationWarning and "distutils Version classes are deprecated" in str(message):
        return
    _show_warning(message, category, filename, lineno, file, line)


warnings.showwarning = _show_warning_but_distutils

import tfbuffers  # noqa: E402 (after the filters; imports no TensorFlow)
from tfbuffers import _noise  # noqa: E402

# quiet_start_up keeps TensorFlow's absent-hardware lines off; a script's terminal also loses the failed cuInit
# that looking for devices prints on a machine without a GPU (a library keeps it: there it may be real).
KNOWN_NOISE = [*_noise.TENSORFLOW_START_UP, r"failed call to cuInit"]

with _noise.stderr_without(KNOWN_NOISE):
    tfbuffers.quiet_start_up()  # TensorFlow, gym, autograph's repeats
    import tensorflow as tf

    tf.get_logger().addFilter(_WithoutDeprecatedBackProp())
    tf.config.list_physical_devices()  # the devices looked for now: the lines about missing CUDA are filtered
    if importlib.util.find_spec("tf_agents") is not None:
        import tf_agents  # noqa: F401 (imported here so that its start-up lines are filtered too)
