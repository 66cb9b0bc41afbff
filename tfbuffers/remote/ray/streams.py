"""`Streams`: one storage of `capacity` rows shared by any number of writers' streams, oldest chunk out.

The rows are cut into chunks of `chunk_rows` (the last one shorter when `chunk_rows` does not divide
`capacity`). A stream (one environment of one writer) fills its chunks in order; when its last chunk is full it
takes a free chunk, or, with none free, the chunk allocated longest ago, whoever holds it: the buffer holds its
capacity whatever the number of writers, and drops its oldest frames first (as Reverb's FIFO remover, a chunk at a
time). A chunk allocated longest ago is always the first chunk of its stream, so a stream loses frames from its
start only, and its frames stay consecutive: windows are read within one stream and never across two.

A frame's id is `allocation * chunk_rows + offset`, where `allocation` counts chunk allocations since the buffer
began: an id outlives its frame's eviction without naming the frame that took its row (`rows_of` says -1).

Not thread-safe: its owner calls it under its lock.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

FREE = -1
FIRST, LAST = 0, 2  # TF-Agents' StepType values


@dataclasses.dataclass
class _Stream:
    chunks: collections.deque[int] = dataclasses.field(default_factory=collections.deque)
    filled: int = 0  # rows written in its last chunk
    frames: int = 0  # frames it holds
    dropped: int = 0  # frames it lost to evictions
    open: bool = True
    cuts: collections.deque[int] = dataclasses.field(default_factory=collections.deque)  # episode boundaries
    last: bool = False  # its newest frame is an episode's LAST


class Streams:
    """The chunks of `capacity` rows, the streams holding them in order, and the ids of their frames."""

    def __init__(self, capacity: int, chunk_rows: int, chunks: np.ndarray | None = None) -> None:
        """Every chunk free, no stream.

        `chunks`: the `[3, chunks]` int64 array to keep the map in (each chunk's owner, allocation and start;
        a file's, to outlive the process), every entry `FREE`; or a reopened map's, which `rebuild` reads.
        None: one in RAM.
        """
        if capacity < 1:
            raise ValueError(f"capacity: expected a positive int, got {capacity}")
        if not 1 <= chunk_rows <= capacity:
            raise ValueError(f"chunk_rows: expected an int in [1, capacity={capacity}], got {chunk_rows}")
        self.capacity, self.chunk_rows = capacity, chunk_rows
        count = -(-capacity // chunk_rows)
        self._rows = np.minimum(chunk_rows, capacity - np.arange(count) * chunk_rows)  # rows of each chunk
        if chunks is None:
            chunks = np.full((3, count), FREE, np.int64)
        if chunks.shape != (3, count):
            raise ValueError(f"chunks: expected an int64 array of shape {[3, count]}, got {list(chunks.shape)}")
        self._owner = chunks[0]  # the stream holding each chunk
        self._allocation = chunks[1]  # the allocation number of its current use
        self._start = chunks[2]  # the number in its stream of its first row's frame (the stream's frames from 0)
        self._allocated: collections.deque[int] = collections.deque()  # held chunks, allocated longest ago first
        self._free: collections.deque[int] = collections.deque(range(count))
        self._streams: dict[int, _Stream] = {}
        self._next_stream = 0
        self._allocations = 0
        self.evicted = 0  # frames dropped to make room since the map was made (or rebuilt)
        self.freed: list[int] = []  # chunks evicted since its owner last read them (it clears the list)

    @property
    def num_chunks(self) -> int:
        """Chunks of the storage, held or free."""
        return len(self._rows)

    def open(self) -> int:
        """A new stream, empty; its number."""
        number = self._next_stream
        self._next_stream += 1
        self._streams[number] = _Stream()
        return number

    def close(self, stream: int) -> None:
        """No more frames for `stream`; those it holds stay, to be sampled, until evicted."""
        self._stream(stream).open = False
        self._forget_if_done(stream)

    def streams(self) -> list[int]:
        """The streams holding frames or still open, in the order they were opened."""
        return list(self._streams)

    def frames(self, stream: int) -> int:
        """Frames `stream` holds."""
        return self._stream(stream).frames

    def dropped(self, stream: int) -> int:
        """Frames `stream` lost to evictions: its oldest frame held is its frame number `dropped` (from 0)."""
        return self._stream(stream).dropped

    def holds(self, stream: int) -> bool:
        """Whether `stream` is still known: open, or closed with frames held."""
        return stream in self._streams

    def num_frames(self) -> int:
        """Frames the streams hold together."""
        return sum(s.frames for s in self._streams.values())

    def append(self, stream: int, count: int, step_types: Any = None) -> np.ndarray:
        """The rows of `count` new frames at the end of `stream`, in order; chunks taken, or evicted, as needed.

        `step_types`: the new frames' TF-Agents step types, for windows within episodes (`starts(episodes=True)`):
        an episode boundary lies before a FIRST frame and after a LAST one. A count larger than the capacity is
        refused: its first frames would be evicted by its last ones.
        """
        s = self._stream(stream)
        if not s.open:
            raise ValueError(f"stream {stream}: closed, it takes no more frames")
        if not 0 <= count <= self.capacity:
            raise ValueError(f"count: expected an int in [0, capacity={self.capacity}], got {count}")
        if step_types is not None:
            types = np.asarray(step_types).reshape(-1).tolist()
            if len(types) != count:
                raise ValueError(f"step_types: expected {count} step type(s), one per frame, got {len(types)}")
            number, last = s.dropped + s.frames, s.last  # the first new frame's number in the stream
            for step_type in types:
                if last or step_type == FIRST:
                    s.cuts.append(number)
                number, last = number + 1, step_type == LAST
            s.last = last
        rows = np.empty(count, np.int64)
        written = 0
        while written < count:
            if not s.chunks or s.filled == self._rows[s.chunks[-1]]:
                self._take_chunk(stream)
                s = self._streams[stream]  # the same stream; its chunks may have gone to the eviction
            tail = s.chunks[-1]
            n = min(count - written, int(self._rows[tail]) - s.filled)
            start = tail * self.chunk_rows + s.filled
            rows[written : written + n] = np.arange(start, start + n)
            s.filled += n
            s.frames += n
            written += n
        return rows

    def _take_chunk(self, stream: int) -> None:
        if not self._free:
            self._evict(self._allocated[0])
        chunk = self._free.popleft()
        s = self._streams[stream]
        self._owner[chunk] = stream
        self._allocation[chunk] = self._allocations
        self._start[chunk] = s.dropped + s.frames
        self._allocations += 1
        self._allocated.append(chunk)
        s.chunks.append(chunk)
        s.filled = 0

    def _evict(self, chunk: int) -> None:
        owner = int(self._owner[chunk])
        s = self._streams[owner]
        first = s.chunks.popleft()
        assert first == chunk and self._allocated[0] == chunk  # the oldest chunk heads its stream
        self._allocated.popleft()
        lost = s.filled if not s.chunks else int(self._rows[chunk])  # its only chunk: the rows written so far
        if not s.chunks:
            s.filled = 0
        s.frames -= lost
        s.dropped += lost
        while s.cuts and s.cuts[0] <= s.dropped:  # a boundary before its oldest frame held bounds nothing now
            s.cuts.popleft()
        self.evicted += lost
        self._owner[chunk] = self._allocation[chunk] = self._start[chunk] = FREE
        self._free.append(chunk)
        self.freed.append(chunk)
        self._forget_if_done(owner)

    def _forget_if_done(self, stream: int) -> None:
        s = self._streams[stream]
        if not s.open and not s.chunks:
            del self._streams[stream]

    def _stream(self, stream: int) -> _Stream:
        try:
            return self._streams[stream]
        except KeyError:
            raise ValueError(
                f"stream: expected one of the buffer's streams {list(self._streams)}, got {stream}"
            ) from None

    # Reads.

    def rows(self, stream: int, starts: Any, num_steps: int = 1) -> np.ndarray:
        """Rows of the windows of `num_steps` frames of `stream` at `starts`: [len(starts), num_steps].

        A stream's frames are counted from the oldest it holds.
        """
        s = self._stream(stream)
        frames = np.asarray(starts, np.int64)[:, None] + np.arange(num_steps)
        if frames.size and (frames.min() < 0 or frames.max() >= s.frames):
            raise ValueError(f"starts: expected windows within the stream's {s.frames} frame(s), got {starts}")
        chunks = np.fromiter(s.chunks, np.int64, len(s.chunks))
        ends = np.cumsum(self._rows[chunks])
        which = np.searchsorted(ends, frames, side="right")
        offsets = frames - (ends[which] - self._rows[chunks[which]])
        return chunks[which] * self.chunk_rows + offsets

    def _valid(self, s: _Stream, num_steps: int, episodes: bool) -> tuple[np.ndarray, np.ndarray]:
        """The frames of `s` starting a window of `num_steps`, as intervals `[low, high)`, in order.

        Within episodes, the starts whose window holds a boundary are left out: for a boundary before frame
        `c`, the starts `c - num_steps + 1` to `c - 1`. O(the stream's boundaries), whatever its frames.
        """
        limit = s.frames - num_steps + 1
        if limit <= 0:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        cuts = np.fromiter(s.cuts, np.int64, len(s.cuts)) - s.dropped if episodes and num_steps > 1 else None
        if cuts is None or not cuts.size:
            return np.array([0]), np.array([limit])
        low, reach = np.maximum(cuts - num_steps + 1, 0), np.maximum.accumulate(cuts)  # the left-out intervals
        begins = np.flatnonzero(np.concatenate([[True], low[1:] > reach[:-1]]))  # where a merged one begins
        ends = np.concatenate([begins[1:] - 1, [len(cuts) - 1]])
        valid_low = np.concatenate([[0], reach[ends]])
        valid_high = np.minimum(np.concatenate([low[begins], [limit]]), limit)
        kept = valid_high > valid_low
        return valid_low[kept], valid_high[kept]

    def starts(self, stream: int, num_steps: int, episodes: bool = False) -> np.ndarray:
        """The frames of `stream` (counted from its oldest) that start a window of `num_steps` frames.

        `episodes`: only windows within one episode (the step types given to `append`).
        """
        low, high = self._valid(self._stream(stream), num_steps, episodes)
        parts = [np.arange(a, b) for a, b in zip(low.tolist(), high.tolist(), strict=True)]
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    def intervals(self, num_steps: int, episodes: bool = False) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Each stream's starts of windows of `num_steps` frames (`starts`) as intervals `[low, high)`.

        Only the streams that can give a window; `windows` counts them, `windows_at` numbers them.
        """
        found = {n: self._valid(s, num_steps, episodes) for n, s in self._streams.items()}
        return {n: (low, high) for n, (low, high) in found.items() if (high > low).any()}

    def windows(self, num_steps: int, episodes: bool = False) -> dict[int, int]:
        """How many windows of `num_steps` frames each stream can give (`starts`), for those that can give one."""
        return {n: int((high - low).sum()) for n, (low, high) in self.intervals(num_steps, episodes).items()}

    def windows_at(
        self,
        indices: Any,
        num_steps: int,
        episodes: bool = False,
        intervals: dict[int, tuple[np.ndarray, np.ndarray]] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(streams, starts) of the windows numbered `indices` among all `num_steps`-frame windows.

        Windows are numbered stream by stream, in the order of `windows(num_steps)`, each stream's from its oldest
        frame: a uniform index in [0, total) is a uniform window, each drawn with probability 1 / total.
        `intervals`: what `intervals(num_steps, episodes)` returned, if the caller has it (nothing changed since).
        """
        intervals = self.intervals(num_steps, episodes) if intervals is None else intervals
        numbers = np.fromiter(intervals, np.int64, len(intervals))
        sizes = np.fromiter(((high - low).sum() for low, high in intervals.values()), np.int64, len(intervals))
        ends = np.cumsum(sizes)
        total = int(ends[-1]) if len(ends) else 0
        indices = np.asarray(indices, np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= total):
            raise ValueError(f"indices: expected window numbers in [0, {total}), got {indices}")
        which = np.searchsorted(ends, indices, side="right")
        offsets = indices - (ends[which] - sizes[which])
        starts = np.empty(len(offsets), np.int64)
        for at in np.unique(which).tolist():  # each stream's intervals found once
            mine = which == at
            low, high = intervals[int(numbers[at])]
            before = np.cumsum(high - low)  # starts in the intervals up to each one
            interval = np.searchsorted(before, offsets[mine], side="right")
            starts[mine] = low[interval] + offsets[mine] - (before[interval] - (high - low)[interval])
        return numbers[which], starts

    def no_starts(self, num_steps: int, episodes: bool = False) -> np.ndarray:
        """Rows of held frames that start no window of `num_steps` (`starts`).

        A stream's newest `num_steps - 1` frames, and within episodes those whose window would hold a boundary.
        """
        parts = []
        for n, s in self._streams.items():
            if not s.frames:
                continue
            low, high = self._valid(s, num_steps, episodes)
            gap_low = np.concatenate([[0], high])  # the frames between the intervals, and after the last
            gap_high = np.concatenate([low, [s.frames]])
            frames = [np.arange(a, b) for a, b in zip(gap_low.tolist(), gap_high.tolist(), strict=True) if b > a]
            if frames:
                parts.append(self.rows(n, np.concatenate(frames))[:, 0])
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    def positions(self, rows: Any) -> tuple[np.ndarray, np.ndarray]:
        """(streams, frames) of held `rows`: the stream holding each, and its frame there, counted from its oldest."""
        rows = np.asarray(rows, np.int64)
        chunks = rows // self.chunk_rows
        owners = self._owner[chunks]
        if (owners == FREE).any():
            raise ValueError(f"rows: expected rows of held chunks, got {rows}")
        first = np.zeros(self.num_chunks, np.int64)  # each held chunk's first frame in its stream
        for n in np.unique(owners).tolist():
            held = np.fromiter(self._streams[n].chunks, np.int64)
            first[held] = np.cumsum(self._rows[held]) - self._rows[held]
        return owners, first[chunks] + rows % self.chunk_rows

    # State, for checkpoints and saves.

    def state(self) -> dict[str, Any]:
        """Everything the chunks' map holds, as plain values: `Streams.restored(state)` makes it again."""
        return {
            "capacity": self.capacity,
            "chunk_rows": self.chunk_rows,
            "allocations": self._allocations,
            "next_stream": self._next_stream,
            "evicted": self.evicted,
            "allocated": list(self._allocated),
            "allocation": self._allocation.tolist(),
            "streams": {
                str(n): {"chunks": list(s.chunks), "filled": s.filled, "frames": s.frames, "dropped": s.dropped,
                         "open": s.open, "cuts": list(s.cuts), "last": s.last}
                for n, s in self._streams.items()
            },
        }  # fmt: skip

    @classmethod
    def restored(cls, state: dict[str, Any]) -> Streams:
        """The streams whose `state()` this is."""
        made = cls(int(state["capacity"]), int(state["chunk_rows"]))
        made.restore(state)
        return made

    def restore(self, state: dict[str, Any]) -> None:
        """Takes the map `state()` gave (of the same capacity and chunks), written into the map's array."""
        self._allocations, self._next_stream = int(state["allocations"]), int(state["next_stream"])
        self.evicted = int(state["evicted"])
        self._allocation[:] = np.asarray(state["allocation"], np.int64)
        self._allocated = collections.deque(int(c) for c in state["allocated"])
        self._owner[:] = self._start[:] = FREE
        self._streams = {}
        for key, saved in state["streams"].items():
            stream = _Stream(collections.deque(int(c) for c in saved["chunks"]), int(saved["filled"]),
                             int(saved["frames"]), int(saved["dropped"]), bool(saved["open"]),
                             collections.deque(int(c) for c in saved["cuts"]), bool(saved["last"]))  # fmt: skip
            self._streams[int(key)] = stream
            chunks = list(stream.chunks)
            self._owner[chunks] = int(key)
            self._start[chunks] = stream.dropped + np.cumsum(self._rows[chunks]) - self._rows[chunks]
        self._free = collections.deque(c for c in range(self.num_chunks) if self._owner[c] == FREE)

    def rebuild(self, filled: np.ndarray, allocations: int, step_types: Callable[[np.ndarray], Any] | None) -> None:
        """The streams of a reopened map (`chunks=` a file's): what the chunks' owners, allocations and starts say.

        `filled`: how many rows of each chunk hold a frame of its current allocation (from its first row on); a
        chunk holding none is freed. `allocations`: more than any allocation number a row was written under.
        `step_types(rows)`: the step types of those frames, for episode boundaries (None: without). Every
        stream is closed: the next frames of its segment go to a new one.
        """
        filled = np.where(self._owner == FREE, 0, np.asarray(filled, np.int64))
        empty = np.flatnonzero((self._owner != FREE) & (filled == 0))
        self._owner[empty] = self._allocation[empty] = self._start[empty] = FREE
        held = np.flatnonzero(self._owner != FREE)
        order = held[np.argsort(self._allocation[held], kind="stable")].tolist()
        self._allocated = collections.deque(order)
        self._free = collections.deque(np.flatnonzero(self._owner == FREE).tolist())
        self._allocations = allocations
        self._streams = {}
        for chunk in order:
            s = self._streams.setdefault(int(self._owner[chunk]), _Stream(open=False))
            s.chunks.append(chunk)
        for n in sorted(self._streams):
            s = self._streams.pop(n)
            self._streams[n] = s  # in the order they were opened
            first, tail = s.chunks[0], s.chunks[-1]
            s.filled, s.dropped = int(filled[tail]), int(self._start[first])
            s.frames = int(self._start[tail]) + s.filled - s.dropped
            if step_types is not None:
                types = np.asarray(step_types(self.rows(n, np.arange(s.frames))[:, 0])).reshape(-1)
                after = np.flatnonzero((types[:-1] == LAST) | (types[1:] == FIRST)) + 1  # frames an episode begins at
                s.cuts = collections.deque((after + s.dropped).tolist())
                s.last = bool(types.size) and int(types[-1]) == LAST
        self._next_stream = max(self._streams, default=-1) + 1


REDRAWS = 4
"""Prioritized draws that land on a row starting no window are drawn again this many times, then exactly."""


def draw_prioritized(
    streams: Streams,
    tree: np.ndarray,
    priorities: np.ndarray,
    rng: np.random.Generator,
    count: int,
    num_steps: int,
    episodes: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """(rows, probabilities) of `count` window starts drawn in proportion to their rows' priorities.

    `priorities`: every row's (0 for rows holding no frame), and `tree` the sum tree over them
    (`tfbuffers.sampling._sum_tree`). Rows starting no window (`Streams.no_starts`) are left out: a draw that lands
    on one is drawn again (rejection keeps the others' proportions exactly), `REDRAWS` times, then among the
    window starts by a running sum. With `episodes`, windows within one episode only (`Streams.starts`). A
    start's probability is its priority over the window starts' total.
    """
    from tfbuffers.sampling import _sum_tree

    excluded = streams.no_starts(num_steps, episodes)
    total = float(tree[1, _sum_tree.SUM]) - float(priorities[excluded].sum())
    if not total > 0:
        raise ValueError(f"num_steps={num_steps}: no window of the buffer has a priority above 0")
    rows = _sum_tree.find_numpy(tree, streams.capacity, rng.random(count) * tree[1, _sum_tree.SUM])
    for round_ in range(REDRAWS + 1):
        again = np.flatnonzero(np.isin(rows, excluded))
        if not again.size:
            break
        if round_ < REDRAWS:
            rows[again] = _sum_tree.find_numpy(tree, streams.capacity, rng.random(again.size) * tree[1, _sum_tree.SUM])
        else:  # the newest frames hold most of the weight: draw among the starts
            weights = priorities.astype(np.float64)
            weights[excluded] = 0.0
            ends = np.cumsum(weights)
            rows[again] = np.minimum(
                np.searchsorted(ends, rng.random(again.size) * ends[-1], side="right"), len(ends) - 1
            )
    return rows, priorities[rows] / total
