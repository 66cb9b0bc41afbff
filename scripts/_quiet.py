"""The scripts' first heavy import: TensorFlow with its known start-up notices filtered, Keras 2 for TF-Agents.

The library never redirects a stream beyond its own imports; the scripts, whose terminal output is theirs,
keep what TensorFlow's C++ start-up prints about hardware this machine does not have (CUDA factories,
drivers, TensorRT, CPU instruction sets, oneDNN) off it: those lines, matched by `KNOWN_NOISE`, are dropped
from what is written to the process's stderr while TensorFlow and TF-Agents import; every other line is
written on. Third-party deprecation warnings raised inside TensorFlow, TF-Agents and TF Probability (not in
tfbuffers or the scripts; distutils' version classes that they call), autograph's `SyntaxWarning`s about
`is` with a literal in TF-Agents' code are ignored, and so is TensorFlow's logged deprecation notice for `foldr`'s
`back_prop`, which TF-Agents calls.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator
from typing import TextIO

# TF-Agents 0.19 builds its networks with Keras 2: on TensorFlow 2.16+ that is tf-keras, chosen by this
# variable before Keras is first used, where tf-keras is installed (TensorFlow 2.15 has Keras 2 anyway). A value
# set by the user wins.
if importlib.util.find_spec("tf_keras") is not None:  # with TensorFlow 2.15 the variable would break Keras
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ INFO and WARNING lines (not its errors)

KNOWN_NOISE = re.compile(
    "|".join(
        [
            r"Unable to register cu(DNN|FFT|BLAS) factory",
            r"All log messages before absl::InitializeLog\(\) is called are written to STDERR",
            r"oneDNN custom operations are on",
            r"Could not find cuda drivers on your machine",
            r"TF-TRT Warning: Could not find TensorRT",
            r"This TensorFlow binary is optimized to use available CPU instructions",
            r"To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler flags",
            r"failed call to cuInit",
        ]
    )
)
DEPRECATED_BACK_PROP = re.compile(r"back_prop=False is deprecated")


@contextlib.contextmanager
def stderr_without_known_noise() -> Iterator[None]:
    """Writes what the process writes to stderr meanwhile (C++ included), less the lines `KNOWN_NOISE` matches."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode(errors="replace").splitlines(keepends=True):
                if not KNOWN_NOISE.search(line):
                    sys.stderr.write(line)
            sys.stderr.flush()


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
warnings.filterwarnings("ignore", message=r'"is( not)?" with (a|\'tuple\') literal', category=SyntaxWarning)

with stderr_without_known_noise():
    import tensorflow as tf

    tf.get_logger().addFilter(_WithoutDeprecatedBackProp())
    tf.config.list_physical_devices()  # the devices looked for now: the lines about missing CUDA are filtered
    from tfbuffers import _noise

    _noise.import_gym()
    if importlib.util.find_spec("tf_agents") is not None:
        import tf_agents  # noqa: F401 (imported here so that its start-up lines are filtered too)
