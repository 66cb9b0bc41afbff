"""Memory-mapped storage (`directory=`, `tfbuffers.open`, `storage.memmap`): exactly the buffer in RAM, on the disk.

The contract, error, state, files and concurrency suites run on it through the `py_memmap` kind of the test
registry (`conftest.BUFFER_KINDS`). Here: the kinds with extras (priorities, episode ends, frame stacks) against
the same buffer in RAM, reopening in another process, the writer's lock, the refusals on open, the
durability words, and a writer killed with SIGKILL again and again.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import tensorflow as tf

import tfbuffers
from tfbuffers.storage import FrameStackTable, _advice, memmap

SPEC = {
    "obs": tf.TensorSpec([3], tf.float32),
    "action": tf.TensorSpec([], tf.int64),
    "step_type": tf.TensorSpec([], tf.int32),
}
STACK_SPEC = {"pixels": tf.TensorSpec([2, 2, 4], tf.uint8), "step_type": tf.TensorSpec([], tf.int32)}
SIZE = {"batch_size": 2, "max_length": 5}
# The kinds with something beside the rows: class, options, spec.
CASES = {
    "uniform": (tfbuffers.PyUniformReplayBuffer, {}, SPEC),
    "prioritized": (tfbuffers.PyPrioritizedReplayBuffer, {"priority_exponent": 0.7}, SPEC),
    "episodes": (tfbuffers.PyUniformReplayBuffer, {"episode_boundaries": True}, SPEC),
    "prioritized_episodes": (tfbuffers.PyPrioritizedReplayBuffer, {"episode_boundaries": True}, SPEC),
    "frame_stacks": (tfbuffers.PyUniformReplayBuffer, {"frame_stacks": "pixels"}, STACK_SPEC),
}


def item(spec, t, batch_size=2):
    """Add number `t`: every value tells its add and segment; step types make episodes of 4 frames."""
    segments = np.arange(batch_size)
    step_type = np.full([batch_size], [0, 1, 1, 2][t % 4], np.int32)
    if "pixels" in spec:
        frames = np.maximum(t - 3 + np.arange(4), 0).astype(np.uint8)
        return {"pixels": np.broadcast_to(frames, [batch_size, 2, 2, 4]).copy(), "step_type": step_type}
    obs = np.stack([t + segments / 10, -np.full([batch_size], t), segments], axis=-1).astype(np.float32)
    return {"obs": obs, "action": (100 * t + segments).astype(np.int64), "step_type": step_type}


def contents(buffer):
    return tf.nest.map_structure(np.asarray, buffer.gather_all())


def assert_same(a, b):
    tf.nest.map_structure(np.testing.assert_array_equal, a, b)


def pair(name, directory, seed=3):
    """The same buffer twice: in memory-mapped files under `directory`, and in RAM."""
    buffer_class, options, spec = CASES[name]
    on_disk = buffer_class(spec, **SIZE, **options, seed=seed, directory=directory)
    in_ram = buffer_class(spec, **SIZE, **options, seed=seed)
    return on_disk, in_ram


def drive(buffers, spec, adds, start=0):
    for t in range(start, start + adds):
        for buffer in buffers:
            buffer.add_batch(item(spec, t))
    if buffers[0].prioritized and start + adds >= 11:
        for buffer in buffers:  # frames of adds 5, 6, 9 and 10
            buffer.update_priorities(np.array([10, 13, 18, 21]), np.array([0.5, 4.0, 2.0, 0.0]))


@pytest.mark.parametrize("name", list(CASES))
def test_samples_probabilities_and_contents_are_those_of_the_buffer_in_ram(name, tmp_path):
    spec = CASES[name][2]
    on_disk, in_ram = pair(name, tmp_path / "buffer")
    drive([on_disk, in_ram], spec, 11)
    assert on_disk.directory == tmp_path / "buffer"
    assert in_ram.directory is None
    assert_same(contents(on_disk), contents(in_ram))
    for num_steps in (None, 2):
        items, info = on_disk.get_next(sample_batch_size=16, num_steps=num_steps)
        expected_items, expected_info = in_ram.get_next(sample_batch_size=16, num_steps=num_steps)
        assert_same(items, expected_items)
        np.testing.assert_array_equal(info.ids, expected_info.ids)
        np.testing.assert_array_equal(info.probabilities, expected_info.probabilities)
    # Inside a graph and a dataset, through the host bridge.
    sample = tf.function(lambda: on_disk.get_next(sample_batch_size=4, num_steps=2))
    expected_sample = tf.function(lambda: in_ram.get_next(sample_batch_size=4, num_steps=2))
    assert_same(sample(), expected_sample())
    element = next(iter(on_disk.as_dataset(sample_batch_size=4, num_steps=2)))
    expected_element = next(iter(in_ram.as_dataset(sample_batch_size=4, num_steps=2)))
    assert_same(element, expected_element)
    assert int(on_disk.num_frames()) == int(in_ram.num_frames()) == 10
    on_disk.close()


@pytest.mark.parametrize("name", list(CASES))
def test_a_directory_reopened_in_another_process_holds_the_buffer_and_goes_on(name, tmp_path):
    buffer_class, options, spec = CASES[name]
    directory = tmp_path / "buffer"
    on_disk, in_ram = pair(name, directory)
    drive([on_disk, in_ram], spec, 7)
    on_disk.close()
    # Another process opens it from the directory alone, adds two frames and exits without closing.
    script = f"""
        import numpy as np, tfbuffers
        buffer = tfbuffers.open({str(directory)!r})
        print(type(buffer).__name__, int(buffer.num_frames()), buffer.constructor_options()["episode_boundaries"])
        items = {_literal(item(spec, 7))}
        spec = buffer.data_spec
        buffer.add_batch({{key: np.asarray(items[key], spec[key].dtype.as_numpy_dtype) for key in spec}})
    """
    output = _run(script)
    assert output.split() == [buffer_class.__name__, "10", str(options.get("episode_boundaries", False))]
    in_ram.add_batch(item(spec, 7))
    reopened = tfbuffers.open(directory, seed=3)
    again = buffer_class(spec, **SIZE, **options, seed=3)
    again.restore_state(in_ram.state())  # the same frames and priorities, sampled by a fresh generator
    assert type(reopened) is buffer_class
    assert reopened.data_spec == buffer_class(spec, **SIZE, **options).data_spec
    assert reopened.constructor_options() == in_ram.constructor_options()
    assert_same(contents(reopened), contents(in_ram))
    items, info = reopened.get_next(sample_batch_size=16, num_steps=2)
    expected_items, expected_info = again.get_next(sample_batch_size=16, num_steps=2)
    assert_same(items, expected_items)
    np.testing.assert_array_equal(info.probabilities, expected_info.probabilities)
    np.testing.assert_array_equal(reopened.add_batch(item(spec, 8)), [16, 17])  # the next ids
    reopened.clear()
    assert int(reopened.num_frames()) == 0
    reopened.close()


def _literal(nest):
    return {key: value.tolist() for key, value in nest.items()}


def _run(script, *args, check=True):
    completed = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args], capture_output=True, text=True, timeout=300
    )
    if check and completed.returncode:
        raise AssertionError(completed.stderr[-3000:])
    return completed.stdout


def test_the_class_open_opens_its_own_class_and_tfbuffers_open_any(tmp_path):
    buffer = tfbuffers.PyPrioritizedReplayBuffer(SPEC, **SIZE, directory=tmp_path / "b")
    buffer.close()
    with pytest.raises(ValueError, match=r"header.json: buffer: expected PyUniformReplayBuffer .*PyPrioritized"):
        tfbuffers.PyUniformReplayBuffer.open(tmp_path / "b")
    reopened = tfbuffers.PyPrioritizedReplayBuffer.open(tmp_path / "b")
    assert reopened.priority_exponent == 0.6
    reopened.close()


def test_from_config_takes_a_directory(tmp_path):
    config = {
        "buffer": "PyPrioritizedReplayBuffer",
        "capacity": 8,
        "batch_size": 2,
        "names": ["x"],
        "shapes": [[]],
        "dtypes": ["int64"],
        "directory": str(tmp_path / "b"),
        "seed": 0,
    }
    buffer = tfbuffers.from_config(config)
    buffer.add_batch({"x": np.array([5, 6])})
    buffer.close()
    reopened = tfbuffers.open(tmp_path / "b")
    assert (type(reopened).__name__, reopened.capacity, contents(reopened)["x"].tolist()) == (
        "PyPrioritizedReplayBuffer",
        8,
        [[5], [6]],
    )
    reopened.close()


def test_one_writer_a_second_is_refused_naming_the_directory_and_process(tmp_path):
    directory = tmp_path / "b"
    buffer = tfbuffers.PyUniformReplayBuffer(SPEC, **SIZE, directory=directory)
    buffer.add_batch(item(SPEC, 0))
    with pytest.raises(memmap.DirectoryInUseError, match=rf"{directory} is held by process {os.getpid()} \(this"):
        tfbuffers.open(directory)
    # Another process is refused too, naming this one; nothing changed.
    script = """
        import sys, tfbuffers
        try:
            tfbuffers.open(sys.argv[1])
        except tfbuffers.storage.memmap.DirectoryInUseError as error:
            print(error)
    """
    assert f"{directory} is held by process {os.getpid()};" in _run(script, str(directory))
    np.testing.assert_array_equal(buffer.add_batch(item(SPEC, 1)), [2, 3])
    buffer.close()
    reopened = tfbuffers.open(directory)  # released by close
    assert int(reopened.num_frames()) == 4
    reopened.close()


def test_a_killed_writer_releases_the_directory(tmp_path):
    directory = tmp_path / "b"
    script = """
        import os, signal, sys, numpy as np, tensorflow as tf, tfbuffers
        buffer = tfbuffers.PyUniformReplayBuffer({"x": tf.TensorSpec([], tf.int64)}, capacity=4, directory=sys.argv[1])
        buffer.add_batch({"x": np.array([7])})
        os.kill(os.getpid(), signal.SIGKILL)
    """
    completed = subprocess.run([sys.executable, "-c", textwrap.dedent(script), str(directory)], timeout=300)
    assert completed.returncode == -signal.SIGKILL
    reopened = tfbuffers.open(directory)
    assert contents(reopened)["x"].tolist() == [[7]]
    reopened.close()


def test_the_constructor_refuses_a_directory_that_holds_files_naming_tfbuffers_open(tmp_path):
    directory = tmp_path / "b"
    tfbuffers.PyUniformReplayBuffer(SPEC, **SIZE, directory=directory).close()
    before = _files(directory)
    with pytest.raises(ValueError, match=r"expected a new or empty directory, .*'header.json'.*tfbuffers.open\("):
        tfbuffers.PyUniformReplayBuffer(SPEC, **SIZE, directory=directory)
    assert _files(directory) == before
    with pytest.raises(ValueError, match=r"storage: expected None with directory"):
        tfbuffers.PyUniformReplayBuffer(SPEC, **SIZE, directory=tmp_path / "c", storage=tfbuffers.storage.NumpyTable)
    with pytest.raises(ValueError, match=r"frame_stacks: expected None, a field's nest path"):
        tfbuffers.PyUniformReplayBuffer(SPEC, **SIZE, directory=tmp_path / "d", frame_stacks="pixels")
    with pytest.raises(FileNotFoundError, match=r"has no header.json: not a buffer directory"):
        tfbuffers.open(tmp_path / "nothing")


def _files(directory):
    """Every file under `directory`: its bytes and modification time."""
    return {
        path.relative_to(directory): (path.read_bytes(), path.stat().st_mtime_ns)
        for path in sorted(pathlib.Path(directory).rglob("*"))
        if path.is_file()
    }


def _closed_prioritized(directory):
    buffer = tfbuffers.PyPrioritizedReplayBuffer(SPEC, **SIZE, directory=directory)
    drive([buffer], SPEC, 3)
    buffer.close()
    return buffer


def _edit_header(directory, change):
    path = pathlib.Path(directory) / "header.json"
    header = json.loads(path.read_text())
    change(header)
    path.write_text(json.dumps(header))


def _set_field_shape(header):
    """The spec's and the fields' `obs` of shape [4]; its data file holds [3]."""
    for entry in header["fields"]:
        if entry["path"] == "obs":
            entry["shape"] = [4]
    for name, leaf in header["spec"]["dict"]:
        if name == "obs":
            leaf["spec"]["shape"] = [4]


def _set_version(header):
    header["version"] = 99


def _truncate(directory):
    path = pathlib.Path(directory) / "fields" / "1.npy"  # obs
    os.truncate(path, path.stat().st_size - 12)


def _remove_priorities(directory):
    (pathlib.Path(directory) / "extras" / "priority.npy").unlink()


def _retype_priorities(directory):
    path = pathlib.Path(directory) / "extras" / "priority.npy"
    np.save(path, np.zeros([10], np.float32))


REFUSALS = {
    "another version": (
        lambda d: _edit_header(d, _set_version),
        r"header.json: format and version: expected \('tfbuffers-memmap', 2\) \(or version 1\), "
        r"got \('tfbuffers-memmap', 99\)",
    ),
    "a spec that is not its data files'": (
        lambda d: _edit_header(d, _set_field_shape),
        r"fields/1.npy: field obs: expected float32 \[10, 4\], got float32 \[10, 3\]",
    ),
    "a shorter file": (
        _truncate,
        r"fields/1.npy: expected 248 bytes \(field obs: float32 \[10, 3\], as header.json says\)",
    ),
    "a missing extra": (
        _remove_priorities,
        r"priority.npy: extra priority: expected a file of float64 \[10\], got none",
    ),
    "an extra of another dtype": (
        _retype_priorities,
        r"priority.npy: extra priority: expected float64 \[10\], got float32 \[10\]",
    ),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_open_refuses_naming_the_file_and_what_differs_and_changes_nothing(case, tmp_path):
    damage, message = REFUSALS[case]
    directory = tmp_path / "b"
    _closed_prioritized(directory)
    damage(directory)
    before = _files(directory)
    with pytest.raises(ValueError, match=message):
        tfbuffers.open(directory)
    assert _files(directory) == before
    with pytest.raises(ValueError, match=message):  # the lock was released: the same refusal again
        tfbuffers.PyPrioritizedReplayBuffer.open(directory)


def _state(directory):
    return np.load(pathlib.Path(directory) / "state.npy", mmap_mode="r+")


def test_flush_and_close_set_the_words_that_tell_a_machine_crash(tmp_path):
    directory = tmp_path / "b"
    buffer = tfbuffers.PyUniformReplayBuffer(SPEC, **SIZE, directory=directory)
    state = _state(directory)
    assert state[memmap.CLEAN] == 0 and state[memmap.UNFLUSHED] == 0  # the header was written after a flush
    np.testing.assert_array_equal(state[memmap.BOOT : memmap.BOOT + 2], memmap.boot_id())
    buffer.add_batch(item(SPEC, 0))
    assert state[memmap.UNFLUSHED] == 1 and state[memmap.ADDED] == 1
    buffer.flush()
    assert state[memmap.UNFLUSHED] == 0 and state[memmap.FLUSHED_ADDED] == 1
    tf.function(buffer.flush)()  # inside a graph too
    buffer.add_batch(item(SPEC, 1))
    assert state[memmap.UNFLUSHED] == 1
    buffer.close()
    assert state[memmap.CLEAN] == 1 and state[memmap.UNFLUSHED] == 0 and state[memmap.FLUSHED_ADDED] == 2
    with pytest.raises(ValueError, match="closed"):
        buffer.flush()


def _crashed_machine(directory, unflushed):
    """The directory as a machine that stopped would leave it: open (not closed), of another boot."""
    state = _state(directory)
    state[memmap.CLEAN] = 0
    state[memmap.UNFLUSHED] = unflushed
    state[memmap.BOOT : memmap.BOOT + 2] = [1, 2]
    state.flush()


def test_after_a_machine_crash_a_directory_written_after_its_flush_is_refused(tmp_path):
    directory = tmp_path / "b"
    buffer = tfbuffers.PyUniformReplayBuffer(SPEC, **SIZE, directory=directory)
    drive([buffer], SPEC, 3)
    buffer.flush()
    buffer.add_batch(item(SPEC, 3))
    buffer.close()
    _crashed_machine(directory, unflushed=1)
    before = _files(directory)
    message = r"the machine stopped .* written to after its last flush\(\) \(at 4 adds; the counter reads 4\)"
    with pytest.raises(ValueError, match=message):
        tfbuffers.open(directory)
    assert _files(directory) == before
    _crashed_machine(directory, unflushed=0)  # nothing written after the flush: opened as it is
    reopened = tfbuffers.open(directory)
    assert int(reopened.num_frames()) == 8
    reopened.close()


def test_a_restore_cut_short_is_refused_and_a_clear_cut_short_finished(tmp_path):
    directory = tmp_path / "b"
    _closed_prioritized(directory)
    state = _state(directory)
    state[memmap.BUSY] = memmap.RESTORING
    state.flush()
    with pytest.raises(ValueError, match=r"a restore or load into this buffer did not finish"):
        tfbuffers.open(directory)
    state[memmap.BUSY] = memmap.CLEARING
    state.flush()
    reopened = tfbuffers.open(directory)
    assert int(reopened.num_frames()) == 0
    np.testing.assert_array_equal(reopened.add_batch(item(SPEC, 0)), [0, 1])
    _, info = reopened.get_next(sample_batch_size=4)
    np.testing.assert_array_equal(info.probabilities, [0.5] * 4)  # the cleared priorities: the new frames' alone
    reopened.close()
    assert _state(directory)[memmap.BUSY] == 0


@pytest.mark.parametrize("adds", [7, 3], ids=["ring full", "ring filling"])
def test_an_add_cut_short_is_undone_from_the_journal(adds, tmp_path):
    """The journal by hand: the rows and priorities of an add that never committed are put back as they were.

    While the ring fills, the rows it wrote lie past the counter (the next add writes them whole); their
    priorities go back to 0, so that no draw reaches them.
    """
    directory = tmp_path / "b"
    on_disk, in_ram = pair("prioritized_episodes", directory)
    if adds < 5:  # the ring filling again after a clear: the journal holds an earlier add's rows
        drive([on_disk, in_ram], SPEC, 7)
        on_disk.clear()
        in_ram.clear()
    drive([on_disk, in_ram], SPEC, adds)
    expected_probabilities = in_ram.get_next(sample_batch_size=8, num_steps=2)[1].probabilities
    table = on_disk.storage
    # Add number `adds` as far as its writes go, without its commit: rows, record of episode ends, priorities.
    with on_disk._lock:
        first_row = 2 * (adds % 5)
        leaves = tf.nest.flatten(item(SPEC, adds))
        on_disk.sampler.before_add(adds, leaves[[f.path for f in on_disk.fields].index("step_type")])
        table.write_block(first_row, leaves)
        on_disk.sampler.on_add(adds, slice(first_row, first_row + 2))
    assert on_disk.storage.extras["priority"][first_row : first_row + 2].tolist() == [1.0, 1.0]
    if adds == 7:
        assert contents(on_disk)["action"][:, 0].tolist() == [700, 701]  # torn: the ring's oldest frames overwritten
    table._finalizer()  # the process dies: its lock goes, nothing is closed
    del on_disk, table
    reopened = tfbuffers.open(directory, seed=3)
    again = tfbuffers.PyPrioritizedReplayBuffer(SPEC, **SIZE, episode_boundaries=True, seed=3)
    again.restore_state(in_ram.state())
    assert_same(contents(reopened), contents(in_ram))
    np.testing.assert_array_equal(reopened.state().extras["priority"], in_ram.state().extras["priority"])
    _, info = reopened.get_next(sample_batch_size=8, num_steps=2)
    np.testing.assert_array_equal(info.probabilities, again.get_next(sample_batch_size=8, num_steps=2)[1].probabilities)
    assert sorted(set(info.probabilities.tolist())) == sorted(set(expected_probabilities.tolist()))
    np.testing.assert_array_equal(reopened.add_batch(item(SPEC, adds)), [2 * adds, 2 * adds + 1])
    reopened.close()


def test_save_streams_a_file_and_load_fills_a_new_directory(tmp_path):
    on_disk, in_ram = pair("prioritized_episodes", tmp_path / "b")
    drive([on_disk, in_ram], SPEC, 8)
    path = on_disk.save(tmp_path / "b.safetensors")
    loaded = tfbuffers.PyPrioritizedReplayBuffer.load(path, directory=tmp_path / "c", seed=3)
    assert loaded.directory == tmp_path / "c"
    assert_same(contents(loaded), contents(in_ram))
    assert loaded.constructor_options() == in_ram.constructor_options()
    np.testing.assert_array_equal(loaded.state().extras["priority"], in_ram.state().extras["priority"])
    loaded.close()
    reopened = tfbuffers.open(tmp_path / "c")
    assert_same(contents(reopened), contents(in_ram))
    reopened.close()
    assert_same(contents(tfbuffers.load(path)), contents(in_ram))  # into RAM, as any file
    with pytest.raises(ValueError, match="expected a new or empty directory"):  # an existing buffer is left alone
        tfbuffers.PyPrioritizedReplayBuffer.load(path, directory=tmp_path / "c")
    assert (tmp_path / "c" / "header.json").is_file()
    on_disk.close()


def test_checkpoints_and_states_restore_into_a_directory(tmp_path):
    on_disk, in_ram = pair("prioritized", tmp_path / "b")
    drive([in_ram], SPEC, 9)
    checkpoint = tf.train.Checkpoint(buffer=in_ram)
    path = checkpoint.save(tmp_path / "ckpt" / "c")
    tf.train.Checkpoint(buffer=on_disk).restore(path).assert_consumed()
    assert_same(contents(on_disk), contents(in_ram))
    on_disk.close()
    reopened = tfbuffers.open(tmp_path / "b")
    assert_same(contents(reopened), contents(in_ram))
    np.testing.assert_array_equal(reopened.state().extras["priority"], in_ram.state().extras["priority"])
    reopened.close()


WRITER = """
    import os, sys, numpy as np, tensorflow as tf, tfbuffers
    directory, log = sys.argv[1], sys.argv[2]
    spec = {"obs": tf.TensorSpec([64, 1024], tf.float32), "step_type": tf.TensorSpec([], tf.int32)}
    if os.path.exists(os.path.join(directory, "header.json")):
        buffer = tfbuffers.open(directory)
    else:
        buffer = tfbuffers.PyPrioritizedReplayBuffer(
            spec, batch_size=4, max_length=16, episode_boundaries=True, directory=directory)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.write(fd, b"ready\\n")
    t = int(buffer.storage.added)
    while True:
        obs = np.broadcast_to((t * 4 + np.arange(4, dtype=np.float32))[:, None, None], [4, 64, 1024])
        buffer.add_batch({"obs": obs, "step_type": np.full([4], [0, 1, 1, 2][t % 4], np.int32)})
        os.write(fd, b"%d\\n" % t)  # add number t returned
        t += 1
"""


def _killed_writer(directory, log, rng):
    """Starts the writer, kills it with SIGKILL at a random moment once it adds; the adds it said returned."""
    log.write_text("")
    writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(WRITER), str(directory), str(log)])
    deadline = time.monotonic() + 120
    while "ready" not in log.read_text():
        assert writer.poll() is None and time.monotonic() < deadline, "the writer did not start"
        time.sleep(0.02)
    time.sleep(rng.uniform(0.05, 0.6))
    writer.send_signal(signal.SIGKILL)
    assert writer.wait(timeout=60) == -signal.SIGKILL
    return [int(line) for line in log.read_text().split()[1:]]


@pytest.mark.slow
def test_a_writer_killed_at_random_moments_loses_no_returned_add_and_tears_nothing(tmp_path):
    directory, log = tmp_path / "b", tmp_path / "log"
    rng = np.random.default_rng(0)
    spec = {"obs": tf.TensorSpec([64, 1024], tf.float32), "step_type": tf.TensorSpec([], tf.int32)}
    returned_before, kills, cut_short = 0, 0, 0
    # At least 6 kills, and on until one cut an add short (about a third do: most of the writer's time is in adds).
    while kills < 6 or not cut_short:
        assert kills < 20, "20 kills and none cut an add short"
        returned = _killed_writer(directory, log, rng)
        kills += 1
        assert returned, "the writer was killed before its first add"
        state = np.load(directory / "state.npy")
        cut_short += state[memmap.JOURNAL_ADD] == state[memmap.ADDED]  # its journal to copy back
        reopened = tfbuffers.open(directory, seed=5)
        added = int(reopened.storage.added)
        # Every add that said it returned is there, and at most the one that returned without saying so.
        assert returned[-1] + 1 <= added <= returned[-1] + 2, (returned[-1], added)
        assert added > returned_before
        returned_before = added
        # No torn frame, no frame of an unfinished add: each stored frame is its add's, whole.
        stored = contents(reopened)
        oldest = added - min(added, 16)
        expected = (np.arange(oldest, added)[None, :] * 4 + np.arange(4)[:, None]).astype(np.float32)
        np.testing.assert_array_equal(stored["obs"], expected[:, :, None, None] * np.ones([64, 1024], np.float32))
        np.testing.assert_array_equal(stored["step_type"][0], [[0, 1, 1, 2][t % 4] for t in range(oldest, added)])
        # The priorities and the record of episode ends rebuilt: sampling is the same buffer's in RAM.
        in_ram = tfbuffers.PyPrioritizedReplayBuffer(spec, batch_size=4, max_length=16, episode_boundaries=True, seed=5)
        in_ram.restore_state(reopened.state())
        _, info = reopened.get_next(sample_batch_size=32, num_steps=2)
        _, expected_info = in_ram.get_next(sample_batch_size=32, num_steps=2)
        np.testing.assert_array_equal(info.ids, expected_info.ids)
        np.testing.assert_array_equal(info.probabilities, expected_info.probabilities)
        windows = 4 * sum(1 for t in range(oldest, added - 1) if t % 4 != 3)  # 2-frame windows inside episodes
        np.testing.assert_allclose(info.probabilities, 1 / windows)
        reopened.close()


RESIDENT = """
    import sys, threading, numpy as np, tensorflow as tf, tfbuffers

    def anonymous():
        status = open("/proc/self/status").read().splitlines()
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("RssAnon:"))

    spec = {"observation": tf.TensorSpec([84, 84, 4], tf.uint8), "action": tf.TensorSpec([], tf.int64)}
    buffer = tfbuffers.PyPrioritizedReplayBuffer(
        spec, batch_size=4, max_length=3_000, episode_boundaries=False, directory=sys.argv[1])
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, [8, 4, 84, 84, 4], dtype=np.uint8)
    before = anonymous()
    peak = 0
    for t in range(3_000):
        buffer.add_batch({"observation": frames[t % 8], "action": np.full([4], t)})
        if t % 100 == 99:
            _, info = buffer.get_next(sample_batch_size=32, num_steps=2)
            buffer.update_priorities(info.ids[:, 0], rng.uniform(0.1, 2.0, 32))
            peak = max(peak, anonymous() - before)
    # A save streams the rows into a file: chunks, not a copy of the buffer.
    saving = threading.Event()
    peaks = [0]

    def watch():
        while not saving.wait(0.001):
            peaks[0] = max(peaks[0], anonymous() - before)

    watcher = threading.Thread(target=watch)
    watcher.start()
    buffer.save(sys.argv[1] + ".safetensors", progress=False)
    saving.set()
    watcher.join()
    print(buffer.nbytes, peak, peaks[0])
"""


@pytest.mark.slow
def test_anonymous_resident_memory_stays_under_a_tenth_of_the_stored_bytes(tmp_path):
    """Adding, sampling and saving 12,000 Atari frames (340 MB): the pages are the page cache's, not the process's."""
    stored, peak, saving = map(int, _run(RESIDENT, str(tmp_path / "b")).split())
    assert stored > 12_000 * 84 * 84 * 4
    assert peak < 0.1 * stored, (peak, stored)
    assert saving < 64 * 2**20, (saving, stored)  # a save's few 16 MB chunks, whatever the buffer's size


def test_memory_mapped_files_are_a_storage_like_the_others_and_directory_is_its_shorthand(tmp_path):
    # storage=MemmapStorage(d) is directory=d: the same files, the same buffer reopened by tfbuffers.open.
    buffer_class, options, spec = CASES["prioritized_episodes"]
    by_storage = buffer_class(spec, **SIZE, **options, seed=3, storage=memmap.MemmapStorage(tmp_path / "s"))
    by_directory = buffer_class(spec, **SIZE, **options, seed=3, directory=tmp_path / "d")
    assert by_storage.directory == tmp_path / "s" and by_directory.directory == tmp_path / "d"
    assert type(by_storage.storage) is type(by_directory.storage) is memmap.MemmapTable
    drive([by_storage, by_directory], spec, 12)
    expected = contents(by_directory), by_directory.state().extras
    by_storage.close()
    by_directory.close()
    headers = [json.loads((tmp_path / name / memmap.HEADER).read_text()) for name in ("s", "d")]
    assert headers[0] == headers[1]
    reopened = tfbuffers.open(tmp_path / "s", seed=3)
    assert_same(contents(reopened), expected[0])
    np.testing.assert_array_equal(reopened.state().extras["priority"], expected[1]["priority"])
    reopened.close()
    with pytest.raises(ValueError, match=re.escape(memmap.STORAGE_AND_DIRECTORY)):
        buffer_class(spec, **SIZE, storage=memmap.MemmapStorage(tmp_path / "x"), directory=tmp_path / "y")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
    with pytest.raises(FileNotFoundError):
        memmap.MemmapStorage(tmp_path / "x", reopen=True)
    stacked = tfbuffers.PyUniformReplayBuffer(
        STACK_SPEC, **SIZE, frame_stacks="pixels", storage=memmap.MemmapStorage(tmp_path / "f")
    )
    drive([stacked], STACK_SPEC, 3)
    assert stacked.frame_stacks == "pixels" and type(stacked.storage) is FrameStackTable  # stacks over the files
    assert type(stacked.storage.inner) is memmap.MemmapTable and stacked.directory == tmp_path / "f"
    assert contents(stacked)["pixels"][:, -1, 0, 0, :].tolist() == [[0, 0, 1, 2]] * 2


PIXELS = {"pixels": tf.TensorSpec([16, 16, 4], tf.uint8), "code": tf.TensorSpec([], tf.int64)}


def shifting_stacks(num_adds, batch_size=2, seed=0):
    """Atari-style adds: each segment's stack is its previous one shifted by a new random frame."""
    rng = np.random.default_rng(seed)
    stacks = rng.integers(0, 256, [batch_size, 16, 16, 4], dtype=np.uint8)
    for t in range(num_adds):
        stacks = np.concatenate([stacks[..., 1:], rng.integers(0, 256, [batch_size, 16, 16, 1], np.uint8)], -1)
        yield {"pixels": stacks, "code": 1000 * np.arange(batch_size) + t}


def test_frame_stacks_over_memory_mapped_files_keep_each_frame_once_on_the_disk(tmp_path):
    directory, size = tmp_path / "b", {"batch_size": 2, "max_length": 200}
    on_disk = tfbuffers.PyUniformReplayBuffer(PIXELS, **size, seed=7, frame_stacks="pixels", directory=directory)
    plain = tfbuffers.PyUniformReplayBuffer(PIXELS, **size, seed=7)
    adds = list(shifting_stacks(530))
    for items in adds[:500]:  # the rings wrap twice
        on_disk.add_batch(items)
        plain.add_batch(items)
    assert_same(contents(on_disk), contents(plain))
    assert_same(on_disk.get_next(16, 2), plain.get_next(16, 2))
    # The stacks' field holds 4 handles a row; the frames are a pool file beside it.
    header = json.loads((directory / memmap.HEADER).read_text())
    assert header["version"] == 2
    assert [(f["path"], f["dtype"], f["shape"]) for f in header["fields"]] == [
        ("code", "int64", []),
        ("pixels", "int64", [4]),
    ]
    slots = (400 + 400) * 4  # every row's 4 frames, and a restore's chunk of new ones (here every row) before the old
    assert header["pools"] == [
        {"name": "frames/pixels", "dtype": "uint8", "shape": [slots, 16, 16], "file": "pools/frames_pixels.npy"}
    ]
    pool = on_disk.storage.pools[1]
    assert len(pool) == len(np.unique(on_disk.storage.handles(1))) == 2 * (200 + 3)  # a new frame a stack
    # A sparse file: its pages on the disk are the frames written, not the most it can hold.
    pool_file = directory / "pools" / "frames_pixels.npy"
    assert pool_file.stat().st_size > slots * 256
    assert pool_file.stat().st_blocks * 512 < (len(pool) + 2 * 4 + 64) * 256, pool_file.stat().st_blocks
    on_disk.close()
    # Reopened: the rows, the frames and their counts as they were; then on, exactly as the plain buffer.
    reopened = tfbuffers.open(directory, seed=7)
    assert type(reopened.storage) is FrameStackTable and reopened.frame_stacks == "pixels"
    assert_same(contents(reopened), contents(plain))
    assert len(reopened.storage.pools[1]) == len(pool)
    again = tfbuffers.PyUniformReplayBuffer(PIXELS, **size, seed=7)
    again.restore_state(plain.state())
    assert_same(reopened.get_next(16, 2), again.get_next(16, 2))
    for items in adds[500:]:
        reopened.add_batch(items)
        plain.add_batch(items)
    assert_same(contents(reopened), contents(plain))
    assert len(reopened.storage.pools[1]) == len(np.unique(reopened.storage.handles(1))) == 2 * (200 + 3)
    reopened.clear()
    plain.clear()
    for items in adds[:3]:
        reopened.add_batch(items)
        plain.add_batch(items)
    assert_same(contents(reopened), contents(plain))
    reopened.close()


@pytest.mark.parametrize("adds", [13, 3], ids=["ring full", "ring filling"])
def test_a_frame_stack_add_cut_short_is_undone_with_its_frames(adds, tmp_path):
    # The journal puts back the add's handles; the frames they name are still in the pool file: an add writes
    # new frames only into slots no row holds, and releases the old ones after its rows.
    directory, size = tmp_path / "b", {"batch_size": 2, "max_length": 5}
    on_disk = tfbuffers.PyUniformReplayBuffer(PIXELS, **size, seed=1, frame_stacks="pixels", directory=directory)
    in_ram = tfbuffers.PyUniformReplayBuffer(PIXELS, **size, seed=1)
    stream = list(shifting_stacks(adds + 2))
    for items in stream[:adds]:
        on_disk.add_batch(items)
        in_ram.add_batch(items)
    table = on_disk.storage
    with on_disk._lock:  # add number `adds` as far as its writes go, without its commit
        table.write_block(2 * (adds % 5), tf.nest.flatten(stream[adds]))
    if adds > 5:
        assert contents(on_disk)["code"][:, 0].tolist() == [adds, 1000 + adds]  # torn: the oldest rows overwritten
    table.inner._finalizer()  # the process dies: its lock goes, nothing is closed
    del on_disk, table
    reopened = tfbuffers.open(directory, seed=1)
    assert_same(contents(reopened), contents(in_ram))
    assert len(reopened.storage.pools[1]) == len(np.unique(reopened.storage.handles(1)))
    for items in stream[adds:]:
        reopened.add_batch(items)
        in_ram.add_batch(items)
    assert_same(contents(reopened), contents(in_ram))
    reopened.close()


def test_a_gather_from_cold_files_asks_for_its_rows_pages_first_and_returns_the_same(tmp_path, monkeypatch):
    """`Advice`: gathers slower than memory (files read from the disk) make the next ones ask for their pages first.

    Each run of consecutive rows is asked for at once; what they return is unchanged, and fields of rows under a
    page are never asked for.
    """
    spec = {"frame": tf.TensorSpec([64, 64], tf.uint8), "reward": tf.TensorSpec([], tf.float32)}  # 4,096-byte rows
    made = {
        where: tfbuffers.PyUniformReplayBuffer(spec, batch_size=2, max_length=64, seed=5, directory=directory)
        for where, directory in (("ram", None), ("files", tmp_path / "files"))
    }
    rng = np.random.default_rng(0)
    block = {"frame": rng.integers(0, 256, (2, 64, 64, 64), np.uint8), "reward": rng.random((2, 64), np.float32)}
    for buffer in made.values():
        buffer.extend(block)
    storage = made["files"]._table
    frame, reward = storage._advice
    assert (frame.row_bytes, reward.row_bytes) == (4096, 4) and frame.first == reward.first == 128  # the .npy header
    asked = []
    monkeypatch.setattr(_advice.Advice, "will_need_run", lambda self, start, stop: asked.append((start, stop)))
    monkeypatch.setattr(_advice.Advice, "COLD_BYTES_PER_SECOND", float("inf"))  # every timed gather is cold
    cold = _advice.Advice.COLD_GATHERS
    for call in range(cold + 2):
        expected, _ = made["ram"].get_next(8, 4)
        asked.clear()
        items, info = made["files"].get_next(8, 4)
        assert_same(items, expected)
        ids = np.asarray(info.ids)
        rows = np.unique(ids % 128)  # step t of segment b: id 2t + b, its row (the segments' frames interleave)
        if call in (0, cold + 1):  # timed, not asked: the next `cold` ask first
            assert asked == [] and frame.asking == cold
            continue
        assert frame.asking == cold - call
        covered = np.concatenate([np.arange(start, stop) for start, stop in asked])
        np.testing.assert_array_equal(covered, rows)  # each row once, in runs
        assert all(stop < next_start for (_, stop), (next_start, _) in zip(asked, asked[1:]))  # runs, not rows
    assert reward.asking == 0  # rows under a page: not timed, never asked for
    # At memory speed: nothing asked.
    monkeypatch.setattr(_advice.Advice, "COLD_BYTES_PER_SECOND", 0.0)
    frame.asking = 0
    asked.clear()
    for _ in range(3):
        expected, _ = made["ram"].get_next(8, 4)
        items, _ = made["files"].get_next(8, 4)
        assert_same(items, expected)
    assert asked == [] and frame.asking == 0
    assert_same(made["files"].gather_all(), made["ram"].gather_all())
    made["files"].close()
    assert storage._advice == []  # the mappings let go with the files


def test_the_advice_is_the_kernels_on_a_real_mapping(tmp_path):
    """`madvise` itself, on a buffer's mapping: random reads, then a run of rows asked for (no error, same rows)."""
    spec = {"frame": tf.TensorSpec([2, 4096], tf.uint8)}
    buffer = tfbuffers.PyUniformReplayBuffer(spec, batch_size=1, max_length=8, seed=0, directory=tmp_path / "b")
    frames = np.arange(8 * 2 * 4096, dtype=np.int64).astype(np.uint8).reshape(1, 8, 2, 4096)
    buffer.extend({"frame": frames})
    (advice,) = buffer._table._advice
    advice.will_need(np.array([[6, 7], [1, 2]]))
    advice.will_need_run(0, 8)
    np.testing.assert_array_equal(buffer.gather_all()["frame"], frames)
    buffer.close()
