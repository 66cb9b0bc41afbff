"""The contract every buffer passes (`tfbuffers.testing.contract`), on every kind the tests register.

The cases are the package's (`tfbuffers.testing.contract.suite`, the same a user runs against a storage or
sampler of their own), parametrized over every kind of `conftest.BUFFER_KINDS` (tfbuffers' own and the storages
and sampler written in conftest.py, each one registry entry), Reverb where dm-reverb imports and Ray, each both
eagerly and with every call inside `tf.function`. The cases the Reverb and Ray buffers do not support are skipped
with the reason (`tfbuffers.testing.contract.remote`). Below them, cases on tfbuffers' own kinds only: storage
bytes, and a `sample_batch_size` known only when the graph runs.
"""

from __future__ import annotations

import re

import conftest
import numpy as np
import pytest
import tensorflow as tf
from conftest import SPEC, assert_whole, batch, fill, make

from tfbuffers.testing.contract import holding, refusing
from tfbuffers.testing.contract.suite import *  # noqa: F403 (the contract's cases, their fixtures, parametrization)

CONTRACT_KINDS = conftest.CONTRACT_KINDS


def test_each_case_reverb_and_ray_skip_is_a_case_of_the_contract():
    cases = {name for module in (holding, refusing) for name in vars(module) if name.startswith("test_")}
    for skips in (conftest.REVERB_SKIPS, conftest.RAY_SKIPS):
        assert set(skips) <= cases
    assert cases - set(conftest.REVERB_SKIPS) >= {"test_bad_dataset_arguments"}  # Reverb runs the rest


# Bytes per frame of SPEC: position f32[2] 8, pixels u8[2, 2] 4, action i32 4, step i64 8.
FRAME_BYTES = 24


@pytest.mark.parametrize("episodes", [False, True], ids=["plain", "episodes"])
@pytest.mark.parametrize("name", ["tf", "py", "tf_prioritized", "py_prioritized"])
def test_nbytes_counts_the_storage(name, episodes):
    buffer = make(name, batch_size=3, max_length=5, **({"episode_boundaries": "step"} if episodes else {}))
    expected = 15 * FRAME_BYTES + 8  # the rows and the int64 add counter
    if episodes:  # an int8 distance per row (and one spare), 17 x 3 float64 sums, an int64 newest end per segment
        expected += 16 + 17 * 3 * 8 + 3 * 8
    if name.endswith("prioritized"):  # float64 priorities, the largest, the sum tree: 2 x 16 nodes of 2 float64
        expected += 15 * 8 + 8 + 2 * 16 * 2 * 8
    assert buffer.nbytes == expected
    fill(buffer, 7)  # allocated at construction: the frames held do not change it
    assert buffer.nbytes == expected
    buffer.close()
    assert buffer.nbytes == 0


# A sample_batch_size known only when the graph runs (issue 29): TF-Agents accepts one inside `tf.function`.

# The episode-aware variant stores step types beside the integer codes (`assert_whole` checks the codes).
EPISODES_SPEC = {**SPEC, "step_type": tf.TensorSpec([], tf.int32)}


def fill_episodes(buffer, num_adds):
    for t in range(num_adds):
        buffer.add_batch({**batch(3, t), "step_type": np.full([3], 1, np.int32)})  # MID: one long episode


DYNAMIC_KINDS = [(name, episodes) for name in conftest.BUFFER_KINDS for episodes in (False, True)]


@pytest.mark.parametrize(("name", "episodes"), DYNAMIC_KINDS, ids=[f"{n}-episodes_{e}" for n, e in DYNAMIC_KINDS])
@pytest.mark.parametrize("dtype", [tf.int32, tf.int64])
def test_a_tensor_sample_batch_size_inside_a_function(name, episodes, dtype):
    if episodes:
        buffer = make(name, spec=EPISODES_SPEC, batch_size=3, max_length=5, episode_boundaries=True)
        fill_episodes(buffer, 4)
    else:
        buffer = make(name, batch_size=3, max_length=5)
        fill(buffer, 4)

    @tf.function(input_signature=[tf.TensorSpec([], dtype)])
    def sample(size):
        windows, info = buffer.get_next(sample_batch_size=size, num_steps=2)
        single, _ = buffer.get_next(sample_batch_size=size)
        return windows, info, single

    for size in (1, 7):
        windows, info, single = sample(tf.constant(size, dtype))
        codes = assert_whole(windows)
        assert codes.shape == (size, 2) and np.all(codes[:, 1] - codes[:, 0] == 1)  # one segment, in order
        assert info.ids.shape == (size, 2) and info.probabilities.shape == (size,)
        assert np.all(info.probabilities.numpy() > 0)
        assert assert_whole(single).shape == (size,)
    graph = sample.get_concrete_function().structured_outputs[0]["step"]
    assert graph.shape.as_list() == [None, 2]  # the batch dimension, unknown until the graph runs
    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape("sample_batch_size: expected a positive int")):
        sample(tf.constant(0, dtype))
    # Refused, the buffer works on.
    buffer.add_batch({**batch(3, 4), "step_type": np.full([3], 1, np.int32)} if episodes else batch(3, 4))
    assert assert_whole(sample(tf.constant(2, dtype))[0]).shape == (2, 2)
    assert int(buffer.num_frames()) == 15


@pytest.mark.parametrize("name", list(conftest.BUFFER_KINDS))
def test_a_tensor_sample_batch_size_of_another_kind_is_refused_when_traced(name):
    buffer = make(name)
    fill(buffer, 2)
    message = "sample_batch_size: expected a positive int or None, got "
    for signature in (tf.TensorSpec([], tf.float32), tf.TensorSpec([2], tf.int64)):
        with pytest.raises(TypeError, match=re.escape(message)):
            tf.function(lambda size: buffer.get_next(sample_batch_size=size), input_signature=[signature])
            tf.function(lambda size: buffer.get_next(sample_batch_size=size)).get_concrete_function(signature)
    assert assert_whole(buffer.get_next(sample_batch_size=2)[0]).shape == (2,)
