"""`Sampler`: what every sampler is, its state and the events a buffer tells it of; `Sample`, the messages.

See `tfbuffers.sampling` for how a buffer uses a sampler.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any, NamedTuple, cast

import numpy as np
import tensorflow as tf

import tfbuffers.sampling._deterministic as _deterministic
import tfbuffers.sampling._episodes as _episodes
from tfbuffers import _ring, _xla
from tfbuffers.sampling.backends import TENSORFLOW, Backend

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
    probabilities. The adds' record of episode ends (`tfbuffers.sampling._episodes`) gives
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
    """Returns the adds' record of episode ends (`tfbuffers.sampling._episodes`), with `step_types` (set by `bind`)."""

    keeps_episode_boundaries = True
    """Whether its draws honour `step_types` and `near` (a buffer with `episode_boundaries` refuses one that
    does not)."""
    prioritized = False
    """Whether it draws by priority (the buffer then has `update_priorities` to set them)."""

    def __init__(self, buffer_name: str, batch_size: int, max_length: int) -> None:
        """A sampler for a ring of `batch_size` segments of `max_length` rows; errors name `buffer_name`."""
        self.watches_adds = True  # whether `before_add` and `on_add` change anything (known once bound)
        self.buffer_name = buffer_name
        self.batch_size = batch_size  # the ring's segments
        self.max_length = max_length  # rows per segment
        self._episode_record: _episodes.EpisodeRecord | None = None  # the adds' record of episode ends (`bind`)
        self._step_field: int | None = None
        self._graph = False

    # The sampler's state and the events that change it. A buffer binds its sampler to its storage once, then
    # tells it of every add, clear, restore and priority update, in the same step as the rows and counter each
    # goes with: under the py buffer's lock (numpy state changes in place; the methods return []), or inside
    # the TF buffer's writers' lock (the methods return the ops to run; `tfbuffers.execution._tf_concurrency`). What a
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
        cls = type(self)
        # Whether adds change its state: a py add skips the two calls otherwise (a plain uniform sampler's adds
        # are the numpy buffer's hot path, some 6 us each).
        self.watches_adds = (
            step_field is not None or cls.before_add is not Sampler.before_add or cls.on_add is not Sampler.on_add
        )
        if step_field is None:
            return
        # Closures over the storage and the record, not the sampler: dropping the buffer frees them at once.
        self.step_types = lambda: storage.column(step_field)
        record = _episodes.EpisodeRecord(storage, step_field, self.batch_size, self.max_length, self._graph)
        self.near = record.read
        self._episode_record = record

    # The windows of the datasets that draw nothing: the single deterministic pass and shuffled epochs.

    def pass_ids(
        self,
        read_added: Callable[[], tf.Tensor],
        gather: Callable[..., list[tf.Tensor]],
        sample_batch_size: int | None,
        num_steps: int | None,
        *,
        window_shift: int | None,
        drop_remainder: bool,
    ) -> tf.data.Dataset:
        """The single deterministic pass's frame ids, in its order: a `tf.data.Dataset` of int64 tensors.

        By default every stored window, oldest first, segments in groups of `sample_batch_size`
        (`tfbuffers.sampling._deterministic.ids_dataset`, which says the shapes), less those `keeps_windows`
        says no to. A sampler that visits other windows, or in another order, overrides it.

        Args:
          read_added: Returns the buffer's add counter, a scalar int64 tensor (read when a pass begins).
          gather: `(ids, fields) -> leaves`: the buffer's frames as tensors (`keeps_windows` reads them).
          sample_batch_size: Segments per element, or None.
          num_steps: Frames per window, or None.
          window_shift: The buffer's `dataset_window_shift`.
          drop_remainder: The buffer's `dataset_drop_remainder`.
        """
        ids = _deterministic.ids_dataset(
            read_added,
            max_length=self.max_length,
            batch_size=self.batch_size,
            sample_batch_size=sample_batch_size,
            num_steps=num_steps,
            window_shift=window_shift,
            drop_remainder=drop_remainder,
        )
        if not self.narrows_windows(num_steps):
            return ids
        if num_steps is None:  # single frames: windows of one
            return _deterministic.kept(
                ids, lambda frame_ids: self.keeps_windows(gather, frame_ids[..., None]), sample_batch_size
            )
        return _deterministic.kept(ids, lambda frame_ids: self.keeps_windows(gather, frame_ids), sample_batch_size)

    def narrows_windows(self, num_steps: int | None) -> bool:
        """Whether the pass and the epochs leave out some stored windows of `num_steps` (`keeps_windows` then).

        With episode boundaries, for windows of more than one frame: those crossing a boundary.
        """
        return self._step_field is not None and (num_steps or 1) > 1

    def keeps_windows(self, gather: Callable[..., list[tf.Tensor]], ids: tf.Tensor) -> tf.Tensor:
        """Which windows of frame ids `ids` (`[..., num_steps]`, stored) the pass and the epochs yield: `[...]` bool.

        In TensorFlow (inside `tf.data`'s functions); `gather(ids, fields)` reads their frames. By default those
        within one episode (their step types, read from the step-type field the sampler was bound with). A
        sampler that draws among fewer windows narrows the datasets that draw nothing here, with `narrows_windows`.
        """
        assert self._step_field is not None, "with episode boundaries only, unless a subclass says otherwise"
        return _episodes.within(tf, gather(ids, [self._step_field])[0])

    def before_add(self, added: Any, step_types: Any) -> list[Any]:
        """Add number `added` (the counter before it) is about to write its rows; it holds `step_types`.

        What the add overwrites and the previous frames are read here. `step_types`: the add's step types
        (`[batch_size]`) with episode boundaries, else None. Graph: the writes, which the rows' write follows.
        """
        return [] if self._episode_record is None else self._episode_record.before_add(added, step_types)

    def on_add(self, added: Any, rows: Any) -> list[Any]:
        """Add number `added` writes its block of storage `rows` now, before the counter moves.

        `rows`: a `slice` on the host, an int64 `[batch_size]` tensor in the graph. Graph: the writes, made beside
        the rows'.
        """
        return [] if self._episode_record is None else self._episode_record.on_add(added)

    def on_add_block(self, added: int, count: int, first_row: int, step_types: Any) -> None:
        """Host: adds `added` to `added + count - 1` wrote their rows, `count * batch_size` from `first_row`.

        Before the counter moves; `before_add` was told of the first add (before any row was written).
        `step_types`: their step types, `[batch_size, count]`, with episode boundaries, else None. By default
        the events of `count` single adds, in order (`on_add`, then the next add's `before_add`, which reads
        the frames before it, now written); a sampler whose state a block changes at once overrides it. Where
        only the record of episode ends follows the adds (`before_add` and `on_add` are this class's), it
        follows the block at once.
        """
        size = self.batch_size
        record = self._episode_record
        if record is not None and type(self).before_add is Sampler.before_add and type(self).on_add is Sampler.on_add:
            record.leave(first_row, first_row + count * size)
            record.join_block(added, count, step_types)
            return
        for t in range(count):
            if t:
                self.before_add(added + t, None if step_types is None else step_types[:, t])
            row = first_row + t * size
            self.on_add(added + t, slice(row, row + size))

    def on_clear(self) -> list[Any]:
        """The buffer is cleared. Graph: the writes."""
        return [] if self._episode_record is None else self._episode_record.on_clear()

    def restore_targets(self) -> list[Any]:
        """Graph: the variables a restore assigns beside the rows, as `on_restore` orders its values."""
        return [] if self._episode_record is None else self._episode_record.restore_targets()

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
        return self._episode_record.on_restore(step_types, self._restored_weights(extras), added)

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
        """The record of episode ends, if it covers windows of `num_steps` (else: one pass).

        Not in an XLA program: the draws it keeps are as many as the running graph finds, a shape XLA must
        know when it compiles (`tfbuffers._xla`), so a compiled sample takes the pass, of static shapes.
        """
        if self.near is None or num_steps - 1 > _episodes.NEAR or (self._graph and _xla.compiling()):
            return None
        return self.near()

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
