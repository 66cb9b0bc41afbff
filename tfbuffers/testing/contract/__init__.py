"""The contract every tfbuffers replay buffer passes, to run against a storage or a sampler of your own.

The contract is the suite of cases `tests/contract_test.py` runs on every buffer kind of tfbuffers: exact
contents after adds that wrap, windows within one segment and in time, uniform probabilities, datasets (sampled,
the deterministic pass, epochs), random access, states and checkpoints, clears, and bad input refused naming
the field with the buffer unchanged, each case eagerly and with every call inside `tf.function`. A storage or
a sampler written outside the library joins it by one registry entry, and one import runs every case on it::

    # test_my_storage.py, run by pytest
    from tfbuffers.testing import contract
    from tfbuffers.testing.contract.suite import *  # noqa: F403 (the cases, their fixtures and parametrization)

    CONTRACT_KINDS = contract.register(contract.with_storage("py_mine", base="py_uniform", storage=MyStorage))

`with_storage` and `with_sampler` make a kind of the registry's buffers (`tfbuffers.kinds`: "py_uniform",
"tf_uniform", ...) with your `storage=` or `sampler=`; `register` adds it and returns its test parameters (the
kind eagerly and under `tf.function`), which the module's `CONTRACT_KINDS` names for the suite. The frames are
`SPEC`'s, integer-coded (`code`, `frames`, `batch`) so that every returned item can be checked to be whole and
the right one (`assert_whole`). pytest is needed (the `testing` extra); nothing else of tfbuffers imports this
package.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import tensorflow as tf

import tfbuffers
import tfbuffers.kinds
import tfbuffers.specs
import tfbuffers.state

__all__ = [
    "REGISTRY",
    "SPEC",
    "BufferKind",
    "FunctionWrapped",
    "Shelf",
    "assert_message",
    "assert_whole",
    "base_name",
    "batch",
    "builtin_kinds",
    "code",
    "fill",
    "frame_stacked",
    "frames",
    "fresh_spec",
    "from_registry",
    "make",
    "make_buffer",
    "new_directory",
    "register",
    "stored_codes",
    "to_numpy",
    "underlying",
    "with_sampler",
    "with_storage",
]


def fresh_spec() -> dict[str, Any]:
    """A new copy of `SPEC`, for a test that checks the identity of what it passes."""
    return {
        "observation": {
            "position": tf.TensorSpec([2], tf.float32, "position"),
            "pixels": tf.TensorSpec([2, 2], tf.uint8, "pixels"),
        },
        "action": tf.TensorSpec([], tf.int32, "action"),
        "step": tf.TensorSpec([], tf.int64, "step"),
    }


SPEC = fresh_spec()
"""The contract's frames: nested, of three dtypes, with a uint8 image (frame stacks store it once)."""


def code(segment: Any, step: Any) -> Any:
    return 1000 * np.asarray(segment) + np.asarray(step)


def frames(codes: Any) -> dict[str, Any]:
    """The items whose fields all derive from integer `codes` (any shape)."""
    codes = np.asarray(codes, np.int64)
    return {
        "observation": {
            "position": np.stack([codes, -codes], axis=-1).astype(np.float32),
            "pixels": np.broadcast_to((codes % 251).astype(np.uint8)[..., None, None], codes.shape + (2, 2)).copy(),
        },
        "action": codes.astype(np.int32),
        "step": codes,
    }


def batch(batch_size: int, t: int) -> dict[str, Any]:
    """The `add_batch` argument for add number `t`."""
    return frames(code(np.arange(batch_size), t))


def to_numpy(structure: Any) -> Any:
    return tf.nest.map_structure(lambda x: np.asarray(x) if not isinstance(x, tuple) else x, structure)


def assert_whole(items: Any) -> np.ndarray:
    """Asserts every field of every returned frame derives from one code; returns the codes."""
    items = to_numpy(items)
    codes = items["step"]
    expected = frames(codes)
    for path_items, path_expected in zip(tf.nest.flatten(items), tf.nest.flatten(expected)):
        np.testing.assert_array_equal(path_items, path_expected)
    return codes


class FunctionWrapped:
    """A buffer whose methods are all called through `tf.function`."""

    def __init__(self, buffer: tfbuffers.ReplayBuffer) -> None:
        self.buffer = buffer
        self._add = tf.function(buffer.add_batch)
        self._extend = tf.function(buffer.extend)
        self._gather_all = tf.function(buffer.gather_all)
        self._num_frames = tf.function(buffer.num_frames)
        self._clear = tf.function(buffer.clear)
        self._get_next: dict[tuple[Any, ...], Any] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.buffer, name)

    def add_batch(self, items: Any) -> Any:
        return self._add(items)

    def extend(self, items: Any) -> Any:
        return self._extend(items)

    def get_next(self, sample_batch_size=None, num_steps=None, time_stacked=True):
        arguments = (sample_batch_size, num_steps, time_stacked)
        # One trace for each set of arguments, as a program's function has; keyed by type too (True == 1).
        key = tuple((type(argument), argument) for argument in arguments)
        if key not in self._get_next:
            self._get_next[key] = tf.function(lambda: self.buffer.get_next(*arguments), autograph=False)
        return self._get_next[key]()

    def gather_all(self) -> Any:
        return self._gather_all()

    def num_frames(self) -> Any:
        return self._num_frames()

    def clear(self) -> None:
        self._clear()

    def __len__(self) -> int:
        return len(self.buffer)

    def sample_all(self) -> Any:
        return tf.function(self.buffer.sample_all)()

    def get_item(self, index: int) -> Any:
        return tf.function(self.buffer.get_item)(tf.constant(index, tf.int64))

    def sample_by_index(self, indices: Any, fields: Any = None) -> Any:
        return tf.function(lambda i: self.buffer.sample_by_index(i, fields))(tf.constant(indices, tf.int64))


@dataclasses.dataclass(frozen=True)
class BufferKind:
    """One buffer class in the registry every multi-buffer test draws from.

    Attributes:
      name: Short name used in test ids.
      make: Builds the buffer from (spec, batch_size, max_length, **options).
      uniform: Whether it samples uniformly (the contract's uniform-only cases run on it).
      every_window: Whether its draws reach every stored window (the cases that wait to see each drawn run on
        it): a uniform or prioritized sampler's do, one that draws among some windows only does not.
      state_format: Its `BufferState.format`: states, checkpoints and files restore across kinds of one format.
      buffer_class: Its class.
      load_options: What `buffer_class.load(path, ...)` is given to rebuild this kind from a file beyond what the
        file records (a storage).
      on_disk: Whether it keeps its rows in a directory (`directory=`): each load gets a new one.
      skips: The contract's cases it does not support, by test function name, each with the reason (a remote
        buffer's table has no order to read, for example): they are skipped, saying why.
    """

    name: str
    make: Callable[..., tfbuffers.ReplayBuffer]
    uniform: bool = True
    state_format: str = tfbuffers.state.SEGMENTED
    buffer_class: type = tfbuffers.PyUniformReplayBuffer
    load_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    on_disk: bool = False
    every_window: bool = True
    skips: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def load(self, path: Any, **overrides: Any) -> Any:
        """A buffer of this kind rebuilt from the file at `path` (`buffer_class.load`)."""
        if self.on_disk:
            overrides.setdefault("directory", new_directory())
        return self.buffer_class.load(path, **self.load_options, **overrides)  # type: ignore[attr-defined]


# The memory-mapped kinds' directories, one each, under one directory removed when the tests' process exits.
_DIRECTORIES = tempfile.TemporaryDirectory(prefix="tfbuffers-test-directories-")


def new_directory(spec: Any = None) -> str:
    """A new directory path for a memory-mapped buffer (`directory=`), not yet made."""
    return os.path.join(tempfile.mkdtemp(dir=_DIRECTORIES.name), "buffer")


def from_registry(kind: tfbuffers.kinds.Kind, **preset: Callable[[Any], Any]) -> Callable[..., Any]:
    """Makes buffers of the registry's `kind`: host kinds seeded (0 unless given), `preset` options from the spec."""

    def make(spec: Any, batch_size: int, max_length: int, **options: Any) -> tfbuffers.ReplayBuffer:
        seed = options.pop("seed", 0)
        if not kind.host:
            seed = None  # the TF kinds draw from TensorFlow's global generator (the fixtures seed it)
        for option, value in preset.items():
            options.setdefault(option, value(spec))
        return tfbuffers.kinds.make(kind.name, spec, batch_size, max_length, seed, **options)

    return make


def frame_stacked(spec: Any) -> list[str] | None:
    """SPEC's uint8 fields of rank >= 1 (its pixels), stored as frame stacks along the last axis."""
    stacked = [
        field.path
        for field in tfbuffers.specs.flatten_spec(spec)
        if field.spec.dtype == tf.uint8 and field.spec.shape.rank >= 1
    ]
    return stacked or None


REGISTRY: dict[str, BufferKind] = {}
"""The kinds the contract's cases make by name (`make`, `make_buffer`): `register` adds to it."""

MODES = ("eager", "function")


def register(*kinds: BufferKind) -> list[str]:
    """Adds `kinds` to the registry; returns their test parameters, `"<name>_eager"` and `"<name>_function"` each.

    Raises:
      ValueError: If a kind of the same name, but another, is registered already.
    """
    for kind in kinds:
        if REGISTRY.get(kind.name, kind) is not kind:
            raise ValueError(f"kind: {kind.name!r} is registered already, as another kind")
        REGISTRY[kind.name] = kind
    return [f"{kind.name}_{mode}" for kind in kinds for mode in MODES]


def base_name(parameter: str) -> str:
    """The kind's name of a test parameter (`"py_mine_function"` -> `"py_mine"`)."""
    return parameter.rsplit("_", 1)[0]


def builtin_kinds() -> list[BufferKind]:
    """`tfbuffers.kinds`' kinds of any data spec ("tf", "py", "tf_prioritized", ...), frame stacks, memory maps."""
    found = []
    for kind in tfbuffers.kinds.KINDS.values():
        if kind.any_spec:
            name = kind.name.removesuffix("_uniform")
            found.append(
                BufferKind(name, from_registry(kind), not kind.prioritized, _state_format(kind), kind.buffer_class)
            )
    py = tfbuffers.kinds.KINDS["py_uniform"]
    found.append(BufferKind("py_frames", from_registry(py, frame_stacks=frame_stacked)))
    # Memory-mapped files (`directory=`): the py buffer's rows, counter and extras on the disk.
    found.append(BufferKind("py_memmap", from_registry(py, directory=new_directory), on_disk=True))
    return found


def with_storage(name: str, base: str, storage: Any) -> BufferKind:
    """A kind of the registry's `base` buffer (`tfbuffers.kinds`, "py_uniform" or "tf_uniform") with `storage=`.

    Files do not record a storage, so the kind's loads pass it again (`BufferKind.load_options`).
    """
    kind = tfbuffers.kinds.KINDS[base]
    return BufferKind(
        name,
        from_registry(kind, storage=lambda spec: storage),
        not kind.prioritized,
        _state_format(kind),
        kind.buffer_class,
        load_options={"storage": storage},
    )


def with_sampler(name: str, base: str, sampler: Any) -> BufferKind:
    """A kind of the registry's `base` uniform buffer (`tfbuffers.kinds`) with `sampler=`; its loads pass it again."""
    kind = tfbuffers.kinds.KINDS[base]
    return BufferKind(
        name,
        from_registry(kind, sampler=lambda spec: sampler),
        state_format=_state_format(kind),
        buffer_class=kind.buffer_class,
        load_options={"sampler": sampler},
    )


def _state_format(kind: tfbuffers.kinds.Kind) -> str:
    return tfbuffers.state.PRIORITIZED if kind.prioritized else tfbuffers.state.SEGMENTED


def make(name: str, spec: Any = SPEC, batch_size: int = 3, max_length: int = 5, **options: Any) -> Any:
    """A buffer of the registered kind `name`."""
    return REGISTRY[name].make(spec, batch_size, max_length, **options)


class Shelf:
    """Buffers kept between tests, so a case gets one made alike, cleared, instead of one whose calls trace again.

    A kind's every `tf.function` (its graph calls, `FunctionWrapped`'s) traces again in a new buffer, and a remote
    kind starts a process: that is most of what a case costs. `make_buffer` lends kept buffers of the `kinds`
    named; the test runner gives them back (`returned`) only when the case passed. A clear must leave a buffer as a
    new one is (the contract's `test_clear` checks it), but for its random ops' state, which no case depends on.
    """

    def __init__(self, kinds: Any) -> None:
        self.kinds = tuple(kinds)
        self._kept: dict[tuple[Any, ...], list[Any]] = {}
        self._lent: list[tuple[tuple[Any, ...], Any]] = []

    def key(self, kind: str, batch_size: int, max_length: int, spec: Any, options: dict[str, Any]) -> tuple | None:
        """What a kept buffer must have been made with to be lent for these arguments; None: never kept."""
        if spec is not SPEC or base_name(kind) not in self.kinds:
            return None
        chosen = tuple((name, type(value), value) for name, value in sorted(options.items()))  # True == 1: not alike
        try:
            hash(chosen)
        except TypeError:
            return None
        return (kind, batch_size, max_length, chosen)

    def take(self, key: tuple) -> Any:
        """A kept buffer made for `key`, cleared, or None."""
        kept = self._kept.get(key)
        if not kept:
            return None
        buffer = kept.pop()
        underlying(buffer).clear()
        return buffer

    def lend(self, key: tuple, buffer: Any) -> None:
        """`buffer` goes back on the shelf under `key` if the case that has it passes."""
        self._lent.append((key, buffer))

    def returned(self, passed: bool) -> None:
        """The case ended: its buffers back on the shelf if it `passed`, else dropped."""
        if passed:
            for key, buffer in self._lent:
                self._kept.setdefault(key, []).append(buffer)
        self._lent.clear()


shelf: Shelf | None = None
"""The `Shelf` `make_buffer` lends from, or None (every buffer new): a test suite sets it and returns buffers."""


def make_buffer(kind: str, batch_size: int = 3, max_length: int = 5, spec: Any = SPEC, **kwargs: Any) -> Any:
    """A buffer of the test parameter `kind` (`"<name>_eager"` or `"<name>_function"`: every call in tf.function)."""
    key = None if shelf is None else shelf.key(kind, batch_size, max_length, spec, kwargs)
    buffer = None if key is None or shelf is None else shelf.take(key)
    if buffer is None:
        name, mode = kind.rsplit("_", 1)
        buffer = make(name, spec, batch_size, max_length, **kwargs)
        buffer = FunctionWrapped(buffer) if mode == "function" else buffer
    if key is not None and shelf is not None:
        shelf.lend(key, buffer)
    return buffer


def underlying(buffer: Any) -> tfbuffers.ReplayBuffer:
    """The buffer itself, unwrapped from `FunctionWrapped`."""
    return buffer.buffer if isinstance(buffer, FunctionWrapped) else buffer


def fill(buffer: Any, num_adds: int, start: int = 0) -> None:
    """Adds numbers `start` .. `start + num_adds - 1` of `batch`."""
    for t in range(start, start + num_adds):
        buffer.add_batch(batch(buffer.batch_size, t))


def stored_codes(batch_size: int, first: int, last: int) -> np.ndarray:
    """Codes of adds first..last (inclusive) for every segment, `[B, T]`."""
    return code(np.arange(batch_size)[:, None], np.arange(first, last + 1)[None, :])


def assert_message(error: Any, message: str) -> None:
    """Messages start with the contract's text, under tf.function too (no autograph traceback)."""
    assert str(error).startswith(message)
