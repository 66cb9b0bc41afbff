"""Model-based fuzzing: random call sequences on a buffer against a plain-Python segmented ring.

Hypothesis drives each buffer kind through add_batch (good and bad batches),
get_next, gather_all, num_frames, clear, the deterministic pass, a checkpoint
round trip and a file round trip; after every step the buffer must agree with
`RingModel`. A bad batch must raise and leave both unchanged.
"""

from __future__ import annotations

import itertools
import tempfile

import conftest
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import tfbuffers
from tfbuffers import files
from tfbuffers import testing as stress

# Examples per machine: the loaded profile's (tests/conftest.py: 30 for make test, 5 a stack for CI).
FUZZ_SETTINGS = settings(
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


class RingModel:
    """The reference: `batch_size` lists of codes, each keeping its last `max_length`."""

    def __init__(self, batch_size: int, max_length: int) -> None:
        self.batch_size, self.max_length = batch_size, max_length
        self.added = 0
        self.codes: dict[int, np.ndarray] = {}  # add number -> the B codes of that add
        self.priorities: dict[int, float] = {}  # frame id -> priority (prioritized buffers)
        self.max_priority = 1.0

    def add(self, codes: np.ndarray) -> np.ndarray:
        self.codes[self.added] = codes
        gone = self.codes.pop(self.added - self.max_length, None)
        if gone is not None:
            for segment in range(self.batch_size):
                self.priorities.pop((self.added - self.max_length) * self.batch_size + segment, None)
        self.added += 1
        ids = (self.added - 1) * self.batch_size + np.arange(self.batch_size)
        self.add_priorities(ids)
        return ids

    def oldest(self) -> int:
        return self.added - min(self.added, self.max_length)

    def num_frames(self) -> int:
        return min(self.added, self.max_length) * self.batch_size

    def gather_all(self) -> np.ndarray:
        adds = range(self.oldest(), self.added)
        return np.array([[self.codes[a][s] for a in adds] for s in range(self.batch_size)], np.int64).reshape(
            self.batch_size, len(adds)
        )

    def code_of(self, frame_id: int) -> int:
        return int(self.codes[frame_id // self.batch_size][frame_id % self.batch_size])

    def windows(self, num_steps: int) -> int:
        return max(min(self.added, self.max_length) - num_steps + 1, 0) * self.batch_size

    def clear(self) -> None:
        self.added = 0
        self.codes.clear()
        self.priorities.clear()
        self.max_priority = 1.0

    # Priorities, for prioritized buffers: every frame's, by id; new frames get the largest given so far.

    def add_priorities(self, ids: np.ndarray) -> None:
        for frame_id in ids.tolist():
            self.priorities[frame_id] = self.max_priority

    def update(self, ids: list[int], priorities: list[float]) -> int:
        """Applies an update the buffer accepted; returns how many ids were skipped (overwritten)."""
        skipped = 0
        for frame_id, priority in zip(ids, priorities):
            if frame_id // self.batch_size < self.oldest():
                skipped += 1
                continue
            self.priorities[frame_id] = priority
            self.max_priority = max(self.max_priority, priority)
        return skipped

    def start_probabilities(self, num_steps: int, exponent: float) -> dict[int, float]:
        """Each window start's draw probability (only starts above 0); empty if every window weighs 0."""
        last_start = self.added - num_steps  # windows must not run past the newest add
        weights = {
            frame_id: priority**exponent
            for frame_id, priority in self.priorities.items()
            if self.oldest() <= frame_id // self.batch_size <= last_start and priority > 0
        }
        total = sum(weights.values())
        return {frame_id: weight / total for frame_id, weight in weights.items()}


def bad_batches(batch_size: int) -> list[tuple[str, object, type[Exception]]]:
    good = stress.frames(np.arange(batch_size, dtype=np.int64))
    wrong_dtype = dict(good, observation=good["observation"].astype(np.float64))
    wrong_batch = stress.frames(np.arange(batch_size + 1, dtype=np.int64))
    missing = {k: v for k, v in good.items() if k != "pixels"}
    extra = dict(good, extra=good["code"])
    wrong_shape = dict(good, pixels=np.zeros((batch_size, 4, 5), np.uint8))
    lossy = dict(good, action=[2**40] * batch_size)
    return [
        ("observation: expected dtype float32, got float64", wrong_dtype, ValueError),
        ("action: expected leading batch size", wrong_batch, ValueError),
        ("missing key(s) ['pixels']", missing, TypeError),
        ("unexpected key(s) ['extra']", extra, TypeError),
        ("pixels: expected shape", wrong_shape, ValueError),
        ("action: expected values representable as int32", lossy, ValueError),
    ]


class BufferMachine(RuleBasedStateMachine):
    """One buffer kind against `RingModel`."""

    kind = ""

    def make(self, batch_size: int, max_length: int) -> tfbuffers.ReplayBuffer:
        return conftest.make(self.kind, stress.SPEC, batch_size, max_length)

    @initialize(batch_size=st.integers(1, 3), max_length=st.integers(1, 4))
    def start(self, batch_size: int, max_length: int) -> None:
        self.buffer = self.make(batch_size, max_length)
        self.model = RingModel(batch_size, max_length)
        self.codes = itertools.count(1)

    @rule()
    def add_batch(self) -> None:
        codes = np.array([next(self.codes) for _ in range(self.model.batch_size)], np.int64)
        ids = self.buffer.add_batch(stress.frames(codes))
        np.testing.assert_array_equal(np.asarray(ids), self.model.add(codes))

    @rule(data=st.data())
    def add_a_bad_batch(self, data: st.DataObject) -> None:
        message, items, error = data.draw(st.sampled_from(bad_batches(self.model.batch_size)))
        with pytest.raises(error) as raised:
            self.buffer.add_batch(items)
        assert message in str(raised.value)

    @rule(sample_batch_size=st.one_of(st.none(), st.integers(1, 5)), num_steps=st.one_of(st.none(), st.integers(1, 3)))
    def get_next(self, sample_batch_size: int | None, num_steps: int | None) -> None:
        if num_steps is not None and num_steps > self.model.max_length:
            with pytest.raises(ValueError, match="num_steps: expected at most max_length"):
                self.buffer.get_next(sample_batch_size, num_steps)
            return
        windows = self.model.windows(num_steps or 1)
        if windows == 0:
            with pytest.raises(tf.errors.InvalidArgumentError, match="is empty. Make sure|per segment so far"):
                self.buffer.get_next(sample_batch_size, num_steps)
            return
        if self.prioritized and not self.model.start_probabilities(num_steps or 1, self.buffer.priority_exponent):
            with pytest.raises(tf.errors.InvalidArgumentError, match="every window that can be drawn has priority 0"):
                self.buffer.get_next(sample_batch_size, num_steps)
            return
        items, info = self.buffer.get_next(sample_batch_size, num_steps)
        codes, ids = stress.check_whole(items), np.asarray(info.ids)
        outer = ([] if sample_batch_size is None else [sample_batch_size]) + ([] if num_steps is None else [num_steps])
        assert list(ids.shape) == outer
        assert [self.model.code_of(i) for i in ids.ravel()] == codes.ravel().tolist()
        if num_steps:
            assert np.all(np.diff(ids.reshape(-1, num_steps), axis=-1) == self.model.batch_size)
        if not self.prioritized:
            np.testing.assert_array_equal(np.asarray(info.probabilities), np.full(outer[:1], 1 / windows, np.float32))
            return
        expected = self.model.start_probabilities(num_steps or 1, self.buffer.priority_exponent)
        starts = ids.reshape(-1, num_steps or 1)[:, 0]
        assert set(starts.tolist()) <= set(expected)  # only windows above 0, never past the newest frame
        probabilities = np.asarray(info.probabilities).ravel()
        np.testing.assert_allclose(probabilities, [expected[s] for s in starts.tolist()], rtol=1e-6)

    @property
    def prioritized(self) -> bool:
        return self.buffer.prioritized

    @precondition(lambda self: hasattr(self, "buffer") and self.buffer.prioritized)
    @rule(
        ids=st.lists(st.integers(-1, 40), min_size=1, max_size=6),
        priorities=st.lists(st.sampled_from([0.0, 0.5, 1.0, 3.0, -1.0, float("nan")]), min_size=6, max_size=6),
    )
    def update_priorities(self, ids: list[int], priorities: list[float]) -> None:
        priorities = priorities[: len(ids)]
        next_id = self.model.added * self.model.batch_size
        bad_priority = any(not p >= 0 for p in priorities)  # checked first, then the ids
        bad = bad_priority or any(not 0 <= i < next_id for i in ids)
        if bad:
            with pytest.raises((ValueError, tf.errors.InvalidArgumentError)) as raised:
                self.buffer.update_priorities(np.array(ids), np.array(priorities))
            expected = "priorities: expected finite values >= 0" if bad_priority else "ids: expected ids"
            assert expected in str(raised.value)
        else:
            skipped = self.buffer.update_priorities(np.array(ids), np.array(priorities))
            assert int(skipped) == self.model.update(ids, priorities)
        stored = self._stored_ids().ravel()
        rows = ((stored // self.model.batch_size) % self.model.max_length) * self.model.batch_size
        rows += stored % self.model.batch_size
        state = self.buffer.state()
        np.testing.assert_array_equal(
            state.extras["priority"][rows], [self.model.priorities[i] for i in stored.tolist()]
        )
        assert float(state.extras["max_priority"]) == self.model.max_priority

    @rule(sample_batch_size=st.one_of(st.none(), st.integers(1, 4)), num_steps=st.one_of(st.none(), st.integers(1, 3)))
    def deterministic_pass(self, sample_batch_size: int | None, num_steps: int | None) -> None:
        if num_steps is not None and num_steps > self.model.max_length:
            return
        dataset = self.buffer.as_dataset(sample_batch_size, num_steps, single_deterministic_pass=True)
        visited: list[int] = []
        for items, info in dataset:
            codes, ids = stress.check_whole(items), np.asarray(info.ids)
            assert [self.model.code_of(i) for i in ids.ravel()] == codes.ravel().tolist()
            if num_steps:
                assert np.all(np.diff(ids, axis=-1) == self.model.batch_size)  # one segment, in time order
            visited += ids.ravel().tolist()
        stored = self._stored_ids().ravel().tolist()
        assert sorted(visited) == sorted(stored)  # every frame once

    def _stored_ids(self) -> np.ndarray:
        adds = np.arange(self.model.oldest(), self.model.added)
        return adds[None, :] * self.model.batch_size + np.arange(self.model.batch_size)[:, None]

    @rule()
    def clear(self) -> None:
        self.buffer.clear()
        self.model.clear()

    @rule()
    def checkpoint_round_trip(self) -> None:
        fresh = self.make(self.model.batch_size, self.model.max_length)
        with tempfile.TemporaryDirectory() as directory:
            path = tf.train.Checkpoint(buffer=self.buffer).write(f"{directory}/ckpt")
            tf.train.Checkpoint(buffer=fresh).read(path).assert_consumed()
        self.buffer = fresh

    @precondition(lambda self: self.model.added > 0)
    @rule()
    def file_round_trip(self) -> None:
        fresh = self.make(self.model.batch_size, self.model.max_length)
        with tempfile.TemporaryDirectory() as directory:
            files.save(self.buffer, f"{directory}/buffer.safetensors", {"round": "trip"})
            assert files.load(f"{directory}/buffer.safetensors", fresh) == {"round": "trip"}
        self.buffer = fresh

    @invariant()
    def agrees_with_the_model(self) -> None:
        if not hasattr(self, "buffer"):
            return
        assert int(self.buffer.num_frames()) == self.model.num_frames()
        np.testing.assert_array_equal(stress.check_whole(self.buffer.gather_all()), self.model.gather_all())


# One machine per registered buffer kind (`conftest.BUFFER_KINDS`) but `tf_dict` and `tf_kept`: the TF buffer over
# a storage or with a sampler written in conftest, whose algorithms are the TF buffer's machine's; the parts run the
# contract, files, state and concurrency suites (and `py_kept`'s machine fuzzes the same sampler). The
# TF prioritized buffer runs half the examples: each costs it a trace per new shape, everything but its priorities
# is the TF buffer's (all the examples), and its priorities are the py prioritized buffer's arithmetic (all; the
# cross-check makes them agree).
FUZZED_KINDS = [name for name in conftest.BUFFER_KINDS if name not in ("tf_dict", "tf_kept")]
for _name in FUZZED_KINDS:
    _machine = type(f"{_name.capitalize()}Machine", (BufferMachine,), {"kind": _name})
    _case = _machine.TestCase
    _case.settings = (
        settings(FUZZ_SETTINGS, max_examples=FUZZ_SETTINGS.max_examples // 2)
        if _name == "tf_prioritized"
        else FUZZ_SETTINGS
    )
    globals()[f"Test{_name.capitalize()}Buffer"] = _case
del _name, _machine, _case  # else pytest collects `_case` too: the last kind's machine a second time
