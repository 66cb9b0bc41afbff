"""Where TF-Agents 0.19 is wrong and tfbuffers is right, shown on the same adds."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from conftest import SPEC, batch, fill, to_numpy
from tf_agents.replay_buffers import tf_uniform_replay_buffer

import tfbuffers


def test_deterministic_pass_after_wrap_mixes_segments_in_tf_agents_not_here():
    ours = tfbuffers.TFUniformReplayBuffer(SPEC, batch_size=2, max_length=4)
    theirs = tf_uniform_replay_buffer.TFUniformReplayBuffer(SPEC, batch_size=2, max_length=4)
    for t in range(6):
        ours.add_batch(batch(2, t))
        theirs.add_batch(tf.nest.map_structure(tf.constant, batch(2, t)))

    def steps(buffer):
        return [int(items["step"]) for items, _ in buffer.as_dataset(single_deterministic_pass=True)]

    assert steps(ours) == [2, 3, 4, 5, 1002, 1003, 1004, 1005]
    # TF-Agents reads row `segment * max_length + id`, which after wrap-around
    # lands in the next segment (and, for the last one, wraps to the first).
    assert steps(theirs) == [2, 3, 1004, 1005, 1002, 1003, 4, 5]


def test_wrong_batch_size_is_caught_up_front_here():
    ours = tfbuffers.TFUniformReplayBuffer(SPEC, batch_size=3, max_length=4)
    fill(ours, 1)
    with pytest.raises(ValueError, match=r"^action: expected leading batch size 3, got 2 \(shape \(2,\)\)$"):
        ours.add_batch(batch(3, 1) | {"action": np.array([1, 2], np.int32)})
    assert int(ours.num_frames()) == 3
    np.testing.assert_array_equal(to_numpy(ours.gather_all())["step"], [[0], [1000], [2000]])
