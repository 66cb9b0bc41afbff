"""What the scripts need before TensorFlow is imported: argument types, the help format, the names to choose from.

Each script builds its parser from these and checks its command line first, so that `--help` and a bad
argument are answered at once, not after TensorFlow's import (several seconds).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import re
import signal
import threading
from collections.abc import Callable
from typing import Any

# tfbuffers.kinds' names of the kinds that take any data spec (_common.BUFFERS), known here without importing it
BUFFER_KINDS = ("py_prioritized", "py_uniform", "tf_prioritized", "tf_uniform")
REVERB_SAMPLERS = ("uniform", "prioritized")  # tfbuffers.remote.options.SAMPLERS' names
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
ADDRESS = re.compile(r"[^\s:,]+:\d+")  # HOST:PORT of a replay server
# The replay servers' engines (tfbuffers.manager.BACKENDS but "local"), each with the module it needs.
BACKENDS = {"reverb": "reverb", "ray": "ray"}
NO_BACKEND = {
    "reverb": "dm-reverb cannot be imported here; it installs on Python 3.11 (the pinned stack)",
    "ray": "ray cannot be imported here; install the extra: pip install 'tfbuffers[ray]'",
}


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and each option's default after its help."""


def new_parser(description: str | None) -> argparse.ArgumentParser:
    """A parser with the scripts' help format."""
    return argparse.ArgumentParser(description=description, formatter_class=HelpFormatter)


def _int_at_least(minimum: int, expected: str) -> Callable[[str], int]:
    """An argparse type: an int >= `minimum`, or a message saying what was expected and what was received."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
        return value

    return parse


positive_int = _int_at_least(1, "a positive int")
non_negative_int = _int_at_least(0, "an int >= 0")


def positive_ints(text: str) -> list[int]:
    """An argparse type: positive ints separated by commas ("1,2,4"), each once, in increasing order."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected positive ints separated by commas, got {text!r}") from None
    if min(values) < 1 or values != sorted(set(values)):
        raise argparse.ArgumentTypeError(f"expected positive ints separated by commas, increasing, got {text!r}")
    return values


def probability(text: str) -> float:
    """An argparse type: a float in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {value}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite float > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not 0.0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value}")
    return value


def non_negative_float(text: str) -> float:
    """An argparse type: a finite float >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not 0.0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return value


def layer_sizes(parser: argparse.ArgumentParser, text: str) -> tuple[int, ...]:
    """--fc-layers: positive sizes separated by commas, or the parser's error."""
    try:
        return tuple(positive_int(size) for size in text.split(","))
    except argparse.ArgumentTypeError as error:
        parser.error(f"argument --fc-layers: {error} (sizes separated by commas, e.g. 100,50)")


def config_values(parser: argparse.ArgumentParser, args: argparse.Namespace, config: Any) -> dict[str, Any]:
    """The parsed flags that are fields of the dataclass `config`, --fc-layers as sizes, --no-progress as progress."""
    fields = {field.name for field in dataclasses.fields(config)}
    values = {key: value for key, value in vars(args).items() if key in fields}
    values["fc_layers"] = layer_sizes(parser, args.fc_layers)
    values["progress"] = not args.no_progress
    return values


def plain_name(text: str) -> str:
    """An argparse type: a file name without directories (letters, digits, `_`, `.`, `-`; not starting with `.`)."""
    if not NAME.match(text):
        raise argparse.ArgumentTypeError(
            f"expected a plain name (letters, digits, '_', '.', '-', no '/', not starting with '.'), got {text!r}"
        )
    return text


def add_backend(parser: argparse.ArgumentParser) -> None:
    """--backend: the replay server's engine."""
    parser.add_argument(
        "--backend",
        choices=list(BACKENDS),
        default=None,
        help="the replay server's engine: reverb (dm-reverb, Python 3.11) or ray (the ray extra, every stack); "
        "default: reverb where dm-reverb imports, else ray (server, actors and learner must agree)",
    )


def backend(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """--backend, or the default one (Reverb where dm-reverb imports, else Ray); the parser's error if it cannot run."""
    chosen = args.backend or next(
        (name for name, module in BACKENDS.items() if importlib.util.find_spec(module) is not None), None
    )
    if chosen is None:
        parser.error(f"argument --backend: neither engine imports here ({'; '.join(NO_BACKEND.values())})")
    if importlib.util.find_spec(BACKENDS[chosen]) is None:
        parser.error(f"argument --backend: {chosen}: {NO_BACKEND[chosen]}")
    return chosen


def stop_on_signals(stop: threading.Event) -> None:
    """SIGTERM and SIGINT set `stop`. Call it again once Ray is connected: `ray.init` installs its own SIGTERM exit."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
