"""Shared fixtures: every buffer kind behind one factory, and integer-coded frames.

A frame of segment `b` at add `t` carries the code `1000 * b + t` in every field,
so that any returned item can be checked to be whole and to be the right one.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
import tempfile
import zlib
from collections.abc import Callable, Mapping
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TF-Agents 0.19 builds its networks with Keras 2: on TensorFlow 2.16+ that is tf-keras, chosen by this
# variable before Keras is first used, where tf-keras is installed (TensorFlow 2.15 has Keras 2 anyway).
if importlib.util.find_spec("tf_keras") is not None:  # with TensorFlow 2.15 the variable would break Keras
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tfbuffers

tfbuffers.quiet_start_up()  # first: TensorFlow imported without the start-up lines about absent hardware

# isort: split
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import settings

import tfbuffers.kinds
import tfbuffers.specs
import tfbuffers.state
import tfbuffers.storage

# The fixtures' folders (tests/data/before_*): their make.py scripts are run by hand, as each says, not collected.
collect_ignore = ["data"]

# Hypothesis profiles (tests/fuzz_test.py, the one module that draws examples): "thorough" for `make test`, "ci"
# for .ci/run (TFBUFFERS_HYPOTHESIS=ci: a third of the examples, new ones each run, so runs add up).
settings.register_profile("thorough", max_examples=30)
settings.register_profile("ci", max_examples=10)
settings.load_profile(os.environ.get("TFBUFFERS_HYPOTHESIS", "thorough"))


def fresh_spec() -> dict[str, Any]:
    """A new copy of `SPEC`, for a test that checks the identity of what it passes."""
    return {
        "observation": {
            "position": tf.TensorSpec([2], tf.float32, "position"),
            "pixels": tf.TensorSpec([2, 2], tf.uint8, "pixels"),
        },
        "action": tf.TensorSpec([], tf.int32, "action"),
        "step": tf.TensorSpec([], tf.int64, "step"),
    }


SPEC = fresh_spec()


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
    """A buffer whose methods are all called through `tf.function`."""

    def __init__(self, buffer: tfbuffers.ReplayBuffer) -> None:
        self.buffer = buffer
        self._add = tf.function(buffer.add_batch)
        self._gather_all = tf.function(buffer.gather_all)
        self._num_frames = tf.function(buffer.num_frames)
        self._clear = tf.function(buffer.clear)
        self._get_next: dict[tuple[Any, ...], Any] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.buffer, name)

    def add_batch(self, items: Any) -> Any:
        return self._add(items)

    def get_next(self, sample_batch_size=None, num_steps=None, time_stacked=True):
        arguments = (sample_batch_size, num_steps, time_stacked)
        # One trace for each set of arguments, as a program's function has; keyed by type too (True == 1).
        key = tuple((type(argument), argument) for argument in arguments)
        if key not in self._get_next:
            self._get_next[key] = tf.function(lambda: self.buffer.get_next(*arguments), autograph=False)
        return self._get_next[key]()

    def gather_all(self) -> Any:
        return self._gather_all()

    def num_frames(self) -> Any:
        return self._num_frames()

    def clear(self) -> None:
        self._clear()

    def __len__(self) -> int:
        return len(self.buffer)

    def sample_all(self) -> Any:
        return tf.function(self.buffer.sample_all)()

    def get_item(self, index: int) -> Any:
        return tf.function(self.buffer.get_item)(tf.constant(index, tf.int64))

    def sample_by_index(self, indices: Any, fields: Any = None) -> Any:
        return tf.function(lambda i: self.buffer.sample_by_index(i, fields))(tf.constant(indices, tf.int64))


@dataclasses.dataclass(frozen=True)
class BufferKind:
    """One buffer class in the registry every multi-buffer test draws from.

    Attributes:
      name: Short name used in test ids.
      make: Builds the buffer from (spec, batch_size, max_length, **options).
      uniform: Whether it samples uniformly (the contract's uniform-only cases run on it).
      state_format: Its `BufferState.format`: states, checkpoints and files restore across kinds of one format.
      buffer_class: Its class.
      load_options: What `buffer_class.load(path, ...)` is given to rebuild this kind from a file beyond what the
        file records (a storage).
      on_disk: Whether it keeps its rows in a directory (`directory=`): each load gets a new one.
    """

    name: str
    make: Callable[..., tfbuffers.ReplayBuffer]
    uniform: bool = True
    state_format: str = tfbuffers.state.SEGMENTED
    buffer_class: type = tfbuffers.PyUniformReplayBuffer
    load_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    on_disk: bool = False

    def load(self, path: Any, **overrides: Any) -> Any:
        """A buffer of this kind rebuilt from the file at `path` (`buffer_class.load`)."""
        if self.on_disk:
            overrides.setdefault("directory", new_directory())
        return self.buffer_class.load(path, **self.load_options, **overrides)  # type: ignore[attr-defined]


# The memory-mapped kinds' directories, one each, under one directory removed when the tests' process exits.
_DIRECTORIES = tempfile.TemporaryDirectory(prefix="tfbuffers-test-directories-")


def new_directory(spec: Any = None) -> str:
    """A new directory path for a memory-mapped buffer (`directory=`), not yet made."""
    return os.path.join(tempfile.mkdtemp(dir=_DIRECTORIES.name), "buffer")


def _from_registry(kind: tfbuffers.kinds.Kind, **preset: Callable[[Any], Any]) -> Callable[..., Any]:
    """Makes buffers of the registry's `kind`: host kinds seeded (0 unless given), `preset` options from the spec."""

    def make(spec: Any, batch_size: int, max_length: int, **options: Any) -> tfbuffers.ReplayBuffer:
        seed = options.pop("seed", 0)
        if not kind.host:
            seed = None  # the TF kinds draw from TensorFlow's global generator (the fixtures seed it)
        for option, value in preset.items():
            options.setdefault(option, value(spec))
        return tfbuffers.kinds.make(kind.name, spec, batch_size, max_length, seed, **options)

    return make


def _frame_stacked(spec: Any) -> list[str] | None:
    """SPEC's uint8 fields of rank >= 1 (its pixels), stored as frame stacks along the last axis."""
    stacked = [
        field.path
        for field in tfbuffers.specs.flatten_spec(spec)
        if field.spec.dtype == tf.uint8 and field.spec.shape.rank >= 1
    ]
    return stacked or None


def _buffer_kinds() -> dict[str, BufferKind]:
    """The registry's kinds of any data spec (ids without "_uniform": "tf", "py"), and the py kind with frame stacks."""
    found = {}
    for kind in tfbuffers.kinds.KINDS.values():
        if kind.any_spec:
            name = kind.name.removesuffix("_uniform")
            state_format = tfbuffers.state.PRIORITIZED if kind.prioritized else tfbuffers.state.SEGMENTED
            found[name] = BufferKind(name, _from_registry(kind), not kind.prioritized, state_format, kind.buffer_class)
    py = tfbuffers.kinds.KINDS["py_uniform"]
    found["py_frames"] = BufferKind("py_frames", _from_registry(py, frame_stacks=_frame_stacked))
    found["py_dict"] = BufferKind(
        "py_dict", _from_registry(py, storage=lambda spec: DictStorage), load_options={"storage": DictStorage}
    )
    # Memory-mapped files (`directory=`): the py buffer's rows, counter and extras on the disk.
    found["py_memmap"] = BufferKind("py_memmap", _from_registry(py, directory=new_directory), on_disk=True)
    tf_kind = tfbuffers.kinds.KINDS["tf_uniform"]
    found["tf_dict"] = BufferKind(
        "tf_dict",
        _from_registry(tf_kind, storage=lambda spec: DictVariables),
        buffer_class=tfbuffers.TFUniformReplayBuffer,
        load_options={"storage": DictVariables},
    )
    # A sampler written here (`KeptAddsUniform`, stateful), on each buffer: one entry each.
    for name, kind in (("py_kept", py), ("tf_kept", tf_kind)):
        found[name] = BufferKind(
            name,
            _from_registry(kind, sampler=lambda spec: KeptAddsUniform),
            buffer_class=kind.buffer_class,
            load_options={"sampler": KeptAddsUniform},
        )
    return found


class DictStorage(tfbuffers.storage.Storage):
    """A storage written here, with only what `Storage` requires: each field's rows in a dict by path.

    It joins every multi-buffer test through its entry in `_buffer_kinds`, with no buffer class written for it.
    """

    def __init__(self, fields: Any, num_rows: int) -> None:
        super().__init__(fields, num_rows)
        self.rows = {
            field.path: np.zeros([num_rows, *field.spec.shape.as_list()], field.spec.dtype.as_numpy_dtype)
            for field in fields
        }

    def write_rows(self, index: int, first_row: int, rows: np.ndarray) -> None:
        self.rows[self.fields[index].path][first_row : first_row + len(rows)] = rows

    def read(self, rows: np.ndarray, fields: Any = None) -> list[np.ndarray]:
        chosen = range(len(self.fields)) if fields is None else fields
        return [self.rows[self.fields[index].path][rows] for index in chosen]

    def nbytes(self) -> int:
        return sum(array.nbytes for array in self.rows.values())


class DictVariables(tfbuffers.storage.GraphStorage):
    """A graph storage written here, with only what `GraphStorage` requires: each field's rows flattened, by path.

    A dict of `[num_rows, elements]` variables, one per field path: reads gather and reshape to the field's
    shape, writes reshape and scatter. It joins every multi-buffer test through its entry in `_buffer_kinds`.
    """

    def __init__(self, fields: Any, num_rows: int, device: str) -> None:
        super().__init__(fields, num_rows, device)
        self.rows = {
            field.path: tf.Variable(
                tf.zeros([num_rows, field.spec.shape.num_elements()], field.spec.dtype), trainable=False
            )
            for field in fields
        }

    def row_variables(self) -> list[tf.Variable]:
        return list(self.rows.values())

    def read(self, rows: Any, fields: Any = None) -> list[tf.Tensor]:
        chosen = range(len(self.fields)) if fields is None else fields
        return [
            tf.reshape(
                tf.gather(self.rows[self.fields[i].path], rows),
                tf.concat([tf.shape(rows, out_type=tf.int64), self.fields[i].spec.shape.as_list()], 0),
            )
            for i in chosen
        ]

    def write_field(self, index: int, rows: Any, values: Any) -> Any:
        flat = tf.reshape(values, [-1, self.fields[index].spec.shape.num_elements()])
        return self.rows[self.fields[index].path].scatter_update(tf.IndexedSlices(flat, rows))


NEWEST = 2


class NewestAdds(tfbuffers.sampling.Sampler):
    """A sampler written here: uniform over the windows that start in each segment's newest `NEWEST` adds.

    Its draws say their mass (the windows' count), so the Ray buffer weighs its segments by it. sampling_test,
    ray_replay_buffer_test and manager_test pass it as `sampler=` to each buffer that takes one.
    """

    keeps_episode_boundaries = False

    def sample(self, backend: Any, added: Any, sample_batch_size: Any, num_steps: Any) -> Any:
        shape = [] if sample_batch_size is None else [sample_batch_size]
        first, windows, checks = self.stored_windows(backend, added, num_steps)
        low = backend.ops.maximum(first, first + windows - NEWEST * self.batch_size)
        count = first + windows - low
        starts = backend.uniform_integers([*shape, 1], low, first + windows, checks)
        ids = starts + backend.ops.arange(num_steps or 1, self.batch_size)
        ids = ids if num_steps else ids[..., 0]
        rows = ids % (self.max_length * self.batch_size)
        return tfbuffers.sampling.Sample(ids, rows, backend.full_inverse(shape, count), mass=count)


class KeptAddsUniform(tfbuffers.sampling.UniformSampler):
    """A sampler written here that keeps state: each storage row's add number, told by the buffer's events.

    Uniform as `UniformSampler`, whose draws it checks against its state: every drawn row must hold the add its
    id names (`id // batch_size`), or the sample fails naming the sampler. So a missed or misordered add, clear or
    restore fails the contract cases on it. Its state is an extra of the storage (`storage.extra`), a numpy array
    on the host and a variable in the graph; a restore rebuilds it from the counter, so states and files need not
    carry it. It joins every multi-buffer test through its entries in `_buffer_kinds` (`py_kept`, `tf_kept`).
    """

    MISMATCH = "KeptAddsUniform: a drawn row does not hold the add its id names"

    def bind(self, storage: Any, backend: Any, step_field: Any) -> None:
        super().bind(storage, backend, step_field)
        self.kept = storage.extra("kept_adds", np.full([self.batch_size * self.max_length], -1, np.int64))

    def on_add(self, added: Any, rows: Any) -> list[Any]:
        events = super().on_add(added, rows)
        if not self._graph:
            self.kept[rows] = added
            return events
        return [*events, self.kept.scatter_update(tf.IndexedSlices(tf.fill([self.batch_size], added), rows))]

    def on_clear(self) -> list[Any]:
        events = super().on_clear()
        if not self._graph:
            self.kept[:] = -1
            return events
        return [*events, self.kept.assign(tf.fill([self.batch_size * self.max_length], tf.constant(-1, tf.int64)))]

    def restore_targets(self) -> list[Any]:
        return [*super().restore_targets(), self.kept]

    def on_restore(self, added: Any, step_types: Any, extras: Any) -> list[Any]:
        values = super().on_restore(added, step_types, extras)
        # Position p of each segment holds the newest add a < added with a % max_length == p (-1 for none).
        positions = np.arange(self.max_length)
        newest = added - 1 - (added - 1 - positions) % self.max_length
        kept = np.repeat(np.where(newest >= 0, newest, -1), self.batch_size).astype(np.int64)
        if self._graph:
            return [*values, kept]
        np.copyto(self.kept, kept)
        return values

    def sample(self, backend: Any, added: Any, sample_batch_size: Any, num_steps: Any) -> Any:
        sample = super().sample(backend, added, sample_batch_size, num_steps)
        holds = backend.tree.gather(self.kept, sample.rows) == sample.ids // self.batch_size
        if not self._graph:
            backend.require(np.all(holds), self.MISMATCH)
            return sample
        holds = tf.reduce_all(holds)
        if sample.valid is True:
            return sample._replace(valid=holds, invalid_message=self.MISMATCH)
        message = backend.select(sample.valid, self.MISMATCH, sample.invalid_message)
        return sample._replace(valid=holds & sample.valid, invalid_message=message)


# Every local kind in tfbuffers.kinds joins every contract, cross-check, fuzz, files and concurrency test here.
BUFFER_KINDS = _buffer_kinds()


class FlushingReverbReplayBuffer(tfbuffers.ReverbReplayBuffer):
    """`ReverbReplayBuffer` whose adds are in the table when `add_batch` returns, for the contract suite.

    Reverb's writers send items when they flush (at an episode's end, `flush()`, `close()`); the contract
    samples right after adding, as a program does once it flushed. Eagerly and inside `tf.function` alike:
    a graph's add runs the eager one when the graph runs (`tfbuffers.execution.host`).
    """

    def _add_batch(self, leaves: Any, deferred: Any) -> Any:
        ids = super()._add_batch(leaves, deferred)
        if tf.executing_eagerly():
            self.flush()
        return ids


def _reverb(spec: Any, batch_size: int, max_length: int, **options: Any) -> tfbuffers.ReverbReplayBuffer:
    """A Reverb buffer of the contract's sizes: items of `max_length` frames (its longest windows), as many items."""
    options.pop("seed", None)  # Reverb's server draws; it takes no seed
    return FlushingReverbReplayBuffer(
        spec, sequence_length=max_length, batch_size=batch_size, capacity=batch_size * max_length, **options
    )


HAS_REVERB = importlib.util.find_spec("reverb") is not None
HAS_RAY = importlib.util.find_spec("ray") is not None
# The contract suite's kinds: every local kind, Reverb on the stack that has it (the pinned one) and Ray (run on the
# current stack, on a local cluster the first buffer starts). The Reverb buffer stores items, not a ring; the Ray
# buffer's rings are read by draws only: the cases either does not support are skipped with the reason
# (`REVERB_SKIPS`, `RAY_SKIPS`).
REVERB_KIND = BufferKind("reverb", _reverb, buffer_class=tfbuffers.ReverbReplayBuffer)
RAY_KIND = BufferKind(
    "ray", _from_registry(tfbuffers.kinds.REMOTE_KINDS["ray_uniform"]), buffer_class=tfbuffers.RayReplayBuffer
)

_REVERB_IDS = (
    "Reverb: BufferInfo.ids are its items' keys and add_batch returns each environment's count of frames, not "
    "the ring's frame ids (tests/reverb_replay_buffer_test.py checks what they are)"
)
_REVERB_ORDER = (
    "Reverb: a table has no order to read: gather_all, sample_all, indices, epochs and the deterministic pass "
    "are refused"
)
_REVERB_ITEMS = (
    "Reverb: a table holds items (windows of sequence_length frames, made once an environment has that many), "
    "removed oldest first across environments: num_frames, len, size and full count items, not frames"
)
_REVERB_LAYOUT = (
    "Reverb: no segments of max_length frames (its windows are sequence_length long) and no ring options "
    "(stateful_dataset, dataset_window_shift, dataset_drop_remainder)"
)
# The contract's cases the Reverb buffer does not support, by test function, and why. Every other case runs on it.
REVERB_SKIPS = {
    "test_is_a_replay_buffer": _REVERB_LAYOUT,
    "test_adds_before_wrap": _REVERB_IDS,
    "test_adds_wrap_around": _REVERB_ORDER,
    "test_single_frames_come_from_the_stored_frames": _REVERB_IDS,
    "test_probabilities_are_uniform_over_stored_windows": _REVERB_ITEMS,
    "test_windows_stay_in_one_segment_and_in_time": _REVERB_IDS,
    "test_window_of_max_length_is_the_whole_segment": _REVERB_ITEMS,
    "test_unbatched_and_unstacked_samples": _REVERB_ITEMS,
    "test_sampling_too_few_frames_raises": (
        "Reverb: an emptier table than min_size_to_sample is refused naming the table and the items it needs; "
        "num_steps is checked against sequence_length"
    ),
    "test_random_dataset_has_static_specs_and_sees_new_data": _REVERB_IDS,
    "test_parallel_random_dataset": _REVERB_ITEMS,
    "test_deterministic_pass_after_wrap_visits_every_frame_once": _REVERB_ORDER,
    "test_deterministic_windows_never_mix_segments": _REVERB_ORDER,
    "test_deterministic_windows_with_shift_one": _REVERB_ORDER,
    "test_deterministic_batched_pass": _REVERB_ORDER,
    "test_deterministic_pass_drop_remainder": _REVERB_ORDER,
    "test_deterministic_pass_reads_the_buffer_when_iterated": _REVERB_ORDER,
    "test_sequence_preprocess_fn_is_applied": _REVERB_ITEMS,
    "test_clear": _REVERB_ORDER,
    "test_checkpoint_round_trip": (
        "Reverb: its server checkpoints the table (py_client.checkpoint, ReplayBufferManager), not tf.train.Checkpoint"
    ),
    "test_bad_batches_are_rejected_and_change_nothing": _REVERB_ORDER,
    "test_exact_python_values_are_accepted": _REVERB_ORDER,
    "test_bad_sampling_arguments": _REVERB_ITEMS,
    "test_list_specs_come_back_as_tuples_from_datasets": _REVERB_ITEMS,
    "test_a_refused_add_inside_a_graph_leaves_the_buffer_working": _REVERB_ORDER,
    "test_reads_inside_a_graph_run_when_the_graph_runs": _REVERB_ORDER,
    "test_stateful_dataset_is_accepted_and_changes_nothing": _REVERB_LAYOUT,
    "test_size_and_len_count_stored_frames": _REVERB_ITEMS,
    "test_len_size_and_full": _REVERB_ITEMS,
    "test_sample_all_and_indices_are_oldest_first_by_id": _REVERB_ORDER,
    "test_an_index_out_of_range_is_refused_and_the_buffer_works_on": _REVERB_ORDER,
    "test_an_epoch_visits_every_window_once_in_random_order": _REVERB_ORDER,
    "test_an_epoch_of_an_empty_buffer_is_empty_and_arguments_are_checked": _REVERB_ORDER,
    "test_construction_from_a_config": (
        "Reverb: no from_config; tfbuffers.ReplayBufferManager records a Reverb buffer's configuration"
    ),
}

_RAY_ORDER = (
    "Ray: an actor's segments are read by draws and gather_all only: no deterministic pass, epochs or random "
    "access by index (sample_all, get_item, sample_by_index)"
)
# The contract's cases the Ray buffer does not support, by test function, and why. Every other case runs on it, on a
# real local cluster: its frames are rings of segments, as the local buffers' are.
RAY_SKIPS = {
    "test_sampling_too_few_frames_raises": (
        "Ray: its refusals name the actor (RayReplayBuffer 'name' is empty ...), for a learner that reads several; "
        "tests/ray_replay_buffer_test.py checks them"
    ),
    "test_random_dataset_has_static_specs_and_sees_new_data": (
        "Ray: as_dataset fetches the next windows from the actor while the last ones are read (prefetch_items), so "
        "an element can predate the adds made just before it is asked for"
    ),
    "test_deterministic_pass_after_wrap_visits_every_frame_once": _RAY_ORDER,
    "test_deterministic_windows_never_mix_segments": _RAY_ORDER,
    "test_deterministic_windows_with_shift_one": _RAY_ORDER,
    "test_deterministic_batched_pass": _RAY_ORDER,
    "test_deterministic_pass_drop_remainder": _RAY_ORDER,
    "test_deterministic_pass_reads_the_buffer_when_iterated": _RAY_ORDER,
    "test_reads_inside_a_graph_run_when_the_graph_runs": _RAY_ORDER,
    "test_sample_all_and_indices_are_oldest_first_by_id": _RAY_ORDER,
    "test_an_index_out_of_range_is_refused_and_the_buffer_works_on": _RAY_ORDER,
    "test_an_epoch_visits_every_window_once_in_random_order": _RAY_ORDER,
    "test_an_epoch_of_an_empty_buffer_is_empty_and_arguments_are_checked": _RAY_ORDER,
    "test_checkpoint_round_trip": (
        "Ray: the actor's frames are saved by save/load (and kept by directory=), not tf.train.Checkpoint: the "
        "client holds no variables"
    ),
    "test_stateful_dataset_is_accepted_and_changes_nothing": (
        "Ray: no stateful_dataset (TF-Agents' flag, which the local buffers accept and ignore; the Ray buffer is no "
        "TF-Agents class)"
    ),
    "test_construction_from_a_config": (
        "Ray: no from_config; its constructor, RayReplayBuffer.load/open and ReplayBufferManager(backend='ray') "
        "make one"
    ),
}
REMOTE_SKIPS = {"reverb": REVERB_SKIPS, "ray": RAY_SKIPS}


def contract_kind(request: pytest.FixtureRequest) -> str:
    """The contract suite's kind parameter; a case Reverb or Ray does not support is skipped, saying why."""
    skips = REMOTE_SKIPS.get(request.param.rsplit("_", 1)[0], {})
    if request.function.__name__ in skips:
        pytest.skip(skips[request.function.__name__])
    tf.random.set_seed(1234)
    return request.param


# (source, target) kinds whose states restore into each other: a TF buffer's into a py buffer and back.
RESTORABLE = [
    (source, target)
    for source in BUFFER_KINDS
    for target in BUFFER_KINDS
    if BUFFER_KINDS[source].state_format == BUFFER_KINDS[target].state_format
]
# (source, target) kinds of different formats: every restore between them is refused.
UNRESTORABLE = [
    (source, target)
    for source in BUFFER_KINDS
    for target in BUFFER_KINDS
    if BUFFER_KINDS[source].state_format != BUFFER_KINDS[target].state_format
]

# Each buffer kind called eagerly and with every call inside `tf.function`.
KINDS = [f"{name}_{mode}" for name in BUFFER_KINDS for mode in ("eager", "function")]
UNIFORM_KINDS = [kind for kind in KINDS if BUFFER_KINDS[kind.rsplit("_", 1)[0]].uniform]
CONTRACT_KINDS = [
    *KINDS,
    *(["reverb_eager", "reverb_function"] if HAS_REVERB else []),
    *(["ray_eager", "ray_function"] if HAS_RAY else []),  # marked `ray`: run on the current stack (MARKER_STACK)
]


def make(name: str, spec: Any = SPEC, batch_size: int = 3, max_length: int = 5, **options: Any) -> Any:
    """A buffer of the registered kind `name` (`"tf"`, `"py"`, `"tf_prioritized"`, `"py_prioritized"`, `"reverb"`)."""
    kind = {REVERB_KIND.name: REVERB_KIND, RAY_KIND.name: RAY_KIND}.get(name) or BUFFER_KINDS[name]
    return kind.make(spec, batch_size, max_length, **options)


# The TF and Ray kinds' buffers of SPEC, kept on a shelf per worker process between tests: a test that asks
# `make_buffer` for one made alike gets a kept one, cleared, instead of a new one whose every `tf.function` (the
# buffer's graph calls, FunctionWrapped's) traces again, or whose actor starts again (a process importing
# TensorFlow): that is most of what such a test costs (the Ray cases took 103 s without the shelf, 27 s with it,
# measured on 2 cores). A buffer goes back on
# the shelf only when the test that had it passed; a clear must leave it as a new one is (tests/contract_test.py
# test_clear checks that on every kind), but for its random ops' state, which no case depends on: a draw's
# assertions hold for any draws. `--every-combination` runs without the shelf.
SHELVED_KINDS = ("tf", "tf_prioritized", "tf_dict", "tf_kept", "ray")
_SHELF: dict[tuple[Any, ...], list[Any]] = {}
_LENT: list[tuple[tuple[Any, ...], Any]] = []
_SHELF_ON = [True]


def _shelf_key(kind: str, batch_size: int, max_length: int, spec: Any, kwargs: dict[str, Any]) -> tuple | None:
    """What a kept buffer must have been made with to be given for these arguments; None: never kept."""
    if not _SHELF_ON[0] or spec is not SPEC or kind.rsplit("_", 1)[0] not in SHELVED_KINDS:
        return None
    options = tuple((name, type(value), value) for name, value in sorted(kwargs.items()))  # True == 1, not alike
    try:
        hash(options)
    except TypeError:
        return None
    return (kind, batch_size, max_length, options)


def make_buffer(kind: str, batch_size: int = 3, max_length: int = 5, spec: Any = SPEC, **kwargs: Any) -> Any:
    """A buffer of `kind` (`"<name>_eager"` or `"<name>_function"`), wrapped so calls run in tf.function."""
    key = _shelf_key(kind, batch_size, max_length, spec, kwargs)
    if key is not None and _SHELF.get(key):
        buffer = _SHELF[key].pop()
        underlying(buffer).clear()
    else:
        name, mode = kind.rsplit("_", 1)
        buffer = make(name, spec, batch_size, max_length, **kwargs)
        buffer = FunctionWrapped(buffer) if mode == "function" else buffer
    if key is not None:
        _LENT.append((key, buffer))
    return buffer


_PASSED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Records whether a test's call passed, for `_shelve_tf_buffers`."""
    report = yield
    if report.when == "call":
        item.stash[_PASSED] = report.passed
    return report


def pytest_configure(config: pytest.Config) -> None:
    _SHELF_ON[0] = not config.getoption("--every-combination")


@pytest.fixture(autouse=True)
def _shelve_tf_buffers(request: pytest.FixtureRequest) -> Any:
    """After each test, its TF buffers back on the shelf if it passed (`make_buffer`)."""
    yield
    if request.node.stash.get(_PASSED, False):
        for key, buffer in _LENT:
            _SHELF.setdefault(key, []).append(buffer)
    _LENT.clear()


def underlying(buffer: Any) -> tfbuffers.ReplayBuffer:
    return buffer.buffer if isinstance(buffer, FunctionWrapped) else buffer


def fill(buffer: Any, num_adds: int, start: int = 0) -> None:
    for t in range(start, start + num_adds):
        buffer.add_batch(batch(buffer.batch_size, t))


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    tf.random.set_seed(1234)
    return request.param


@pytest.fixture(params=UNIFORM_KINDS)
def uniform_kind(request: pytest.FixtureRequest) -> str:
    """The kinds whose sampling is uniform: the contract's cases that assert uniform probabilities."""
    tf.random.set_seed(1234)
    return request.param


# Docstring examples (in tfbuffers/, collected with the tests) that need dm-reverb, which installs on the
# pinned stack only. The hook sees every collected item, the package's doctests included.
NEEDS_REVERB = ("tfbuffers/remote/reverb/buffer.py", "tfbuffers/manager.py")


# Modules marked slow as a whole: those whose tests start processes, train agents, run notebooks, soak or fuzz,
# and the long parametrized suites beyond the contract (prioritized, episodes, files, cross-checks, statistics,
# observers, Reverb). `make test-fast` (`-m "not slow"`) runs the rest, the contract suite and the unit tests (less
# SLOW_TESTS and SLOW_KINDS below), in about 80 seconds; make test runs everything of its stack.
SLOW_MODULES = {
    "actors_test.py",
    "colabs_test.py",
    "collect_test.py",
    "concurrency_test.py",
    "cross_check_test.py",
    "episodes_test.py",
    "files_test.py",
    "fuzz_test.py",
    "hygiene_test.py",
    "keras_test.py",
    "manager_test.py",
    "observers_test.py",
    "packaging_test.py",
    "prioritized_test.py",
    "ray_replay_buffer_test.py",
    "replay_server_test.py",
    "reverb_replay_buffer_test.py",
    "sampling_stats_test.py",
    "scripts_test.py",
    "tf_agents_examples_test.py",
    "tf_agents_tests_test.py",
    "timeout_test.py",
}


# The covering design over buffer kind x execution mode x case (docs/development.md, "Tests"). A
# kind-mode parameter ("<kind>_eager", "<kind>_function") crosses every case with every kind in both modes. What
# the mode changes is the execution layer of the buffer's class: TFUniformReplayBuffer's graph calls (GraphCalls
# eagerly, the caller's trace inside tf.function) and PyUniformReplayBuffer's host bridge (tfbuffers.host). The
# two kinds that are those classes as they are ("tf", "py") run every case in both modes. Every other kind is one
# of them with another storage (py_frames, py_dict, py_memmap, tf_dict), sampler and priorities (the prioritized
# kinds) or home (Reverb and Ray, through the same host bridge), none of which the mode reaches: each runs every case
# in one mode, the two modes alternating over cases and, for one case, over kinds. So every (case, kind), (case, mode)
# and (kind, mode) pair still runs; `--every-combination` runs the whole cross product.
CORE_KINDS = ("tf", "py")
COVERED_KINDS = (
    "tf_prioritized",
    "py_prioritized",
    "py_frames",
    "py_dict",
    "py_memmap",
    "reverb",
    "tf_dict",
    "py_kept",
    "tf_kept",
    "ray",
)
MODES = ("eager", "function")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--every-stack",
        action="store_true",
        help="tfbuffers: run here the long runs kept to the other stack too (conftest.py ONE_STACK)",
    )
    parser.addoption(
        "--every-combination",
        action="store_true",
        help="tfbuffers: run every case on every buffer kind in both modes, each on a new buffer (conftest.py)",
    )


def kind_and_mode(item: pytest.Item) -> tuple[str, str] | None:
    """The buffer kind and mode a test item runs on (its "<kind>_<mode>" parameter), or None."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    for value in params.values():
        if isinstance(value, str) and value.endswith(tuple(f"_{mode}" for mode in MODES)):
            name, mode = value.rsplit("_", 1)
            if name in BUFFER_KINDS or name in (REVERB_KIND.name, RAY_KIND.name):
                return name, mode
    return None


def covered(item: pytest.Item) -> bool:
    """Whether the covering design runs `item`: core kinds always, other kinds in the mode their case draws."""
    found = kind_and_mode(item)
    if found is None or found[0] not in COVERED_KINDS:
        return True
    name, mode = found
    case = item.nodeid.replace(f"{name}_{mode}", "")  # the case: the test and its other parameters
    return MODES[(zlib.crc32(case.encode()) + COVERED_KINDS.index(name)) % 2] == mode


# The two stacks (the Makefile's rule: Python 3.11 is the pinned one). Both run the contract and unit suites whole;
# a few long runs, whose code is the same on both stacks (processes, threads, files, Ray), run on one stack only
# (docs/development.md, "Tests"; `--every-stack` runs them here too): the notebooks at full size in a kernel, the
# benchmark's smoke runs and the Reverb-backed tests on the pinned stack; the long kill, soak and stress runs, and
# Ray, on the current one. A key is a module, a test function ("module::function") or one of its cases
# ("module::function[id]"); the most specific key found decides, "both" undoing a wider key.
STACK = "pinned" if sys.version_info[:2] == (3, 11) else "current"
ONE_STACK = {
    "colabs_test.py::test_notebook_runs_at_full_size_in_a_kernel": "pinned",
    # Each notebook's cells and checks at small sizes on the current stack (Colab's); on the pinned stack the
    # kernel runs every cell at full size, and the small run only where the pinned stack adds a backend (Reverb).
    "colabs_test.py::test_notebook_runs": "current",
    "colabs_test.py::test_notebook_runs[reverb_and_scaling.ipynb]": "both",
    "colabs_test.py::test_a_notebook_s_training_repeats_exactly": "current",  # trains twice at small size
    "scripts_test.py::test_quick_benchmark_completes_and_writes_its_outputs": "pinned",  # Reverb's peers too
    "scripts_test.py::test_the_atari_workload_stores_frame_stacks_and_compares_them": "pinned",
    "scripts_test.py::test_a_seeded_dqn_run_repeats_exactly_and_prints_only_its_results": "pinned",
    "concurrency_test.py": "current",
    "memmap_test.py::test_a_writer_killed_at_random_moments_loses_no_returned_add_and_tears_nothing": "current",
    "files_test.py::test_a_save_killed_at_random_moments_leaves_the_previous_or_the_new_file": "current",
    "files_test.py::test_saves_beside_a_writer_are_consistent_snapshots": "current",
    "scripts_test.py::test_a_short_soak_checks_frames_and_records_memory": "current",
    "scripts_test.py::test_the_quick_sweep_measures_every_local_kind_at_every_point": "current",
    "scripts_test.py::test_the_her_comparison_writes_its_table_and_figure": "current",
}
# Tests marked `ray` (a local Ray cluster) run on the current stack, as the Reverb ones run on the pinned stack; the
# pinned stack installs the wheel with the ray extra and runs a Ray buffer from it (tests/packaging_test.py).
MARKER_STACK = {"ray": "current"}


def one_stack(item: pytest.Item) -> str | None:
    """The one stack `item` runs on (ONE_STACK, MARKER_STACK), or None for both."""
    module = item.path.name
    function = f"{module}::{getattr(item, 'originalname', item.name)}"
    case = f"{module}::{item.name}"
    for key in (case, function, module):
        if key in ONE_STACK:
            return None if ONE_STACK[key] == "both" else ONE_STACK[key]
    return next((stack for marker, stack in MARKER_STACK.items() if item.get_closest_marker(marker)), None)


# Tests that need an optional dependency, by module (the rest carry the marker themselves: the contract's and the
# manager's Reverb cases, the scripts' and the actors' runs on a server): `pytest -m "not reverb"` and the like.
NEEDS = {
    "reverb": ("reverb", {"reverb_replay_buffer_test.py", "replay_server_test.py"}),
    "ray": ("ray", {"ray_replay_buffer_test.py"}),
    "offline": ("minari", {"offline_test.py"}),
}


# Tests of the fast modules marked slow too, so that `make test-fast` fits its 90 s (docs/development.md): those
# that start processes, and the multi-kind cases on the TF prioritized kind, whose traces take a third of the fast
# subset's time (its own module, tests/prioritized_test.py, and make test run them; storage_test.py and
# compat_test.py keep its priorities and restores in the fast subset), and on the TF test storage (14 s more; the
# TF buffer's code is the "tf" kind's, and storage_test.py keeps its own cases fast).
SLOW_TESTS = {
    "memmap_test.py::test_a_directory_reopened_in_another_process_holds_the_buffer_and_goes_on",
    "memmap_test.py::test_one_writer_a_second_is_refused_naming_the_directory_and_process",
    "memmap_test.py::test_a_killed_writer_releases_the_directory",
    "memmap_test.py::test_anonymous_resident_memory_stays_under_a_tenth_of_the_stored_bytes",
    "sum_tree_test.py::test_numba_is_used_unless_switched_off",
    "compat_test.py::test_a_ray_buffer_saved_or_mapped_before_the_composition_loads_and_reopens",  # a Ray cluster
    # Each starts a Python that imports TensorFlow (or mkdocs): what import tfbuffers and quiet_start_up change.
    "hygiene_test.py::test_quiet_start_up_keeps_tensorflows_start_up_lines_off",
    "hygiene_test.py::test_importing_tfbuffers_changes_nothing_in_the_process",
    "hygiene_test.py::test_quiet_start_up_keeps_the_programs_warnings_filters_in_front",
    "readme_test.py::test_the_api_reference_builds_with_warnings_as_errors_and_covers_every_public_module",
}
SLOW_KINDS = ("tf_prioritized", "tf_dict", "tf_kept", "ray")
KEEP_SLOW_KINDS_FAST = ("storage_test.py", "compat_test.py")  # the modules whose slow kinds' cases stay fast


def on_a_slow_kind(item: pytest.Item) -> bool:
    """Whether `item` is a case on a kind of SLOW_KINDS: a "<kind>_<mode>" parameter, or the kind's bare name."""
    found = kind_and_mode(item)
    if found is not None:
        return found[0] in SLOW_KINDS
    params = getattr(getattr(item, "callspec", None), "params", {}).values()
    return item.path.name not in KEEP_SLOW_KINDS_FAST and any(
        value in SLOW_KINDS for value in params if isinstance(value, str)
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks slow and dependency-needing tests, skips those this stack cannot run saying why, keeps the covering design.

    The docstring examples whose dependency this stack lacks are skipped too.
    """
    skips = {
        marker: pytest.mark.skip(reason=f"needs the {marker} extra ({module} does not import here)")
        for marker, (module, _) in NEEDS.items()
        if importlib.util.find_spec(module) is None
    }
    if "reverb" in skips:
        skips["reverb"] = pytest.mark.skip(reason="dm-reverb installs on the pinned stack only (Python 3.11)")
    kept, deselected = [], []
    for item in items:
        function = f"{item.path.name}::{getattr(item, 'originalname', item.name)}"
        found = kind_and_mode(item)
        if item.path.name in SLOW_MODULES or function in SLOW_TESTS or on_a_slow_kind(item):
            item.add_marker(pytest.mark.slow)
        for marker, (_, modules) in NEEDS.items():
            if item.path.name in modules:
                item.add_marker(marker)
        if found is not None and found[0] in (REVERB_KIND.name, RAY_KIND.name):
            item.add_marker(found[0])  # "reverb" or "ray": the stack that runs it, the extra it needs
        if str(item.path).replace("\\", "/").endswith(NEEDS_REVERB):
            item.add_marker("reverb")
        for marker, skip in skips.items():
            if item.get_closest_marker(marker) is not None:
                item.add_marker(skip)
        stack = one_stack(item)
        if stack not in (None, STACK) and not config.getoption("--every-stack"):
            item.add_marker(pytest.mark.skip(reason=f"runs on the {stack} stack only (tests/conftest.py ONE_STACK)"))
        (kept if config.getoption("--every-combination") or covered(item) else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept
