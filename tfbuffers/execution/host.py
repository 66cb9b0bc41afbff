"""The host bridge: how a graph calls a buffer whose frames live on the host.

The py buffers keep numpy arrays, the Reverb buffer a client of a server; a buffer hosted in
another process would keep a handle. Inside a `tf.function` or a `tf.data` pipeline each of their
calls (add, sample, gather, clear, count) becomes one stateful `tf.numpy_function` op that runs
when the graph runs, never when it is traced. This module writes that once, and `HostExecution`
makes a buffer's hooks of it:

- `call(method, inputs, dtypes, shapes)`: `method(*inputs)` as such an op. The op reaches the
  method's buffer through a weak reference (TensorFlow keeps the functions given to
  `numpy_function` for as long as it pleases): a buffer its user dropped is freed, and a graph
  still running it says so (`DROPPED`). Outputs get their static shapes.
- `sample(sample_arrays, fields, sample_batch_size, num_steps)`: a sample drawn on the host. A
  tensor `sample_batch_size` (known when the graph runs) becomes an input of the op; a refusal
  the host raises as `tf.errors.InvalidArgumentError` (an empty buffer) reaches the graph with its
  own message first, as a Python `ValueError` raised there would.

>>> import numpy as np
>>> import tensorflow as tf
>>> class Counter:
...     def __init__(self):
...         self.count = np.int64(0)
...     def add(self, n):
...         self.count += n
...         return self.count
>>> counter = Counter()
>>> step = tf.function(lambda n: call(counter.add, [n], tf.int64, []))
>>> int(step(tf.constant(2, tf.int64))), int(step(tf.constant(3, tf.int64)))
(2, 5)
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tfbuffers import _xla
from tfbuffers.replay_buffer import BufferInfo, weak_method
from tfbuffers.specs import DeferredShapeCheck, Field

HOST_IN_XLA = (
    "{owner}: its frames live on the host, reached through tf.numpy_function, which XLA cannot compile: "
    "inside tf.function(jit_compile=True) expected TFUniformReplayBuffer or TFPrioritizedReplayBuffer, or a call "
    "outside the compiled function"
)


def _check_not_compiled(method: Callable[..., Any]) -> None:
    """Refuses, when traced, a host call in an XLA program (TensorFlow's own error names no buffer)."""
    if _xla.compiling():
        owner = getattr(method, "__self__", method)
        raise TypeError(HOST_IN_XLA.format(owner=type(owner).__name__))


def call(method: Callable[..., Any], inputs: Sequence[Any], dtypes: Any, shapes: Any) -> Any:
    """`method(*inputs)` (a bound method) as a stateful op that runs when the graph runs.

    `dtypes` is one dtype (one output, checked against `shapes`, its shape, when the op runs) or a
    list (outputs given `shapes`, one per output, as static shapes).

    Raises:
      TypeError: In an XLA program (`tf.function(jit_compile=True)`), when traced: `HOST_IN_XLA`.
    """
    _check_not_compiled(method)
    outputs = tf.numpy_function(weak_method(method), list(inputs), dtypes, stateful=True)
    if not isinstance(dtypes, list | tuple):
        return tf.ensure_shape(outputs, shapes)
    if tf.is_tensor(outputs):  # eagerly, a list of one output comes back as the tensor alone
        outputs = [outputs]
    for output, shape in zip(outputs, shapes):
        output.set_shape(shape)
    return outputs


def add_when_run(add_arrays: Callable[..., np.ndarray], leaves: Sequence[Any], batch_size: int) -> tf.Tensor:
    """An `add_batch` inside a graph: the host's add, run when the graph runs, not when it is traced.

    `add_arrays(*arrays)` is a bound method returning the `[batch_size]` ids. The host checks the values
    again as it stores them, so shapes unknown at trace time are checked too.
    """
    return call(add_arrays, [tf.convert_to_tensor(leaf) for leaf in leaves], tf.int64, [batch_size])


def now_or_when_run(method: Callable[[], Any]) -> Any:
    """`method()` (a bound method returning an int64 scalar) now when eager; inside a graph, when it runs."""
    if tf.executing_eagerly():
        return method()
    return call(method, [], tf.int64, [])


def gather_all(gather_arrays: Callable[[], list[np.ndarray]], fields: Sequence[Field], batch_size: int) -> list[Any]:
    """The leaves of `gather_arrays()` (every frame, `[batch_size, frames, ...]`): now eagerly, in a graph when run."""
    if tf.executing_eagerly():
        return gather_arrays()
    outer = tf.TensorShape([batch_size, None])
    return call(gather_arrays, [], [f.spec.dtype for f in fields], [outer.concatenate(f.spec.shape) for f in fields])


def arrays(leaves: Sequence[Any]) -> list[np.ndarray]:
    """An eager `add_batch`'s checked leaves as numpy arrays (eager tensors are the only others there)."""
    return [leaf if isinstance(leaf, np.ndarray) else np.asarray(leaf.numpy()) for leaf in leaves]


def sample(
    sample_arrays: Callable[[int | None, int | None], tuple[list[np.ndarray], np.ndarray, np.ndarray]],
    fields: Sequence[Field],
    sample_batch_size: Any,
    num_steps: int | None,
    *,
    ids_per_step: bool = True,
) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]:
    """`(leaves, ids, probabilities)` of `sample_arrays(sample_batch_size, num_steps)` run on the host in the graph.

    `sample_arrays` (a bound method) returns `(leaves, ids, probabilities)`: the leaves of `fields`
    (shaped `[batch?, steps?] + spec`), the ids and the probabilities. The ids are shaped like the
    leaves' outer dimensions (`ids_per_step`: a frame id per step) or `[batch?]` (an id per window,
    Reverb's item keys); probabilities `[batch?]`.

    Raises:
      TypeError: In an XLA program (`tf.function(jit_compile=True)`), when traced: `HOST_IN_XLA`.
    """
    _check_not_compiled(sample_arrays)
    host = weak_method(sample_arrays)
    static_size = None if tf.is_tensor(sample_batch_size) else sample_batch_size  # the graph's tensor not kept

    def draw(*size: np.ndarray) -> list[np.ndarray]:
        try:
            leaves, ids, probabilities = host(int(size[0]) if size else static_size, num_steps)
        except tf.errors.InvalidArgumentError as error:
            # numpy_function turns a ValueError, not an OpError, into InvalidArgumentError with the message first.
            raise ValueError(error.message) from None
        return [*leaves, ids, probabilities]

    inputs = [sample_batch_size] if tf.is_tensor(sample_batch_size) else []
    batch = [] if sample_batch_size is None else [static_size]
    outer = batch + ([] if num_steps is None else [num_steps])
    dtypes = [*(field.spec.dtype for field in fields), tf.int64, tf.float32]
    outputs = tf.numpy_function(draw, inputs, dtypes, stateful=True)
    for leaf, field in zip(outputs, fields):
        leaf.set_shape(tf.TensorShape(outer).concatenate(field.spec.shape))
    ids = tf.ensure_shape(outputs[-2], outer if ids_per_step else batch)
    probabilities = tf.ensure_shape(outputs[-1], batch)
    return outputs[: len(fields)], ids, probabilities


class HostExecution(metaclass=abc.ABCMeta):
    """The host execution mode: a buffer's `ReplayBuffer` hooks made of its calls on numpy arrays.

    A buffer whose frames live on the host (the py buffers' arrays, a Reverb or Ray client's server) says
    what each call does on numpy arrays, and this mix-in runs it eagerly at once, or inside a graph as one
    op when the graph runs (`call`):

    - `_add_value(arrays)`: one frame per segment (checked leaves, batch first) → the `[batch_size]` ids;
    - `_extend_value(arrays, frames)`: a block, `[batch_size, frames, ...]` → the `[batch_size, frames]` ids (one
      `_add_value` per frame unless overridden);
    - `_sample_arrays(sample_batch_size, num_steps)` → `(leaves, ids, probabilities)` (`sample`'s draw);
    - `_num_frames_value()`, `_clear_value()` → an int64 scalar;
    - `_gather_all_arrays()` → every frame's leaves, `[batch_size, frames, ...]`.

    `IDS_PER_STEP`: whether `BufferInfo.ids` has an id per frame of a window or one per window.
    """

    IDS_PER_STEP = True
    # What the buffer (a `ReplayBuffer`) has.
    _fields: tuple[Field, ...]
    batch_size: Any
    _pack: Callable[..., Any]
    add_batch: Callable[..., Any]
    extend: Callable[..., Any]
    _add_batch_outer_dims: Callable[[], tuple[int, ...]]

    @abc.abstractmethod
    def _add_value(self, arrays: list[np.ndarray]) -> np.ndarray:
        """Adds one frame per segment (checked leaves, batch first); returns the `[batch_size]` ids."""

    @abc.abstractmethod
    def _sample_arrays(
        self, sample_batch_size: int | None, num_steps: int | None
    ) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        """`(leaves, ids, probabilities)`: a sample drawn on the host (`sample`'s draw)."""

    @abc.abstractmethod
    def _num_frames_value(self) -> np.int64:
        """What `num_frames()` returns."""

    @abc.abstractmethod
    def _clear_value(self) -> np.int64:
        """Empties the buffer; returns 0."""

    @abc.abstractmethod
    def _gather_all_arrays(self) -> list[np.ndarray]:
        """Every stored frame's leaves, `[batch_size, frames, ...]`, oldest first."""

    def _num_frames(self) -> Any:
        return now_or_when_run(self._num_frames_value)

    def _add_batch(self, leaves: list[Any], deferred: list[DeferredShapeCheck]) -> Any:
        if not tf.executing_eagerly():
            return add_when_run(self._add_arrays, leaves, self.batch_size)
        return self._add_value(arrays(leaves))

    def _add_arrays(self, *values: np.ndarray) -> np.ndarray:
        # A graph's add when it runs: checked again, for the shapes unknown when it was traced.
        return np.asarray(self.add_batch(self._pack(values)))

    def _extend(self, leaves: list[Any], deferred: list[DeferredShapeCheck], frames: int) -> Any:
        if not tf.executing_eagerly():  # the block's add when the graph runs, checked again there
            outer = [*self._add_batch_outer_dims(), frames]
            return call(self._extend_arrays, [tf.convert_to_tensor(leaf) for leaf in leaves], tf.int64, outer)
        return self._extend_value(arrays(leaves), frames)

    def _extend_arrays(self, *values: np.ndarray) -> np.ndarray:
        return np.asarray(self.extend(self._pack(values)))

    def _extend_value(self, arrays: list[np.ndarray], frames: int) -> np.ndarray:
        """Adds a checked block (`[batch_size, frames, ...]` leaves); returns the `[batch_size, frames]` ids.

        One `_add_value` per frame by default; a buffer that writes blocks at once (the py buffers) overrides it.
        """
        return super()._extend(arrays, [], frames)  # type: ignore[misc]

    def _get_next(self, sample_batch_size: Any, num_steps: int | None) -> tuple[Any, BufferInfo]:
        if tf.executing_eagerly():
            leaves, ids, probabilities = self._sample_arrays(sample_batch_size, num_steps)
        else:
            draw = self._sample_arrays, self._fields, sample_batch_size, num_steps
            leaves, ids, probabilities = sample(*draw, ids_per_step=self.IDS_PER_STEP)
        return self._pack(leaves), BufferInfo(ids, probabilities)

    def _gather_all(self) -> Any:
        return self._pack(gather_all(self._gather_all_arrays, self._fields, self.batch_size))

    def _clear(self) -> None:
        now_or_when_run(self._clear_value)
