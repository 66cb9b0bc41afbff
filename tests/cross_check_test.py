"""The TF and numpy buffers agree exactly on the same adds."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from conftest import SPEC, fill, to_numpy

import tfbuffers


def pair(**kwargs):
    return (
        tfbuffers.TFUniformReplayBuffer(SPEC, **kwargs),
        tfbuffers.PyUniformReplayBuffer(SPEC, **kwargs),
    )


def assert_same(a, b):
    for x, y in zip(tf.nest.flatten(to_numpy(a)), tf.nest.flatten(to_numpy(b))):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("num_adds", [0, 1, 4, 5, 6, 13])
def test_gather_all_and_num_frames_agree(num_adds):
    tf_buffer, py_buffer = pair(batch_size=3, max_length=5)
    fill(tf_buffer, num_adds)
    fill(py_buffer, num_adds)
    assert int(tf_buffer.num_frames()) == int(py_buffer.num_frames())
    assert_same(tf_buffer.gather_all(), py_buffer.gather_all())


@pytest.mark.parametrize("sample_batch_size", [None, 2, 4])
@pytest.mark.parametrize("num_steps", [None, 1, 3])
@pytest.mark.parametrize("window_shift", [None, 1, 2])
@pytest.mark.parametrize("drop_remainder", [False, True])
def test_deterministic_passes_agree(sample_batch_size, num_steps, window_shift, drop_remainder):
    tf_buffer, py_buffer = pair(
        batch_size=3, max_length=5, dataset_window_shift=window_shift, dataset_drop_remainder=drop_remainder
    )
    fill(tf_buffer, 7)
    fill(py_buffer, 7)
    kwargs = {"sample_batch_size": sample_batch_size, "num_steps": num_steps, "single_deterministic_pass": True}
    if drop_remainder and sample_batch_size == 4:
        for buffer in (tf_buffer, py_buffer):
            with pytest.raises(ValueError, match="ALL data will be dropped"):
                buffer.as_dataset(**kwargs)
        return
    tf_elements = list(tf_buffer.as_dataset(**kwargs))
    py_elements = list(py_buffer.as_dataset(**kwargs))
    assert len(tf_elements) == len(py_elements) > 0
    for (tf_items, tf_info), (py_items, py_info) in zip(tf_elements, py_elements):
        assert_same(tf_items, py_items)
        np.testing.assert_array_equal(tf_info.ids.numpy(), py_info.ids.numpy())
    if window_shift is None and not drop_remainder:
        ids = np.sort(np.concatenate([info.ids.numpy().ravel() for _, info in tf_elements]))
        np.testing.assert_array_equal(ids, np.arange(2 * 3, 7 * 3))


@pytest.mark.parametrize("num_steps", [None, 2, 3])
def test_prioritized_buffers_agree_on_priorities_and_probabilities(num_steps):
    tf.random.set_seed(7)
    options = dict(batch_size=3, max_length=5, priority_exponent=0.7)
    tf_buffer = tfbuffers.TFPrioritizedReplayBuffer(SPEC, **options)
    py_buffer = tfbuffers.PyPrioritizedReplayBuffer(SPEC, seed=7, **options)
    rng = np.random.default_rng(7)
    for buffer in (tf_buffer, py_buffer):
        fill(buffer, 7)  # adds 2..6 stored: ids 6..20
    ids = np.arange(0, 21)  # 0..5 were overwritten: skipped by both
    priorities = rng.choice([0.0, 0.5, 2.0, 9.0], size=ids.size)
    assert int(tf_buffer.update_priorities(ids, priorities)) == int(py_buffer.update_priorities(ids, priorities)) == 6
    for buffer in (tf_buffer, py_buffer):
        fill(buffer, 1, start=7)  # new frames: the largest priority, 9.0
    tf_state, py_state = tf_buffer.state(), py_buffer.state()
    for name in tf_state.extras:
        np.testing.assert_array_equal(tf_state.extras[name], py_state.extras[name])
    drawn = []
    for buffer in (tf_buffer, py_buffer):
        _, info = buffer.get_next(sample_batch_size=3000, num_steps=num_steps)
        first = np.asarray(info.ids) if num_steps is None else np.asarray(info.ids)[:, 0]
        drawn.append(dict(zip(first.tolist(), np.asarray(info.probabilities).tolist())))
    # The same windows can be drawn, each with the same probability (the TF buffer's adds add their change to
    # the tree's sums, the py buffer's recompute them: equal up to float64 rounding).
    assert sorted(drawn[0]) == sorted(drawn[1])
    np.testing.assert_allclose(
        [drawn[0][i] for i in sorted(drawn[0])], [drawn[1][i] for i in sorted(drawn[1])], rtol=1e-6
    )
