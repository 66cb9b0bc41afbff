"""The Ray buffer's elastic layout (`layout="elastic"`): its actor, `RayHost`, run in this process (no Ray needed).

The writers' calls (`claim`, `add`, `release`) are made as `RayWriter` makes them; the real cluster's runs are in
ray_replay_buffer_test.py.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import tensorflow as tf

from tfbuffers.remote.ray.actor import RayHost
from tfbuffers.remote.ray.config import actor_config
from tfbuffers.remote.ray.elastic import STORE_DIRECTORY, chunk_rows
from tfbuffers.storage.memmap import DirectoryInUseError

SPEC = {"x": tf.TensorSpec([], tf.int64)}
EPISODES = {"x": tf.TensorSpec([], tf.int64), "step_type": tf.TensorSpec([], tf.int32)}


def host(capacity=400, batch_size=4, sampler="uniform", spec=None, **options):
    config = actor_config(
        spec or SPEC, capacity, batch_size=batch_size, max_length=None, sampler=sampler, priority_exponent=1.0,
        episode_boundaries=options.pop("episode_boundaries", False), frame_stacks=None,
        directory=options.pop("directory", None),
        min_size_to_sample=None, samples_per_insert=None, error_buffer=None, seed=options.pop("seed", 0),
        name="elastic", layout="elastic", **options,
    )  # fmt: skip
    return RayHost(config)


class Writer:
    """A writer of one environment, as `RayWriter` calls the actor: its add numbers counted from the claim's."""

    def __init__(self, actor, token):
        self.actor, self.token = actor, token
        segments, adds = actor.claim(1, token)
        self.segment, self.next = segments[0], adds[0]

    def add(self, values, step_types=None):
        ids = []
        for i, value in enumerate(values):
            frame = {"x": np.array([value], np.int64)}
            if step_types is not None:
                frame["step_type"] = np.array([step_types[i]], np.int32)
            leaves = tf.nest.flatten(frame)
            ids.append(int(self.actor.add([self.segment], leaves, None, self.token, np.array([self.next]))[0]))
            self.next += 1
        return ids

    def close(self):
        self.actor.release(self.token)


def xs(actor, segment):
    return actor.gather_segment(segment)[-1].tolist()  # "x", the last field in the spec's order


def test_writers_one_after_another_keep_every_frame_up_to_the_capacity():
    # Issue 50, finding 4: capacity 400 in 4 segments. Four writers in turn, 60 frames each, keep 240; then one
    # writer alone fills all 400 (the segments' layout keeps 100 of its frames: its segment's share).
    actor = host()
    for w in range(4):
        writer = Writer(actor, f"w{w}")
        writer.add(range(1000 * w, 1000 * w + 60))
        writer.close()
    assert actor.num_frames() == 240 and sorted(actor.frames_per_segment()) == [60, 60, 60, 60]
    alone = Writer(actor, "alone")
    alone.add(range(5000, 5400))
    assert actor.num_frames() == 400
    assert actor.frames_per_segment()[alone.segment] == 400
    assert xs(actor, alone.segment) == list(range(5000, 5400))  # every other writer's frames went first: oldest out
    assert sum(actor.frames_per_segment()) == 400


def test_the_oldest_frames_go_first_across_writers_a_chunk_at_a_time():
    actor = host()
    rows = chunk_rows(400, 4)
    assert rows == 3  # 400 rows in 4 * 32 chunks
    a, b = Writer(actor, "a"), Writer(actor, "b")
    a.add(range(300))
    b.add(range(1000, 1200))  # 500 in all: a's oldest chunks make room, 3 frames at a time
    assert xs(actor, b.segment) == list(range(1000, 1200))
    kept = xs(actor, a.segment)
    evicted = 300 - len(kept)
    assert kept == list(range(evicted, 300)) and evicted % rows == 0
    assert 100 <= evicted < 100 + rows and actor.num_frames() == 500 - evicted


def test_a_new_writer_on_a_segment_starts_a_stream_no_window_crosses_into():
    actor = host(capacity=40, batch_size=1)
    first = Writer(actor, "first")
    first.add(range(10))
    first.close()
    second = Writer(actor, "second")
    assert second.segment == first.segment
    second.add(range(100, 110))
    assert xs(actor, 0) == list(range(10)) + list(range(100, 110))
    leaves, ids, probabilities = actor.sample(2000, 3, 1, None)
    windows = leaves[0]
    assert {tuple(w) for w in windows.tolist()} == {(s, s + 1, s + 2) for s in [*range(8), *range(100, 108)]}
    np.testing.assert_array_equal(probabilities, np.float32(1 / 16))
    np.testing.assert_array_equal(ids, np.where(windows < 100, windows, windows - 90))  # each frame's add number


def test_ids_name_their_frames_across_streams_and_evicted_ones_are_skipped():
    actor = host(capacity=40, batch_size=2, sampler="prioritized")
    a = Writer(actor, "a")
    ids = a.add(range(30))
    assert ids == [2 * n + a.segment for n in range(30)]
    b = Writer(actor, "b")
    b.add(range(100, 120))  # 50 in 40: a's 10 oldest frames go (chunks of 1 row)
    assert xs(actor, a.segment) == list(range(10, 30))
    given = np.array([ids[0], ids[9], ids[10], ids[29], ids[10]]), np.array([5.0, 5.0, 3.0, 7.0, 0.0])
    assert actor.update_priorities(*given) == 2  # ids[0] and ids[9] evicted; ids[10] twice: its last priority, 0
    leaves, _, probabilities = actor.sample(4000, None, 1, None)
    drawn = leaves[0]
    assert 10 not in drawn and set(drawn.tolist()) <= {*range(11, 30), *range(100, 120)}
    # Frames weigh their priority (exponent 1): 29 weighs 7, every other held frame 1 (10 weighs 0).
    expected = {value: (7.0 if value == 29 else 1.0) / (7 + 18 + 20) for value in drawn.tolist()}
    np.testing.assert_allclose(probabilities, np.float32([expected[v] for v in drawn.tolist()]), rtol=1e-6)
    assert abs(np.mean(drawn == 29) - 7 / 45) < 0.03


def test_priorities_reach_each_ids_frame_across_a_segments_streams_in_any_order():
    # One segment held by three writers in turn (three streams), the oldest 10 frames evicted: every id given
    # at once, shuffled, reaches its own frame (one searchsorted per segment), the evicted ones are counted.
    actor = host(capacity=40, batch_size=1, sampler="prioritized")
    values, ids = [], []
    for token, first, count in (("w1", 0, 15), ("w2", 100, 15), ("w3", 200, 20)):
        writer = Writer(actor, token)
        values += list(range(first, first + count))
        ids += writer.add(range(first, first + count))
        writer.close()
    assert ids == list(range(50)) and xs(actor, 0) == values[10:]
    order = np.random.default_rng(0).permutation(50)
    given = np.concatenate([[ids[20]], np.asarray(ids)[order]])  # ids[20] twice: its last priority counts
    priorities = np.concatenate([[1000.0], np.asarray(values, np.float64)[order] + 1])
    assert actor.update_priorities(given, priorities) == 10
    leaves, drawn_ids, probabilities = actor.sample(3000, None, 1, None)
    held = np.asarray(values[10:], np.float64) + 1
    np.testing.assert_array_equal(drawn_ids, np.asarray(ids)[np.searchsorted(values, leaves[0])])
    np.testing.assert_allclose(probabilities, np.float32((leaves[0] + 1) / held.sum()), rtol=1e-6)


def test_prioritized_windows_never_start_in_a_streams_newest_frames():
    actor = host(capacity=20, batch_size=2, sampler="prioritized")
    a, b = Writer(actor, "a"), Writer(actor, "b")
    a.add(range(5))
    b.add(range(100, 103))
    actor.update_priorities(np.array([a.segment + 2 * 4]), np.array([100.0]))  # a's newest frame: starts no window
    leaves, _, probabilities = actor.sample(1000, 2, 1, None)
    starts = leaves[0][:, 0].tolist()
    assert set(starts) <= {0, 1, 2, 3, 100, 101}
    np.testing.assert_allclose(probabilities, np.float32(1 / 6))


def test_windows_stay_within_an_episode():
    actor = host(capacity=40, batch_size=1, spec=EPISODES, episode_boundaries=True)
    writer = Writer(actor, "w")
    types = [0, 1, 1, 2, 0, 1, 2, 0, 1, 1]  # episodes of 4, 3 and 3 frames
    writer.add(range(10), types)
    leaves, _, probabilities = actor.sample(500, 3, 1, None)
    assert {tuple(w) for w in leaves[1].tolist()} == {(0, 1, 2), (1, 2, 3), (4, 5, 6), (7, 8, 9)}
    np.testing.assert_allclose(probabilities, np.float32(1 / 4))


def test_an_empty_buffer_and_one_without_a_window_say_so_and_change_nothing():
    actor = host(capacity=40, batch_size=2)
    with pytest.raises(ValueError, match="is empty"):
        actor.sample(1, 2, 1, None)
    writer = Writer(actor, "w")
    writer.add([1, 2])
    with pytest.raises(ValueError, match=r"num_steps=3: expected a writer's stream of at least 3 .* holds 2\)"):
        actor.sample(1, 3, 1, None)
    writer.add([3])
    assert actor.sample(1, 3, 1, None)[0][0].tolist() == [[1, 2, 3]]


def test_clear_empties_every_stream_and_the_writers_go_on():
    actor = host(capacity=40, batch_size=2)
    writer = Writer(actor, "w")
    writer.add(range(10))
    actor.clear()
    assert actor.num_frames() == 0
    writer.next = 0  # the writer counts on from the actor's count, 0 after a clear
    assert writer.add([7, 8]) == [writer.segment, 2 + writer.segment]
    assert xs(actor, writer.segment) == [7, 8]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"layout": "ring"}, r"layout: expected one of \['segments', 'elastic'\] or None, got 'ring'"),
        ({"frame_stacks": 4}, r"frame_stacks: expected None with layout='elastic', got 4"),
    ],
)
def test_a_layout_or_option_it_does_not_take_is_refused_naming_it(options, message):
    arguments = dict(
        capacity=40, batch_size=2, max_length=None, sampler="uniform", priority_exponent=1.0,
        episode_boundaries=False, frame_stacks=None, directory=None, min_size_to_sample=None,
        samples_per_insert=None, error_buffer=None, seed=0, name="elastic", layout="elastic",
    )  # fmt: skip
    arguments.update(options)
    with pytest.raises(ValueError, match=message):
        actor_config(SPEC, **arguments)


def test_a_saved_store_loads_as_it_was_and_goes_on(tmp_path):
    actor = host(capacity=40, batch_size=2, sampler="prioritized")
    a = Writer(actor, "a")
    ids = a.add(range(30))
    b = Writer(actor, "b")
    b.add(range(100, 120))
    actor.update_priorities(np.array([ids[20]]), np.array([9.0]))
    actor.save(str(tmp_path / "saved"), "prioritized")
    config = actor.config()
    loaded = RayHost({**config, "source": ["load", str(tmp_path / "saved")]})
    for segment in (a.segment, b.segment):
        assert xs(loaded, segment) == xs(actor, segment)
    assert loaded.frames_per_segment() == actor.frames_per_segment()
    first, second = actor.sample(50, 2, 1, None), loaded.sample(50, 2, 1, None)  # the same seed, the same state
    for left, right in zip(first[0], second[0], strict=True):
        np.testing.assert_array_equal(left, right)
    np.testing.assert_array_equal(first[1], second[1])
    np.testing.assert_array_equal(first[2], second[2])
    # The writers go on where they were: b's stream continues, a's next add evicts the oldest chunk.
    b.actor = loaded
    b.add([120])
    assert xs(loaded, b.segment) == list(range(100, 121))
    # A new stream: the frames b added after the save are not in it, so no window joins 119 to 120.
    windows = {tuple(w) for w in loaded.sample(3000, 2, 1, None)[0][0].tolist()}
    assert (119, 120) not in windows and (118, 119) in windows
    assert loaded.update_priorities(np.array([ids[0], ids[20]]), np.array([1.0, 2.0])) == 1


def test_a_damaged_save_is_refused_naming_the_file_and_nothing_changes(tmp_path):
    actor = host(capacity=40, batch_size=2)
    Writer(actor, "a").add(range(10))
    actor.save(str(tmp_path / "saved"), "uniform")
    other = host(capacity=80, batch_size=2)
    Writer(other, "a").add(range(5))
    with pytest.raises(ValueError, match=r"expected a store of 80 rows in chunks of 1, got 40 in chunks of 1"):
        other._store.load(tmp_path / "saved")
    assert xs(other, 0) + xs(other, 1) == list(range(5))


EPISODE_TYPES = [0, 1, 1, 1, 2]  # TF-Agents' FIRST, MID and LAST: episodes of 5 frames


def killed_copy(directory, to):
    """The files of a memory-mapped store as its process's death would leave them now: no flush, no close."""
    shutil.copytree(directory, to)
    return to


def reopened(actor, directory):
    return RayHost({**actor.config(), "directory": str(directory), "source": ["open"]})


def test_a_memory_mapped_store_reopens_with_every_frame_its_process_stored_and_goes_on(tmp_path):
    # The elastic layout with directory= (the segments' layout gave each writer a quarter of the capacity there).
    actor = host(capacity=40, batch_size=2, sampler="prioritized", spec=EPISODES, episode_boundaries=True,
                 directory=str(tmp_path / "buffer"))  # fmt: skip
    assert sorted(path.name for path in (tmp_path / "buffer").iterdir()) == [
        "elastic",
        "rate_limiter.npy",
        "ray_buffer.json",
    ]
    a, b = Writer(actor, "a"), Writer(actor, "b")
    ids = a.add(range(30), EPISODE_TYPES * 6)
    b.add(range(100, 118), (EPISODE_TYPES * 4)[:18])  # 48 in 40: a's 8 oldest frames go (chunks of 1 row)
    actor.update_priorities(np.array([ids[20]]), np.array([9.0]))
    with pytest.raises(DirectoryInUseError, match="held by process"):
        reopened(actor, tmp_path / "buffer")  # one process writes a directory at a time
    mapped = reopened(actor, killed_copy(tmp_path / "buffer", tmp_path / "killed"))
    assert xs(mapped, a.segment) == list(range(8, 30)) and xs(mapped, b.segment) == list(range(100, 118))
    assert mapped.frames_per_segment() == actor.frames_per_segment()
    first, second = actor.sample(200, 2, 1, None), mapped.sample(200, 2, 1, None)  # the same seed, the same state
    for left, right in zip(first[0], second[0], strict=True):
        np.testing.assert_array_equal(left, right)
    np.testing.assert_array_equal(first[1], second[1])
    np.testing.assert_array_equal(first[2], second[2])  # the priorities too: ids[20] weighs 9
    windows = {tuple(w) for w in mapped.sample(3000, 2, 1, None)[0][1].tolist()}
    assert (24, 25) not in windows and (28, 29) in windows and (104, 105) not in windows  # within episodes
    # The writers go on: b's add numbers from where they were, in a new stream (no window joins 117 to 118).
    b.actor = mapped
    assert b.add([118], [2]) == [18 * 2 + b.segment]
    assert xs(mapped, b.segment) == list(range(100, 119))
    windows = {tuple(w) for w in mapped.sample(3000, 2, 1, None)[0][1].tolist()}
    assert (117, 118) not in windows and (116, 117) in windows
    assert mapped.update_priorities(np.array([ids[0], ids[20]]), np.array([1.0, 2.0])) == 1  # ids[0] evicted
    mapped.close()
    actor.close()


def test_a_row_not_stamped_when_its_process_died_is_not_a_frame(tmp_path):
    # An add stamps its row last (and a file's journal undoes one cut short): a row whose stamp is not its chunk's
    # allocation holds no frame of it, and a chunk holding none is free.
    actor = host(capacity=40, batch_size=2, directory=str(tmp_path / "buffer"))
    a = Writer(actor, "a")
    a.add(range(5))
    killed = killed_copy(tmp_path / "buffer", tmp_path / "killed")
    extras = killed / STORE_DIRECTORY / "extras"
    stamps = np.load(extras / "elastic_stamp.npy", mmap_mode="r+")
    counts = np.load(extras / "elastic_added.npy", mmap_mode="r+")
    numbers = np.load(extras / "elastic_number.npy")
    stamps[np.flatnonzero(numbers == 4)] = -1  # the last add, cut short before its stamp (and its count)
    counts[0, a.segment] = 4
    stamps.flush(), counts.flush()
    del stamps, counts
    mapped = reopened(actor, killed)
    assert xs(mapped, a.segment) == [0, 1, 2, 3] and mapped.num_frames() == 4
    a.actor, a.next = mapped, 4  # its add did not return: the writer sends it again
    assert a.add([4]) == [4 * 2 + a.segment]
    assert xs(mapped, a.segment) == [0, 1, 2, 3, 4]
    mapped.close()
    actor.close()


def test_a_memory_mapped_store_cleared_reopens_empty(tmp_path):
    actor = host(capacity=40, batch_size=2, directory=str(tmp_path / "buffer"))
    writer = Writer(actor, "w")
    writer.add(range(10))
    actor.clear()
    mapped = reopened(actor, killed_copy(tmp_path / "buffer", tmp_path / "killed"))
    assert mapped.num_frames() == 0 and mapped.frames_per_segment() == [0, 0]
    writer.actor, writer.next = mapped, 0
    assert writer.add([7]) == [writer.segment]
    mapped.close()
    actor.close()
