"""Episode boundaries kept up to date by the adds, so that sampling windows within episodes is cheap.

A buffer with `episode_boundaries` records, per segment, every *cut*: the add
number `e` of a frame after which an episode ends (frame `e` is LAST, or frame
`e + 1` is FIRST). Each add appends at most one cut per segment (between the
previous newest frame and its own) and drops at most one (the cut after the
frame it overwrites), so the record is kept in O(batch_size) per add:

* `ends`: `[max_length * batch_size]` int64, a ring of cuts per segment,
  interleaved like the rows (cut number `k` of segment `b` at `(k % max_length)
  * batch_size + b`). A segment holds at most `max_length - 1` cuts between
  stored frames, so the slot an add writes is never a live cut's.
* `count`: `[batch_size]` cuts recorded since the last clear.
* `tail`: `[batch_size]` the first live cut: cuts `tail .. count - 1` lie
  between stored frames, oldest first.

A window of `num_steps` frames starting at add `p` crosses cut `e` iff
`e - num_steps + 2 <= p <= e`, so the windows a sample may draw are the stored
ones minus one interval of starts per live cut: the count of valid windows and
the k-th valid window follow from the live cuts alone (`Intervals`), in
O(cuts + draws * log cuts) rather than a pass over the whole buffer. Restores
and loads rebuild the record from the step-type column (`rebuild`).

The functions take an array namespace (`xp`: numpy or `tfbuffers._sampling`'s
backend functions) as `tfbuffers._ring` does.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

FIRST, LAST = 0, 2
"""TF-Agents' `StepType` values: an episode boundary lies between a LAST frame and the next, or before a FIRST."""


class Cuts(NamedTuple):
    """The recorded cuts: `ends` `[max_length * batch_size]`, `tail` and `count` `[batch_size]`, all int64."""

    ends: Any
    tail: Any
    count: Any


def empty(max_length: int, batch_size: int) -> Cuts:
    """No cuts (a new or cleared buffer)."""
    return Cuts(
        np.zeros([max_length * batch_size], np.int64),
        np.zeros([batch_size], np.int64),
        np.zeros([batch_size], np.int64),
    )


def is_cut(previous_types: Any, new_types: Any) -> Any:
    """Whether an episode boundary lies between frames of step types `previous_types` and `new_types`."""
    return (previous_types == LAST) | (new_types == FIRST)


def add(xp: Any, cuts: Cuts, head: Any, cut: Any, added: Any, max_length: int, batch_size: int) -> tuple[Any, ...]:
    """How add number `added` changes the record: `(tail, count, slots, values)`.

    Args:
      xp: The array functions (`tfbuffers._sum_tree.NUMPY` or `.TENSORFLOW`).
      cuts: The record before the add.
      head: `[batch_size]` `ends` at each segment's `tail` slot (read before the write).
      cut: `[batch_size]` bool, whether a boundary lies between the segment's previous newest frame and the one
        this add writes (`is_cut`; False for the first add).
      added: The add counter before the add.
      max_length: Frames per segment.
      batch_size: Segments.

    Returns:
      The new `tail` and `count`, and `values` to write to `ends` at `slots` (each `[batch_size]`): the cut
      after add `added - 1` in every segment's next slot, counted only where `cut` (elsewhere the slot is no
      live cut's and is written again later).
    """
    # The add overwrites the oldest frame once the ring is full: the cut after it, if any, is the first live one.
    oldest_after = added + 1 - xp.minimum(added + 1, max_length)
    tail = cuts.tail + xp.int64((cuts.tail < cuts.count) & (head < oldest_after))
    count = cuts.count + xp.int64(cut) * (1 if max_length > 1 else 0)  # one frame per segment: nothing to cut
    slots = (cuts.count % max_length) * batch_size + xp.arange(batch_size)
    return tail, count, slots, cuts.count * 0 + (added - 1)


def rebuild(step_types: np.ndarray, added: int, max_length: int, batch_size: int) -> Cuts:
    """The record of the stored frames' cuts, from the step-type column (`[capacity]`, storage row order)."""
    cuts = empty(max_length, batch_size)
    frames = min(added, max_length)
    adds = np.arange(added - frames, added, dtype=np.int64)
    types = np.asarray(step_types).reshape(max_length, batch_size)[adds % max_length]  # [frames, batch_size]
    segments, positions = np.nonzero(is_cut(types[:-1], types[1:]).T)  # by segment, then oldest first
    count = np.bincount(segments, minlength=batch_size).astype(np.int64)
    numbers = np.arange(len(segments)) - np.repeat(np.cumsum(count) - count, count)
    cuts.ends[numbers * batch_size + segments] = adds[positions]
    return Cuts(cuts.ends, cuts.tail, count)


class Intervals(NamedTuple):
    """The starts of windows that cross a cut, one interval `[low, low + size)` of add numbers per live cut.

    Flat over every segment's live cuts, segment by segment, oldest first;
    intervals are disjoint, clipped to the stored windows, possibly empty.
    """

    segment: Any
    """`[cuts]` the segment of each interval."""
    low: Any
    """`[cuts]` its first start."""
    size: Any
    """`[cuts]` how many starts it holds (0 or more)."""
    before: Any
    """`[cuts + 1]` exclusive running sum of `size`."""
    first: Any
    """`[batch_size]` each segment's first interval (a position in the flat arrays)."""
    valid: Any
    """`[batch_size]` how many windows of each segment cross no cut."""


def intervals(b: Any, cuts: Cuts, added: Any, max_length: int, batch_size: int, num_steps: int) -> Intervals:
    """The intervals of starts that cross a live cut, for windows of `num_steps` (>= 2) frames.

    `b` is a `tfbuffers._sampling.Backend`. A cut recorded by an add that began
    after `added` was read (a concurrent writer) lies past the newest frame read
    and clips to an empty interval.
    """
    ops, xp = b.ops, b.tree
    oldest = added - ops.minimum(added, max_length)
    windows = ops.maximum(ops.minimum(added, max_length) - num_steps + 1, 0)
    last_start = oldest + windows - 1
    lengths = ops.maximum(cuts.count - cuts.tail, 0)
    first = b.cumsum(lengths) - lengths
    segment = b.repeat(ops.arange(batch_size), lengths)
    position = ops.arange(b.cumsum(lengths)[-1])
    number = xp.gather(cuts.tail, segment) + position - xp.gather(first, segment)
    ends = xp.gather(cuts.ends, (number % max_length) * batch_size + segment)
    # Each interval starts after the previous cut of its segment: intervals never overlap.
    previous = b.concat([ends[:1] * 0 - 1, ends[:-1]])
    previous = xp.where(position == xp.gather(first, segment), oldest - 1, previous)
    low = ops.maximum(ops.maximum(ends - num_steps + 2, previous + 1), oldest)
    size = ops.maximum(ops.minimum(ends, last_start) - low + 1, 0)
    before = b.concat([size[:1] * 0, b.cumsum(size)])
    crossing = xp.gather(before, first + lengths) - xp.gather(before, first)
    return Intervals(segment, low, size, before, first, windows - crossing)


def nth_valid_starts(b: Any, spans: Intervals, draws: Any, added: Any, max_length: int, batch_size: int) -> Any:
    """Frame ids of the first frames of valid windows numbered `draws` (in `[0, sum(spans.valid))`, any shape).

    Windows are numbered segment by segment, oldest first. Draw `k` of segment
    `s` (after its earlier segments' windows) is the start `oldest + k + (starts
    of the intervals that lie before it)`: one search among the segments and
    one among the intervals, whose ranks (valid starts before each interval,
    plus the earlier segments') increase along the flat arrays.
    """
    ops, xp = b.ops, b.tree
    oldest = added - ops.minimum(added, max_length)
    running = b.cumsum(spans.valid)
    segment = ops.minimum(b.searchsorted(running, draws), batch_size - 1)  # past the last only with no window
    rank = draws - (xp.gather(running, segment) - xp.gather(spans.valid, segment))
    earlier = running - spans.valid
    valid_before = (spans.low - oldest) - (
        spans.before[:-1] - xp.gather(spans.before, xp.gather(spans.first, spans.segment))
    )
    # An empty interval past the last valid start ranks after all of its segment's windows.
    ranks = xp.gather(earlier, spans.segment) + ops.minimum(valid_before, xp.gather(spans.valid, spans.segment))
    passed = b.searchsorted(ranks, draws)
    skipped = xp.gather(spans.before, passed) - xp.gather(spans.before, xp.gather(spans.first, segment))
    return (oldest + rank + skipped) * batch_size + segment


def interval_rows(b: Any, spans: Intervals, max_length: int, batch_size: int) -> Any:
    """The storage rows of every start in the intervals (`[sum(spans.size)]`), interval by interval."""
    adds = b.repeat(spans.low - spans.before[:-1], spans.size) + b.ops.arange(spans.before[-1])
    return (adds % max_length) * batch_size + b.repeat(spans.segment, spans.size)
