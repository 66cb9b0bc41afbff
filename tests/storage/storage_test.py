"""The storage interface: a storage written in a test joins the buffers, and a wrong one is refused."""

from __future__ import annotations

import pathlib
import re
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from conftest import BUFFER_KINDS, SPEC, DictStorage, DictVariables, batch, code, frames, make, make_buffer, underlying

import tfbuffers
from tfbuffers.storage import FrameStackTable, GraphStorage, NumpyTable, Storage, VariableStorage


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


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_the_graph_test_storage_holds_the_rows_of_its_buffer_and_of_one_loaded_from_its_file(tmp_path, mode):
    buffer = make_buffer(f"tf_dict_{mode}", batch_size=2, max_length=3)
    storage = underlying(buffer).storage
    assert type(storage) is DictVariables
    for t in range(4):
        buffer.add_batch(batch(2, t))
    assert int(storage.added.numpy()) == 4
    # add t writes segment s's code 1000 * s + t at row (t % 3) * 2 + s: add 3 overwrote add 0's rows; each
    # field flattened to [rows, elements]: the [2, 2] pixels to 4, the position to the code and its negation
    np.testing.assert_array_equal(storage.rows["step"].numpy()[:, 0], [3, 1003, 1, 1001, 2, 1002])
    assert storage.rows["observation/pixels"].shape.as_list() == [6, 4]
    np.testing.assert_array_equal(storage.rows["observation/position"].numpy()[1], [1003, -1003])
    pixels = underlying(buffer).gather_all()["observation"]["pixels"].numpy()
    np.testing.assert_array_equal(pixels[1, 2], [[250, 250]] * 2)  # segment 1's add 3: 1003 % 251
    loaded = BUFFER_KINDS["tf_dict"].load(underlying(buffer).save(tmp_path / "b.safetensors"))
    assert type(loaded.storage) is DictVariables
    np.testing.assert_array_equal(loaded.storage.rows["step"].numpy(), storage.rows["step"].numpy())
    np.testing.assert_array_equal(loaded.gather_all()["step"].numpy(), [[1, 2, 3], [1001, 1002, 1003]])
    assert [v.name for v in loaded.variables()][-1] == "TFUniformReplayBuffer/added:0"  # rows, then the counter


def test_the_default_storages():
    assert type(make("py").storage) is NumpyTable
    assert type(make("py_frames").storage) is FrameStackTable
    assert type(make("py_prioritized", storage=DictStorage).storage) is DictStorage
    assert type(make("tf").storage) is VariableStorage
    assert type(make("tf_prioritized", storage=DictVariables).storage) is DictVariables


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


def test_a_graph_storage_must_implement_what_graph_storage_requires():
    class Partial(GraphStorage):
        def row_variables(self):
            return []

    with pytest.raises(TypeError, match="abstract method.*read.*write_field"):
        Partial(tfbuffers.specs.flatten_spec(SPEC), 4, "cpu:0")


@pytest.mark.parametrize(
    ("storage", "message"),
    [
        (VariableStorage(tfbuffers.specs.flatten_spec(SPEC), 6, "cpu:0"), r"got VariableStorage <tfbuffers\.storage"),
        (lambda fields, num_rows, device: DictStorage(fields, num_rows), "got a factory that made DictStorage"),
    ],
)
def test_a_wrong_graph_storage_is_refused_naming_it_and_the_next_buffer_is_made(storage, message):
    expected = r"^storage: expected a callable \(fields, num_rows, device\) -> tfbuffers\.storage\.GraphStorage, "
    with pytest.raises(TypeError, match=expected + message):
        tfbuffers.TFUniformReplayBuffer(SPEC, batch_size=2, max_length=3, storage=storage)
    buffer = tfbuffers.TFUniformReplayBuffer(SPEC, batch_size=2, max_length=3, storage=DictVariables)
    buffer.add_batch(batch(2, 5))
    assert buffer.gather_all()["step"].numpy().tolist() == [[5], [1005]]


def test_the_device_is_the_storage_s_and_its_ops_run_there():
    buffer = tfbuffers.TFPrioritizedReplayBuffer(
        SPEC, batch_size=2, max_length=3, device="cpu:0", storage=DictVariables
    )
    assert buffer.device == buffer.storage.device == "cpu:0"
    assert {v.device for v in buffer.variables()} == {"/job:localhost/replica:0/task:0/device:CPU:0"}


def test_frame_stacks_wrap_a_storage_written_in_a_test_file():
    # The storage holds the stacks' handles (int64[depth]); each distinct frame is stored once, beside it.
    spec = {"pixels": tf.TensorSpec([2, 2, 4], tf.uint8), "step": tf.TensorSpec([], tf.int64)}
    stacked = tfbuffers.PyUniformReplayBuffer(
        spec, batch_size=2, max_length=3, seed=4, frame_stacks="pixels", storage=DictStorage
    )
    plain = tfbuffers.PyUniformReplayBuffer(spec, batch_size=2, max_length=3, seed=4)
    assert type(stacked.storage) is FrameStackTable and type(stacked.storage.inner) is DictStorage
    assert stacked.storage.inner.rows["pixels"].shape == (6, 4)
    assert stacked.storage.inner.rows["pixels"].dtype == np.int64
    for t in range(5):  # stack t holds frames t-3..t, each frame all one value; the rings wrap
        frames = np.maximum(np.arange(t - 3, t + 1), 0).astype(np.uint8)
        items = {"pixels": np.broadcast_to(frames, [2, 2, 2, 4]).copy(), "step": np.array([t, 100 + t])}
        stacked.add_batch(items)
        plain.add_batch(items)
    for received, expected in zip(tf.nest.flatten(stacked.gather_all()), tf.nest.flatten(plain.gather_all())):
        np.testing.assert_array_equal(received, expected)
    items, _ = stacked.get_next(sample_batch_size=8, num_steps=2)
    expected, _ = plain.get_next(sample_batch_size=8, num_steps=2)
    np.testing.assert_array_equal(items["pixels"], expected["pixels"])
    # Adds 2, 3, 4 held: frames 0..4, one slot each (a frame of one value, whichever segment and stack hold it).
    assert len(stacked.storage.pools[0]) == 5
    handles = stacked.storage.inner.rows["pixels"]
    np.testing.assert_array_equal(stacked.storage.handles(0), handles)
    frames = stacked.storage.pools[0].gather(handles)[..., 0, 0]  # each frame's one value, by row and position
    np.testing.assert_array_equal(frames, stacked.storage.read_rows(0, 0, 6)[:, 0, 0, :])
    assert sorted(np.unique(frames).tolist()) == [0, 1, 2, 3, 4]


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


@pytest.mark.parametrize("name", ["DictStorage", "DictVariables"])
def test_the_storage_docs_development_md_writes_runs_as_written(name):
    # docs/development.md's storage of each interface, executed from the page: a buffer on it adds and reads back.
    page = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "development.md").read_text()
    (code,) = [block for block in re.findall(r"```python\n(.*?)```", page, re.DOTALL) if f"class {name}(" in block]
    spec = {"x": tf.TensorSpec([2], tf.float32), "step": tf.TensorSpec([], tf.int64)}
    namespace = {"tfbuffers": tfbuffers, "tf": tf, "np": np, "spec": spec}
    exec(compile(textwrap.dedent(code), "docs/development.md", "exec"), namespace)  # noqa: S102
    buffer = namespace["buffer"]
    assert type(buffer.storage).__name__ == name and buffer.capacity == 8000
    buffer.add_batch({"x": np.repeat(np.arange(8, dtype=np.float32)[:, None], 2, axis=1), "step": np.arange(8)})
    items, _ = buffer.get_next(sample_batch_size=3)
    np.testing.assert_array_equal(np.asarray(items["x"])[:, 0], np.asarray(items["step"]))


class KeptDictStorage(DictStorage):
    """A storage that outlives its buffer: its rows, counter and extras in a dict the test keeps (`attach`, `ready`).

    A second buffer on the same dict finds the first one's frames (`Recovery(reopened=True)`), as a reopened
    directory does: the buffer rebuilds its sampler's state (sum tree, record of episode ends) from them.
    """

    def __init__(self, kept: dict, fields, num_rows):
        super().__init__(fields, num_rows)
        self.kept = kept
        if "rows" in kept:
            self.rows, self.added = kept["rows"], kept["added"]

    def attach(self, batch_size, max_length):
        self.kept.setdefault("sizes", (batch_size, max_length))
        assert self.kept["sizes"] == (batch_size, max_length) and not self.extras  # before any extra

    def extra(self, name, initial):
        if name in self.kept.get("extras", {}):
            self.extras[name] = self.kept["extras"][name]
            return self.extras[name]
        return super().extra(name, initial)

    def ready(self, buffer_name, data_spec, options):
        reopened = "rows" in self.kept
        self.kept.update(rows=self.rows, extras=self.extras, buffer=(buffer_name, options()))
        return tfbuffers.storage.Recovery(reopened=reopened)

    def close(self):
        self.kept["added"] = self.added


@pytest.mark.parametrize("options", [{}, {"episode_boundaries": True}], ids=["plain", "episodes"])
def test_a_storage_that_outlives_its_buffer_is_found_again_with_its_priorities(options):
    kept: dict = {}
    spec = {"x": tf.TensorSpec([], tf.int64), "step_type": tf.TensorSpec([], tf.int32)}

    def storage(fields, num_rows):
        return KeptDictStorage(kept, fields, num_rows)

    def make_pair():
        size = {"batch_size": 2, "max_length": 4, "priority_exponent": 0.5, "seed": 0, **options}
        return (
            tfbuffers.PyPrioritizedReplayBuffer(spec, **size, storage=storage),
            tfbuffers.PyPrioritizedReplayBuffer(spec, **size),
        )

    first, in_ram = make_pair()
    for t in range(6):
        frames = {"x": np.array([t, 100 + t]), "step_type": np.full([2], [0, 1, 2][t % 3], np.int32)}
        first.add_batch(frames)
        in_ram.add_batch(frames)
    for buffer in (first, in_ram):
        buffer.update_priorities(np.array([5, 8, 9]), np.array([3.0, 0.0, 2.0]))
    assert kept["buffer"][0] == "PyPrioritizedReplayBuffer"
    first.close()
    again, _ = make_pair()
    assert again.storage.kept is kept and int(again.num_frames()) == 8
    np.testing.assert_array_equal(again.state().extras["priority"], in_ram.state().extras["priority"])
    num_steps = 2 if options else None
    for buffer in (again, in_ram):
        buffer.sampler.priorities.tree()  # the sum trees' ancestors up to date
    np.testing.assert_array_equal(again.sampler.priorities.tree(), in_ram.sampler.priorities.tree())
    _, info = again.get_next(sample_batch_size=64, num_steps=num_steps)
    _, expected = in_ram.get_next(sample_batch_size=64, num_steps=num_steps)
    np.testing.assert_array_equal(info.probabilities, expected.probabilities)
    np.testing.assert_array_equal(info.ids, expected.ids)


def test_a_block_reaches_a_table_whose_arrays_are_not_contiguous_along_their_rows():
    """A storage's strided arrays get every frame of a block.

    `extend` assigns a run's frames through a view of the rows in `[adds, batch_size, ...]`: a split of the row
    axis, a view whatever the rows' stride (no copy that would lose the write).
    """

    class Strided(NumpyTable):
        def _allocate(self, index, field):  # every other row of an array twice as long
            shape = field.spec.shape.as_list()
            return np.zeros((2 * self.num_rows, *shape), field.spec.dtype.as_numpy_dtype)[::2]

    blocks = tfbuffers.PyUniformReplayBuffer(SPEC, batch_size=2, max_length=4, storage=Strided)
    adds = tfbuffers.PyUniformReplayBuffer(SPEC, batch_size=2, max_length=4)
    codes = code(np.arange(2)[:, None], np.arange(6)[None, :])
    blocks.extend(frames(codes))
    for t in range(6):
        adds.add_batch(frames(codes[:, t]))
    expected = adds.gather_all()
    tf.nest.map_structure(np.testing.assert_array_equal, blocks.gather_all(), expected)
    np.testing.assert_array_equal(blocks.gather_all()["step"], codes[:, 2:])
