"""`extend`: a block of frames per segment is exactly its adds one by one, on every segmented kind.

The contract (`tfbuffers.testing.contract`: `test_extend_is_the_adds_one_by_one`,
`test_bad_blocks_are_rejected_and_change_nothing`) runs on every kind; here, what a block must keep beside the
rows: the record of episode ends and the priorities (each new frame the largest so far), frame stacks and
memory-mapped files, whose journal covers a run of adds, and shapes a graph learns only when it runs.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from conftest import SPEC, code, frames

import tfbuffers
from tfbuffers.storage import memmap
from tfbuffers.testing.contract import new_directory

EPISODE_SPEC = dict(SPEC, step_type=tf.TensorSpec([], tf.int32))
# Blocks of (frames, first add number): two, then past the ring's end, none, a ring's worth less one, more than it.
BLOCKS = [(2, 0), (7, 2), (0, 9), (4, 9), (12, 13)]


def block(first: int, count: int, batch_size: int = 3) -> dict:
    """Adds `first..first + count - 1` of every segment as one block; an episode ends at every add number 4k + 3."""
    codes = code(np.arange(batch_size)[:, None], np.arange(first, first + count)[None, :])
    items = frames(codes)
    items["step_type"] = np.where(codes % 1000 % 4 == 3, 2, np.where(codes % 1000 % 4 == 0, 0, 1)).astype(np.int32)
    return items


def _frame(items: dict, t: int) -> dict:
    return tf.nest.map_structure(lambda leaf: leaf[:, t], items)


def _state_arrays(buffer) -> dict:
    """What the buffer keeps: its state's rows, counter and extras, and the sampler's own (episode record, tree)."""
    state = buffer.state()
    kept = {"counters": np.asarray(sorted(state.counters.items())), **state.arrays}
    kept.update({f"extra/{name}": value for name, value in state.extras.items()})
    if isinstance(buffer, tfbuffers.TFUniformReplayBuffer):
        for variable in buffer.variables():
            kept[f"variable/{variable.name}"] = variable.numpy()
    else:
        sampler = buffer.sampler
        if getattr(sampler, "priorities", None) is not None:
            sampler.priorities.tree()  # the host tree's stale ancestors recomputed, as a draw does
        storage = getattr(buffer.storage, "inner", buffer.storage)
        kept.update({f"storage/{name}": np.array(value) for name, value in storage.extras.items()})
    return kept


KINDS = {  # each buffer's class and options, beside `batch_size=3` and `max_length` (5 unless a test says)
    "py": (tfbuffers.PyUniformReplayBuffer, dict(seed=0)),
    "py_prioritized": (tfbuffers.PyPrioritizedReplayBuffer, dict(seed=0)),
    "py_prioritized_frames": (tfbuffers.PyPrioritizedReplayBuffer, dict(seed=0, frame_stacks="observation/pixels")),
    "py_prioritized_memmap": (tfbuffers.PyPrioritizedReplayBuffer, dict(seed=0, directory=new_directory)),
    "tf": (tfbuffers.TFUniformReplayBuffer, {}),
    "tf_prioritized": (tfbuffers.TFPrioritizedReplayBuffer, {}),
}


def _buffer(name: str, max_length: int = 5, **options):
    cls, own = KINDS[name]
    own = {key: value() if callable(value) else value for key, value in own.items()}  # a new directory each
    return cls(EPISODE_SPEC, batch_size=3, max_length=max_length, **own, **options)


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("episodes", [False, True], ids=["plain", "episodes"])
@pytest.mark.parametrize("name", list(KINDS))
def test_a_block_keeps_what_its_adds_one_by_one_keep(name, episodes, mode):
    blocks, adds = _buffer(name, episode_boundaries=episodes), _buffer(name, episode_boundaries=episodes)
    extend = blocks.extend if mode == "eager" else tf.function(blocks.extend)
    for count, first in BLOCKS:
        items = block(first, count)
        ids = np.asarray(extend(items))
        np.testing.assert_array_equal(ids, np.arange(first, first + count)[None, :] * 3 + np.arange(3)[:, None])
        for t in range(count):
            adds.add_batch(_frame(items, t))
        expected = _state_arrays(adds)
        kept = _state_arrays(blocks)
        assert kept.keys() == expected.keys()
        for key, value in expected.items():
            np.testing.assert_array_equal(kept[key], value, err_msg=f"{key} after the block of {count} at {first}")
    if name.startswith("py"):  # one generator each, seeded alike: the same sampler state draws the same windows
        drawn, expected_draw = blocks.get_next(sample_batch_size=16, num_steps=2), adds.get_next(16, 2)
        np.testing.assert_array_equal(drawn[1].ids, expected_draw[1].ids)
        np.testing.assert_array_equal(drawn[1].probabilities, expected_draw[1].probabilities)


def _random_episodes(first: int, count: int, lengths: np.random.Generator) -> dict:
    """`block(first, count)` with each segment's episodes of random lengths, 1 to 30 frames (LAST ends each)."""
    items = block(first, count)
    items["step_type"] = np.ones([3, count], np.int32)
    for segment in range(3):
        ends = np.cumsum(lengths.integers(1, 31, count)) - 1  # ends past the block are never reached
        items["step_type"][segment, ends[ends < count]] = 2
    return items


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("name", ["py", "py_prioritized", "py_prioritized_memmap", "tf_prioritized"])
def test_a_block_of_many_episodes_keeps_the_record_its_adds_one_by_one_keep(name, mode):
    """Blocks of many episode ends per segment keep the record of episode ends their adds one by one keep.

    A ring of 40 frames, episodes shorter and longer than the record's reach (`NEAR`, 16), blocks past the
    ring's end, and priorities given between them. The priorities are powers of two with exponent 1, so every
    sum of the record is exact in any order: a block's sums equal its adds' one by one to the last bit.
    """
    options = dict(episode_boundaries=True) | ({"priority_exponent": 1.0} if "prioritized" in name else {})
    blocks, adds = _buffer(name, max_length=40, **options), _buffer(name, max_length=40, **options)
    extend = blocks.extend if mode == "eager" else tf.function(blocks.extend)
    lengths, priorities = np.random.default_rng(7), np.random.default_rng(8)
    first = 0
    for count in (25, 30, 1, 40, 17, 33):
        items = _random_episodes(first, count, lengths)
        extend(items)
        for t in range(count):
            adds.add_batch(_frame(items, t))
        first += count
        expected, kept = _state_arrays(adds), _state_arrays(blocks)
        for key, value in expected.items():
            np.testing.assert_array_equal(kept[key], value, err_msg=f"{key} after the block of {count} to {first}")
        if "prioritized" in name:  # new priorities for a few stored frames, the same on both
            ids = priorities.choice(np.arange(first - min(first, 40), first) * 3, 8, replace=False) + 1
            given = 2.0 ** priorities.integers(-3, 4, 8)
            for buffer in (blocks, adds):
                buffer.update_priorities(tf.constant(ids, tf.int64), tf.constant(given, tf.float32))
    record = next(value for key, value in _state_arrays(blocks).items() if "episodes/near" in key)
    assert record[1:, 2].sum() > 3 * 16  # the record holds many frames near their episode's end


@pytest.mark.parametrize("name", ["py", "tf"])
def test_a_block_refused_when_the_graph_runs_leaves_the_buffer_working(name):
    buffer = _buffer(name)
    signature = tf.nest.map_structure(lambda s: tf.TensorSpec([None, 2, *s.shape], s.dtype), EPISODE_SPEC)
    extend = tf.function(buffer.extend, input_signature=[signature])
    buffer.extend(block(0, 4))
    before = _state_arrays(buffer)
    for _ in range(2):
        with pytest.raises(tf.errors.InvalidArgumentError, match="action: expected leading batch size 3"):
            extend(tf.nest.map_structure(tf.constant, block(4, 2, batch_size=2)))
        after = _state_arrays(buffer)
        for key, value in before.items():
            np.testing.assert_array_equal(after[key], value, err_msg=key)
    # The next block in the same graph, an add, a sample, gather_all and clear work.
    np.testing.assert_array_equal(
        extend(tf.nest.map_structure(tf.constant, block(4, 2))), [[12, 15], [13, 16], [14, 17]]
    )
    buffer.add_batch(_frame(block(6, 1), 0))
    np.testing.assert_array_equal(buffer.gather_all()["step"], code(np.arange(3)[:, None], np.arange(2, 7)[None, :]))
    items, _ = buffer.get_next(sample_batch_size=8, num_steps=2)
    np.testing.assert_array_equal(np.diff(np.asarray(items["step"]), axis=1), 1)
    buffer.clear()
    assert int(buffer.num_frames()) == 0


def test_a_block_with_no_time_axis_known_when_traced_is_refused_naming_the_field():
    buffer = _buffer("tf")
    signature = tf.nest.map_structure(lambda s: tf.TensorSpec([3, None, *s.shape], s.dtype), EPISODE_SPEC)
    with pytest.raises(
        ValueError, match=r"^action: expected a block \[batch_size, T, \.\.\.\] with T known, got shape \(3, None\)"
    ):
        tf.function(buffer.extend, input_signature=[signature]).get_concrete_function()
    assert int(buffer.num_frames()) == 0


def _memmap_pair(directory, journal_adds=None, monkeypatch=None):
    if journal_adds is not None:  # the journal of `journal_adds` adds' rows (28 bytes a row here, 3 rows an add)
        monkeypatch.setattr(memmap, "JOURNAL_BYTES", journal_adds * 3 * 28)

    def make(**options):
        return tfbuffers.PyPrioritizedReplayBuffer(
            EPISODE_SPEC, batch_size=3, max_length=5, seed=0, episode_boundaries=True, **options
        )

    return make(directory=directory), make()


def test_the_journal_holds_a_run_of_adds_and_a_run_cut_short_is_undone(tmp_path):
    on_disk, in_ram = _memmap_pair(tmp_path / "b")
    assert on_disk.storage.block_rows() == 15  # a ring's worth: every run of a block is one commit
    for buffer in (on_disk, in_ram):
        buffer.extend(block(0, 7))
    expected = _state_arrays(in_ram)
    # The first run of a block (adds 7-9, rows 6-14: the ring's end) as far as its writes go (rows, priorities,
    # record of episode ends), then its process dies.
    table, items = on_disk.storage, block(7, 3)
    with on_disk._lock:
        on_disk.sampler.before_add(7, items["step_type"][:, 0])
        rows = [leaf.swapaxes(0, 1).reshape(9, *leaf.shape[2:]) for leaf in tf.nest.flatten(items)]
        table.write_block(6, rows)
        on_disk.sampler.on_add_block(7, 3, 6, items["step_type"][:, :3])
    assert table.extras["priority"][6:15].tolist() == [1.0] * 9
    table._finalizer()
    del on_disk, table
    reopened = tfbuffers.open(tmp_path / "b", seed=0)
    kept = _state_arrays(reopened)
    for key in expected:
        np.testing.assert_array_equal(kept[key], expected[key], err_msg=key)
    np.testing.assert_array_equal(reopened.extend(block(7, 4)), np.arange(7, 11)[None, :] * 3 + np.arange(3)[:, None])
    reopened.close()


def test_a_block_longer_than_the_journal_commits_run_by_run_and_a_death_keeps_whole_adds(tmp_path, monkeypatch):
    on_disk, in_ram = _memmap_pair(tmp_path / "b", journal_adds=2, monkeypatch=monkeypatch)
    assert on_disk.storage.block_rows() == 6
    table = on_disk.storage
    written = []
    write_frames = table.write_frames

    def dies_on_the_third_run(first_row, leaves):  # leaves: [adds, batch_size, ...]
        if len(written) == 2:
            raise SystemExit("killed")  # the process dies here: the third run's journal is not even taken
        written.append((first_row, leaves[0].shape[0] * leaves[0].shape[1]))
        write_frames(first_row, leaves)

    table.write_frames = dies_on_the_third_run
    with pytest.raises(SystemExit):
        on_disk.extend(block(0, 7))
    assert written == [(0, 6), (6, 6)]
    table._finalizer()
    del on_disk, table
    reopened = tfbuffers.open(tmp_path / "b", seed=0)
    in_ram.extend(block(0, 4))  # the two runs that committed
    kept, expected = _state_arrays(reopened), _state_arrays(in_ram)
    for key in expected:
        np.testing.assert_array_equal(kept[key], expected[key], err_msg=key)
    reopened.close()
