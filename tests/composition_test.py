"""Every sampler on every storage, in both execution modes: the parts compose, whichever are put together.

The contract suite runs each part against the buffer's default others (a storage written in conftest.py with the
uniform sampler, the stateful sampler written there on the default storage). Here one case crosses them: the
samplers (uniform, the stateful `KeptAddsUniform` written in conftest.py, prioritized) × the storages of each
execution mode (host: numpy arrays, `DictStorage` written in conftest.py, memory-mapped files, and frame
stacks wrapping each of the three; graph: variables, `DictVariables` written in conftest.py) × eager calls or
calls inside `tf.function`. Each combination adds until the rings wrap, reads every frame back, draws windows
with exact probabilities, restores its state into a new buffer of the same parts, and clears.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tensorflow as tf
from conftest import (
    SPEC,
    DictStorage,
    DictVariables,
    FunctionWrapped,
    KeptAddsUniform,
    assert_whole,
    code,
    fill,
    new_directory,
    to_numpy,
    underlying,
)

import tfbuffers

SAMPLERS = ("uniform", "kept", "prioritized")
# Frame stacks wrap a storage: "frames" wraps the default (numpy), "frames+dict" a test file's, "frames+memmap" files.
STORAGES = {
    "host": ("numpy", "dict", "memmap", "frames", "frames+dict", "frames+memmap"),
    "graph": ("variables", "dict"),
}
# What each part is, read back from the buffer made of it.
SAMPLER_CLASSES = {"uniform": "UniformSampler", "kept": "KeptAddsUniform", "prioritized": "PrioritizedSampler"}
STORAGE_CLASSES = {
    ("host", "numpy"): "NumpyTable",
    ("host", "dict"): "DictStorage",
    ("host", "memmap"): "MemmapTable",
    ("graph", "variables"): "VariableStorage",
    ("graph", "dict"): "DictVariables",
}
COMBINATIONS = [
    (mode, sampler, storage, wrapped)
    for mode, storages in STORAGES.items()
    for sampler, storage, wrapped in itertools.product(SAMPLERS, storages, ("eager", "function"))
]


def make(mode: str, sampler: str, storage: str) -> tfbuffers.ReplayBuffer:
    """A buffer of 3 segments of 5 frames made of these parts."""
    options: dict = {}
    if sampler == "kept":
        options["sampler"] = KeptAddsUniform
    if storage.startswith("frames"):
        options["frame_stacks"] = "observation/pixels"
        storage = storage.partition("+")[2]
    if storage == "dict":
        options["storage"] = DictStorage if mode == "host" else DictVariables
    elif storage == "memmap":
        options["directory"] = new_directory()
    if mode == "host":
        cls = tfbuffers.PyPrioritizedReplayBuffer if sampler == "prioritized" else tfbuffers.PyUniformReplayBuffer
        return cls(SPEC, batch_size=3, max_length=5, seed=0, **options)
    cls = tfbuffers.TFPrioritizedReplayBuffer if sampler == "prioritized" else tfbuffers.TFUniformReplayBuffer
    return cls(SPEC, batch_size=3, max_length=5, **options)


@pytest.mark.parametrize(("mode", "sampler", "storage", "wrapped"), COMBINATIONS)
def test_every_sampler_on_every_storage_in_both_modes(mode, sampler, storage, wrapped):
    tf.random.set_seed(7)
    made = make(mode, sampler, storage)
    buffer = FunctionWrapped(made) if wrapped == "function" else made
    assert made.prioritized == (sampler == "prioritized")
    assert type(made.sampler).__name__ == SAMPLER_CLASSES[sampler]
    wrapped_storage = storage.partition("+")[2] or "numpy"
    if storage.startswith("frames"):
        assert type(made.storage).__name__ == "FrameStackTable"
        assert type(made.storage.inner).__name__ == STORAGE_CLASSES[mode, wrapped_storage]
    else:
        assert type(made.storage).__name__ == STORAGE_CLASSES[mode, storage]
    fill(buffer, 7)  # the rings wrap: each segment holds adds 2..6
    stored = code(np.arange(3)[:, None], np.arange(2, 7)[None, :])
    np.testing.assert_array_equal(assert_whole(buffer.gather_all()), stored)
    items, info = buffer.get_next(sample_batch_size=300, num_steps=2)
    codes = assert_whole(items)
    np.testing.assert_array_equal(codes[:, 1], codes[:, 0] + 1)  # one segment, consecutive
    assert set(codes[:, 0].tolist()) == set(stored[:, :-1].ravel().tolist())  # every window of 2 drawn
    ids = to_numpy(info.ids)
    np.testing.assert_array_equal(codes, 1000 * (ids % 3) + ids // 3)  # the ids name the frames
    # 12 windows of 2 (4 per segment), each 1/12: uniform, and prioritized at its first priorities (all 1).
    np.testing.assert_allclose(to_numpy(info.probabilities), np.full([300], 1 / 12), rtol=1e-6)
    # Its state restores into a new buffer of the same parts, which then draws and adds as this one.
    again = make(mode, sampler, storage)
    again.restore_state(made.state())
    np.testing.assert_array_equal(assert_whole(again.gather_all()), stored)
    assert set(assert_whole(again.get_next(sample_batch_size=100)[0]).tolist()) == set(stored.ravel().tolist())
    fill(again, 1, start=7)
    np.testing.assert_array_equal(assert_whole(again.gather_all())[:, -1], code(np.arange(3), 7))
    buffer.clear()
    assert int(buffer.num_frames()) == 0
    fill(buffer, 2)
    assert set(assert_whole(buffer.get_next(sample_batch_size=50)[0]).tolist()) == {0, 1, 1000, 1001, 2000, 2001}
    for closing in (underlying(buffer), again):
        if hasattr(closing, "close"):
            closing.close()
