"""`ElasticStore`: the Ray buffer's `layout="elastic"`, one storage of `capacity` rows shared by every writer.

The segments' layout gives each of the `batch_size` segments `capacity / batch_size` rows: a segment no writer
claims holds nothing, and a writer's ring overwrites its own frames while other segments stay empty. The elastic
layout keeps every frame in one storage of `capacity` rows cut into chunks (`Streams`): each claim of a segment
(a writer's environment) opens a stream there, which takes chunks as it fills, and when none is free the chunk
allocated longest ago goes, whoever holds it. The buffer holds its capacity whatever the number of writers,
oldest frames out (within a chunk of the capacity: a new chunk is taken whole), and windows are read within
one stream: never from one writer's frames into another's, nor across episodes with `episode_boundaries`.

Ids are the segments' (`add_number * batch_size + segment`, the add number counted per segment across the
writers that held it), so `RayWriter`, `update_priorities` and the draws' reports do not change. `RayHost`
reads the store through one `ElasticSegment` per segment, in the place of the segments' py buffers; a draw is
one draw over every stream's windows (`draw`), uniform or by priority, with exact probabilities.

Not thread-safe: `RayHost` calls it under its lock.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np

from tfbuffers import specs, storage
from tfbuffers.buffers._segmented import _step_type_field
from tfbuffers.remote.ray.streams import FREE, Streams, draw_prioritized
from tfbuffers.sampling import _sum_tree
from tfbuffers.sampling.base import EMPTY, NO_PRIORITY
from tfbuffers.sampling.priorities import leaf_weights

LAYOUTS = ("segments", "elastic")
ROWS_FILE = "elastic.safetensors"
MAP_FILE = "elastic.json"
STORE_DIRECTORY = "elastic"
"""With `directory=`: the store's memory-mapped files, in this subdirectory."""
FORMAT = 1
CHUNKS_PER_SEGMENT = 32
"""The capacity is cut into `batch_size * CHUNKS_PER_SEGMENT` chunks (at most `MAX_CHUNK_ROWS` rows each)."""
MAX_CHUNK_ROWS = 4096

NO_WINDOW = (
    "{buffer}: num_steps={num_steps}: expected a writer's stream of at least {num_steps} consecutive frames"
    "{episodes}, got none (the longest holds {longest})"
)


def made_storage(directory: str | None, fields: list[specs.Field], capacity: int, reopen: bool) -> storage.Storage:
    """The rows of `capacity` frames: in RAM, or memory-mapped under `directory`/`STORE_DIRECTORY`, new or `reopen`ed.

    A memory-mapped add is journaled as one frame of a ring buffer's (`tfbuffers.storage.memmap`): a row it
    overwrites comes back if the process dies before its counter moves.
    """
    if directory is None:
        return storage.make(None, fields, capacity)
    from tfbuffers.storage.memmap import MemmapStorage

    made = MemmapStorage(pathlib.Path(directory) / STORE_DIRECTORY, reopen=reopen)(fields, capacity)
    try:
        made.attach(1, capacity)
    except BaseException:
        made.close()
        raise
    return made


def held_rows(streams: Streams) -> np.ndarray:
    """Every row holding a frame, stream by stream, each stream's oldest first."""
    parts = [streams.rows(n, np.arange(streams.frames(n)))[:, 0] for n in streams.streams()]
    return np.concatenate(parts) if parts else np.empty(0, np.int64)


def chunk_rows(capacity: int, batch_size: int) -> int:
    """Rows per chunk: a 32nd of a segment's share, at most `MAX_CHUNK_ROWS`.

    Frames go a chunk at a time: a full buffer holds its capacity less at most a chunk per stream.
    """
    return max(1, min(MAX_CHUNK_ROWS, capacity // (batch_size * CHUNKS_PER_SEGMENT)))


class ElasticStore:
    """The frames of every segment's streams in one storage of `batch_size * max_length` rows (see the module)."""

    def __init__(self, config: dict[str, Any], reopen: bool = False) -> None:
        """A new store, in RAM or (`config["directory"]`) memory-mapped there; `reopen`: the one a directory holds.

        Raises:
          ValueError: Naming the directory or file, if a new directory is not empty or a reopened one's files
            are not this store's (nothing changed on the disk then).
          tfbuffers.storage.memmap.DirectoryInUseError: If another process holds the directory.
        """
        self._label = f"RayReplayBuffer {config['name']!r}"
        self._fields = specs.flatten_spec(config["data_spec"])
        self.segments = config["batch_size"]
        capacity = self.segments * config["max_length"]
        rows = chunk_rows(capacity, self.segments)
        self._storage = made_storage(config["directory"], self._fields, capacity, reopen)
        try:
            extra = self._storage.extra  # in the files with a directory: every array below outlives the process
            self._slot = extra("elastic/segment", np.full(capacity, -1, np.int64))  # each row's segment,
            self._number = extra("elastic/number", np.full(capacity, -1, np.int64))  # its add number there,
            self._stamp = extra("elastic/stamp", np.full(capacity, -1, np.int64))  # its chunk's allocation then
            self._priorities = extra("priority", np.zeros(capacity, np.float64))
            self._chunks = extra("elastic/chunks", np.full((3, -(-capacity // rows)), FREE, np.int64))
            self._counts = extra("elastic/added", np.zeros((1, self.segments), np.int64))
            self._largest = extra("elastic/largest", np.ones((1, 1), np.float64))
            recovery = self._storage.ready("RayReplayBuffer elastic store", config["data_spec"], dict)
        except BaseException:
            self._storage.close()
            raise
        self._streams = Streams(capacity, rows, self._chunks)
        self._step_field = _step_type_field(self._fields, config["episode_boundaries"])
        self._episodes = self._step_field is not None  # the streams keep their episodes' boundaries
        self._open: list[int | None] = [None] * self.segments  # each segment's stream taking its adds
        self._history: list[list[tuple[int, int]]] = [[] for _ in range(self.segments)]  # (first add, stream)
        self.prioritized = config["sampler"] == "prioritized"
        self._exponent = float(config["priority_exponent"])
        self._weights = np.zeros(capacity, np.float64)  # priority ** exponent, the sum tree's leaves
        self._tree = _sum_tree.empty(capacity)
        self.views = [ElasticSegment(self, s) for s in range(self.segments)]
        if recovery.clearing:  # a clear its process did not finish
            self.clear()
        elif recovery.reopened:
            self._rebuild()

    @property
    def added(self) -> np.ndarray:
        """Each segment's adds since the last clear, across its streams."""
        return self._counts[0]

    @property
    def largest(self) -> float:
        """The priority of new frames: the largest given so far (1 at first)."""
        return float(self._largest[0, 0])

    @largest.setter
    def largest(self, value: float) -> None:
        self._largest[0, 0] = value

    def _rebuild(self) -> None:
        """A reopened directory's streams, rebuilt from its chunks' map and the rows' stamps.

        A row holds a frame if its stamp is its chunk's allocation: an add stamps its row last, and a file's
        journal undoes an add whose counter had not moved.
        """
        capacity, rows = self._streams.capacity, self._streams.chunk_rows
        count = self._streams.num_chunks
        stamps = np.full(count * rows, -2, np.int64)
        stamps[:capacity] = self._stamp
        current = stamps.reshape(count, rows) == self._chunks[1][:, None]
        filled = np.where(current.all(axis=1), rows, current.argmin(axis=1))  # the prefix of each chunk stamped
        allocations = int(max(self._chunks[1].max(initial=-1), self._stamp.max(initial=-1))) + 1
        step_types = None
        if self._step_field is not None:
            column = self._storage.column(self._step_field)
            step_types = lambda held: column[held]  # noqa: E731
        self._streams.rebuild(filled, allocations, step_types)
        held = held_rows(self._streams)
        valid = np.zeros(capacity, bool)
        valid[held] = True
        self._slot[~valid], self._number[~valid], self._priorities[~valid] = -1, -1, 0.0
        for n in self._streams.streams():
            oldest = int(self._streams.rows(n, [0])[0, 0])
            segment = int(self._slot[oldest])
            self._history[segment].append((int(self._number[oldest]) - self._streams.dropped(n), n))
        numbers, slots = self._number[held], self._slot[held]
        for segment in range(self.segments):  # an add whose count had not moved when its process died, counted
            self.added[segment] = max(int(self.added[segment]), int(numbers[slots == segment].max(initial=-1)) + 1)
        self._weights[:] = leaf_weights(self._priorities, self._exponent)
        self._tree = _sum_tree.build(self._weights, capacity)

    # Writes.

    def new_stream(self, segment: int) -> None:
        """A new writer holds `segment`: its adds go to a new stream (no window reaches back into the last one's)."""
        stream = self._open[segment]
        if stream is not None:
            self._streams.close(stream)
            self._open[segment] = None

    def add(self, segment: int, leaves: list[np.ndarray]) -> int:
        """Appends one frame (`leaves`, each `[1, ...]`) to `segment`'s stream; returns its add number there."""
        stream = self._open[segment]
        if stream is None:
            stream = self._open[segment] = self._streams.open()
            self._history[segment].append((int(self.added[segment]), stream))
        types = None if self._step_field is None else leaves[self._step_field].reshape(1)
        row = int(self._streams.append(stream, 1, types)[0])
        self._forget_freed()
        self._storage.write_block(row, leaves)  # a memory-mapped row journaled until the counter moves
        number = int(self.added[segment])
        self._slot[row], self._number[row] = segment, number
        if self.prioritized:
            self._set([row], np.array([self.largest]))
        self._stamp[row] = self._chunks[1][row // self._streams.chunk_rows]  # the row holds a frame
        self._storage.added += 1  # the add is kept (a file's journal spent)
        self.added[segment] = number + 1
        return number

    def _forget_freed(self) -> None:
        """The chunks evicted by the last append: their rows name no frame and weigh nothing."""
        if self._streams.freed:
            rows = (np.asarray(self._streams.freed, np.int64)[:, None] * self._streams.chunk_rows).ravel()
            rows = (rows[:, None] + np.arange(self._streams.chunk_rows)).ravel()
            rows = rows[rows < self._streams.capacity]
            self._streams.freed.clear()
            self._slot[rows], self._number[rows], self._stamp[rows] = -1, -1, -1
            if self.prioritized:
                self._set(rows, np.zeros(len(rows)))

    def _set(self, rows: Any, priorities: np.ndarray) -> None:
        """Sets the priorities of distinct `rows`, and their weights in the sum tree."""
        rows = np.asarray(rows, np.int64)
        weights = np.asarray(leaf_weights(priorities, self._exponent), np.float64)
        self._priorities[rows], self._weights[rows] = priorities, weights
        _sum_tree.update_numpy(self._tree, self._streams.capacity, rows, weights, distinct=True)

    def clear(self) -> None:
        """Empties every stream; the segments count their adds from 0 again (as a segment's `clear`)."""
        capacity, rows = self._streams.capacity, self._streams.chunk_rows
        with self._storage.changing("clear"):  # a directory's clear cut short is finished when it is reopened
            self._chunks[...] = FREE
            self._slot[:], self._number[:], self._stamp[:] = -1, -1, -1
            self._priorities[:] = 0.0
            self.added[:] = 0
            self.largest = 1.0
            self._storage.added = 0
        self._streams = Streams(capacity, rows, self._chunks)
        self._open = [None] * self.segments
        self._history = [[] for _ in range(self.segments)]
        self._weights[:] = 0.0
        self._tree = _sum_tree.empty(capacity)

    # Reads.

    def _held(self, segment: int) -> list[int]:
        """`segment`'s streams still holding frames (or open), oldest first; forgets the others."""
        history = [(first, n) for first, n in self._history[segment] if self._streams.holds(n)]
        self._history[segment] = history
        return [n for _, n in history]

    def num_frames(self, segment: int | None = None) -> int:
        """Frames `segment`'s streams hold (None: every segment's)."""
        if segment is None:
            return self._streams.num_frames()
        return sum(self._streams.frames(n) for n in self._held(segment))

    def gather(self, segment: int) -> list[np.ndarray]:
        """`segment`'s frames, its streams' one after another, oldest first: each leaf `[1, frames, ...]`."""
        parts = [self._streams.rows(n, np.arange(self._streams.frames(n)))[:, 0] for n in self._held(segment)]
        rows = np.concatenate(parts) if parts else np.empty(0, np.int64)
        return [leaf[None] for leaf in self._storage.read(rows)]

    def rows_of(self, segment: int, numbers: np.ndarray) -> np.ndarray:
        """The rows of `segment`'s add numbers `numbers`, -1 for frames evicted since."""
        held = self._held(segment)
        numbers = np.asarray(numbers, np.int64)
        firsts = np.fromiter((first for first, _ in self._history[segment]), np.int64, len(held))
        which = np.searchsorted(firsts, numbers, side="right") - 1  # the stream each add went to (-1: before all)
        rows = np.full(len(numbers), -1, np.int64)
        for at in np.unique(which[which >= 0]).tolist():
            mine = np.flatnonzero(which == at)
            stream = held[at]
            frames = numbers[mine] - firsts[at] - self._streams.dropped(stream)
            kept = (frames >= 0) & (frames < self._streams.frames(stream))
            rows[mine[kept]] = self._streams.rows(stream, frames[kept])[:, 0]
        return rows

    def update_priorities(self, segment: int, numbers: np.ndarray, priorities: np.ndarray) -> int:
        """Sets the priorities of `segment`'s frames `numbers` (checked); returns how many were evicted (skipped)."""
        rows = self.rows_of(segment, numbers)
        held = rows >= 0
        if held.any():
            given = np.asarray(priorities, np.float64)[held]
            self._set(*_sum_tree.NUMPY.last_of_each(rows[held], given))  # a repeated id: its last priority
            self.largest = max(self.largest, float(given.max()))
        return int((~held).sum())

    def draw(
        self, rng: np.random.Generator, count: int, num_steps: int | None
    ) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        """`count` windows of `num_steps` frames (None: single frames) over every stream: (leaves, ids, probabilities).

        Uniform: each window with probability 1 / windows; by priority: its first frame's weight over the
        weights of the frames that start a window.
        """
        steps = num_steps or 1
        streams = self._streams
        if not streams.num_frames():
            raise ValueError(EMPTY.format(buffer=self._label))
        intervals = streams.intervals(steps, self._episodes)
        if not intervals:
            longest = max(streams.frames(n) for n in streams.streams())
            episodes = " within one episode" if self._episodes else ""
            raise ValueError(NO_WINDOW.format(buffer=self._label, num_steps=steps, episodes=episodes, longest=longest))
        if self.prioritized:
            try:
                starts, probabilities = draw_prioritized(
                    streams, self._tree, self._weights, rng, count, steps, self._episodes
                )  # fmt: skip
            except ValueError:
                raise ValueError(NO_PRIORITY.format(buffer=self._label)) from None
            owners, frames = streams.positions(starts)
        else:
            total = int(sum((high - low).sum() for low, high in intervals.values()))
            owners, frames = streams.windows_at(rng.integers(total, size=count), steps, self._episodes, intervals)
            probabilities = np.full(count, 1.0 / total)
        rows = np.empty((count, steps), np.int64)
        for n in np.unique(owners).tolist():
            mine = owners == n
            rows[mine] = streams.rows(n, frames[mine], steps)
        read = rows if num_steps is not None else rows[:, 0]  # every frame's id, as the local buffers give them
        leaves = self._storage.read(read)
        ids = self._number[read] * self.segments + self._slot[read]
        return leaves, ids, np.asarray(probabilities, np.float32)

    # Files, for `save`, checkpoints and `load`.

    def save(self, directory: pathlib.Path) -> None:
        """Writes the store under `directory`: its rows and per-row arrays (safetensors) and the streams' map (JSON)."""
        from safetensors.numpy import save_file

        arrays = {f"field-{i}": np.ascontiguousarray(rows) for i, rows in enumerate(self._storage.copies())}
        arrays.update(segment=self._slot, number=self._number, priority=self._priorities)
        directory.mkdir(parents=True, exist_ok=True)
        save_file(arrays, str(directory / ROWS_FILE))
        layout = {
            "format": FORMAT,
            "streams": self._streams.state(),
            "added": self.added.tolist(),
            "open": self._open,
            "history": self._history,
            "largest": self.largest,
        }
        (directory / MAP_FILE).write_text(json.dumps(layout))

    def load(self, directory: pathlib.Path) -> None:
        """Replaces the store's contents by what `save` wrote under `directory`, checked first (nothing changes if not).

        Raises:
          FileNotFoundError: If a file is missing.
          ValueError: If the files are of another format, capacity or spec, naming what differs.
        """
        from safetensors.numpy import load_file

        where = directory / MAP_FILE
        layout = json.loads(where.read_text())
        if layout.get("format") != FORMAT:
            raise ValueError(f"{where}: format: expected {FORMAT}, got {layout.get('format')!r}")
        streams = Streams.restored(layout["streams"])
        capacity = self._streams.capacity
        if (streams.capacity, streams.chunk_rows) != (capacity, self._streams.chunk_rows):
            raise ValueError(
                f"{where}: expected a store of {capacity} rows in chunks of {self._streams.chunk_rows}, got "
                f"{streams.capacity} in chunks of {streams.chunk_rows}"
            )
        if len(layout["added"]) != self.segments:
            raise ValueError(f"{where}: expected {self.segments} segments, got {len(layout['added'])}")
        arrays = load_file(str(directory / ROWS_FILE))
        expected = {f"field-{i}": ((capacity, *field.spec.shape), field.spec.dtype.as_numpy_dtype)
                    for i, field in enumerate(self._fields)}  # fmt: skip
        expected.update(segment=((capacity,), np.int64), number=((capacity,), np.int64))
        expected["priority"] = ((capacity,), np.float64)
        for name, (shape, dtype) in expected.items():
            array = arrays.get(name)
            if array is None or array.shape != tuple(shape) or array.dtype != dtype:
                received = None if array is None else f"{array.dtype}{list(array.shape)}"
                raise ValueError(
                    f"{directory / ROWS_FILE}: {name}: expected {np.dtype(dtype)}{list(shape)}, got {received}"
                )  # fmt: skip
        with self._storage.changing("restore"):  # a directory's load cut short is refused when it is reopened
            self._storage.replace([arrays[f"field-{i}"] for i in range(len(self._fields))])
            self._streams = Streams(capacity, self._streams.chunk_rows, self._chunks)
            self._streams.restore(layout["streams"])
            self._slot[:], self._number[:] = arrays["segment"], arrays["number"]
            held = held_rows(self._streams)
            self._stamp[:] = -1
            self._stamp[held] = self._chunks[1][held // self._streams.chunk_rows]
            self._priorities[:] = arrays["priority"]
            self.added[:] = [int(a) for a in layout["added"]]
            self.largest = float(layout["largest"])
            self._storage.added = int(self.added.sum())
        for n in layout["open"]:  # the frames after the save are not here: a writer's next add starts a stream
            if n is not None:
                self._streams.close(int(n))
        self._open = [None] * self.segments
        self._history = [[(int(first), int(n)) for first, n in held] for held in layout["history"]]
        self._weights[:] = leaf_weights(self._priorities, self._exponent)
        self._tree = _sum_tree.build(self._weights, capacity)

    def flush(self) -> None:
        """Writes a memory-mapped store back to the disk (`msync`): a machine crash after it keeps every add."""
        self._storage.flush()

    def close(self) -> None:
        """Releases the storage."""
        self._storage.close()


class _Added:
    """A segment's add count, read where `RayHost` reads a py buffer's `storage.added`."""

    def __init__(self, store: ElasticStore, segment: int) -> None:
        self._store, self._segment = store, segment

    @property
    def added(self) -> int:
        return int(self._store.added[self._segment])


class _Largest:
    """The store's priority for new frames, read where `RayHost` reads a prioritized segment's sampler."""

    def __init__(self, store: ElasticStore) -> None:
        self._store = store

    @property
    def max_priority(self) -> float:
        return self._store.largest

    def raise_max_priority(self, priority: float) -> None:
        self._store.largest = max(self._store.largest, float(priority))


class ElasticSegment:
    """Segment `segment` of an `ElasticStore`, read and written by `RayHost` as it would a py buffer of one segment."""

    def __init__(self, store: ElasticStore, segment: int) -> None:
        self.store, self._segment = store, segment  # the store: what `save_segments` writes
        self.storage = _Added(store, segment)
        self.sampler = _Largest(store)

    def new_stream(self) -> None:
        """A new writer claimed the segment (`ElasticStore.new_stream`)."""
        self.store.new_stream(self._segment)

    def num_frames(self) -> int:
        """Frames the segment's streams hold."""
        return self.store.num_frames(self._segment)

    def gather_all(self) -> list[np.ndarray]:
        """The segment's frames, each leaf `[1, frames, ...]`."""
        return self.store.gather(self._segment)

    def update_priorities(self, numbers: np.ndarray, priorities: np.ndarray) -> int:
        """`ElasticStore.update_priorities` for this segment."""
        return self.store.update_priorities(self._segment, numbers, priorities)

    def clear(self) -> None:
        """Empties the whole store (`RayHost.clear` clears every segment)."""
        self.store.clear()

    def flush(self) -> None:
        """Writes a memory-mapped store back to the disk (once for every segment)."""
        if self._segment == 0:
            self.store.flush()

    def close(self) -> None:
        """Releases the store (once for every segment)."""
        if self._segment == 0:
            self.store.close()
