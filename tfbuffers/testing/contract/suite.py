"""The contract as a pytest suite: `from tfbuffers.testing.contract.suite import *` in a test module runs it.

The module names its kinds in `CONTRACT_KINDS` (what `tfbuffers.testing.contract.register` returns: each kind
eagerly and with every call inside `tf.function`); `pytest_generate_tests` gives every case those kinds,
`uniform_kind` the ones that sample uniformly (`BufferKind.uniform`) and `every_window_kind` the ones whose
draws reach every stored window (`BufferKind.every_window`). A case a kind does not support
(`BufferKind.skips`) is skipped, saying why. TensorFlow's global seed is set before each case, so the TF kinds
draw alike run after run.
"""

from __future__ import annotations

from typing import Any

import pytest
import tensorflow as tf

from tfbuffers.testing.contract import REGISTRY, base_name
from tfbuffers.testing.contract.holding import *  # noqa: F403
from tfbuffers.testing.contract.refusing import *  # noqa: F403

NO_KINDS = (
    "CONTRACT_KINDS: expected the test module {module} to name its kinds (tfbuffers.testing.contract.register "
    "returns them), got none"
)


# The kind parameters, and which kinds each gives the cases that take it.
FILTERS: dict[str, Any] = {
    "kind": lambda kind: True,
    "uniform_kind": lambda kind: kind.uniform,
    "every_window_kind": lambda kind: kind.every_window,
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Each case once per kind of the module's `CONTRACT_KINDS` that its kind parameter takes (`FILTERS`)."""
    wanted = [name for name in FILTERS if name in metafunc.fixturenames]
    if not wanted:
        return
    kinds = getattr(metafunc.module, "CONTRACT_KINDS", None)
    if not kinds:
        raise ValueError(NO_KINDS.format(module=metafunc.module.__name__))
    for name in wanted:
        chosen = [kind for kind in kinds if FILTERS[name](REGISTRY[base_name(kind)])]
        metafunc.parametrize(name, chosen, indirect=True)


def _kind(request: pytest.FixtureRequest) -> str:
    skips = REGISTRY[base_name(request.param)].skips
    if request.function.__name__ in skips:
        pytest.skip(skips[request.function.__name__])
    tf.random.set_seed(1234)
    return request.param


@pytest.fixture
def kind(request: pytest.FixtureRequest) -> Any:
    """A registered kind, eagerly ("<name>_eager") or with every call inside `tf.function` ("<name>_function")."""
    return _kind(request)


@pytest.fixture
def uniform_kind(request: pytest.FixtureRequest) -> Any:
    """A registered kind that samples uniformly (the cases that assert uniform probabilities take it)."""
    return _kind(request)


@pytest.fixture
def every_window_kind(request: pytest.FixtureRequest) -> Any:
    """A registered kind whose draws reach every stored window (the cases that wait to see each drawn take it)."""
    return _kind(request)
