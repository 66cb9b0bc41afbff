"""`Streams`: the chunks of one storage shared by writers' streams, oldest chunk out (no Ray needed)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tfbuffers.remote.ray.streams import Streams, draw_prioritized
from tfbuffers.sampling import _sum_tree


class Stored:
    """Streams and the storage their rows index: each frame's code written where `append` says."""

    def __init__(self, capacity, chunk_rows):
        self.streams = Streams(capacity, chunk_rows)
        self.storage = np.full(capacity, -1, np.int64)
        self.appended = {}  # stream -> every code it appended, in order

    def open(self):
        stream = self.streams.open()
        self.appended[stream] = []
        return stream

    def add(self, stream, codes, step_types=None):
        rows = self.streams.append(stream, len(codes), step_types)
        self.storage[rows] = codes
        self.appended[stream].extend(codes)
        return rows

    def held(self, stream):
        """The codes `stream` holds, read back through its rows."""
        frames = self.streams.frames(stream)
        return self.storage[self.streams.rows(stream, np.arange(frames))[:, 0]].tolist() if frames else []


def test_writers_one_after_another_share_the_whole_capacity():
    # Finding 4 of issue 50 (and 1): four writers of one environment each, 60 frames each, one after another, in
    # a buffer of 400: all 240 kept, whatever the number of writers.
    stored = Stored(400, 16)
    for writer in range(4):
        stream = stored.open()
        stored.add(stream, list(range(writer * 1000, writer * 1000 + 60)))
        stored.streams.close(stream)
    assert stored.streams.num_frames() == 240 and stored.streams.evicted == 0
    assert [stored.held(s) for s in stored.streams.streams()] == [stored.appended[s] for s in range(4)]


def test_one_writer_alone_fills_the_capacity_it_asked_for():
    stored = Stored(400, 16)
    stream = stored.open()
    stored.add(stream, list(range(400)))
    assert stored.streams.num_frames() == 400 and stored.held(stream) == list(range(400))
    stored.add(stream, [400])  # one more: its oldest chunk (16 frames) goes
    assert stored.held(stream) == list(range(16, 401)) and stored.streams.evicted == 16


def test_the_chunk_allocated_longest_ago_goes_first_whoever_holds_it():
    stored = Stored(8, 2)
    a, b = stored.open(), stored.open()
    stored.add(a, [0, 1, 2])  # chunks 0 and 1 (half)
    stored.add(b, [10, 11, 12, 13])  # chunks 2 and 3: the buffer is full of chunks
    stored.add(a, [3])  # fills a's second chunk: nothing evicted
    assert stored.streams.evicted == 0 and stored.streams.num_frames() == 8
    stored.add(b, [14])  # b needs a chunk: a's first, allocated first, goes
    assert stored.held(a) == [2, 3] and stored.held(b) == [10, 11, 12, 13, 14]
    stored.add(a, [4, 5])  # a needs a chunk: its own, allocated before b's, goes
    assert stored.held(a) == [4, 5] and stored.held(b) == [10, 11, 12, 13, 14]
    assert stored.streams.evicted == 4


def test_a_capacity_that_chunk_rows_does_not_divide_is_held_whole():
    stored = Stored(10, 4)  # chunks of 4, 4 and 2 rows
    stream = stored.open()
    stored.add(stream, list(range(10)))
    assert stored.held(stream) == list(range(10)) and stored.streams.num_chunks == 3
    stored.add(stream, [10])
    assert stored.held(stream) == list(range(4, 11))  # the first chunk's 4 frames went
    windows = stored.streams.windows(3)
    assert windows == {stream: 5}
    rows = stored.streams.rows(stream, np.arange(5), 3)
    assert stored.storage[rows].tolist() == [[4 + i, 5 + i, 6 + i] for i in range(5)]  # across chunks, in order


def test_windows_stay_within_one_stream():
    stored = Stored(12, 2)
    streams = [stored.open() for _ in range(3)]
    for step in range(4):  # interleaved adds: the streams' chunks alternate in the storage
        for s in streams:
            stored.add(s, [s * 100 + step])
    assert stored.streams.windows(2) == dict.fromkeys(streams, 3)
    for s in streams:
        codes = stored.storage[stored.streams.rows(s, np.arange(3), 2)]
        assert (codes // 100 == s).all() and (np.diff(codes, axis=1) == 1).all()


def test_positions_name_each_rows_stream_and_frame_and_follow_evictions():
    stored = Stored(6, 2)
    a, b = stored.open(), stored.open()
    rows_a = stored.add(a, [0, 1, 2])  # chunks 0 and 1 (half)
    rows_b = stored.add(b, [10])  # chunk 2
    streams, frames = stored.streams.positions(np.concatenate([rows_a, rows_b]))
    assert streams.tolist() == [a, a, a, b] and frames.tolist() == [0, 1, 2, 0]
    stored.add(b, [11, 12])  # b's second chunk is a's first, the oldest: a keeps its frame 2, now its frame 0
    streams, frames = stored.streams.positions(rows_a[2:])
    assert streams.tolist() == [a] and frames.tolist() == [0]
    streams, frames = stored.streams.positions(stored.streams.rows(b, np.arange(3))[:, 0])
    assert streams.tolist() == [b] * 3 and frames.tolist() == [0, 1, 2]


def test_a_stream_closed_keeps_its_frames_until_evicted_and_is_then_forgotten():
    stored = Stored(4, 2)
    a = stored.open()
    stored.add(a, [0, 1])
    stored.streams.close(a)
    with pytest.raises(ValueError, match="stream 0: closed, it takes no more frames"):
        stored.streams.append(a, 1)
    assert stored.streams.streams() == [a] and stored.held(a) == [0, 1]
    b = stored.open()
    stored.add(b, [10, 11, 12])
    assert stored.streams.streams() == [b] and stored.streams.num_frames() == 3  # a's chunk went to b
    with pytest.raises(ValueError, match=r"stream: expected one of the buffer's streams \[1\], got 0"):
        stored.streams.frames(a)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda s, n: s.append(n, 5), r"count: expected an int in \[0, capacity=4\], got 5"),
        (lambda s, n: s.append(n, -1), r"count: expected an int in \[0, capacity=4\], got -1"),
        (lambda s, n: s.rows(n, [1], 2), r"starts: expected windows within the stream's 2 frame\(s\), got \[1\]"),
        (lambda s, n: s.positions([3]), r"rows: expected rows of held chunks, got \[3\]"),
    ],
)
def test_bad_calls_are_refused_and_change_nothing(call, message):
    stored = Stored(4, 2)
    stream = stored.open()
    stored.add(stream, [0, 1])
    before = json.dumps(stored.streams.state())
    with pytest.raises(ValueError, match=message):
        call(stored.streams, stream)
    assert json.dumps(stored.streams.state()) == before
    stored.add(stream, [2])
    assert stored.held(stream) == [0, 1, 2]


@pytest.mark.parametrize(("capacity", "chunk_rows"), [(0, 1), (4, 0), (4, 5)])
def test_bad_sizes_are_refused(capacity, chunk_rows):
    with pytest.raises(ValueError, match="capacity: expected a positive int|chunk_rows: expected an int in"):
        Streams(capacity, chunk_rows)


def test_random_writers_keep_a_suffix_of_each_stream_within_the_capacity_and_restore_from_their_state():
    rng = np.random.default_rng(7)
    stored = Stored(50, 4)
    code = 0
    for step in range(2_000):
        open_ = [s for s in stored.appended if s in stored.streams.streams() and stored.streams._streams[s].open]
        if len(open_) < 2 or rng.random() < 0.02:
            open_.append(stored.open())
        if len(open_) > 1 and rng.random() < 0.02:
            stored.streams.close(open_.pop(int(rng.integers(len(open_)))))
        stream = open_[int(rng.integers(len(open_)))]
        count = int(rng.integers(1, 7))
        stored.add(stream, list(range(code, code + count)))
        code += count
        assert stored.streams.num_frames() <= 50
        assert stored.streams.num_frames() + stored.streams.evicted == code
        if step % 100 == 0:
            for s in stored.streams.streams():
                held = stored.held(s)
                assert held == stored.appended[s][len(stored.appended[s]) - len(held) :]  # a suffix, in order
            restored = Streams.restored(json.loads(json.dumps(stored.streams.state())))
            assert restored.state() == stored.streams.state()
            for s in stored.streams.streams():
                frames = stored.streams.frames(s)
                np.testing.assert_array_equal(
                    restored.rows(s, np.arange(frames)), stored.streams.rows(s, np.arange(frames))
                )
    # Full, the buffer holds within a chunk per stream of its capacity: only the streams' last chunks are part-full.
    assert stored.streams.num_frames() >= 50 - 4 * len(stored.streams.streams())


def test_window_numbers_name_every_window_once():
    stored = Stored(12, 2)
    a, b, c = stored.open(), stored.open(), stored.open()
    stored.add(a, [0, 1, 2, 3])
    stored.add(b, [10])  # too short for a window of 2
    stored.add(c, [20, 21, 22])
    assert stored.streams.windows(2) == {a: 3, c: 2}
    streams, starts = stored.streams.windows_at(np.arange(5), 2)
    assert list(zip(streams.tolist(), starts.tolist(), strict=True)) == [(a, 0), (a, 1), (a, 2), (c, 0), (c, 1)]
    windows = [stored.storage[stored.streams.rows(s, [t], 2)[0]].tolist() for s, t in zip(streams, starts, strict=True)]
    assert windows == [[0, 1], [1, 2], [2, 3], [20, 21], [21, 22]]
    with pytest.raises(ValueError, match=r"indices: expected window numbers in \[0, 5\), got \[5\]"):
        stored.streams.windows_at([5], 2)


@pytest.mark.parametrize("newest_weight", [1.0, 1e6], ids=["rejection", "exact fallback"])
def test_prioritized_draws_follow_the_starts_priorities_exactly(newest_weight):
    stored = Stored(12, 2)
    a, b = stored.open(), stored.open()
    rows_a = stored.add(a, [0, 1, 2, 3])
    rows_b = stored.add(b, [10, 11, 12])
    priorities = np.zeros(12)
    priorities[rows_a] = [1.0, 2.0, 3.0, newest_weight]  # windows of 2: starts 0, 1, 2 of a; 10, 11 of b
    priorities[rows_b] = [4.0, 5.0, newest_weight]
    tree = _sum_tree.build(priorities, 12)
    assert sorted(stored.streams.no_starts(2).tolist()) == sorted([rows_a[3], rows_b[2]])
    rows, probabilities = draw_prioritized(stored.streams, tree, priorities, np.random.default_rng(3), 150_000, 2)
    starts = [rows_a[0], rows_a[1], rows_a[2], rows_b[0], rows_b[1]]
    expected = np.array([1.0, 2.0, 3.0, 4.0, 5.0]) / 15.0
    assert set(rows.tolist()) == set(starts)  # never a newest frame
    np.testing.assert_array_equal(probabilities, priorities[rows] / 15.0)
    counts = np.array([(rows == row).sum() for row in starts])
    np.testing.assert_allclose(counts / 150_000, expected, atol=0.004)  # about 4 standard deviations, seed fixed


def test_with_step_types_windows_stay_within_episodes():
    stored = Stored(12, 2)
    a, b = stored.open(), stored.open()
    rows_a = stored.add(a, [0, 1, 2, 3, 4, 5], [0, 1, 2, 0, 1, 1])  # an episode ends at frame 2, the next starts at 3
    rows_b = stored.add(b, [10, 11], [1, 1])
    rows_b = np.concatenate([rows_b, stored.add(b, [12, 13], [0, 1])])  # a FIRST at frame 2: a boundary before it
    assert stored.streams.starts(a, 2, episodes=True).tolist() == [0, 1, 3, 4]
    assert stored.streams.starts(b, 2, episodes=True).tolist() == [0, 2]
    assert stored.streams.starts(a, 3, episodes=True).tolist() == [0, 3]
    assert stored.streams.windows(3, episodes=True) == {a: 2}
    streams, starts = stored.streams.windows_at(np.arange(6), 2, episodes=True)
    assert list(zip(streams.tolist(), starts.tolist(), strict=True)) == [(a, 0), (a, 1), (a, 3), (a, 4), (b, 0), (b, 2)]
    assert stored.streams.windows(2) == {a: 5, b: 3}  # without episodes: every consecutive pair

    excluded = stored.streams.no_starts(2, episodes=True)
    assert sorted(excluded.tolist()) == sorted([rows_a[2], rows_a[5], rows_b[1], rows_b[3]])
    priorities = np.zeros(12)
    priorities[rows_a], priorities[rows_b] = 1.0, 2.0
    tree = _sum_tree.build(priorities, 12)
    rows, probabilities = draw_prioritized(stored.streams, tree, priorities, np.random.default_rng(0), 1_000, 2, True)
    starts = {*rows_a[[0, 1, 3, 4]].tolist(), *rows_b[[0, 2]].tolist()}
    assert set(rows.tolist()) == starts
    np.testing.assert_array_equal(probabilities, priorities[rows] / 8.0)  # 4 starts of 1, 2 of 2


def test_episode_starts_kept_as_frames_come_and_go_match_the_step_types_read_whole():
    # The boundaries are kept as frames are appended and evicted; read whole, the held frames' step types say the
    # same starts: no boundary inside a window (after a LAST, before a FIRST).
    rng = np.random.default_rng(5)
    stored = Stored(60, 4)
    types_of = {}  # stream -> every step type it appended
    streams = [stored.open() for _ in range(3)]
    for stream in streams:
        types_of[stream] = []
    for _ in range(300):
        stream = streams[rng.integers(len(streams))]
        count = int(rng.integers(1, 6))
        types = rng.choice([0, 1, 1, 1, 2], size=count)
        stored.add(stream, list(range(count)), types)
        types_of[stream].extend(types.tolist())
        if rng.random() < 0.05:  # a writer leaves, another comes
            stored.streams.close(stream)
            streams[streams.index(stream)] = new = stored.open()
            types_of[new] = []
        for n in stored.streams.streams():
            held = np.array(types_of[n][stored.streams.dropped(n) :], np.int64)
            for num_steps in (1, 2, 3, 5):
                boundary = np.concatenate([[0], np.cumsum((held[:-1] == 2) | (held[1:] == 0))]) if held.size else held
                expected = [f for f in range(held.size - num_steps + 1) if boundary[f + num_steps - 1] == boundary[f]]
                assert stored.streams.starts(n, num_steps, episodes=True).tolist() == expected
        counts = stored.streams.windows(3, episodes=True)
        assert counts == {n: len(stored.streams.starts(n, 3, True)) for n in counts}
        total = sum(counts.values())
        if total:
            numbered, starts = stored.streams.windows_at(np.arange(total), 3, episodes=True)
            every = [(n, f) for n in counts for f in stored.streams.starts(n, 3, True).tolist()]
            assert list(zip(numbered.tolist(), starts.tolist(), strict=True)) == every
    state = json.loads(json.dumps(stored.streams.state()))
    restored = Streams.restored(state)
    for n in stored.streams.streams():
        assert restored.starts(n, 3, True).tolist() == stored.streams.starts(n, 3, True).tolist()
