"""The abstract base class: hooks are enforced at construction, BufferInfo matches TF-Agents."""

from __future__ import annotations

import re
import sys

import pytest
import tensorflow as tf
from tf_agents.replay_buffers import tf_uniform_replay_buffer

import tfbuffers

SPEC = tf.TensorSpec([], tf.int32)


def test_a_subclass_missing_a_hook_fails_at_construction():
    class Incomplete(tfbuffers.ReplayBuffer):
        def _num_frames(self):
            return 0

    with pytest.raises(TypeError) as raised:
        Incomplete(SPEC, capacity=1)
    # Python words this differently from version to version (3.12 quotes the names): check what it names.
    message = str(raised.value)
    assert message.startswith("Can't instantiate abstract class Incomplete")
    missing = [
        "_add_batch",
        "_add_batch_outer_dims",
        "_as_dataset",
        "_clear",
        "_gather_all",
        "_get_next",
        "_max_num_steps",
        "_single_deterministic_pass_dataset",
    ]
    named = re.findall(r"_[a-z_]+", message.split("abstract method", 1)[1])
    assert named == missing  # every missing hook, and only those (`_num_frames` is implemented)


def test_buffer_info_has_tf_agents_fields():
    assert tfbuffers.BufferInfo._fields == tf_uniform_replay_buffer.BufferInfo._fields == ("ids", "probabilities")


def test_public_names():
    from tfbuffers import (
        frames,
        her,
        manager,
        n_step,
        prioritized,
        py_hashed_replay_buffer,
        py_prioritized_replay_buffer,
        py_uniform_replay_buffer,
        ray_replay_buffer,
        replay_buffer,
        reverb_replay_buffer,
        state,
        tf_prioritized_replay_buffer,
        tf_uniform_replay_buffer,
    )

    assert sorted(tfbuffers.__all__) == [
        "BufferInfo",
        "BufferState",
        "FrameBuffer",
        "PyHashedReplayBuffer",
        "PyPrioritizedReplayBuffer",
        "PyUniformReplayBuffer",
        "RayReplayBuffer",
        "RayWriter",
        "ReplayBuffer",
        "ReplayBufferManager",
        "ReverbReplayBuffer",
        "TFPrioritizedReplayBuffer",
        "TFUniformReplayBuffer",
        "from_config",
        "her_dataset",
        "importance_weights",
        "load",
        "n_step_dataset",
        "n_step_transitions",
        "open",
        "quiet_start_up",
        "relabel_windows",
        "sharded_dataset",
    ]
    # Each name is the object its module defines, not a stand-in.
    assert tfbuffers.BufferInfo is replay_buffer.BufferInfo
    assert tfbuffers.BufferState is state.BufferState
    assert tfbuffers.PyPrioritizedReplayBuffer is py_prioritized_replay_buffer.PyPrioritizedReplayBuffer
    assert tfbuffers.PyUniformReplayBuffer is py_uniform_replay_buffer.PyUniformReplayBuffer
    assert tfbuffers.ReplayBuffer is replay_buffer.ReplayBuffer
    assert tfbuffers.ReverbReplayBuffer is reverb_replay_buffer.ReverbReplayBuffer
    assert tfbuffers.RayReplayBuffer is ray_replay_buffer.RayReplayBuffer
    assert tfbuffers.RayWriter is ray_replay_buffer.RayWriter
    assert tfbuffers.ReplayBufferManager is manager.ReplayBufferManager
    assert tfbuffers.TFPrioritizedReplayBuffer is tf_prioritized_replay_buffer.TFPrioritizedReplayBuffer
    assert tfbuffers.importance_weights is prioritized.importance_weights
    assert tfbuffers.TFUniformReplayBuffer is tf_uniform_replay_buffer.TFUniformReplayBuffer
    assert tfbuffers.sharded_dataset is reverb_replay_buffer.sharded_dataset
    assert tfbuffers.FrameBuffer is frames.FrameBuffer
    assert tfbuffers.PyHashedReplayBuffer is py_hashed_replay_buffer.PyHashedReplayBuffer
    assert tfbuffers.n_step_dataset is n_step.n_step_dataset
    assert tfbuffers.n_step_transitions is n_step.n_step_transitions
    assert tfbuffers.her_dataset is her.her_dataset
    assert tfbuffers.relabel_windows is her.relabel_windows
    # The functions of its own: they build a local buffer of the class a file, directory or config names.
    assert tfbuffers.load.__module__ == tfbuffers.open.__module__ == tfbuffers.from_config.__module__ == "tfbuffers"
    # And the one call that changes the process, when made: the start-up notices kept off
    # (tests/project/hygiene_test.py).
    assert tfbuffers.quiet_start_up.__module__ == "tfbuffers._noise"


def test_the_reverb_buffer_without_dm_reverb_says_how_to_get_it(monkeypatch):
    # Importing tfbuffers never needs dm-reverb; constructing its Reverb buffer does, and says so.
    monkeypatch.setitem(sys.modules, "reverb", None)  # what a stack without dm-reverb sees
    with pytest.raises(ImportError, match=r"ReverbReplayBuffer needs dm-reverb, .* installs on Python 3.11"):
        tfbuffers.ReverbReplayBuffer({"x": tf.TensorSpec([], tf.int64)})


def test_the_ray_buffer_without_ray_says_how_to_get_it(monkeypatch):
    # Importing tfbuffers never needs Ray; constructing its Ray buffer does, and says so.
    monkeypatch.setitem(sys.modules, "ray", None)  # what an install without the ray extra sees
    with pytest.raises(ImportError, match=r"RayReplayBuffer needs Ray, .* pip install 'tfbuffers\[ray\]'"):
        tfbuffers.RayReplayBuffer({"x": tf.TensorSpec([], tf.int64)}, capacity=4)
