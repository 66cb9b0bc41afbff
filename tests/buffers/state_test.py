"""`tfbuffers.state`: states and checkpoints match fields by name and refuse what does not fit."""

from __future__ import annotations

import collections
import dataclasses

import conftest
import numpy as np
import pytest
import tensorflow as tf

from tfbuffers import state

KINDS = list(conftest.BUFFER_KINDS)
AB = {"a": tf.TensorSpec([], tf.int64), "b": tf.TensorSpec([2], tf.float32)}
BC = {"b": tf.TensorSpec([2], tf.float32), "c": tf.TensorSpec([], tf.int64)}


def make(kind, spec, batch_size=2, max_length=3):
    return conftest.make(kind, spec, batch_size, max_length)


def add_ab(buffer, t):
    buffer.add_batch({"a": np.array([t, 100 + t]), "b": np.full([2, 2], t, np.float32)})


def contents(buffer):
    return tf.nest.map_structure(np.asarray, buffer.gather_all())


@pytest.mark.parametrize(("source", "target"), conftest.RESTORABLE)
def test_a_checkpoint_restores_by_field_path_into_any_kind(tmp_path, source, target):
    buffer = make(source, AB)
    for t in range(4):
        add_ab(buffer, t)
    path = tf.train.Checkpoint(buffer=buffer).save(str(tmp_path / "ckpt"))
    # The same fields in another order of declaration: matched by path, not position.
    restored = make(target, {"b": AB["b"], "a": AB["a"]})
    tf.train.Checkpoint(buffer=restored).restore(path).assert_consumed()
    np.testing.assert_array_equal(contents(restored)["a"], [[1, 2, 3], [101, 102, 103]])
    np.testing.assert_array_equal(contents(restored)["b"][:, :, 0], [[1, 2, 3], [1, 2, 3]])
    ids = restored.add_batch({"a": np.array([4, 104]), "b": np.zeros([2, 2], np.float32)})
    assert np.asarray(ids).tolist() == [8, 9]


@pytest.mark.parametrize(("source", "target"), conftest.UNRESTORABLE)
def test_a_state_of_another_format_is_refused_and_changes_nothing(tmp_path, source, target):
    # A uniform buffer's state has no priorities to restore; a prioritized one's priorities have nowhere to go.
    buffer = make(source, AB)
    add_ab(buffer, 1)
    restored = make(target, AB)
    add_ab(restored, 5)
    name = type(restored).__name__
    expected = (
        f"format: holds {conftest.BUFFER_KINDS[source].state_format}, "
        f"this {name} stores {conftest.BUFFER_KINDS[target].state_format}"
    )
    with pytest.raises(ValueError) as raised:
        restored.restore_state(buffer.state())
    assert str(raised.value) == f"state: {expected}"
    path = tf.train.Checkpoint(buffer=buffer).save(str(tmp_path / "ckpt"))
    with pytest.raises((ValueError, tf.errors.NotFoundError)) as raised:
        tf.train.Checkpoint(buffer=restored).restore(path)
    # The prioritized checkpoint's own keys are missing from a uniform one: TensorFlow says so first.
    assert expected in str(raised.value) or "extra:priority not found in checkpoint" in str(raised.value)
    np.testing.assert_array_equal(contents(restored)["a"], [[5], [105]])
    add_ab(restored, 6)
    np.testing.assert_array_equal(contents(restored)["a"], [[5, 6], [105, 106]])


@pytest.mark.parametrize("kind", KINDS)
def test_a_checkpoint_with_other_fields_is_refused_and_changes_nothing(tmp_path, kind):
    # Issue 11, bug 4: {a, b} restored into {b, c} put a's data in b and b's in c.
    buffer = make(kind, AB)
    add_ab(buffer, 7)
    path = tf.train.Checkpoint(buffer=buffer).save(str(tmp_path / "ckpt"))
    other = make(kind, BC)
    other.add_batch({"b": np.ones([2, 2], np.float32), "c": np.array([5, 6])})
    with pytest.raises(tf.errors.NotFoundError, match="field:c not found in checkpoint"):
        tf.train.Checkpoint(buffer=other).restore(path)
    np.testing.assert_array_equal(contents(other)["c"], [[5], [6]])
    # Same paths, another dtype: TensorFlow's restore refuses it, naming the key and both dtypes.
    retyped = make(kind, {"a": tf.TensorSpec([], tf.int64), "b": tf.TensorSpec([2], tf.float64)})
    with pytest.raises(
        tf.errors.InvalidArgumentError, match="field:b; expected dtype double does not equal original dtype float"
    ):
        tf.train.Checkpoint(buffer=retyped).restore(path)
    assert len(retyped) == 0


@pytest.mark.parametrize("kind", KINDS)
def test_a_checkpoint_of_another_layout_is_refused(tmp_path, kind):
    buffer = make(kind, AB, batch_size=2, max_length=3)
    add_ab(buffer, 1)
    path = tf.train.Checkpoint(buffer=buffer).save(str(tmp_path / "ckpt"))
    other = make(kind, AB, batch_size=2, max_length=4)
    name = type(other).__name__
    with pytest.raises(ValueError) as raised:
        tf.train.Checkpoint(buffer=other).restore(path)
    assert str(raised.value) == f"checkpoint: max_length: holds 3, this {name} expects 4"
    assert len(other) == 0


@pytest.mark.parametrize("kind", KINDS)
def test_a_checkpoint_without_the_buffer_state_is_reported(tmp_path, kind):
    # A TF-Agents buffer's checkpoint (or any other object's) holds no tfbuffers state:
    # TensorFlow restores nothing, and the restore status says so.
    from tf_agents.replay_buffers import tf_uniform_replay_buffer

    foreign = tf_uniform_replay_buffer.TFUniformReplayBuffer(AB, batch_size=2, max_length=3)
    path = tf.train.Checkpoint(buffer=foreign).save(str(tmp_path / "ckpt"))
    buffer = make(kind, AB)
    status = tf.train.Checkpoint(buffer=buffer).restore(path)
    with pytest.raises(AssertionError, match=rf"unmatched objects: \[StateCheckpoint\({type(buffer).__name__}\)\]"):
        status.assert_existing_objects_matched()


@pytest.mark.parametrize("kind", KINDS)
def test_restore_state_refuses_other_fields_by_name(kind):
    buffer = make(kind, AB)
    add_ab(buffer, 3)
    other = make(kind, BC)
    name = type(other).__name__
    with pytest.raises(ValueError) as raised:
        other.restore_state(buffer.state())
    assert str(raised.value) == (
        f"state: fields: a is not in this {name}; c is missing; "
        "a field is restored only into the field of the same nest path"
    )
    wrong_shape = state.BufferState(
        **{**buffer.state().__dict__, "arrays": {"a": np.zeros([5]), "b": np.zeros([6, 2])}}
    )
    with pytest.raises(ValueError, match=r"^state: a: holds shape \(5,\) float64, this .* stores \(6,\) int64$"):
        buffer.restore_state(wrong_shape)
    np.testing.assert_array_equal(contents(buffer)["a"], [[3], [103]])


Pair = collections.namedtuple("Pair", ["observation", "policy_info"])


@pytest.mark.parametrize("kind", KINDS)
def test_a_module_holding_a_buffer_saves_as_a_saved_model(tmp_path, kind):
    # Issue 11, bug 6: the py buffer's checkpoint hook failed inside SavedModel's tracing.
    module = tf.Module()
    module.buffer = make(kind, AB)
    add_ab(module.buffer, 2)
    tf.saved_model.save(module, str(tmp_path / "saved"))
    assert (tmp_path / "saved" / "saved_model.pb").is_file()
    np.testing.assert_array_equal(contents(module.buffer)["a"], [[2], [102]])  # saving changed nothing


@pytest.mark.parametrize("kind", KINDS)
def test_specs_wrapped_by_tf_module_are_accepted(kind):
    # Issue 11, bug 5: PPOAgent.collect_data_spec is a namedtuple of dicts that tf.Module wraps.
    holder = tf.Module()
    holder.spec = Pair(
        observation={"x": tf.TensorSpec([2], tf.float32)},
        policy_info={"logits": [tf.TensorSpec([3], tf.float32)]},
    )
    wrapped = holder.spec
    assert type(wrapped).__name__ == "_TupleWrapper"
    buffer = make(kind, wrapped)
    assert type(buffer.data_spec) is Pair and type(buffer.data_spec.policy_info["logits"]) is list
    items = Pair({"x": np.ones([2, 2], np.float32)}, {"logits": [np.zeros([2, 3], np.float32)]})
    buffer.add_batch(items)
    sample, _ = buffer.get_next(sample_batch_size=3)
    assert type(sample) is Pair
    np.testing.assert_array_equal(np.asarray(sample.observation["x"]), np.ones([3, 2]))
    elements = next(iter(buffer.as_dataset(sample_batch_size=2)))[0]
    assert type(elements) is Pair and isinstance(elements.policy_info["logits"], tuple)


def test_large_aligned_arrays_reach_a_restore_without_a_copy_and_others_are_converted():
    from tfbuffers.execution._states import SHARED_BYTES, shared_tensor
    from tfbuffers.files import aligned_zeros

    large = aligned_zeros((SHARED_BYTES // 4,), np.float32)
    assert large.ctypes.data % 64 == 0 and large.nbytes == SHARED_BYTES
    large[:3] = [1.0, 2.0, 3.0]
    shared = shared_tensor(large)
    large[0] = 7.0  # the tensor reads the array's memory
    assert shared.dtype == tf.float32 and shared[:3].numpy().tolist() == [7.0, 2.0, 3.0]
    unaligned = np.frombuffer(aligned_zeros((SHARED_BYTES + 4,), np.uint8), np.float32, offset=4)
    for value in (np.arange(6, dtype=np.float32), unaligned, large[::2]):
        first = value.flat[0]
        converted = shared_tensor(value)  # small, not 64-byte aligned, strided
        value.flat[0] = 9
        assert tuple(converted.shape) == value.shape and converted.numpy().flat[0] == first
    flags = aligned_zeros((SHARED_BYTES,), bool)
    flags[1::3] = True
    as_tensor = shared_tensor(flags)  # shared on numpy 2, converted on 1.26 (which cannot export bool)
    assert as_tensor.dtype == tf.bool and np.array_equal(as_tensor.numpy(), flags)


@pytest.mark.parametrize("kind", ["tf", "tf_prioritized", "tf_dict"])
def test_a_restore_from_arrays_its_graph_reads_in_place_copies_them(kind):
    """A TF buffer restored from large aligned arrays holds their values; later changes to them do not reach it."""
    from tfbuffers.files import aligned_zeros

    spec = {"pixels": tf.TensorSpec([4096], tf.uint8), "reward": tf.TensorSpec([], tf.float32)}
    source, target = make(kind, spec, batch_size=2, max_length=256), make(kind, spec, batch_size=2, max_length=256)
    for t in range(300):  # wrapped
        source.add_batch({"pixels": np.full([2, 4096], t % 251, np.uint8), "reward": np.array([t, -t], np.float32)})
    saved = source.state()
    arrays = {}
    for name, array in saved.arrays.items():
        arrays[name] = aligned_zeros(array.shape, array.dtype)
        arrays[name][...] = array
    assert arrays["pixels"].nbytes == 2 * 1024 * 1024  # large enough to be shared
    target.restore_state(dataclasses.replace(saved, arrays=arrays))
    expected = contents(source)
    arrays["pixels"][...] = 255
    arrays["reward"][...] = -1.0
    after = contents(target)
    np.testing.assert_array_equal(after["pixels"], expected["pixels"])
    np.testing.assert_array_equal(after["reward"], expected["reward"])
    target.add_batch({"pixels": np.zeros([2, 4096], np.uint8), "reward": np.zeros([2], np.float32)})  # it goes on
    assert int(target.num_frames()) == 2 * 256
