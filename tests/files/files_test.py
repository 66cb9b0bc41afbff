"""Buffer files: round trips, refusals, saves beside writers, and SIGKILL during saves."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import textwrap
import threading

import conftest
import numpy as np
import pytest
import tensorflow as tf

import tfbuffers
from tfbuffers import files
from tfbuffers import testing as stress

KINDS = list(conftest.BUFFER_KINDS)


def make(kind: str, batch_size: int = 2, max_length: int = 3) -> tfbuffers.ReplayBuffer:
    return conftest.make(kind, stress.SPEC, batch_size, max_length)


def fill(buffer: tfbuffers.ReplayBuffer, first: int, num_adds: int) -> None:
    for t in range(first, first + num_adds):
        buffer.add_batch(stress.frames(t * 10 + np.arange(buffer.batch_size, dtype=np.int64)))


@pytest.mark.parametrize(("source", "target"), conftest.RESTORABLE)
def test_round_trip_across_kinds_with_the_next_add_in_place(tmp_path, source, target):
    saved = make(source)
    fill(saved, 0, 5)  # wrapped: holds adds 2, 3, 4
    path = files.save(saved, tmp_path / "b.safetensors", {"run": 7, "note": "é"})
    header = files.read_header(path)
    assert header["frames"] == 6 and header["batch_size"] == 2 and header["max_length"] == 3
    assert header["buffer"] == type(saved).__name__ and header["metadata"] == {"run": 7, "note": "é"}
    loaded = make(target)
    assert files.load(path, loaded) == {"run": 7, "note": "é"}
    np.testing.assert_array_equal(stress.check_whole(loaded.gather_all()), [[20, 30, 40], [21, 31, 41]])
    fill(loaded, 5, 1)
    np.testing.assert_array_equal(stress.check_whole(loaded.gather_all()), [[30, 40, 50], [31, 41, 51]])
    assert list(tmp_path.iterdir()) == [path]  # no temporaries left


@pytest.mark.parametrize("kind", KINDS)
def test_a_file_of_another_layout_is_refused_and_the_buffer_kept(tmp_path, kind):
    path = files.save(make(kind, batch_size=2, max_length=3), tmp_path / "b.safetensors")
    buffer = make(kind, batch_size=3, max_length=3)
    fill(buffer, 0, 1)
    with pytest.raises(ValueError) as raised:
        files.load(path, buffer)
    name = type(buffer).__name__
    assert str(raised.value) == f"{path}: batch_size: holds 2, this {name} expects 3"
    other_spec = dict(stress.SPEC, action=tf.TensorSpec([], tf.int64))
    retyped = conftest.BUFFER_KINDS[kind].make(other_spec, 2, 3)
    with pytest.raises(ValueError) as raised:
        files.load(path, retyped)
    assert str(raised.value) == (
        f"{path}: fields: action holds int32[], this {type(retyped).__name__} stores int64[]; "
        "a field is restored only into the field of the same nest path"
    )
    np.testing.assert_array_equal(stress.check_whole(buffer.gather_all()), [[0], [1], [2]])


def test_files_that_are_not_buffer_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such buffer file"):
        files.read_header(tmp_path / "missing.safetensors")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(ValueError, match="expected a tfbuffers buffer file"):
        files.read_header(junk)
    with pytest.raises(TypeError) as raised:
        files.save(make("py"), tmp_path / "b.safetensors", {"bad": object()})
    assert str(raised.value).startswith("metadata: expected a JSON-serialisable dict, got ")
    assert not (tmp_path / "b.safetensors").exists()


@pytest.mark.parametrize("kind", KINDS)
def test_saves_beside_a_writer_are_consistent_snapshots(tmp_path, kind):
    buffer = make(kind, batch_size=2, max_length=4)
    fill(buffer, 0, 1)
    stop = threading.Event()

    def writer() -> None:
        t = 1
        while not stop.is_set():
            fill(buffer, t, 1)
            t += 1

    thread = threading.Thread(target=writer)
    thread.start()
    loaded = make(kind, batch_size=2, max_length=4)  # each load replaces the last one's contents
    try:
        for i in range(20):
            path = files.save(buffer, tmp_path / f"{i}.safetensors")
            files.load(path, loaded)
            codes = stress.check_whole(loaded.gather_all())
            # Each segment holds consecutive adds, newest last: no torn or stale rows.
            assert np.all(np.diff(codes, axis=1) == 10) and np.all(codes[1] == codes[0] + 1)
    finally:
        stop.set()
        thread.join()


SAVER = textwrap.dedent(
    """
    import sys
    import numpy as np
    import tfbuffers
    from tfbuffers import files
    from tfbuffers import testing as stress

    path, start = sys.argv[1], int(sys.argv[2])
    buffer = tfbuffers.PyUniformReplayBuffer(stress.SPEC, batch_size=4, max_length=100_000)
    for round_ in range(start, start + 10_000):
        codes = round_ * 1_000_000 + np.arange(4, dtype=np.int64)
        buffer.add_batch(stress.frames(codes))
        files.save(buffer, path, {"round": round_})
        print(round_, flush=True)
    """
)


def test_a_save_killed_at_random_moments_leaves_the_previous_or_the_new_file(tmp_path):
    path = tmp_path / "buffer.safetensors"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    rng = random.Random(0)
    kills = interrupted = 0
    last_loaded = 0
    # Five kills, and more (at most 30) until one has landed inside a save: where a kill lands
    # depends on the machine's speed (3 to 5 of the first 5 on the project's machine).
    while kills < 5 or (interrupted == 0 and kills < 30):
        process = subprocess.Popen(
            [sys.executable, "-c", SAVER, str(path), str(last_loaded + 1)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            text=True,
        )
        assert process.stdout is not None
        completed = int(process.stdout.readline())  # one save done: the next ones are ~7 MB each
        for _ in range(rng.randrange(0, 3)):
            completed = int(process.stdout.readline())
        threading.Event().wait(rng.uniform(0.0, 0.15))
        process.send_signal(signal.SIGKILL)
        process.wait()
        kills += 1
        interrupted += any(p.name.endswith(".tmp") for p in tmp_path.iterdir())  # a save's private directory
        printed = process.stdout.read().split()  # rounds saved after the last line read
        completed = int(printed[-1]) if printed else completed
        # The file at `path` is a whole save: the last completed one or the one after it.
        header = files.read_header(path)
        round_ = header["metadata"]["round"]
        assert completed <= round_ <= completed + 1 and round_ > last_loaded
        loaded = tfbuffers.PyUniformReplayBuffer(stress.SPEC, batch_size=4, max_length=100_000)
        files.load(path, loaded)
        codes = stress.check_whole(loaded.gather_all())
        assert codes.shape[0] == 4 and codes[0, -1] == round_ * 1_000_000
        assert np.all(np.diff(codes[0]) == 1_000_000) and codes[0, 0] == (last_loaded + 1) * 1_000_000
        last_loaded = round_
    # The test is only worth something if a kill landed inside a save.
    assert interrupted >= 1
    # Temporaries of killed saves are removed by the next save.
    files.save(tfbuffers.PyUniformReplayBuffer(stress.SPEC, batch_size=4, max_length=100_000), path)
    assert sorted(pathlib.Path(tmp_path).iterdir()) == [path]


def test_without_safetensors_files_save_and_load_and_a_version_1_file_names_the_extra(tmp_path):
    # Format version 2 is written and read by tfbuffers itself: the core install (no extras) saves and loads.
    import safetensors.numpy

    buffer = tfbuffers.PyUniformReplayBuffer({"step": tf.TensorSpec([], tf.int64)}, batch_size=1, max_length=3)
    header = {"format": "tfbuffers.segmented/1", "buffer": "PyUniformReplayBuffer", "batch_size": "1"}
    header |= {"max_length": "3", "frames": "0", "metadata": "{}"}
    header["fields"] = json.dumps(buffer.state().describe()["fields"])
    v1 = tmp_path / "v1.safetensors"
    safetensors.numpy.save_file(
        {"added": np.array([0], np.int64), "field/step": np.zeros([3, 1], np.int64)}, v1, header
    )
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["safetensors"] = None
        import numpy as np, tensorflow as tf, tfbuffers
        from tfbuffers import files
        buffer = tfbuffers.PyUniformReplayBuffer({{"step": tf.TensorSpec([], tf.int64)}}, batch_size=1, max_length=3)
        buffer.add_batch({{"step": np.array([5])}})
        path = buffer.save({str(tmp_path / "v2.safetensors")!r})
        print(tfbuffers.load(path).gather_all()["step"].tolist())
        files.load({str(v1)!r}, buffer)
        """
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 1
    assert run.stdout.splitlines()[-1] == "[[5]]"
    assert f"ImportError: {v1}: a format version 1 file is read with safetensors" in run.stderr
    assert "pip install 'tfbuffers[files]'" in run.stderr


# Format version 2 (issue 15): files alone rebuild buffers, hold only the stored frames, and are verified.

CLASSES = {name: kind.buffer_class for name, kind in conftest.BUFFER_KINDS.items()}
FRAME_BYTES = 8 + 3 * 4 + 4 * 4 + 4  # stress.SPEC: code, observation, pixels, action


def prioritized(kind: str) -> bool:
    return conftest.BUFFER_KINDS[kind].state_format == tfbuffers.state.PRIORITIZED


def header_end(path: pathlib.Path) -> int:
    return 8 + int.from_bytes(path.read_bytes()[:8], "little")


def assert_same_state(got: tfbuffers.BufferState, expected: tfbuffers.BufferState) -> None:
    assert got.counters == expected.counters
    for group in ("arrays", "extras"):
        assert list(getattr(got, group)) == list(getattr(expected, group))
        for name, array in getattr(expected, group).items():
            np.testing.assert_array_equal(getattr(got, group)[name], array, err_msg=name)


@pytest.mark.parametrize(("source", "target"), conftest.RESTORABLE)
def test_a_file_alone_rebuilds_the_buffer_exactly(tmp_path, source, target):
    saved = make(source)
    fill(saved, 0, 5)  # wrapped: holds adds 2, 3, 4 (ids 4..9)
    if prioritized(source):
        saved.update_priorities(np.array([4, 5, 9]), np.array([0.5, 3.0, 0.0]))
    path = saved.save(tmp_path / "b.safetensors", {"run": 7})
    loaded = conftest.BUFFER_KINDS[target].load(path)
    assert type(loaded) is CLASSES[target] and (loaded.batch_size, loaded.max_length) == (2, 3)
    assert loaded.data_spec == saved.data_spec
    assert_same_state(loaded.state(), saved.state())  # rows, counter and priorities, bit for bit
    np.testing.assert_array_equal(stress.check_whole(loaded.gather_all()), [[20, 30, 40], [21, 31, 41]])
    fill(loaded, 5, 1)
    np.testing.assert_array_equal(stress.check_whole(loaded.gather_all()), [[30, 40, 50], [31, 41, 51]])
    same = tfbuffers.load(path)  # the class it was saved from
    assert type(same) is type(saved)
    assert_same_state(same.state(), saved.state())
    assert files.read_header(path)["metadata"] == {"run": 7}


@pytest.mark.parametrize("kind", KINDS)
def test_a_file_grows_with_the_frames_held_not_the_capacity(tmp_path, kind):
    extra_per_frame, extra = (8, 8) if prioritized(kind) else (0, 0)  # a priority per frame; the largest one
    for adds in (0, 5, 200):
        buffer = make(kind, batch_size=2, max_length=250)
        fill(buffer, 0, adds)
        path = buffer.save(tmp_path / f"{adds}.safetensors")
        assert path.stat().st_size - header_end(path) == adds * 2 * (FRAME_BYTES + extra_per_frame) + extra
        assert files.read_header(path)["frames"] == adds * 2


@pytest.mark.parametrize(("source", "target"), conftest.RESTORABLE)
def test_a_file_loads_into_another_max_length(tmp_path, source, target):
    saved = make(source, batch_size=2, max_length=4)
    fill(saved, 0, 6)  # holds adds 2..5: ids 4..11
    if prioritized(source):
        saved.update_priorities(np.array([10, 11, 4]), np.array([2.5, 0.0, 7.0]))
    path = saved.save(tmp_path / "b.safetensors")
    # Shorter: the newest frames that fit; the counter is kept (ids continue).
    shorter = conftest.BUFFER_KINDS[target].load(path, max_length=3)
    into = make(target, batch_size=2, max_length=3)
    files.load(path, into)
    for buffer in (shorter, into):
        np.testing.assert_array_equal(stress.check_whole(buffer.gather_all()), [[30, 40, 50], [31, 41, 51]])
        if prioritized(target):
            priorities = buffer.state().extras["priority"]
            rows = tfbuffers._ring.rows_of_ids(np.array([10, 11, 6]), 3, 2)
            np.testing.assert_array_equal(priorities[rows], [2.5, 0.0, 1.0])  # id 4 (7.0) was dropped
            assert float(buffer.state().extras["max_priority"]) == 7.0  # still the priority new frames get
        assert np.asarray(buffer.add_batch(stress.frames(np.array([60, 61])))).tolist() == [12, 13]
    # Longer: everything; the counter is the adds loaded (ids restart), and the buffer fills on.
    longer = conftest.BUFFER_KINDS[target].load(path, max_length=10)
    np.testing.assert_array_equal(stress.check_whole(longer.gather_all()), [[20, 30, 40, 50], [21, 31, 41, 51]])
    assert np.asarray(longer.add_batch(stress.frames(np.array([60, 61])))).tolist() == [8, 9]
    assert int(longer.num_frames()) == 10


@pytest.mark.parametrize(("source", "target"), conftest.UNRESTORABLE)
def test_priorities_are_never_dropped_and_a_uniform_file_seeds_a_prioritized_buffer(tmp_path, source, target):
    saved = make(source)
    fill(saved, 0, 2)
    path = saved.save(tmp_path / "b.safetensors")
    if prioritized(source):
        with pytest.raises(ValueError) as raised:
            conftest.BUFFER_KINDS[target].load(path)
        assert str(raised.value) == (
            f"{path}: format: holds tfbuffers.prioritized/1 (priorities), this {CLASSES[target].__name__} stores "
            "tfbuffers.segmented/1: loading would drop the priorities; load it into a prioritized buffer"
        )
        return
    loaded = conftest.BUFFER_KINDS[target].load(path)  # the frames get priority 1.0, as added frames do
    extras = loaded.state().extras
    np.testing.assert_array_equal(extras["priority"], [1.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    assert float(extras["max_priority"]) == 1.0
    _, info = loaded.get_next(sample_batch_size=8)
    np.testing.assert_allclose(np.asarray(info.probabilities), np.full(8, 0.25))


def damage(path: pathlib.Path, how: str) -> str:
    """Damages the file at `path`; returns the start of the message its load must raise."""
    data = bytearray(path.read_bytes())
    end = header_end(path)
    if how == "flipped payload byte":
        header = json.loads(bytes(data[8:end]))
        begin, stop = header["field/pixels"]["data_offsets"]
        data[end + (begin + stop) // 2] ^= 0x01
        message = f"{path}: field/pixels: checksum mismatch (sha256 "
    elif how == "truncated":
        data = data[:-5]
        message = f"{path}: truncated: expected {len(data) + 5} bytes, the file has {len(data)}"
    elif how == "appended":
        data += b"\0"
        message = f"{path}: expected {len(data) - 1} bytes, the file has {len(data)}: something was appended to it"
    elif how == "tampered header":
        data[8:end] = bytes(data[8:end]).replace(b'"added":"5"', b'"added":"4"')
        message = f"{path}: header: checksum mismatch (sha256 "
    else:  # a newer format version
        data[8:end] = bytes(data[8:end]).replace(b"tfbuffers.buffer/2", b"tfbuffers.buffer/3")
        message = (
            f"{path}: written by a newer tfbuffers (format tfbuffers.buffer/3); this tfbuffers reads format "
            "versions 1 to 2: upgrade tfbuffers to load it"
        )
    assert bytes(data) != path.read_bytes()
    path.write_bytes(bytes(data))
    return message


@pytest.mark.parametrize("how", ["flipped payload byte", "truncated", "appended", "tampered header", "newer version"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_damaged_file_is_refused_and_the_buffer_works_on(tmp_path, kind, how):
    saved = make(kind)
    fill(saved, 0, 5)
    path = saved.save(tmp_path / "b.safetensors")
    message = damage(path, how)
    buffer = make(kind)
    fill(buffer, 100, 2)
    for load in (lambda: files.load(path, buffer), lambda: type(buffer).load(path), lambda: tfbuffers.load(path)):
        with pytest.raises(ValueError) as raised:
            load()
        assert str(raised.value).startswith(message), str(raised.value)
    # Unchanged; the next add, sample, gather_all and clear work, eagerly and inside tf.function.
    np.testing.assert_array_equal(stress.check_whole(buffer.gather_all()), [[1000, 1010], [1001, 1011]])
    tf.function(buffer.add_batch)(stress.frames(np.array([1020, 1021])))
    buffer.add_batch(stress.frames(np.array([1030, 1031])))
    stress.check_whole(tf.function(lambda: buffer.get_next(sample_batch_size=4, num_steps=2)[0])())
    stress.check_whole(buffer.get_next(sample_batch_size=4)[0])
    gathered = tf.function(buffer.gather_all)()
    np.testing.assert_array_equal(stress.check_whole(gathered), [[1010, 1020, 1030], [1011, 1021, 1031]])
    tf.function(buffer.clear)()
    assert int(buffer.num_frames()) == 0
    fill(buffer, 0, 1)
    buffer.clear()
    assert int(buffer.num_frames()) == 0


def test_the_file_is_plain_safetensors(tmp_path):
    import safetensors

    buffer = make("tf_prioritized")
    fill(buffer, 0, 4)  # holds adds 1..3
    path = buffer.save(tmp_path / "b.safetensors")
    with safetensors.safe_open(str(path), framework="np") as opened:
        assert sorted(opened.keys()) == [
            "extra/max_priority",
            "extra/priority",
            "field/action",
            "field/code",
            "field/observation",
            "field/pixels",
        ]
        # Time-major, oldest first: [frames per segment, batch_size, ...].
        np.testing.assert_array_equal(opened.get_tensor("field/code"), [[10, 11], [20, 21], [30, 31]])
        assert opened.get_tensor("field/pixels").shape == (3, 2, 4, 4)
        np.testing.assert_array_equal(opened.get_tensor("extra/priority"), np.ones([3, 2]))
        assert opened.metadata()["format"] == "tfbuffers.buffer/2"


def test_specs_come_back_with_their_nest_types_and_bounds(tmp_path):
    import collections

    from tf_agents.specs import tensor_spec
    from tf_agents.trajectories import trajectory

    action = tensor_spec.BoundedTensorSpec([], tf.int64, 0, 3, "action")
    observation = tensor_spec.BoundedTensorSpec([2], tf.float32, [-1.0, -2.0], [1.0, 2.0], "observation")
    scalar = tf.TensorSpec([], tf.float32)
    steps = tf.TensorSpec([], tf.int32, "step_type")
    traj = trajectory.Trajectory(steps, observation, action, (), steps, scalar, scalar)
    point = collections.namedtuple("Point", ["x", "y"])
    spec = {"traj": traj, "point": point(scalar, scalar), "pair": (scalar, [scalar])}
    buffer = tfbuffers.PyUniformReplayBuffer(spec, batch_size=1, max_length=2)
    loaded = tfbuffers.load(buffer.save(tmp_path / "b.safetensors"))
    assert isinstance(loaded.data_spec["traj"], trajectory.Trajectory)  # TF-Agents' own class
    assert loaded.data_spec["traj"] == traj  # bounds included
    assert type(loaded.data_spec["point"]).__name__ == "Point" and loaded.data_spec["point"]._fields == ("x", "y")
    assert isinstance(loaded.data_spec["pair"], tuple) and isinstance(loaded.data_spec["pair"][1], list)
    tf.nest.assert_same_structure(loaded.data_spec, spec)


def test_class_options_travel_in_the_file_and_overrides_win(tmp_path):
    buffer = tfbuffers.TFPrioritizedReplayBuffer(
        stress.SPEC,
        batch_size=2,
        max_length=3,
        priority_exponent=0.25,
        scope="mine",
        dataset_drop_remainder=True,
        dataset_window_shift=2,
        wait_for_writers=False,
    )
    path = buffer.save(tmp_path / "b.safetensors")
    assert files.read_header(path)["options"] == {
        "priority_exponent": 0.25,
        "scope": "mine",
        "device": "cpu:*",
        "dataset_drop_remainder": True,
        "dataset_window_shift": 2,
        "stateful_dataset": False,
        "episode_boundaries": False,
        "wait_for_writers": False,
    }
    loaded = tfbuffers.load(path)
    assert (loaded.priority_exponent, loaded.scope, loaded._dataset_window_shift) == (0.25, "mine", 2)
    assert loaded.constructor_options() == buffer.constructor_options()
    other = tfbuffers.PyPrioritizedReplayBuffer.load(path, max_length=5, seed=3)  # the options it takes
    assert (other.priority_exponent, other.max_length, other._dataset_drop_remainder) == (0.25, 5, True)


def test_a_long_save_shows_progress_and_a_save_that_writers_keep_spoiling_falls_back(tmp_path, capsys, monkeypatch):
    buffer = make("py", batch_size=2, max_length=8)
    fill(buffer, 0, 6)
    buffer.save(tmp_path / "shown.safetensors", progress=True)
    assert "saving shown.safetensors" in capsys.readouterr().err
    tfbuffers.load(tmp_path / "shown.safetensors", progress=True)
    assert "loading shown.safetensors" in capsys.readouterr().err
    buffer.save(tmp_path / "quiet.safetensors", progress=False)
    files.load(tmp_path / "quiet.safetensors", buffer, progress=False)
    tfbuffers.PyUniformReplayBuffer.load(tmp_path / "quiet.safetensors", progress=False)
    assert capsys.readouterr().err == ""

    made = []
    stream = type(buffer).row_source

    def spoiled(self):
        # as if an add overwrote the oldest frame during every attempt
        source = dataclasses.replace(stream(self), intact=lambda: False)
        made.append(source)
        return source

    monkeypatch.setattr(type(buffer), "row_source", spoiled)
    path = buffer.save(tmp_path / "b.safetensors")
    assert len(made) == files.SAVE_ATTEMPTS  # then one in-memory snapshot
    assert_same_state(tfbuffers.PyUniformReplayBuffer.load(path).state(), buffer.state())


def test_version_1_files_still_load_into_a_buffer(tmp_path):
    import safetensors.numpy

    buffer = make("py", batch_size=2, max_length=3)
    fill(buffer, 0, 4)
    state = buffer.state()
    tensors = {"added": np.array([4], np.int64), **{f"field/{p}": a for p, a in state.arrays.items()}}
    header = {
        "format": "tfbuffers.segmented/1",
        "buffer": "PyUniformReplayBuffer",
        "batch_size": "2",
        "max_length": "3",
        "frames": "6",
        "fields": json.dumps(state.describe()["fields"]),
        "metadata": json.dumps({"old": True}),
    }
    path = tmp_path / "v1.safetensors"
    safetensors.numpy.save_file(tensors, path, metadata=header)
    loaded = make("tf", batch_size=2, max_length=3)
    assert files.load(path, loaded) == {"old": True}
    assert_same_state(loaded.state(), state)
    assert files.read_header(path)["version"] == 1
    with pytest.raises(ValueError, match="a format version 1 file holds no data spec"):
        tfbuffers.load(path)


def test_fields_safetensors_cannot_store_are_refused_before_writing(tmp_path):
    buffer = tfbuffers.PyUniformReplayBuffer({"z": tf.TensorSpec([], tf.complex64)}, batch_size=1, max_length=2)
    with pytest.raises(TypeError) as raised:
        buffer.save(tmp_path / "b.safetensors")
    assert str(raised.value) == "z: expected a dtype that safetensors stores (bool, ints, floats), got complex64"
    assert list(tmp_path.iterdir()) == []


LOAD_PEAK = """
import json, sys
import numpy as np, tensorflow as tf, tfbuffers
from tfbuffers import files

kind, path, make = sys.argv[1], sys.argv[2], sys.argv[3] == "make"
spec = {"pixels": tf.TensorSpec([4096], tf.uint8), "reward": tf.TensorSpec([], tf.float32)}
buffer = getattr(tfbuffers, kind)(spec, batch_size=4, max_length=8192)  # 128 MiB of pixels
if make:
    pixels = np.arange(4 * 8192 * 4096, dtype=np.int64).astype(np.uint8).reshape(4, 8192, 4096)
    buffer.extend({"pixels": pixels, "reward": np.arange(4 * 8192, dtype=np.float32).reshape(4, 8192)})
    buffer.save(path, progress=False)
    sys.exit()


def status(key):
    line = next(line for line in open("/proc/self/status") if line.startswith(key + ":"))
    return int(line.split()[1]) * 1024


files.load(path, buffer, progress=False)  # every page of the storage touched (a py buffer's zeros were not)
with open("/proc/self/clear_refs", "w") as clear:
    clear.write("5")  # the high-water mark (VmHWM) reset to the resident memory now
before = status("VmRSS")
files.load(path, buffer, progress=False)
peak = status("VmHWM") - before
_, info = buffer.get_next(8)
print(json.dumps({"peak": peak, "frames": int(buffer.num_frames()), "stored": buffer.nbytes}))
"""


@pytest.mark.parametrize("kind", ["TFUniformReplayBuffer", "TFPrioritizedReplayBuffer", "PyUniformReplayBuffer"])
def test_a_load_into_a_buffer_takes_one_copy_of_its_frames_beside_it(tmp_path, kind):
    """`files.load` reads and verifies the whole file first: one copy of the frames, no more (a second load's peak).

    A TF buffer's restore took two more (the copy converted to tensors, then a variable's worth for each assign):
    4.2x its storage on atari's 1.1 GB (2026-12-03); now it reads the verified copy where it lies.
    """
    path = tmp_path / "buffer.safetensors"

    def run(how):
        done = subprocess.run([sys.executable, "-c", LOAD_PEAK, kind, str(path), how], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    run("make")
    measured = json.loads(run("load").strip().splitlines()[-1])
    assert measured["frames"] == 4 * 8192
    pixels = 4 * 8192 * 4096
    assert measured["stored"] >= pixels
    assert 0.9 * pixels < measured["peak"] < 1.5 * pixels, measured["peak"] / pixels  # the copy, and no more
