"""Eager calls of a TF buffer's graph methods: each compiled once, its assertion failures raised as one line.

A TF buffer builds its ops in methods that work inside a graph (a `tf.function`, a dataset) and eagerly.
Called eagerly, each goes through its `tf.function`, made once per buffer (one call instead of many eager
ops); writers go through it holding the eager writers' lock (`tfbuffers.execution._tf_concurrency`).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tfbuffers.replay_buffer import weak_method


class GraphCalls:
    """A TF buffer's compiled methods, made once each, and its eager calls under the writers' lock."""

    def __init__(self, eager_lock: threading.Lock) -> None:
        self._eager_lock = eager_lock
        self._functions: dict[str, OneLineErrors] = {}

    def compiled(self, method: Callable[..., Any]) -> Any:
        """`tf.function` of the bound `method`, made once; it holds the buffer weakly (no reference cycle).

        Called eagerly, its assertion failures raise as the py buffers' do (`OneLineErrors`).
        """
        function = self._functions.get(method.__name__)
        if function is None:
            compiled = tf.function(weak_method(method), autograph=False)
            function = self._functions[method.__name__] = OneLineErrors(compiled)
        return function

    def locked(self, method: Callable[..., Any], *args: Any) -> Any:
        """An eager call of `method(*args)`, compiled, holding the eager writers' lock."""
        with self._eager_lock:
            return self.compiled(method)(*args)

    def if_eager(self, method: Callable[..., Any]) -> Callable[..., Any]:
        """`method`, through its compiled `tf.function` when called eagerly: one call instead of many ops."""
        return self.compiled(method) if tf.executing_eagerly() else method

    @property
    def functions(self) -> dict[str, OneLineErrors]:
        """The compiled functions made so far, by method name (a copy)."""
        return dict(self._functions)

    def clear(self) -> None:
        """Drops the compiled functions (the buffer was closed)."""
        self._functions.clear()


_ASSERTION = re.compile(r"assertion failed: (.*?)\n\t \[\[", re.DOTALL)


def assertion_message(error: tf.errors.InvalidArgumentError) -> str | None:
    """The data of the failed `tf.debugging.Assert` that `error` reports, as one line; None for other errors.

    TensorFlow prints an Assert's data as `[message] [value]...`: the message loses its brackets.
    """
    found = _ASSERTION.search(error.message)
    if found is None:
        return None
    data = found[1]
    if data.startswith("[") and data.endswith("]"):
        first, separator, rest = data[1:-1].partition("] [")
        data = first + (" [" + rest + "]" if separator else "")
    return data


class OneLineErrors:
    """A compiled function whose eager calls raise a failed assertion as its message alone.

    Called eagerly, a `tf.function`'s failed `Assert` raises an `InvalidArgumentError` whose message is a
    graph traceback ("Graph execution error: ... Detected at node ... assertion failed: [...]"). The py
    buffers raise the same type with the message alone; so do these calls. Other errors pass unchanged.
    Everything else (`get_concrete_function`, ...) is the function's.
    """

    def __init__(self, function: Any) -> None:
        self._function = function

    def __call__(self, *args: Any) -> Any:
        try:
            return self._function(*args)
        except tf.errors.InvalidArgumentError as error:
            message = assertion_message(error)
            if message is None:
                raise
            raise tf.errors.InvalidArgumentError(error.node_def, error.op, message) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._function, name)
