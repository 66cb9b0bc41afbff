"""Imports that would print to the user's terminal on tfbuffers' behalf, made quietly."""

from __future__ import annotations

import contextlib
import io
import sys


def import_gym_quietly() -> None:
    """Imports `gym` with its import-time notice kept off stderr.

    tf-agents 0.19 imports `gym` 0.23, which prints that gym is unmaintained and
    that users should move to gymnasium. tfbuffers' environments are gymnasium's
    already; the notice, printed because tfbuffers imported tf-agents' environment
    modules, would only mislead. Import `gym` yourself first to see it.
    """
    if "gym" in sys.modules:
        return
    # Without gym, tf-agents fails to import just after, and says why.
    with contextlib.redirect_stderr(io.StringIO()), contextlib.suppress(ImportError):
        import gym  # noqa: F401


import_gym_quietly()  # on import: modules that import tf-agents' environments import this module first
