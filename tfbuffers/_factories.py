"""What an option that takes a factory (`storage=`, `sampler=`) gets: the object made, checked before it is used."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def made(factory: Any, arguments: Sequence[Any], expected: type, message: str) -> Any:
    """What `factory(*arguments)` makes, if `factory` is a callable that makes an `expected` (an abstract class).

    Raises:
      TypeError: `message` (naming the option) with `{received}` filled in: what `factory` is, or what it made.
    """
    if not callable(factory):
        raise TypeError(message.format(received=f"{type(factory).__name__} {factory!r}"))
    result = factory(*arguments)
    if not isinstance(result, expected):
        raise TypeError(message.format(received=f"a factory that made {type(result).__name__}"))
    return result
