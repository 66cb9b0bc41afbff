"""Known notices of other libraries, kept off a user's terminal where tfbuffers brings them in; nothing else.

TF-Agents 0.19 imports `gym` 0.23, which prints a notice that gym is unmaintained and that users should move
to gymnasium. tfbuffers' environments are gymnasium's already, so the notice only misleads. `import_gym` imports
gym with exactly that notice (the text gym itself prints) filtered out of `sys.stderr`: anything else written
meanwhile (a warning, an error) passes through.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from typing import Any, TextIO, cast


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
    """Imports `gym` (where installed and not imported yet) without its unmaintained-notice."""
    if "gym" in sys.modules or importlib.util.find_spec("gym") is None:
        return
    quiet = cast(TextIO, _Without(sys.stderr, gym_notices()))
    with contextlib.redirect_stderr(quiet), contextlib.suppress(ImportError):
        import gym  # noqa: F401
