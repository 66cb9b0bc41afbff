"""The storage interface: a storage written in a test joins the buffers, and a wrong one is refused."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from conftest import BUFFER_KINDS, SPEC, DictStorage, batch, make

import tfbuffers
from tfbuffers.storage import FrameStackTable, NumpyTable, Storage


def test_the_test_storage_holds_the_rows_of_its_buffer_and_of_one_loaded_from_its_file(tmp_path):
    buffer = make("py_dict", batch_size=2, max_length=3)
    assert type(buffer.storage) is DictStorage
    for t in range(4):
        buffer.add_batch(batch(2, t))
    assert buffer.storage.added == 4
    # add t writes segment s's code 1000 * s + t at row (t % 3) * 2 + s: add 3 overwrote add 0's rows
    np.testing.assert_array_equal(buffer.storage.rows["step"], [3, 1003, 1, 1001, 2, 1002])
    loaded = BUFFER_KINDS["py_dict"].load(buffer.save(tmp_path / "b.safetensors"))
    assert type(loaded.storage) is DictStorage
    np.testing.assert_array_equal(loaded.storage.rows["step"], buffer.storage.rows["step"])


def test_the_default_storages():
    assert type(make("py").storage) is NumpyTable
    assert type(make("py_frames").storage) is FrameStackTable
    assert type(make("py_prioritized", storage=DictStorage).storage) is DictStorage


def test_a_storage_must_implement_what_storage_requires():
    class Partial(Storage):
        def write_rows(self, index, first_row, rows):
            pass

    with pytest.raises(TypeError, match="abstract method"):
        Partial(tfbuffers.specs.flatten_spec(SPEC), 4)


@pytest.mark.parametrize(
    ("storage", "error", "message"),
    [
        ("numpy", TypeError, r"storage: expected a callable \(fields, num_rows\) -> .*Storage, got str 'numpy'"),
        (lambda fields, rows: {}, TypeError, "storage: expected a callable .*, got a factory that made dict"),
    ],
)
def test_a_wrong_storage_is_refused_naming_it(storage, error, message):
    with pytest.raises(error, match=message):
        tfbuffers.PyUniformReplayBuffer(SPEC, batch_size=2, max_length=3, storage=storage)


def test_a_storage_with_frame_stacks_is_refused():
    spec = {"pixels": tf.TensorSpec([2, 2, 4], tf.uint8)}
    with pytest.raises(ValueError, match="storage: expected None with frame_stacks"):
        tfbuffers.PyUniformReplayBuffer(spec, batch_size=1, max_length=3, frame_stacks="pixels", storage=DictStorage)


@pytest.mark.parametrize("name", ["py_prioritized", "py_dict", "tf_prioritized"])
def test_a_buffer_keeps_its_priorities_and_record_of_episode_ends_in_its_storage(name):
    options = {"priority_exponent": 1.0} if "prioritized" in name else {}
    buffer = make(name, batch_size=2, max_length=3, episode_boundaries="step", **options)
    extras = buffer.storage.extras
    episode_extras = ["episodes/distance", "episodes/near", "episodes/last_end"]
    prioritized = ["priority", "max_priority", "sum_tree"] if buffer.prioritized else []
    assert sorted(extras) == sorted(episode_extras + prioritized)
    for t in range(4):
        buffer.add_batch(batch(2, t))  # step 2 (LAST) ends segment 0's episode at add 2
    if buffer.prioritized:
        buffer.update_priorities(np.array([6, 7]), np.array([3.0, 0.5]))
    value = {key: np.asarray(extras[key]) for key in extras}
    assert value["episodes/last_end"].tolist() == [2, -1]
    if buffer.prioritized:
        # add 3 wrote rows 0-1 (ids 6, 7); the max priority is the largest given
        np.testing.assert_array_equal(value["priority"][:2], [3.0, 0.5])
        assert float(value["max_priority"]) == 3.0
        np.testing.assert_array_equal(buffer.state().extras["priority"], value["priority"])
    buffer.clear()
    assert np.asarray(extras["episodes/last_end"]).tolist() == [-1, -1]


def test_the_tf_buffers_variables_are_their_storages_in_the_order_made():
    spec = {"x": tf.TensorSpec([], tf.int64), "step_type": tf.TensorSpec([], tf.int32)}
    buffer = tfbuffers.TFPrioritizedReplayBuffer(spec, 2, 3, scope="rb", episode_boundaries=True)
    assert [v.name for v in buffer.variables()] == [
        "rb/step_type:0",
        "rb/x:0",
        "rb/added:0",
        "rb/episodes/distance:0",
        "rb/episodes/near:0",
        "rb/episodes/last_end:0",
        "rb/priority:0",
        "rb/max_priority:0",
        "rb/sum_tree:0",
    ]
    # rows 6 * (8 + 4), counter 8, distance 7 * 1, near 17 * 3 * 8, last_end 2 * 8, priority 6 * 8, max 8,
    # sum tree 2 * 8 leaves * 2 * 8
    assert buffer.nbytes == 72 + 8 + 7 + 408 + 16 + 48 + 8 + 256
    buffer.close()
    assert buffer.variables() == ()
