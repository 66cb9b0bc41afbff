"""Constructor calls that do not fit a class's signature, refused naming the class and the arguments it takes."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any


def explained(init: Callable[..., None]) -> Callable[..., None]:
    """Wraps an `__init__` so that a call that does not fit its signature raises naming what the class takes.

    The message is Python's reason (`got an unexpected keyword argument 'sampler'`, `too many positional
    arguments`) after the class's name, then `expected arguments among [...]`: what a user switching from
    TF-Agents reads when an option of one buffer is not one of another (`sampler=` on a prioritized buffer).
    `inspect.signature` of the class still reads the wrapped `__init__`'s.
    """
    signature = inspect.signature(init)
    taken = [name for name in signature.parameters if name != "self"]

    @functools.wraps(init)
    def checked(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            signature.bind(self, *args, **kwargs)
        except TypeError as error:
            raise TypeError(f"{type(self).__name__}: {error}; expected arguments among {taken}") from None
        init(self, *args, **kwargs)

    return checked
