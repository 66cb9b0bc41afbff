"""Known notices of other libraries, kept off a user's terminal by `quiet_start_up()`, when called; nothing else.

`import tfbuffers` changes nothing in the process: the filters below run only when a program or notebook
calls `tfbuffers.quiet_start_up()`, first (the scripts and notebooks do).

TF-Agents 0.19 imports `gym` 0.23, which prints a notice that gym is unmaintained and that users should move
to gymnasium. tfbuffers' environments are gymnasium's already, so the notice only misleads. `import_gym` imports
gym with exactly that notice (the text gym itself prints) filtered out of `sys.stderr`: anything else written
meanwhile (a warning, an error) passes through.

TensorFlow's C++ start-up prints, on import, lines about hardware the machine does not have (CUDA drivers,
cuDNN/cuFFT/cuBLAS factories registered twice, TensorRT, CPU instruction sets, oneDNN). Where `import tfbuffers`
is what first imports TensorFlow, `import_tensorflow` imports it with the lines `TENSORFLOW_START_UP` matches
dropped from what the process writes to stderr during that import (C++ included); every other line is written
on once the import is over. A program that imports TensorFlow before the call sees TensorFlow's lines as before.

Autograph compiles a converted copy of each function it traces (TF-Agents' drivers and policies, through
`common.function`) and Python warns again about what the original's source holds (`is` with a literal): a
repeat, shown once per trace, of what Python said (once, when it compiled the original). Warnings raised on
those copies are ignored; the original's stay.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator
from typing import Any, TextIO, cast

TENSORFLOW_START_UP = [
    r"Unable to register cu(DNN|FFT|BLAS) factory",
    r"All log messages before absl::InitializeLog\(\) is called are written to STDERR",
    r"oneDNN custom operations are on",
    r"Could not find cuda drivers on your machine",
    r"TF-TRT Warning: Could not find TensorRT",
    r"This TensorFlow binary is optimized to use available CPU instructions",
    r"To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler flags",
]


class _Without:
    """A text stream that writes through to `stream`, less the exact texts in `dropped` (and the newline after)."""

    def __init__(self, stream: TextIO, dropped: set[str]) -> None:
        self._stream, self._dropped, self._after_dropped = stream, dropped, False

    def write(self, text: str) -> int:
        if text in self._dropped or (self._after_dropped and text == "\n"):
            self._after_dropped = text != "\n"
            return len(text)
        self._after_dropped = False
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def gym_notices() -> set[str]:
    """The notices gym prints on import (as `gym_notices` publishes them), or none."""
    try:
        from gym_notices import notices
    except ImportError:
        return set()
    return {text for text in notices.notices.values() if isinstance(text, str)}


def import_gym() -> None:
    """Imports `gym` (where installed and not imported yet) without its unmaintained-notice.

    gym 0.23's import also puts a filter first in the process's warnings filters (every `DeprecationWarning`
    shown once), which would override the program's own filters set before this call: the filters are
    restored as they were.
    """
    if "gym" in sys.modules or importlib.util.find_spec("gym") is None:
        return
    quiet = cast(TextIO, _Without(sys.stderr, gym_notices()))
    with contextlib.redirect_stderr(quiet), contextlib.suppress(ImportError), warnings.catch_warnings():
        import gym  # noqa: F401


_STDERR_HELD = threading.RLock()  # one thread at a time swaps the process's stderr (restored in reverse order)


@contextlib.contextmanager
def stderr_without(patterns: list[str]) -> Iterator[None]:
    """Writes what the process writes to stderr meanwhile (C++ included), less the lines `patterns` match.

    Meanwhile stderr is a file, which a write never waits on: in a Jupyter kernel, whose stderr is a pipe
    that a Python thread empties, C++ code that holds the GIL while it logs cannot fill the pipe and wait
    forever. Lines are written on, in order, when the block ends.
    """
    known = re.compile("|".join(patterns))
    with _STDERR_HELD:
        sys.stderr.flush()
        try:
            saved = os.dup(2)
        except OSError:  # no stderr to filter
            yield
            return
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
                    if not known.search(line):
                        sys.stderr.write(line)
                sys.stderr.flush()


def ignore_autograph_repeats() -> None:
    """Ignores `SyntaxWarning`s raised on autograph's converted copies of functions (not on the originals)."""
    warnings.filterwarnings("ignore", category=SyntaxWarning, module=r".*__autograph_generated_file")


def import_tensorflow() -> None:
    """Imports TensorFlow (where not imported yet) without its start-up lines about absent hardware."""
    if "tensorflow" in sys.modules:
        return
    with stderr_without(TENSORFLOW_START_UP):
        import tensorflow  # noqa: F401


def quiet_start_up() -> None:
    """Imports TensorFlow and gym without their notices about what the machine lacks; call it first, once.

    What it keeps off stderr, and nothing else (every other line is written on):

    * TensorFlow's C++ start-up lines about absent hardware (CUDA drivers, cuDNN/cuFFT/cuBLAS factories,
      TensorRT, CPU instruction sets, oneDNN: `TENSORFLOW_START_UP`), where TensorFlow is not imported yet.
      They are written to the process's file descriptor 2, which no logging filter reaches: for the
      import only, fd 2 is a temporary file whose other lines are written on afterwards.
    * gym 0.23's notice that it is unmaintained (printed when TF-Agents 0.19 imports it; tfbuffers'
      environments are gymnasium's), where gym is installed and not imported yet.
    * from now on, the repeats of a `SyntaxWarning` that autograph's converted copies of a function raise
      (Python warned once, on the original; that warning stays).

    `import tfbuffers` does none of this: it changes nothing in the process. The scripts and the notebooks
    call it first, as a program or notebook that wants a quiet terminal does:

    >>> import tfbuffers
    >>> tfbuffers.quiet_start_up()  # before TensorFlow is imported
    >>> import tensorflow as tf
    """
    import_tensorflow()
    import_gym()
    ignore_autograph_repeats()
