"""Shared fixtures: every buffer kind behind one factory, and integer-coded frames.

A frame of segment `b` at add `t` carries the code `1000 * b + t` in every field,
so that any returned item can be checked to be whole and to be the right one.
"""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow as tf

import tfbuffers

SPEC = {
    "observation": {
        "position": tf.TensorSpec([2], tf.float32, "position"),
        "pixels": tf.TensorSpec([2, 2], tf.uint8, "pixels"),
    },
    "action": tf.TensorSpec([], tf.int32, "action"),
    "step": tf.TensorSpec([], tf.int64, "step"),
}


def code(segment: Any, step: Any) -> Any:
    return 1000 * np.asarray(segment) + np.asarray(step)


def frames(codes: Any) -> dict[str, Any]:
    """The items whose fields all derive from integer `codes` (any shape)."""
    codes = np.asarray(codes, np.int64)
    return {
        "observation": {
            "position": np.stack([codes, -codes], axis=-1).astype(np.float32),
            "pixels": np.broadcast_to((codes % 251).astype(np.uint8)[..., None, None], codes.shape + (2, 2)).copy(),
        },
        "action": codes.astype(np.int32),
        "step": codes,
    }


def batch(batch_size: int, t: int) -> dict[str, Any]:
    """The `add_batch` argument for add number `t`."""
    return frames(code(np.arange(batch_size), t))


def to_numpy(structure: Any) -> Any:
    return tf.nest.map_structure(lambda x: np.asarray(x) if not isinstance(x, tuple) else x, structure)


def assert_whole(items: Any) -> np.ndarray:
    """Asserts every field of every returned frame derives from one code; returns the codes."""
    items = to_numpy(items)
    codes = items["step"]
    expected = frames(codes)
    for path_items, path_expected in zip(tf.nest.flatten(items), tf.nest.flatten(expected)):
        np.testing.assert_array_equal(path_items, path_expected)
    return codes


class FunctionWrapped:
    """A TF buffer whose methods are all called through `tf.function`."""

    def __init__(self, buffer: tfbuffers.TFUniformReplayBuffer) -> None:
        self.buffer = buffer
        self._add = tf.function(buffer.add_batch)
        self._gather_all = tf.function(buffer.gather_all)
        self._num_frames = tf.function(buffer.num_frames)
        self._clear = tf.function(buffer.clear)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.buffer, name)

    def add_batch(self, items: Any) -> Any:
        return self._add(items)

    def get_next(self, sample_batch_size=None, num_steps=None, time_stacked=True):
        return tf.function(lambda: self.buffer.get_next(sample_batch_size, num_steps, time_stacked), autograph=False)()

    def gather_all(self) -> Any:
        return self._gather_all()

    def num_frames(self) -> Any:
        return self._num_frames()

    def clear(self) -> None:
        self._clear()


KINDS = ["tf_eager", "tf_function", "py"]


def make_buffer(kind: str, batch_size: int = 3, max_length: int = 5, spec: Any = SPEC, **kwargs: Any) -> Any:
    if kind == "py":
        return tfbuffers.PyUniformReplayBuffer(
            spec, batch_size=batch_size, max_length=max_length, seed=kwargs.pop("seed", 0), **kwargs
        )
    buffer = tfbuffers.TFUniformReplayBuffer(spec, batch_size=batch_size, max_length=max_length, **kwargs)
    return FunctionWrapped(buffer) if kind == "tf_function" else buffer


def underlying(buffer: Any) -> tfbuffers.ReplayBuffer:
    return buffer.buffer if isinstance(buffer, FunctionWrapped) else buffer


def fill(buffer: Any, num_adds: int, start: int = 0) -> None:
    for t in range(start, start + num_adds):
        buffer.add_batch(batch(buffer.batch_size, t))


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    tf.random.set_seed(1234)
    return request.param
