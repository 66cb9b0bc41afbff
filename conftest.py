"""Collection rules for the whole repository (tests/conftest.py holds the tests' fixtures)."""

from __future__ import annotations

import importlib.util

import pytest

# Docstring examples that need dm-reverb, which installs on the pinned stack only (Python 3.11).
NEEDS_REVERB = ("tfbuffers/reverb_replay_buffer.py", "tfbuffers/manager.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skips, saying why, the docstring examples whose dependency this stack lacks."""
    if importlib.util.find_spec("reverb") is not None:
        return
    skip = pytest.mark.skip(reason="dm-reverb installs on the pinned stack only (Python 3.11)")
    for item in items:
        if str(item.path).replace("\\", "/").endswith(NEEDS_REVERB):
            item.add_marker(skip)
