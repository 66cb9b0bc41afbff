"""The scripts' first import: keeps gym's import-time notice off their terminal.

The library never redirects a stream; the scripts, whose output is theirs, do
it once here, before anything imports tf-agents.
"""

from __future__ import annotations

import contextlib
import io
import sys


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
