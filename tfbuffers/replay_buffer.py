"""The abstract `ReplayBuffer` every tfbuffers buffer implements.

The public methods and their return conventions are TF-Agents 0.19's
(`tf_agents.replay_buffers.replay_buffer.ReplayBuffer`), so code written for a
TF-Agents buffer runs unchanged. The base class is a template: each public
method checks its arguments once, here, and delegates to a private hook. All
hooks are abstract, so a subclass that forgets one fails when it is
instantiated, not on first use.
"""

from __future__ import annotations

import abc
import collections
import numbers
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tfbuffers import _blocks, specs

BufferInfo = collections.namedtuple("BufferInfo", ["ids", "probabilities"])
BufferInfo.__doc__ = """What a buffer says about the items it returns.

Attributes:
  ids: int64 frame ids of the returned items, shaped like their outer
    dimensions (`[sample_batch_size, num_steps]` for time-stacked windows).
    Unique per stored frame; see each buffer for how they are numbered.
  probabilities: float32 probability with which each sample was drawn, shaped
    `[sample_batch_size]` (a scalar without a sample batch); `()` for a
    deterministic pass, where nothing is drawn.
"""

NOT_A_POSITIVE_INT = "{name}: expected a positive int{or_none}, got {received}"
FRAMES_GONE = (
    "deterministic pass: frames it was to read are no longer stored (overwritten or cleared since the pass "
    "began); pause adds during a single deterministic pass"
)
CLOSED = "{buffer}: the buffer is closed"
DROPPED = "{buffer}: the buffer was garbage-collected while a graph that reads or writes it still runs; keep it"
NUM_STEPS_TOO_LARGE = "num_steps: expected at most max_length={max_length}, got {received}"
NUM_STEPS_TOO_LARGE_FOR_PASS = (
    "num_steps: expected at most max_length={max_length}, got {received}: no window fits in a segment, "
    "so ALL data will be dropped by the deterministic pass"
)
NOT_CALLABLE = "{name}: expected a callable or None, got {received}"


# The library's graph code has no tensor-dependent Python control flow: autograph
# would only slow tracing down (and warn about code it cannot convert).
_not_converted = tf.autograph.experimental.do_not_convert


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"


def optional_positive_int(name: str, value: Any) -> int | None:
    """Returns `value` as a Python int (None stays None), or raises naming the argument.

    Accepts Python and numpy integers and tensors with a static integer value.

    Raises:
      TypeError: If `value` is not an integer (bools are not integers here).
      ValueError: If `value` is not positive.
    """
    return None if value is None else _positive_int(name, value, " or None")


def sample_batch_size_argument(value: Any) -> int | tf.Tensor | None:
    """`sample_batch_size` as `get_next` takes it: a positive int, None, or (in a graph) a scalar integer tensor.

    A tensor whose value is known only when the graph runs (a `tf.function` argument, as TF-Agents allows)
    comes back as an int64 scalar, checked positive when the graph runs. Anything else is
    `optional_positive_int`'s.

    Raises:
      TypeError: If `value` is not an integer, or is a tensor of another dtype or rank.
      ValueError: If `value` is not positive.
      tf.errors.InvalidArgumentError: When the graph runs, if the tensor's value is not positive.
    """
    if value is None or (type(value) is int and value > 0):
        return value
    if not (tf.is_tensor(value) and tf.get_static_value(value) is None):
        return optional_positive_int("sample_batch_size", value)
    if not value.dtype.is_integer or value.shape.rank != 0:
        raise TypeError(
            NOT_A_POSITIVE_INT.format(name="sample_batch_size", or_none=" or None", received=_describe(value))
        )
    size = tf.cast(value, tf.int64)
    message = NOT_A_POSITIVE_INT.format(name="sample_batch_size", or_none=" or None", received="").rstrip()
    with tf.control_dependencies([tf.debugging.Assert(size > 0, [message, size])]):
        return tf.identity(size)


def positive_int(name: str, value: Any) -> int:
    """Like `optional_positive_int`, but None is refused."""
    return _positive_int(name, value, "")


def _positive_int(name: str, value: Any, or_none: str) -> int:
    if type(value) is int and value > 0:  # the common case, without tf.is_tensor's cost on every sample
        return value
    static = tf.get_static_value(value) if tf.is_tensor(value) else value
    if isinstance(static, np.ndarray) and static.shape == ():
        static = static[()]
    if static is None or isinstance(static, bool | np.bool_) or not isinstance(static, numbers.Integral):
        raise TypeError(NOT_A_POSITIVE_INT.format(name=name, or_none=or_none, received=_describe(value)))
    if static <= 0:
        raise ValueError(NOT_A_POSITIVE_INT.format(name=name, or_none=or_none, received=_describe(value)))
    return int(static)


def _tuples_for_lists(structure: Any) -> Any:
    """`tf.data` treats a Python list as one tensor; datasets use tuples instead."""
    if isinstance(structure, list):
        return tuple(_tuples_for_lists(x) for x in structure)
    if isinstance(structure, dict):
        return type(structure)((k, _tuples_for_lists(v)) for k, v in structure.items())
    if isinstance(structure, tuple) and hasattr(structure, "_fields"):
        return type(structure)(*(_tuples_for_lists(x) for x in structure))
    if isinstance(structure, tuple):
        return tuple(_tuples_for_lists(x) for x in structure)
    return structure


def weak_method(method: Callable[..., Any]) -> Callable[..., Any]:
    """`method` (a bound method) called through a weak reference to its object; raises `DROPPED` once it is gone.

    For `tf.numpy_function` and `tf.function`, whose registries of callables outlive
    the graphs that use them: a buffer reached this way is freed once its user drops it.
    """
    return _WeakMethod(method)


class _WeakMethod:
    """A bound method held weakly (see `weak_method`).

    An object, not a closure: `tf.function` counts traces by the Python code it wraps, so every
    buffer's closures would count as one function traced again and again ("triggered tf.function
    retracing"); each object counts on its own, as each buffer's functions are.
    """

    def __init__(self, method: Callable[..., Any]) -> None:
        self._reference = weakref.WeakMethod(method)
        self._kind = type(method.__self__).__name__  # type: ignore[attr-defined]
        self.__name__ = method.__name__

    def __call__(self, *args: Any) -> Any:
        target = self._reference()
        if target is None:
            raise ValueError(DROPPED.format(buffer=self._kind))
        return target(*args)


def keep_alive(dataset: tf.data.Dataset, buffer: Any) -> tf.data.Dataset:
    """`dataset`, which now holds `buffer` for as long as it lives (as a TF-Agents dataset holds its buffer).

    A dataset reads its buffer through weak references (`weak_method`); a user who keeps only the
    dataset (`iter(make_buffer().as_dataset())`) keeps the buffer too.
    """
    _DATASET_SOURCES[dataset] = buffer
    return dataset


_DATASET_SOURCES: weakref.WeakKeyDictionary[tf.data.Dataset, Any] = weakref.WeakKeyDictionary()


class ReplayBuffer(tf.Module, metaclass=abc.ABCMeta):
    """Abstract base class of tfbuffers' replay buffers.

    Eagerly, methods act and return values; inside a `tf.function` they build
    the graph that does so. Subclasses implement the `_`-prefixed hooks.
    """

    @tf.__internal__.tracking.no_automatic_dependency_tracking
    def __init__(self, data_spec: Any, capacity: int, stateful_dataset: bool = False) -> None:
        """Initializes the buffer.

        Args:
          data_spec: A nest of `tf.TensorSpec` (or `tf_agents` `ArraySpec`)
            describing one stored item, without the batch dimension.
          capacity: How many items the buffer holds.
          stateful_dataset: Accepted for TF-Agents compatibility and ignored: the
            datasets read the buffer's variables or call into Python, so they
            are stateful whatever it says (TF-Agents sets a `tf.data` option
            that TensorFlow 2 no longer has, to the same effect).

        Raises:
          TypeError: If a leaf of `data_spec` is not a spec.
          ValueError: If a leaf's shape is not fully defined or its dtype is
            neither numeric nor bool.
        """
        super().__init__()
        data_spec = specs.unwrap(data_spec)
        self._fields = tuple(specs.flatten_spec(data_spec))
        self._data_spec = data_spec
        self._dataset_structure = _tuples_for_lists(data_spec)
        # Planned from the spec as given (attributes of a tf.Module hold dicts and lists in wrappers).
        self._packers = (specs.packer(data_spec), specs.packer(_tuples_for_lists(data_spec)))
        self._capacity = capacity
        self._stateful_dataset = stateful_dataset
        self._fast_path: specs.NumpyFastPath | None = None
        self._block_check: _blocks.BlockCheck | None = None
        self._closed = False

    @property
    def data_spec(self) -> Any:
        """The spec of one stored item, as given to the constructor."""
        return self._data_spec

    @property
    def capacity(self) -> int:
        """How many items the buffer holds."""
        return self._capacity

    @property
    def fields(self) -> tuple[specs.Field, ...]:
        """The leaves of `data_spec` in `tf.nest.flatten` order: `Field(path, tf.TensorSpec)` each."""
        return self._fields

    @property
    def stateful_dataset(self) -> bool:
        """The constructor's `stateful_dataset`, which changes nothing (see `__init__`)."""
        return self._stateful_dataset

    @property
    def prioritized(self) -> bool:
        """Whether the buffer samples by priority: then `update_priorities(ids, priorities)` sets them."""
        return False

    @property
    def size(self) -> int:
        """The number of frames stored, a Python int (TF-Agents' `PyUniformReplayBuffer.size`); eager only."""
        return int(self.num_frames())

    def __len__(self) -> int:
        """The number of frames stored (`size`)."""
        return self.size

    @property
    def full(self) -> bool:
        """Whether it holds `capacity` frames (items, on Reverb): every segment its `max_length` (eager only)."""
        return self.size == self.capacity

    @_not_converted
    def num_frames(self) -> Any:
        """Returns the number of frames (items) stored, an int64 scalar."""
        self._check_open()
        return self._num_frames()

    @_not_converted
    def add_batch(self, items: Any) -> Any:
        """Adds a batch of items, one per segment.

        The whole batch is checked against `data_spec` before anything is
        stored: a rejected batch leaves the buffer exactly as it was.

        Args:
          items: A nest matching `data_spec`, each leaf with the buffer's batch
            size as its leading dimension. Tensors and numpy arrays must carry
            exactly the spec's dtype; nothing is cast.

        Returns:
          The int64 ids of the stored frames, shape `[batch_size]`. (A tensor,
          not an op, so that `tf.function(buffer.add_batch)` and TF-Agents
          drivers, which group their observers' results, both accept it.)

        Raises:
          TypeError: If the structure of `items` differs from `data_spec` or a
            leaf is not array-like.
          ValueError: If a leaf's dtype, batch size or inner shape differs.
          tf.errors.InvalidArgumentError: Inside a graph, when a shape unknown at
            trace time turns out wrong.
        """
        self._check_open()
        if self._fast_path is None:
            self._fast_path = specs.NumpyFastPath(self._data_spec, self._fields, self._add_batch_outer_dims())
        leaves = self._fast_path.leaves(items)
        if leaves is not None:
            return self._add_batch(leaves, [])
        leaves, deferred = specs.check_batch(items, self._data_spec, self._fields, self._add_batch_outer_dims())
        return self._add_batch(leaves, deferred)

    @_not_converted
    def extend(self, items: Any) -> Any:
        """Adds a block of `T` frames per segment: exactly `add_batch(items[:, t])` for `t = 0, ..., T - 1`.

        One check of the whole block and, in the segmented buffers, one write per field (two where the ring
        wraps): a rollout, a dataset or another buffer's contents go in at the speed of an array copy, with the
        ids, windows, record of episode ends and priorities of the `T` adds. Eagerly or inside a `tf.function`
        (where `T` must be known when traced). TF-Agents has no such method.

        Args:
          items: A nest matching `data_spec`, each leaf `[batch_size, T, *shape]` (batch-major, like the
            `[B, T]` trajectories of TF-Agents), one `T` (0 or more) for all. Exactly the spec's dtypes, as
            `add_batch`.

        Returns:
          The int64 ids of the stored frames, `[batch_size, T]`.

        Raises:
          TypeError: If the structure differs from `data_spec` or a leaf is not array-like.
          ValueError: Naming the field, if a leaf's number of frames differs from the first leaf's (or no leaf
            says it), or its dtype, batch size or inner shape differs. The buffer is unchanged then.
        """
        self._check_open()
        if self._block_check is None:
            self._block_check = _blocks.BlockCheck(self._data_spec, self._fields, self._add_batch_outer_dims())
        return self._extend(*self._block_check(items))

    @_not_converted
    def get_next(
        self, sample_batch_size: int | None = None, num_steps: int | None = None, time_stacked: bool = True
    ) -> tuple[Any, BufferInfo]:
        """Samples an item, or a batch of items or windows, from the buffer.

        Args:
          sample_batch_size: Number of samples; None returns one sample without
            a batch dimension. Inside a `tf.function` also a scalar integer
            tensor known only when the graph runs (as TF-Agents allows); the
            batch dimension is then unknown until it runs.
          num_steps: Length of the windows of consecutive frames to sample; None
            returns single frames without a time dimension.
          time_stacked: With `num_steps`, stack the window on a time axis
            (`[B, T, ...]`, or `[T, ...]`); otherwise return a tuple of
            `num_steps` items (and a tuple of ids).

        Returns:
          `(items, BufferInfo(ids, probabilities))`.

        Raises:
          TypeError: If an argument is not an int (or None).
          ValueError: If an argument is not positive, or `num_steps` exceeds
            what one segment holds.
          tf.errors.InvalidArgumentError: If the buffer holds fewer than
            `num_steps` frames per segment (or is empty).
        """
        self._check_open()
        sample_batch_size = sample_batch_size_argument(sample_batch_size)
        num_steps = self._check_num_steps(num_steps)
        items, info = self._get_next(sample_batch_size, num_steps)
        if num_steps is not None and not time_stacked:
            axis = 0 if sample_batch_size is None else 1
            items = _split_time(items, num_steps, axis)
            info = BufferInfo(_split_time(info.ids, num_steps, axis), info.probabilities)
        return items, info

    @_not_converted
    def as_dataset(
        self,
        sample_batch_size: int | None = None,
        num_steps: int | None = None,
        num_parallel_calls: int | None = None,
        sequence_preprocess_fn: Callable[[Any], Any] | None = None,
        single_deterministic_pass: bool = False,
    ) -> tf.data.Dataset:
        """Returns a `tf.data.Dataset` of `(items, BufferInfo)` from the buffer.

        By default the dataset is infinite and samples as `get_next` does; it
        reads the buffer as it is when each element is made, so it sees new data
        without being rebuilt: no element is read before `next` asks for it
        unless the pipeline reads ahead (`prefetch`, `num_parallel_calls`). The
        TF buffers' datasets turn off tf.data's automatic map parallelization and
        prefetch injection to keep it so (a pipeline may turn them on again with
        its own `tf.data.Options`). With `single_deterministic_pass=True` it visits
        the stored frames once, in a fixed order (see the buffer's docstring).

        Nests in the data spec that are lists come back as tuples, since
        `tf.data` would read a list as one tensor.

        Args:
          sample_batch_size: As in `get_next`.
          num_steps: As in `get_next`.
          num_parallel_calls: How many elements to make in parallel; None for
            one at a time, `tf.data.AUTOTUNE` to let tf.data choose.
          sequence_preprocess_fn: Applied to the items of every element (for
            example `agent.preprocess_sequence`). TF-Agents' uniform buffers
            refuse it; tfbuffers applies it.
          single_deterministic_pass: One pass over the stored frames in a fixed
            order instead of endless sampling.

        Returns:
          The dataset.

        Raises:
          TypeError: If an argument has the wrong type.
          ValueError: If an argument is out of range.
        """
        self._check_open()
        sample_batch_size = optional_positive_int("sample_batch_size", sample_batch_size)
        num_steps = self._check_num_steps(
            num_steps, NUM_STEPS_TOO_LARGE_FOR_PASS if single_deterministic_pass else None
        )
        if num_parallel_calls is not None and num_parallel_calls != tf.data.AUTOTUNE:
            num_parallel_calls = positive_int("num_parallel_calls", num_parallel_calls)
        if sequence_preprocess_fn is not None and not callable(sequence_preprocess_fn):
            raise TypeError(
                NOT_CALLABLE.format(name="sequence_preprocess_fn", received=_describe(sequence_preprocess_fn))
            )
        if single_deterministic_pass:
            dataset = self._single_deterministic_pass_dataset(sample_batch_size, num_steps, num_parallel_calls)
        else:
            dataset = self._as_dataset(sample_batch_size, num_steps, num_parallel_calls)
        if sequence_preprocess_fn is not None:
            dataset = dataset.map(
                lambda items, info: (sequence_preprocess_fn(items), info), num_parallel_calls=num_parallel_calls
            )
        return dataset

    @_not_converted
    def gather_all(self) -> Any:
        """Returns every stored item, `[batch_size, frames, ...]`, oldest first per segment."""
        self._check_open()
        return self._gather_all()

    @_not_converted
    def clear(self) -> None:
        """Empties the buffer."""
        self._check_open()
        self._clear()

    def close(self) -> None:
        """Releases the buffer's storage; later calls raise. Closing twice is allowed.

        Datasets made by `as_dataset` keep what they read alive until they are
        dropped themselves. `with buffer:` closes it on leaving the block.
        """
        if not self._closed:
            self._closed = True
            self._close()

    @property
    def closed(self) -> bool:
        """Whether `close()` was called."""
        return self._closed

    def __enter__(self) -> ReplayBuffer:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(CLOSED.format(buffer=type(self).__name__))

    def _close(self) -> None:
        """Releases storage, servers, threads and files (nothing by default)."""

    def _check_num_steps(self, num_steps: Any, message: str | None = None) -> int | None:
        num_steps = optional_positive_int("num_steps", num_steps)
        limit = self._max_num_steps()
        if num_steps is not None and num_steps > limit:
            raise ValueError((message or NUM_STEPS_TOO_LARGE).format(max_length=limit, received=num_steps))
        return num_steps

    def _pack(self, leaves: Sequence[Any]) -> Any:
        return self._packers[0](leaves)

    def _pack_for_dataset(self, leaves: Sequence[Any]) -> Any:
        return self._packers[1](leaves)

    # Hooks.

    @abc.abstractmethod
    def _add_batch_outer_dims(self) -> tuple[int, ...]:
        """The leading dimensions `add_batch` expects on every leaf."""

    @abc.abstractmethod
    def _max_num_steps(self) -> int:
        """The longest window that can be sampled."""

    @abc.abstractmethod
    def _num_frames(self) -> Any:
        """Returns the number of stored frames."""

    @abc.abstractmethod
    def _add_batch(self, leaves: list[Any], deferred: list[specs.DeferredShapeCheck]) -> Any:
        """Stores checked leaves (in `tf.nest.flatten` order); returns their ids."""

    def _extend(self, leaves: list[Any], deferred: list[specs.DeferredShapeCheck], frames: int) -> Any:
        """Stores a checked block (leaves `[*outer, frames, ...]`); returns the ids. By default one add per frame.

        Eagerly (every shape known: `deferred` is empty); a buffer that runs in graphs extends it.
        """
        assert not deferred, "a graph's block: the buffer's own _extend"
        ids = [self._add_batch(_blocks.frame(leaves, t), []) for t in range(frames)]
        if not ids:
            return np.zeros([*self._add_batch_outer_dims(), 0], np.int64)
        return tf.stack(ids, axis=1) if tf.is_tensor(ids[0]) else np.stack(ids, axis=1)

    @abc.abstractmethod
    def _get_next(self, sample_batch_size: int | None, num_steps: int | None) -> tuple[Any, BufferInfo]:
        """Samples; windows always time-stacked (the base class splits them)."""

    @abc.abstractmethod
    def _as_dataset(
        self, sample_batch_size: int | None, num_steps: int | None, num_parallel_calls: int | None
    ) -> tf.data.Dataset:
        """The endless sampling dataset."""

    @abc.abstractmethod
    def _single_deterministic_pass_dataset(
        self, sample_batch_size: int | None, num_steps: int | None, num_parallel_calls: int | None
    ) -> tf.data.Dataset:
        """The single deterministic pass dataset."""

    @abc.abstractmethod
    def _gather_all(self) -> Any:
        """Returns all stored items."""

    @abc.abstractmethod
    def _clear(self) -> None:
        """Empties the buffer."""


def _split_time(structure: Any, num_steps: int, axis: int) -> tuple[Any, ...]:
    """A time-stacked nest as a tuple of `num_steps` nests (numpy or tensors)."""
    if axis == 0:
        return tuple(tf.nest.map_structure(lambda x, t=t: x[t], structure) for t in range(num_steps))
    return tuple(tf.nest.map_structure(lambda x, t=t: x[:, t], structure) for t in range(num_steps))
