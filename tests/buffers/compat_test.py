"""Files, checkpoints and directories written before a redesign load and restore exactly.

`tests/data/before_storage_seam/` holds buffers' files and `tf.train.Checkpoint`s written by commit 753026e,
the code before the storage seam (issue 30); `tests/data/before_composition/` the same written by commit
cbb61de, before storages, samplers and remote buffers became parts (issue 49), and memory-mapped directories
and a Ray buffer's save and directories beside them. Each folder's `make.py` says how, and which adds they
hold. Each is read by today's code into the buffer it was, and again into a fresh buffer of the same
configuration, and must hold the very frames, counter and priorities written, sample exactly as before, and go
on adding.
"""

from __future__ import annotations

import pathlib
import shutil

import numpy as np
import pytest
import tensorflow as tf

import tfbuffers

FOLDERS = {  # the redesign a folder's files were written before: its files
    "storage_seam": pathlib.Path(__file__).parents[1] / "data" / "before_storage_seam",
    "composition": pathlib.Path(__file__).parents[1] / "data" / "before_composition",
}
SPEC = {
    "obs": tf.TensorSpec([2], tf.float32),
    "action": tf.TensorSpec([], tf.int64),
    "step_type": tf.TensorSpec([], tf.int32),
}
STACK_SPEC = {"pixels": tf.TensorSpec([2, 2, 4], tf.uint8), "step_type": tf.TensorSpec([], tf.int32)}
SIZE = {"batch_size": 2, "max_length": 3}
# Each fixture's class, its constructor's options beyond the sizes, and its data spec.
FIXTURES = {
    "py_uniform": (tfbuffers.PyUniformReplayBuffer, {"seed": 0}, SPEC),
    "py_episodes": (tfbuffers.PyUniformReplayBuffer, {"seed": 0, "episode_boundaries": True}, SPEC),
    "py_prioritized": (tfbuffers.PyPrioritizedReplayBuffer, {"seed": 0}, SPEC),
    "py_frame_stacks": (tfbuffers.PyUniformReplayBuffer, {"seed": 0, "frame_stacks": "pixels"}, STACK_SPEC),
    "tf_uniform": (tfbuffers.TFUniformReplayBuffer, {}, SPEC),
    "tf_episodes": (tfbuffers.TFUniformReplayBuffer, {"episode_boundaries": True}, SPEC),
    "tf_prioritized": (tfbuffers.TFPrioritizedReplayBuffer, {}, SPEC),
}
# The stored adds (of 5 into segments of 3 frames) and the priorities `make.py` set.
STORED_ADDS = [2, 3, 4]
SET_PRIORITIES = {4: 0.5, 7: 2.0, 9: 3.0}


def expected_contents(name):
    """`gather_all()` of a fixture, from the rule `make.py` wrote its adds by: `[2 segments, 3 frames, ...]`."""
    t = np.array(STORED_ADDS)
    segments = np.arange(2)[:, None]
    step_types = np.broadcast_to(t % 3, [2, 3]).astype(np.int32)
    if name == "py_frame_stacks":
        depth = np.maximum(t[:, None] - 3 + np.arange(4), 0).astype(np.uint8)  # [3 frames, 4]
        return {"pixels": np.broadcast_to(depth[None, :, None, None, :], [2, 3, 2, 2, 4]), "step_type": step_types}
    obs = np.stack([t + segments / 10, np.broadcast_to(-t, [2, 3])], axis=-1).astype(np.float32)
    return {"obs": obs, "action": 100 * t + segments, "step_type": step_types}


def contents(buffer):
    return tf.nest.map_structure(np.asarray, buffer.gather_all())


def assert_holds_the_fixture(buffer, name):
    buffer_class, options, _ = FIXTURES[name]
    assert type(buffer) is buffer_class
    assert buffer.batch_size == 2 and buffer.max_length == 3
    recorded = {option: value for option, value in options.items() if option != "seed"}  # files keep no seed
    assert {option: getattr(buffer, option) for option in recorded} == recorded
    assert int(buffer.num_frames()) == 6
    expected = expected_contents(name)
    received = contents(buffer)
    assert sorted(received) == sorted(expected)
    for path, values in expected.items():
        np.testing.assert_array_equal(received[path], values, err_msg=path)
        assert received[path].dtype == values.dtype, path
    if buffer.prioritized:
        weights = {i: SET_PRIORITIES.get(i, 1.0) ** buffer.priority_exponent for i in range(4, 10)}
        _, info = buffer.get_next(sample_batch_size=64)
        ids = np.asarray(info.ids)
        assert set(ids.tolist()) <= set(weights)
        np.testing.assert_allclose(
            np.asarray(info.probabilities), [weights[i] / sum(weights.values()) for i in ids.tolist()], rtol=1e-6
        )


def windows_of_two(buffer):
    """Every id a `get_next(num_steps=2)` may start at, and the probability it gives each."""
    _, info = buffer.get_next(sample_batch_size=64, num_steps=2)
    firsts = np.asarray(info.ids)[:, 0]
    return sorted(set(firsts.tolist())), sorted(set(np.round(np.asarray(info.probabilities), 9).tolist()))


def assert_goes_on(buffer, name):
    """The adds and samples of the code that wrote the fixture: windows, probabilities, the next ids."""
    if not buffer.prioritized:
        if name.endswith("episodes"):  # adds 2, 3, 4 are LAST, FIRST, MID: only windows from add 3
            assert windows_of_two(buffer) == ([6, 7], [0.5])
        else:
            assert windows_of_two(buffer) == ([4, 5, 6, 7], [0.25])
    frame = {path: values[:, -1] for path, values in expected_contents(name).items()}
    assert np.asarray(buffer.add_batch(frame)).tolist() == [10, 11]
    assert int(buffer.num_frames()) == 6
    buffer.clear()
    assert int(buffer.num_frames()) == 0


def fresh(name):
    buffer_class, options, spec = FIXTURES[name]
    return buffer_class(spec, **SIZE, **options)


# The files and checkpoints of before_composition are today's format until issue 49's changes land: `make test` reads
# them, the fast subset the older ones only (the same loaders), to keep within its 90 s.
EACH = pytest.mark.parametrize(
    ("folder", "name"),
    [
        pytest.param(folder, name, marks=[pytest.mark.slow] if folder == "composition" else [])
        for folder in FOLDERS
        for name in FIXTURES
    ],
)
# The memory-mapped directories of tests/data/before_composition: their kind's fixture.
DIRECTORIES = {
    "py_uniform_memmap": "py_uniform",
    "py_episodes_memmap": "py_episodes",
    "py_prioritized_memmap": "py_prioritized",
    "py_frame_stacks_memmap": "py_frame_stacks",  # stacks stored whole (header version 1): opened as they are
}


@EACH
def test_a_file_written_before_a_redesign_loads_into_the_buffer_it_was(folder, name):
    buffer = tfbuffers.load(FOLDERS[folder] / f"{name}.tfb", progress=False)
    assert_holds_the_fixture(buffer, name)
    assert_goes_on(buffer, name)


@EACH
def test_a_file_written_before_a_redesign_loads_through_its_class(folder, name):
    buffer = FIXTURES[name][0].load(FOLDERS[folder] / f"{name}.tfb", progress=False)
    assert_holds_the_fixture(buffer, name)


@EACH
def test_a_checkpoint_written_before_a_redesign_restores(folder, name):
    buffer = fresh(name)
    tf.train.Checkpoint(buffer=buffer).read(str(FOLDERS[folder] / f"{name}.ckpt")).assert_consumed()
    assert_holds_the_fixture(buffer, name)
    assert_goes_on(buffer, name)


@pytest.mark.parametrize("directory", sorted(DIRECTORIES))
def test_a_memory_mapped_directory_written_before_the_composition_reopens(directory, tmp_path):
    copy = shutil.copytree(FOLDERS["composition"] / directory, tmp_path / directory)  # reopened for writing
    buffer = tfbuffers.open(copy, seed=0)
    assert buffer.directory == copy
    assert_holds_the_fixture(buffer, DIRECTORIES[directory])
    assert_goes_on(buffer, DIRECTORIES[directory])
    buffer.close()


@pytest.mark.ray
def test_a_ray_buffer_saved_or_mapped_before_the_composition_loads_and_reopens(tmp_path):
    expected = expected_contents("py_uniform")
    saved = tfbuffers.RayReplayBuffer.load(FOLDERS["composition"] / "ray_saved", seed=0)
    mapped = shutil.copytree(FOLDERS["composition"] / "ray_memmap", tmp_path / "ray_memmap")
    reopened = tfbuffers.RayReplayBuffer.open(mapped, seed=0)
    try:
        assert (saved.sampler, reopened.sampler) == ("prioritized", "uniform")
        for buffer in (saved, reopened):
            assert (buffer.batch_size, buffer.max_length, int(buffer.num_frames())) == (2, 3, 6)
            received = contents(buffer)
            for path, values in expected.items():
                np.testing.assert_array_equal(received[path], values, err_msg=path)
                assert received[path].dtype == values.dtype, path
        weights = {i: SET_PRIORITIES.get(i, 1.0) ** 0.6 for i in range(4, 10)}  # its manifest's priority_exponent
        _, info = saved.get_next(sample_batch_size=64)
        ids = np.asarray(info.ids).tolist()
        assert set(ids) <= set(weights)
        total = sum(weights.values())  # a segment by its windows' weight, then a window in it: the local buffer's
        np.testing.assert_allclose(np.asarray(info.probabilities), [weights[i] / total for i in ids], rtol=1e-6)
    finally:
        saved.close()
        reopened.close()


def test_the_fixtures_are_those_make_py_writes():
    # Every kind that each make.py writes is read here: file and checkpoint, and the directories.
    for folder, data in FOLDERS.items():
        written = {path.name.split(".")[0] for path in data.iterdir() if path.suffix in (".tfb", ".index")}
        assert written == set(FIXTURES), folder
    directories = {path.name for path in FOLDERS["composition"].iterdir() if path.is_dir()}
    assert directories == {*DIRECTORIES, "ray_saved", "ray_memmap"}
