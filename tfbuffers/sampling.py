"""Samplers: which windows a sample draws, written once for numpy and TensorFlow.

A sampler turns the add counter into drawn windows: their frame ids, their storage rows and the exact
probability of each draw. It reads nothing but the counter, the state it keeps and, with episode
boundaries, the step-type column (`Sampler.step_types`), so a buffer swaps its sampler without touching
storage, locking or datasets: the TF buffer calls it inside its lock-free checked read, the py buffer under
its lock, and both buffers' `get_next`, `as_dataset` and tf.function calls through those same reads.

Its state lives in the buffer's storage (`Sampler.bind`) and follows the buffer's events (`before_add`,
`on_add`, `on_clear`, `on_restore`, `on_update_priorities`), made in the same step as the rows and counter
each goes with: every sampler keeps the adds' record of episode ends with episode boundaries
(`Sampler.near`), and `PrioritizedSampler` the priorities and their sum tree.

The formulas take a `Backend` (`TENSORFLOW`, or `numpy_backend(rng)`), as the ring arithmetic of
`tfbuffers._ring` takes its ops namespace: one definition serves both kinds of buffer.

`TFUniformReplayBuffer` and `PyUniformReplayBuffer` take any sampler: `sampler=` a callable
`(buffer_name, batch_size, max_length) -> Sampler` (a `Sampler` subclass itself, for example; the
default is `UniformSampler`). The prioritized buffers are the uniform ones with a `PrioritizedSampler`. A
sampler of the newest frames only, for example (docs/development.md goes through it):

>>> import numpy as np, tensorflow as tf
>>> from tfbuffers import PyUniformReplayBuffer, TFUniformReplayBuffer
>>> class NewestAdds(Sampler):  # uniform over the windows that start in each segment's newest 2 adds
...     keeps_episode_boundaries = False
...     def sample(self, backend, added, sample_batch_size, num_steps):
...         shape = [] if sample_batch_size is None else [sample_batch_size]
...         first, windows, checks = self.stored_windows(backend, added, num_steps)
...         low = backend.ops.maximum(first, first + windows - 2 * self.batch_size)
...         count = first + windows - low  # the windows' first ids are low .. first + windows - 1
...         starts = backend.uniform_integers(shape + [1], low, first + windows, checks)
...         ids = starts + backend.ops.arange(num_steps or 1, self.batch_size)
...         ids = ids if num_steps else ids[..., 0]
...         rows = ids % (self.max_length * self.batch_size)  # tfbuffers._ring's layout
...         return Sample(ids, rows, backend.full_inverse(shape, count))
>>> for buffer in (PyUniformReplayBuffer({"x": tf.TensorSpec([], tf.int64)}, batch_size=2, max_length=4,
...                                      sampler=NewestAdds, seed=0),
...                TFUniformReplayBuffer({"x": tf.TensorSpec([], tf.int64)}, batch_size=2, max_length=4,
...                                      sampler=NewestAdds)):
...     for t in range(6):
...         _ = buffer.add_batch({"x": np.array([t, 100 + t])})
...     items, info = buffer.get_next(sample_batch_size=50)
...     print(sorted(set(np.asarray(items["x"]).tolist())), float(np.asarray(info.probabilities)[0]))
[4, 5, 104, 105] 0.25
[4, 5, 104, 105] 0.25
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable
from typing import Any, NamedTuple, cast

import numpy as np
import tensorflow as tf

from tfbuffers import _episodes, _ring, _sum_tree, prioritized
from tfbuffers._factories import made

EMPTY = "{buffer} is empty. Make sure to add items before sampling the buffer."
NO_PRIORITY = (
    "{buffer}: every window that can be drawn has priority 0. A priority of 0 means never drawn: "
    "give some stored frame a priority above 0 with update_priorities, or add frames."
)
NO_EPISODE_WINDOW = (
    "{buffer}: no stored window of {num_steps} frames lies within one episode (episode_boundaries is on): "
    "add frames, or sample fewer steps"
)
NOT_A_SAMPLER = (
    "sampler: expected a callable (buffer_name, batch_size, max_length) -> tfbuffers.sampling.Sampler, got {received}"
)
PRIORITIZED_SAMPLER = (
    "sampler: expected a sampler that draws without priorities (a uniform buffer keeps none), got {sampler}, "
    "which is prioritized: use TFPrioritizedReplayBuffer or PyPrioritizedReplayBuffer"
)
NO_EPISODES = (
    "sampler: {sampler} does not keep episode boundaries (keeps_episode_boundaries is False); expected "
    "episode_boundaries=False with it, or a sampler that keeps them"
)
NOT_ENOUGH_FRAMES = (
    "num_steps: expected at most the frames one segment holds, got {num_steps}: {buffer} holds fewer than "
    "{num_steps} frame(s) per segment so far. Add items before sampling windows of {num_steps}."
)


class Backend(NamedTuple):
    """What a sampler needs of an array library, beyond the ring's `ops`."""

    ops: _ring.Ops
    uniform_integers: Callable[[list[int], Any, Any, list[Any]], Any]
    """`(shape, low, high, after)`: int64 uniform in `[low, high)`, drawn once the `after` checks passed (which
    make sure that `high > low`: in TensorFlow the op fails otherwise)."""
    require: Callable[[Any, Any], Any]
    """`(condition, message)`: raises `InvalidArgumentError(message)` unless `condition`; in TensorFlow it
    returns the check, for `uniform_integers`' `after`."""
    select: Callable[[Any, str, str], Any]
    """`(condition, a, b)`: `a` if `condition` else `b` (a string tensor in TensorFlow)."""
    full_inverse: Callable[[list[int], Any], Any]
    """`(shape, count)`: a float32 array of `1 / count` (computed in float64)."""
    draw_leaves: Callable[[Any, int, list[int], list[Any], Any, Any], Any]
    """`(tree, capacity, shape, after, total, mask)`: sum-tree leaves drawn in proportion to their values, none
    in `mask`, once the `after` checks passed (`total`: the unmasked leaves' sum)."""
    tree: _sum_tree.Ops
    """The sum tree's functions on this backend."""
    float32: Callable[[Any], Any]
    """`(x)`: `x` as float32 (probabilities)."""
    uniform_floats: Callable[[list[int], list[Any]], Any]
    """`(shape, after)`: float64 uniform in `[0, 1)`, drawn once the `after` checks passed."""
    cumsum: Callable[[Any], Any]
    """`(x)`: the running sums along axis 0 (inclusive)."""
    searchsorted: Callable[[Any, Any], Any]
    """`(sorted, values)`: int64 positions of the first entries of the 1-D `sorted` above each value."""
    concat: Callable[[list[Any]], Any]
    """`(arrays)`: concatenated along axis 0."""
    reshape: Callable[[Any, list[int]], Any]
    """`(x, shape)`: `x` reshaped."""
    cast: Callable[[Any, Any], Any]
    """`(x, dtype)`: `x` as the numpy `dtype` (`np.int64`, `np.float64`)."""
    boolean_mask: Callable[[Any, Any], Any]
    """`(x, mask)`: the entries of `x` where `mask` (1-D) is True."""
    sum: Callable[[Any], Any]
    """`(x)`: the sum along axis 0 (0 for none)."""
    size: Callable[[Any], Any]
    """`(x)`: the number of elements (an int, or an int64 scalar in TensorFlow)."""


def _tf_uniform_integers(shape: list[int], low: Any, high: Any, after: list[Any]) -> tf.Tensor:
    with tf.control_dependencies(after):
        return tf.random.uniform(shape, low, high, dtype=tf.int64)


def _tf_uniform_floats(shape: list[int], after: list[Any]) -> tf.Tensor:
    with tf.control_dependencies(after):
        return tf.random.uniform(shape, dtype=tf.float64)


def _tf_require(condition: Any, message: Any) -> Any:
    # A plain Assert with string data needs no tf.cond guard: fewer ops per sample.
    return tf.debugging.Assert(condition, [message])


def _tf_draw_leaves(tree: Any, capacity: int, shape: list[int], after: list[Any], total: Any, mask: Any) -> Any:
    with tf.control_dependencies(after):
        targets = tf.random.uniform(shape, dtype=tf.float64) * total
    if mask is None:
        return _sum_tree.find_wide(tree, capacity, targets)
    return _sum_tree.find(_sum_tree.TENSORFLOW, tree, capacity, targets, mask)


TENSORFLOW = Backend(
    ops=_ring.TENSORFLOW,
    uniform_integers=_tf_uniform_integers,
    require=_tf_require,
    select=lambda condition, a, b: tf.where(condition, a, b),
    full_inverse=lambda shape, count: tf.fill(shape, tf.cast(1.0 / tf.cast(count, tf.float64), tf.float32)),
    draw_leaves=_tf_draw_leaves,
    tree=_sum_tree.TENSORFLOW,
    float32=lambda x: tf.cast(x, tf.float32),
    uniform_floats=_tf_uniform_floats,
    cumsum=lambda x: tf.cumsum(x, axis=0),
    searchsorted=lambda sorted_, values: tf.searchsorted(sorted_, values, side="right", out_type=tf.int64),
    concat=lambda arrays: tf.concat(arrays, 0),
    reshape=tf.reshape,
    cast=lambda x, dtype: tf.cast(x, tf.as_dtype(dtype)),
    boolean_mask=tf.boolean_mask,
    sum=lambda x: tf.reduce_sum(x, axis=0),
    size=lambda x: tf.size(x, out_type=tf.int64),
)


def _np_require(condition: Any, message: Any) -> None:
    if not condition:
        raise tf.errors.InvalidArgumentError(None, None, message)


def numpy_backend(rng: np.random.Generator) -> Backend:
    """The numpy backend, drawing from `rng`."""
    return Backend(
        ops=_ring.NUMPY,
        uniform_integers=lambda shape, low, high, after: rng.integers(low, high, size=shape, dtype=np.int64),
        require=_np_require,
        select=lambda condition, a, b: a if condition else b,
        full_inverse=lambda shape, count: np.full(shape, 1.0 / count, np.float32),
        draw_leaves=lambda tree, capacity, shape, after, total, mask: _sum_tree.draw_numpy(
            tree, capacity, rng.random, shape, mask
        ),
        tree=_sum_tree.NUMPY,
        float32=lambda x: np.asarray(x, np.float32),
        uniform_floats=lambda shape, after: np.asarray(rng.random(shape)),
        cumsum=lambda x: np.cumsum(x, axis=0),
        searchsorted=lambda sorted_, values: np.searchsorted(sorted_, values, side="right").astype(np.int64),
        concat=lambda arrays: np.concatenate(arrays, 0),
        reshape=np.reshape,
        cast=lambda x, dtype: np.asarray(x, dtype),
        boolean_mask=lambda x, mask: x[mask],
        sum=lambda x: np.sum(x, axis=0),
        size=np.size,
    )


class Sample(NamedTuple):
    """Drawn windows: frame ids and storage rows `[*batch, num_steps]` (no time axis without num_steps)."""

    ids: Any
    rows: Any
    probabilities: Any
    valid: Any = True
    """Whether the state the draw read allows it (a prioritized buffer: some window weighs more than 0).
    The numpy backend raises at once instead; in TensorFlow the caller asserts it, with `invalid_message`, once
    it knows the read was not torn by a concurrent writer (a torn read is read again)."""
    invalid_message: str = ""
    mass: Any = None
    """The weight of every window the draw chose among: their count (uniform) or the sum of their first frames'
    weights (prioritized); a window's probability is its weight over it. None from a sampler that does not say.
    What a buffer made of several rings draws each ring in proportion to (`tfbuffers.ray_replay_buffer`)."""


def valid_window_starts(
    backend: Backend, step_types: Any, added: Any, max_length: int, batch_size: int, num_steps: int
) -> Any:
    """`[capacity]` bool by storage row: whether the window of `num_steps` frames starting there can be drawn.

    It can when it is stored (one segment, consecutive frames, none past the newest)
    and crosses no episode boundary: none of its frames but the last is a LAST
    frame, none but the first a FIRST frame. A few vectorised passes over the
    step-type column (`[capacity]`, storage row order), whatever the batch: the
    prioritized sampler's exact pass when rejection kept too few draws.
    """
    ops = backend.ops
    positions = ops.arange(max_length)
    windows = _ring.windows_per_segment(ops, added, max_length, num_steps)
    # A window starting `j` adds after the oldest frame is stored if j < windows; position p holds add oldest + j.
    stored = (positions - _ring.oldest_add(ops, added, max_length) % max_length) % max_length < windows
    types = backend.reshape(step_types, [max_length, batch_size])
    following = backend.concat([types[1:], types[:1]])  # the next position's frames (the newest's is never read)
    cut = _episodes.is_cut(types, following)  # a boundary between position p and p + 1
    if num_steps == 2:
        crossing = cut
    else:
        # Boundaries among positions p .. p + num_steps - 2 (circular), from one running sum.
        cuts = backend.cast(cut, np.int32)
        running = backend.cumsum(backend.concat([cuts[:1] * 0, cuts, cuts[: num_steps - 2]]))
        crossing = running[num_steps - 1 : num_steps - 1 + max_length] - running[:max_length] > 0
    return backend.reshape(stored[:, None] & ~crossing, [-1])


class Sampler(abc.ABC):
    """Draws windows of a segmented ring (see `tfbuffers._ring` for the layout).

    Windows never leave a segment, never read past the newest frame nor into an
    overwritten row: a sampler picks among the windows the counter says are stored.
    With `step_types` and `near` set (a buffer's `episode_boundaries`), windows of
    more than one frame never cross an episode boundary either: draws are uniform
    (or in proportion to priority) over the windows within one episode, with exact
    probabilities. The adds' record of episode ends (`tfbuffers._episodes`) gives
    how many windows (how much weight) cross a boundary; draws over every stored
    window that land on one are left out (rejection, over a number of draws fixed
    before drawing, so the kept ones follow the valid windows' proportions
    exactly). Should too few be kept, or windows be longer than the record covers,
    the batch is drawn in one pass over every row instead: the valid starts from
    the step types, a running sum and a search (exact too, but O(capacity)).
    """

    step_types: Callable[[], Any] | None = None
    """Returns the step-type column (`[capacity]`, storage row order), or None: no episode boundaries (set by
    `bind`)."""
    near: Callable[[], _episodes.Near] | None = None
    """Returns the adds' record of episode ends (see `tfbuffers._episodes`), with `step_types` (set by `bind`)."""

    keeps_episode_boundaries = True
    """Whether its draws honour `step_types` and `near` (a buffer with `episode_boundaries` refuses one that
    does not)."""
    prioritized = False
    """Whether it draws by priority (the buffer then has `update_priorities` to set them)."""

    def __init__(self, buffer_name: str, batch_size: int, max_length: int) -> None:
        """A sampler for a ring of `batch_size` segments of `max_length` rows; errors name `buffer_name`."""
        self.buffer_name = buffer_name
        self.batch_size = batch_size  # the ring's segments
        self.max_length = max_length  # rows per segment
        self._episode_record: Any = None  # the adds' record of episode ends (`bind`): HostRecord or GraphRecord
        self._step_field: int | None = None
        self._graph = False
        self._cut: Any = None  # a host add's episode cuts, from `before_add` to `on_add`

    # The sampler's state and the events that change it. A buffer binds its sampler to its storage once, then
    # tells it of every add, clear, restore and priority update, in the same step as the rows and counter each
    # goes with: under the py buffer's lock (numpy state changes in place; the methods return []), or inside
    # the TF buffer's writers' lock (the methods return the ops to run; `tfbuffers._tf_concurrency`). What a
    # sampler keeps lives in the storage's extras (`storage.extra`), so that states, files, checkpoints and
    # memory-mapped directories carry it. The base class keeps the record of episode ends, with episode
    # boundaries; a sampler of its own state extends the events and calls `super()` first.

    def bind(self, storage: Any, backend: Backend, step_field: int | None) -> None:
        """Keeps the sampler's state in `storage` (a `tfbuffers.storage.Storage` or `GraphStorage`).

        Called once by the buffer, after its storage is made (inside its device and name scope for TF).

        Args:
          storage: The buffer's storage: the sampler's extras are made there (`storage.extra`), in a fixed order.
          backend: `TENSORFLOW` for a TF buffer (the events return ops), a numpy backend for a py buffer.
          step_field: The step-type field's index with episode boundaries, else None. Then `step_types` reads
            its column and `near` the adds' record of episode ends, which the base class keeps.
        """
        self._graph = backend is TENSORFLOW
        self._step_field = step_field
        if step_field is None:
            return
        # Closures over the storage and the record, not the sampler: dropping the buffer frees them at once.
        self.step_types = lambda: storage.column(step_field)
        if self._graph:
            record: Any = _episodes.GraphRecord(storage, step_field, self.batch_size, self.max_length)
            self.near = record.read
        else:
            record = _episodes.HostRecord(storage, step_field, self.batch_size, self.max_length)
            self.near = lambda: record.record
        self._episode_record = record

    def before_add(self, added: Any, step_types: Any) -> list[Any]:
        """Add number `added` (the counter before it) is about to write its rows; it holds `step_types`.

        What the add overwrites and the previous frames are read here. `step_types`: the add's step types
        (`[batch_size]`) with episode boundaries, else None. Graph: the writes, which the rows' write follows.
        """
        record = self._episode_record
        if record is None:
            return []
        if self._graph:
            return record.written(added, step_types)
        self._cut = record.cut_before(added, step_types)
        return []

    def on_add(self, added: Any, rows: Any) -> list[Any]:
        """Add number `added` writes its block of storage `rows` now, before the counter moves.

        `rows`: a `slice` on the host, an int64 `[batch_size]` tensor in the graph. Graph: the writes, made beside
        the rows'.
        """
        if self._episode_record is not None and not self._graph:
            self._episode_record.written(added, self._cut)
        return []

    def on_clear(self) -> list[Any]:
        """The buffer is cleared. Graph: the writes."""
        if self._episode_record is None:
            return []
        if self._graph:
            return self._episode_record.cleared()
        self._episode_record.cleared()
        return []

    def restore_targets(self) -> list[Any]:
        """Graph: the variables a restore assigns beside the rows, as `on_restore` orders its values."""
        return [] if self._episode_record is None else list(self._episode_record.variables)

    def on_restore(self, added: Any, step_types: Any, extras: dict[str, np.ndarray]) -> list[Any]:
        """The rows were replaced by a restore's (host), or are (graph): the state follows them.

        Args:
          added: The restored add counter.
          step_types: The restored step-type column (numpy) with episode boundaries, else None.
          extras: The restored state's checked extras (`state_template`'s).

        Returns:
          Graph: the values of `restore_targets()`, assigned with the rows in one step. Host: [] (restored in place).
        """
        if self._episode_record is None:
            return []
        weights = self._restored_weights(extras)
        if self._graph:
            return list(self._episode_record.rebuilt(step_types, weights, added))
        _episodes.assign(self._episode_record.record, self._episode_record.rebuilt(step_types, weights, added))
        return []

    def _restored_weights(self, extras: dict[str, np.ndarray]) -> np.ndarray:
        """Every row's weight in draws after a restore of `extras` (1; a prioritized sampler's priorities')."""
        return np.ones([self.batch_size * self.max_length])

    def on_update_priorities(self, rows: Any, priorities: Any) -> list[Any]:
        """Sets the priorities of distinct storage `rows` (a prioritized sampler's). Graph: the writes."""
        raise ValueError(f"sampler: {type(self).__name__} draws without priorities: it keeps none to update")

    def state_extras(self) -> dict[str, Any]:
        """The state's extras it keeps, by name (`state()` and files carry them): host copies, graph variables."""
        return {}

    def state_template(self, template: Any) -> Any:
        """A buffer's `state_template` with this sampler's format and extras (the uniform one's, as given)."""
        return template

    def check_extras(self, extras: dict[str, np.ndarray], source: str) -> None:
        """Raises a ValueError naming `source` and the extra if a state's extras are not ones it can restore.

        A uniform sampler's state has no extras to check (`state_template` gives none).
        """
        return

    def read_guard(self, sample: Sample, leaves: list[Any], added: Any, num_steps: int | None) -> Any:
        """Graph: whether a draw read beside a concurrent add is whole (a bool tensor), or None: no rule.

        The TF buffer draws without its writers' lock: a draw whose state an add has changed before the counter
        moved (a row given its priority, the record of episode ends) is read again when this is False.
        `leaves`: the sample's rows' fields, read.
        """
        if self._episode_record is None or (num_steps or 1) <= 1:
            return None
        # The record of episode ends is read beside a concurrent add's writes: a window it lets through that
        # crosses a boundary (or runs past the newest frame) is read again.
        within = tf.reduce_all(_episodes.within(tf, leaves[cast(int, self._step_field)]))
        return within & (tf.reduce_max(sample.ids) < added * self.batch_size)

    def close(self) -> None:
        """The buffer closed: its storage and state are let go."""
        self._episode_record = None
        self.step_types = self.near = None

    def stored_windows(self, backend: Backend, added: Any, num_steps: int | None) -> tuple[Any, Any, list[Any]]:
        """The stored windows of `num_steps` frames, and the checks that there is one.

        Returns `(first, count, checks)`: windows start at frame ids `first .. first + count - 1`
        (consecutive ids, every segment's), and `checks` refuse an empty ring or one with fewer than
        `num_steps` frames per segment, naming the buffer (numpy raises at once; in TensorFlow, pass them
        as the `after` of the draw).
        """
        first, windows = _ring.stored_windows(backend.ops, added, self.max_length, self.batch_size, num_steps or 1)
        empty = EMPTY.format(buffer=self.buffer_name)
        if num_steps is None or num_steps == 1:
            return first, windows, [backend.require(windows > 0, empty)]
        too_few = NOT_ENOUGH_FRAMES.format(buffer=self.buffer_name, num_steps=num_steps)
        return first, windows, [backend.require(windows > 0, backend.select(added > 0, too_few, empty))]

    def _windows_from(self, backend: Backend, first_rows: Any, added: Any, num_steps: int | None) -> tuple[Any, Any]:
        """Ids and rows of the windows whose first frames are at storage rows `first_rows`."""
        first = _ring.ids_of_rows(backend.ops, first_rows, added, self.max_length, self.batch_size)
        ids, rows = _ring.window_ids_and_rows(backend.ops, first, self.max_length, self.batch_size, num_steps or 1)
        if num_steps is None:
            return ids[..., 0], rows[..., 0]
        return ids, rows

    def _episodes_apply(self, num_steps: int | None) -> bool:
        return self.near is not None and (num_steps or 1) > 1  # a single frame never crosses a boundary

    def _record(self, num_steps: int) -> _episodes.Near | None:
        """The record of episode ends, if it covers windows of `num_steps` (else: one pass)."""
        return self.near() if self.near is not None and num_steps - 1 <= _episodes.NEAR else None

    def _crossing(
        self, backend: Backend, record: _episodes.Near, added: Any, num_steps: int, columns: Callable[[Any], Any]
    ) -> Any:
        """`[3]`: the `near` columns summed over the stored windows of `num_steps` that cross a boundary.

        `columns(rows)` gives rows' `near` columns. The rows at distances below
        `num_steps`, less those of each segment's newest `num_steps - 1` frames
        (their windows would run past the newest frame: no stored windows).
        """
        ops = backend.ops
        adds = added - 1 - ops.arange(num_steps - 1)
        segments = ops.arange(self.batch_size)
        rows = backend.reshape((adds % self.max_length)[:, None] * self.batch_size + segments[None, :], [-1])
        stored = (adds >= _ring.oldest_add(ops, added, self.max_length))[:, None] & (segments[None, :] >= 0)
        stored = backend.reshape(stored, [-1])
        distance = backend.tree.gather(record.distance, rows)
        counted = stored & (distance >= 1) & (distance < num_steps)
        newest = columns(rows) * backend.cast(counted, np.float64)[:, None]
        return backend.sum(record.near[1:num_steps]) - backend.sum(newest)

    def _kept_draws(self, backend: Backend, record: _episodes.Near, first_rows: Any, num_steps: int) -> Any:
        """Which draws (by their windows' first rows) cross no boundary: one gather of distances."""
        distance = backend.tree.gather(record.distance, first_rows)
        return (distance == 0) | (distance >= num_steps)

    def _draw_count(self, backend: Backend, wanted: int, share: Any) -> Any:
        """How many draws to make so that `wanted` land within episodes but about once in 10^4 batches.

        `share`: the share of the draws' weight within episodes. At least an eighth is assumed: below
        that, too few are kept more often, and the batch is drawn in one pass.
        """
        if isinstance(wanted, int):
            bound: Any = wanted + 4 * float(np.sqrt(wanted)) + 16
        else:  # a sample_batch_size known only when the graph runs
            wanted = tf.cast(wanted, tf.float64)
            bound = wanted + 4 * tf.sqrt(wanted) + 16
        return backend.cast(bound / backend.tree.maximum(share, 0.125), np.int64) + 1

    def _no_window(self, num_steps: int | None) -> str:
        return NO_EPISODE_WINDOW.format(buffer=self.buffer_name, num_steps=num_steps)

    def _valid_starts(self, backend: Backend, added: Any, num_steps: int) -> Any:
        step_types = self.step_types
        assert step_types is not None  # set with `near`
        return valid_window_starts(backend, step_types(), added, self.max_length, self.batch_size, num_steps)

    @abc.abstractmethod
    def sample(self, backend: Backend, added: Any, sample_batch_size: int | None, num_steps: int | None) -> Sample:
        """Draws `sample_batch_size` windows (one, without a batch axis, for None) of `num_steps` frames.

        Raises (numpy) or fails when run (TensorFlow) with `InvalidArgumentError`
        if the ring is empty or holds no window of `num_steps` frames (within one
        episode, with episode boundaries).
        """


SamplerFactory = Callable[[str, int, int], Sampler]
"""What `sampler=` takes: `(buffer_name, batch_size, max_length) -> Sampler` (a `Sampler` subclass, say)."""


def make(
    factory: SamplerFactory | None, buffer_name: str, batch_size: int, max_length: int, *, prioritized: bool = False
) -> Sampler:
    """The sampler `factory` makes (a `UniformSampler` for None), checked; not yet bound (`Sampler.bind`).

    `prioritized`: made for a prioritized buffer (which has `update_priorities`): it must draw by priority.

    Raises:
      TypeError: Naming `sampler`, if `factory` is not callable or makes something else than a `Sampler`.
      ValueError: Naming `sampler`, if it makes a prioritized one for a uniform buffer (which keeps no
        priorities), or a uniform one for a prioritized buffer.
    """
    if factory is None:
        return UniformSampler(buffer_name, batch_size, max_length)
    sampler: Sampler = made(factory, (buffer_name, batch_size, max_length), Sampler, NOT_A_SAMPLER)
    if sampler.prioritized and not prioritized:
        raise ValueError(PRIORITIZED_SAMPLER.format(sampler=type(sampler).__name__))
    if prioritized and not sampler.prioritized:
        raise ValueError(f"sampler: expected a prioritized sampler for {buffer_name}, got {type(sampler).__name__}")
    return sampler


def _choose(backend: Backend, enough: Any, from_draws: Callable[[], Any], in_one_pass: Callable[[], Any]) -> Any:
    """`from_draws()` if `enough`, else `in_one_pass()`; in TensorFlow, only the chosen one runs."""
    if backend is TENSORFLOW:
        return tf.cond(enough, from_draws, in_one_pass)
    return from_draws() if enough else in_one_pass()


class UniformSampler(Sampler):
    """Every window that can be drawn equally likely: probability `1 / windows`."""

    def sample(self, backend: Backend, added: Any, sample_batch_size: int | None, num_steps: int | None) -> Sample:
        """See `Sampler.sample`."""
        shape = [] if sample_batch_size is None else [sample_batch_size]
        first, windows, checks = self.stored_windows(backend, added, num_steps)
        steps, wanted = num_steps or 1, 1 if sample_batch_size is None else sample_batch_size
        if not self._episodes_apply(num_steps):
            # The windows' first frames drawn as ids, with a time axis unless num_steps is None: a few ops in all.
            ids = backend.uniform_integers(shape + ([] if num_steps is None else [1]), first, first + windows, checks)
            if steps > 1:
                ids = ids + backend.ops.arange(steps, self.batch_size)
            rows = _ring.rows_of_ids(ids, self.max_length, self.batch_size)
            return Sample(ids, rows, backend.full_inverse(shape, windows), mass=windows)  # windows > 0 once checked

        def in_one_pass() -> tuple[Any, Any]:
            running = backend.cumsum(backend.cast(self._valid_starts(backend, added, steps), np.int64))
            if backend is not TENSORFLOW:
                backend.require(running[-1] > 0, self._no_window(num_steps))
            # Validity is asserted later in TensorFlow (a torn read is read again first): the op draws meanwhile.
            draws = backend.uniform_integers([wanted], 0, backend.ops.maximum(running[-1], 1), checks)
            # Draw k lands on the row of the k-th valid window: the first row whose running count exceeds k.
            first_rows = backend.searchsorted(running, draws)
            return backend.ops.minimum(first_rows, self.batch_size * self.max_length - 1), running[-1]

        record = self._record(steps)
        if record is None:
            first_rows, count = in_one_pass()
        else:
            ones = lambda rows: _episodes.columns(backend.cast(rows * 0 + 1, np.float64))  # noqa: E731
            count = windows - backend.cast(
                self._crossing(backend, record, added, steps, ones)[_episodes.COUNT], np.int64
            )
            if backend is not TENSORFLOW:
                backend.require(count > 0, self._no_window(num_steps))
            share = backend.cast(count, np.float64) / backend.cast(backend.ops.maximum(windows, 1), np.float64)
            draws = backend.uniform_integers([self._draw_count(backend, wanted, share)], first, first + windows, checks)
            candidates = _ring.rows_of_ids(draws, self.max_length, self.batch_size)
            kept = self._kept_draws(backend, record, candidates, steps)
            chosen = backend.boolean_mask(candidates, kept)
            enough = backend.sum(backend.cast(kept, np.int64)) >= wanted
            first_rows = _choose(backend, enough, lambda: chosen[:wanted], lambda: in_one_pass()[0])
        ids, rows = self._windows_from(backend, backend.reshape(first_rows, shape), added, num_steps)
        probabilities = backend.full_inverse(shape, backend.ops.maximum(count, 1))
        return Sample(ids, rows, probabilities, count > 0, self._no_window(num_steps), count)


class PrioritizedSampler(Sampler):
    """Windows drawn with probability proportional to their first frame's weight in a sum tree.

    The tree's leaves are the ring's rows (a frame's weight is `priority ** alpha`,
    0 for priority 0, set by the buffer). Windows of `num_steps` never start in the
    newest `num_steps - 1` adds of a segment (they would run past the newest frame):
    those rows are left out of each draw (in TensorFlow by rejection,
    `_draw_outside`), so the probabilities are exact over the windows that can be
    drawn. Rows not written since the last clear weigh 0. With episode
    boundaries, as `Sampler` says: the weight within episodes is the tree's less
    `near`'s, and draws from the tree are kept where they cross no boundary.
    """

    prioritized = True

    def __init__(self, buffer_name: str, batch_size: int, max_length: int, priority_exponent: float = 0.6) -> None:
        """As `Sampler`; draws are proportional to `priority ** priority_exponent` (alpha, checked).

        Its state (`bind`): the priorities, the largest one and their sum tree, kept in the storage's extras
        (`tfbuffers.prioritized.extras`) after the record of episode ends, as `HostPriorities` on the host or
        `GraphPriorities` in the graph. `TFPrioritizedReplayBuffer` and `PyPrioritizedReplayBuffer` are the
        uniform buffers with this sampler (`factory`).
        """
        super().__init__(buffer_name, batch_size, max_length)
        self.priority_exponent = prioritized.check_exponent(priority_exponent)
        self.priorities: Any = None

    @classmethod
    def factory(cls, priority_exponent: float) -> SamplerFactory:
        """`sampler=` for this sampler of `priority_exponent`: `(buffer_name, batch_size, max_length) -> sampler`."""
        prioritized.check_exponent(priority_exponent)
        return functools.partial(cls, priority_exponent=priority_exponent)

    def bind(self, storage: Any, backend: Backend, step_field: int | None) -> None:
        """See `Sampler.bind`; then the priorities, after the record of episode ends, which weighs rows by them."""
        super().bind(storage, backend, step_field)
        if self._graph:
            self.priorities = prioritized.GraphPriorities(storage, self.batch_size, self.priority_exponent)
        else:
            size = (self.batch_size, self.max_length)
            self.priorities = prioritized.HostPriorities(storage, *size, self.priority_exponent)
        if self._episode_record is not None:
            self._episode_record.weights = cast(Any, self.priorities).weights

    def _tree(self) -> Any:
        """The current sum tree: the host's with every ancestor up to date, or the graph's variable."""
        return self.priorities.tree if self._graph else self.priorities.tree()

    def on_add(self, added: Any, rows: Any) -> list[Any]:
        """See `Sampler.on_add`: the block's frames get the largest priority given so far."""
        recorded = super().on_add(added, rows)
        if self._graph:
            return [*recorded, *self.priorities.added(rows)]
        self.priorities.added(rows.start)
        return recorded

    def on_clear(self) -> list[Any]:
        """See `Sampler.on_clear`: every priority 0, new frames get 1.0."""
        cleared = self.priorities.cleared()  # ops in the graph; None on the host, changed in place
        return [*(cleared or []), *super().on_clear()]

    def restore_targets(self) -> list[Any]:
        """See `Sampler.restore_targets`: the priorities, the largest one and the tree, then the record's."""
        return [*self.priorities.restore_targets, *super().restore_targets()]

    def on_restore(self, added: Any, step_types: Any, extras: dict[str, np.ndarray]) -> list[Any]:
        """See `Sampler.on_restore`: the priorities set, the tree rebuilt from them, then the record."""
        if self._graph:
            return [*self.priorities.restored(extras), *super().on_restore(added, step_types, extras)]
        self.priorities.restore(extras)
        return super().on_restore(added, step_types, extras)

    def _restored_weights(self, extras: dict[str, np.ndarray]) -> np.ndarray:
        return prioritized.leaf_weights(extras[prioritized.PRIORITY], self.priority_exponent)

    def on_update_priorities(self, rows: Any, priorities: Any) -> list[Any]:
        """Sets the priorities of distinct `rows`, moving their weight in the record of episode ends first."""
        weights = prioritized.leaf_weights(priorities, self.priority_exponent)
        if not self._graph:
            if self._episode_record is not None:  # from the rows' old weights, read before the tree changes
                self._episode_record.reweighted(rows, weights)
            self.priorities.update(rows, priorities, weights)
            return []
        moved = [] if self._episode_record is None else [self._episode_record.reweighted(rows, weights)]
        with tf.control_dependencies(moved):
            return [*moved, *self.priorities.update(rows, priorities, weights)]

    def state_extras(self) -> dict[str, Any]:
        """See `Sampler.state_extras`: the priorities and the largest one (`tfbuffers.prioritized`)."""
        return self.priorities.state()

    def state_template(self, template: Any) -> Any:
        """See `Sampler.state_template`: the prioritized format, the priorities as extras."""
        return prioritized.state_template(template, self.batch_size * self.max_length)

    def check_extras(self, extras: dict[str, np.ndarray], source: str) -> None:
        """See `Sampler.check_extras`: finite priorities >= 0, and a max priority >= all of them."""
        prioritized.check_extras(extras, source)

    def read_guard(self, sample: Sample, leaves: list[Any], added: Any, num_steps: int | None) -> Any:
        """See `Sampler.read_guard`.

        An add gives its rows their priority in the same step as it writes them, before the counter moves: a
        draw by priority can find a row the counter does not count yet, while it is written. Its id is then at
        or past `added` frames (a ring not yet full; in a full one it names the frame being overwritten, which
        the overlap check catches): read again.
        """
        guard = super().read_guard(sample, leaves, added, num_steps)
        return tf.reduce_max(sample.ids) < added * self.batch_size if guard is None else guard

    @property
    def max_priority(self) -> float:
        """The priority new frames get: the largest given so far (1.0 after a clear). Host only."""
        return float(self.priorities.largest)

    def raise_max_priority(self, priority: float) -> None:
        """New frames get `priority` from now on if it is larger than `max_priority`. Host only."""
        self.priorities.raise_largest(float(priority))

    def close(self) -> None:
        """See `Sampler.close`: the priorities let go too."""
        super().close()
        if self.priorities is not None:
            self.priorities.close()

    def sample(self, backend: Backend, added: Any, sample_batch_size: int | None, num_steps: int | None) -> Sample:
        """See `Sampler.sample`. Also fails if every window that can be drawn has priority 0."""
        shape = [] if sample_batch_size is None else [sample_batch_size]
        _, windows, checks = self.stored_windows(backend, added, num_steps)
        tree, capacity = self._tree(), self.batch_size * self.max_length
        newest = backend.ops.minimum((num_steps or 1) - 1, added)  # adds whose windows would run past the newest
        masked_rows = _ring.block_start(added - newest, self.max_length, self.batch_size)
        leaf_mask = (
            None
            if (num_steps or 1) == 1
            else _sum_tree.mask(backend.tree, tree, capacity, masked_rows, newest * self.batch_size)
        )
        total, positive = _sum_tree.unmasked_total(backend.tree, tree, leaf_mask)
        no_priority = NO_PRIORITY.format(buffer=self.buffer_name)
        if self._episodes_apply(num_steps):
            totals = (total, positive, leaf_mask)
            return self._sample_episodes(backend, added, shape, num_steps or 1, checks, windows, totals)
        if backend is not TENSORFLOW:
            backend.require(positive > 0, no_priority)
        if leaf_mask is not None and backend is TENSORFLOW:
            rows = self._draw_outside(backend, tree, shape, checks, total, leaf_mask)
        else:
            rows = self._draw(backend, tree, shape, checks, total, leaf_mask)
        weights = backend.tree.nodes(tree, _sum_tree.leaf_count(capacity) + rows)[..., _sum_tree.SUM]
        ids, rows = self._windows_from(backend, rows, added, num_steps)
        return Sample(ids, rows, backend.float32(weights / total), positive > 0, no_priority, total)

    def _draw(
        self, backend: Backend, tree: Any, shape: list[int], checks: list[Any], total: Any, leaf_mask: Any
    ) -> Any:
        """Leaves drawn in proportion to their weights, none in `leaf_mask` (a descent that leaves it out)."""
        capacity = self.batch_size * self.max_length
        # Within the leaves even on a torn read (a concurrent clear or update), which is then read again.
        return backend.ops.minimum(backend.draw_leaves(tree, capacity, shape, checks, total, leaf_mask), capacity - 1)

    def _draw_from_whole_tree(
        self, backend: Backend, tree: Any, root: Any, count: Any, checks: list[Any], leaf_mask: _sum_tree.Mask
    ) -> tuple[Any, Any]:
        """`count` leaves drawn over the whole tree (its sum: `root`), and which lie outside `leaf_mask`.

        In TensorFlow a descent that leaves a mask out runs about 2.4 times the ops of a plain one (each
        level subtracts the masked sums below both children): a plain descent of a few more draws, less
        those that land in the mask, costs less. The draws kept follow the unmasked leaves' weights exactly.
        """
        rows = self._draw(backend, tree, [count], checks, root, None)
        return rows, (rows - leaf_mask.start) % leaf_mask.capacity >= leaf_mask.length

    def _draw_outside(
        self, backend: Backend, tree: Any, shape: list[int], checks: list[Any], total: Any, leaf_mask: _sum_tree.Mask
    ) -> tf.Tensor:
        """As `_draw`, in TensorFlow, by rejection (as `_sum_tree.draw_numpy`).

        Draws over the whole tree; those in the mask are drawn again once, and any still there by the descent
        that leaves the mask out. Each draw kept follows the unmasked leaves' weights exactly. The mask (the
        newest adds) seldom holds much weight: the redraws, behind a `tf.cond`, rarely run.
        """
        capacity = self.batch_size * self.max_length
        root = backend.tree.nodes(tree, 1)[_sum_tree.SUM]
        with tf.control_dependencies(checks):
            # Every uniform drawn here, not in the cond's branches: a branch's random op may get the same seed
            # as one outside it (under tf.random.set_seed) and repeat its numbers.
            uniforms = tf.random.uniform([3, shape[0] if shape else 1], dtype=tf.float64)  # draws, redraws, exact ones

        def find(targets: tf.Tensor, mask: _sum_tree.Mask | None = None) -> tf.Tensor:
            if mask is None:
                found = _sum_tree.find_wide(tree, capacity, targets)
            else:
                found = _sum_tree.find(_sum_tree.TENSORFLOW, tree, capacity, targets, mask)
            return tf.minimum(found, capacity - 1)  # within the leaves even on a torn read, then read again

        def outside(rows: tf.Tensor) -> tf.Tensor:
            return (rows - leaf_mask.start) % capacity >= leaf_mask.length

        rows = find(uniforms[0] * root)

        def redraw() -> tf.Tensor:
            masked = tf.where(tf.logical_not(outside(rows)))  # [k, 1]
            again = find(tf.gather_nd(uniforms[1], masked) * root)
            kept = outside(again)
            exact = tf.cond(
                tf.reduce_all(kept), lambda: again, lambda: find(tf.gather_nd(uniforms[2], masked) * total, leaf_mask)
            )
            return tf.tensor_scatter_nd_update(rows, masked, tf.where(kept, again, exact))

        return tf.reshape(tf.cond(tf.reduce_all(outside(rows)), lambda: rows, redraw), shape)

    def _sample_episodes(
        self,
        backend: Backend,
        added: Any,
        shape: list[int],
        steps: int,
        checks: list[Any],
        windows: Any,
        totals: tuple[Any, Any, Any],
    ) -> Sample:
        tree, capacity = self._tree(), self.batch_size * self.max_length
        leaves, wanted = _sum_tree.leaf_count(capacity), shape[0] if shape else 1
        no_window, no_priority = self._no_window(steps), NO_PRIORITY.format(buffer=self.buffer_name)

        def in_one_pass() -> tuple[Any, ...]:
            valid = self._valid_starts(backend, added, steps)
            weights = backend.tree.flat(tree)[leaves : leaves + capacity, _sum_tree.SUM] * backend.cast(
                valid, np.float64
            )
            running = backend.cumsum(weights)
            counts = backend.sum(backend.cast(valid, np.int64)), backend.sum(backend.cast(weights > 0, np.float64))
            if backend is not TENSORFLOW:
                backend.require(counts[0] > 0, no_window)
                backend.require(counts[1] > 0, no_priority)
            last = backend.sum(backend.cast(running < running[-1], np.int64))  # the last row weighing above 0
            targets = backend.uniform_floats([wanted], checks) * running[-1]
            first_rows = backend.ops.minimum(backend.searchsorted(running, targets), last)
            return first_rows, backend.tree.gather(weights, first_rows) / running[-1], *counts, running[-1]

        record = self._record(steps)
        if record is None:
            first_rows, probabilities, window_count, within_positive, mass = in_one_pass()
        else:
            total, positive, leaf_mask = totals
            weights = lambda rows: _episodes.columns(backend.tree.nodes(tree, leaves + rows)[:, _sum_tree.SUM])  # noqa: E731
            crossing = self._crossing(backend, record, added, steps, weights)
            window_count = windows - backend.cast(crossing[_episodes.COUNT], np.int64)
            within_total, within_positive = total - crossing[_episodes.WEIGHT], positive - crossing[_episodes.POSITIVE]
            if backend is not TENSORFLOW:
                backend.require(window_count > 0, no_window)
                backend.require(within_positive > 0, no_priority)
            if backend is TENSORFLOW:  # drawn over the whole tree, masked leaves then left out (`_draw_outside`)
                root = backend.tree.nodes(tree, 1)[_sum_tree.SUM]
                draws = self._draw_count(backend, wanted, within_total / backend.tree.maximum(root, 1e-300))
                candidates, outside = self._draw_from_whole_tree(backend, tree, root, draws, checks, leaf_mask)
                kept = self._kept_draws(backend, record, candidates, steps) & outside
            else:
                draws = self._draw_count(backend, wanted, within_total / backend.tree.maximum(total, 1e-300))
                candidates = self._draw(backend, tree, [draws], checks, total, leaf_mask)
                kept = self._kept_draws(backend, record, candidates, steps)
            chosen = backend.boolean_mask(candidates, kept)

            def from_draws() -> tuple[Any, Any, Any]:
                rows = chosen[:wanted]
                return rows, backend.tree.nodes(tree, leaves + rows)[:, _sum_tree.SUM] / within_total, within_total

            def passed() -> tuple[Any, Any, Any]:
                first_rows, probabilities, _, _, mass = in_one_pass()
                return first_rows, probabilities, mass

            enough = backend.sum(backend.cast(kept, np.int64)) >= wanted
            first_rows, probabilities, mass = _choose(backend, enough, from_draws, passed)
        ids, rows = self._windows_from(backend, backend.reshape(first_rows, shape), added, steps)
        valid = (window_count > 0) & (within_positive > 0)
        message = backend.select(window_count > 0, no_priority, no_window)
        return Sample(ids, rows, backend.float32(backend.reshape(probabilities, shape)), valid, message, mass)
