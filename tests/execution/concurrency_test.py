"""Several threads on one buffer: every returned frame whole, written, and where its id says.

`tfbuffers.testing` checks each frame as it is returned; a run fails on the first
torn, unwritten or misplaced frame. Rings are short (max_length 3 to 6) so that
writers overwrite the rows readers are gathering all the time.
"""

from __future__ import annotations

import os
import threading
import time

import conftest
import numpy as np
import pytest
import tensorflow as tf

import tfbuffers
from tfbuffers import testing as stress
from tfbuffers.execution._tf_concurrency import CONCURRENT_WRITERS, READ_BUSY, READ_BUSY_DATASET, WAITED_TOO_LONG

SECONDS = 2.0
# The runs that must catch a tear stop at the first one (within a second or two on an idle machine); on a loaded
# one the threads overlap less often, so they may take far longer to see one.
UNTIL_TORN = 180.0


def make(kind: str, max_length: int = 4) -> tfbuffers.ReplayBuffer:
    return conftest.make(kind, stress.SPEC, 3, max_length)


@pytest.mark.parametrize("kind", list(conftest.BUFFER_KINDS))
@pytest.mark.parametrize("clear_every", [None, 0.05])
def test_eager_writers_and_readers_of_every_kind(kind, clear_every):
    buffer = make(kind)
    report = stress.run(
        buffer, seconds=SECONDS, writers=2, samplers=2, dataset_readers=1, clear_every=clear_every, min_operations=5
    )
    assert min(report.adds, report.samples, report.dataset_batches, report.gathers) >= 5
    assert report.frames_checked >= 5 * 2 * 8  # at least the samples' frames, 8 windows of 2 each
    assert report.clears >= 5 if clear_every else report.clears == 0
    prioritized = buffer.prioritized
    assert report.priority_updates >= 5 if prioritized else report.priority_updates == 0
    # Counters are consistent once the threads are done.
    frames = int(buffer.num_frames())
    if clear_every is None:
        assert frames == min(report.adds, 4) * 3
    else:
        assert frames % 3 == 0 and frames <= 12


def test_a_graph_writer_with_lock_free_readers():
    buffer = make("tf", max_length=3)
    report = stress.run(buffer, seconds=SECONDS, writers=1, add=tf.function(buffer.add_batch), min_operations=5)
    assert min(report.adds, report.samples, report.dataset_batches, report.gathers) >= 5
    assert report.frames_checked >= 5 * 2 * 8


def test_the_stress_run_catches_a_torn_sample(monkeypatch):
    # Without the seqlock check, a sample may gather rows while they are rewritten.
    buffer = make("tf", max_length=2)

    def unchecked(self, read, added, max_length):
        tensors, _ = read()
        return tensors

    monkeypatch.setattr(type(buffer._concurrency), "read_whole", unchecked)
    with pytest.raises(stress.StressError, match="torn frame|another id|not consecutive"):
        stress.run(
            buffer, seconds=UNTIL_TORN, writers=1, samplers=2, dataset_readers=0, add=tf.function(buffer.add_batch)
        )


def test_the_stress_run_catches_a_torn_dataset_element(monkeypatch):
    # A dataset's element is one read, dropped when torn: without the check, it may hold rows being rewritten.
    buffer = make("tf", max_length=2)

    def unchecked(self, sample_batch_size, num_steps):
        tensors, _ = self.draw(sample_batch_size, num_steps)[0]()
        return tf.constant(True), tensors[:-2], tensors[-2], tensors[-1]

    monkeypatch.setattr(type(buffer._reads), "attempt", unchecked)
    with pytest.raises(stress.StressError, match="torn frame|another id|not consecutive"):
        stress.run(
            buffer, seconds=UNTIL_TORN, writers=1, samplers=0, dataset_readers=2, add=tf.function(buffer.add_batch)
        )


@pytest.mark.parametrize("kind", ["tf", "tf_prioritized"])
def test_reads_torn_every_time_fail_with_read_busy_then_the_buffer_reads_again(monkeypatch, kind):
    # A rewrite that never ends (the generation left odd) tears every read: get_next gives up after
    # READ_ATTEMPTS reads, a dataset after READ_ATTEMPTS dropped elements in a row.
    monkeypatch.setattr(tfbuffers.execution._tf_concurrency, "READ_ATTEMPTS", 5)  # read when the graphs are traced
    monkeypatch.setattr(tfbuffers.execution._tf_concurrency, "READ_WAIT_SECONDS", 0.0)
    buffer = make(kind, max_length=4)
    buffer.add_batch(stress.frames(np.arange(3, dtype=np.int64)))
    dataset = buffer.as_dataset(2, 1)
    in_graph = tf.function(lambda: buffer.get_next(2, 1))
    concurrency = buffer._concurrency
    concurrency.generation.assign_add(1)
    busy = READ_BUSY.format(buffer=type(buffer).__name__, attempts=5, seconds=0)
    dropped = READ_BUSY_DATASET.format(buffer=type(buffer).__name__, attempts=5)
    for read, message in (
        (lambda: buffer.get_next(2, 1), busy),
        (in_graph, busy),
        (lambda: next(iter(dataset)), dropped),
    ):
        with pytest.raises(tf.errors.InvalidArgumentError) as raised:
            read()
        assert message in raised.value.message
    assert int(concurrency.torn.numpy()) == 4  # the dataset's fifth torn read in a row failed
    concurrency.generation.assign_add(1)  # the rewrite ends
    for read in (lambda: buffer.get_next(2, 1), in_graph, lambda: next(iter(dataset))):
        items, info = read()
        np.testing.assert_array_equal(stress.check_whole(items), info.ids)
    assert int(concurrency.torn.numpy()) == 0
    buffer.add_batch(stress.frames(np.arange(3, 6, dtype=np.int64)))
    assert int(buffer.num_frames()) == 6


def test_torn_reads_keep_trying_past_read_attempts_until_the_wait_has_passed(monkeypatch):
    # Both bounds must pass before READ_BUSY: a reader that a loaded machine deschedules while a writer keeps
    # overwriting a small ring can spend a thousand attempts in milliseconds.
    monkeypatch.setattr(tfbuffers.execution._tf_concurrency, "READ_ATTEMPTS", 5)  # read when the graphs are traced
    monkeypatch.setattr(tfbuffers.execution._tf_concurrency, "READ_WAIT_SECONDS", 0.5)

    buffer = make("tf", max_length=4)
    buffer.add_batch(stress.frames(np.arange(3, dtype=np.int64)))
    concurrency = buffer._concurrency
    concurrency.generation.assign_add(1)  # every read is torn
    busy = READ_BUSY.format(buffer="TFUniformReplayBuffer", attempts=5, seconds=0.5)
    in_graph = tf.function(lambda: buffer.get_next(2, 1))
    for read in (lambda: buffer.get_next(2, 1), in_graph):
        began = time.monotonic()
        with pytest.raises(tf.errors.InvalidArgumentError) as raised:
            read()
        assert busy in raised.value.message
        assert time.monotonic() - began >= 0.5  # a lower bound only: the clock it waits on is tf.timestamp
    concurrency.generation.assign_add(1)  # the rewrite ends
    items, info = in_graph()
    np.testing.assert_array_equal(stress.check_whole(items), info.ids)


def test_under_op_determinism_torn_reads_are_bounded_by_attempts_alone(monkeypatch):
    # tf.timestamp fails when op determinism is on (train_dqn.py --seed enables it): the retry loop reads no clock.
    from tensorflow.python.framework import config

    monkeypatch.setattr(tfbuffers.execution._tf_concurrency, "READ_ATTEMPTS", 5)  # read when the graphs are traced
    buffer = make("tf", max_length=4)
    buffer.add_batch(stress.frames(np.arange(3, dtype=np.int64)))
    config.enable_op_determinism()
    tf.random.set_seed(0)  # random ops under determinism need one
    try:
        in_graph = tf.function(lambda: buffer.get_next(2, 1))
        buffer._concurrency.generation.assign_add(1)  # every read is torn
        busy = READ_BUSY.format(buffer="TFUniformReplayBuffer", attempts=5, seconds=0)
        for read in (lambda: buffer.get_next(2, 1), in_graph):
            with pytest.raises(tf.errors.InvalidArgumentError) as raised:  # not FailedPreconditionError (the clock)
                read()
            assert busy in raised.value.message
        buffer._concurrency.generation.assign_add(1)
        items, info = in_graph()
        np.testing.assert_array_equal(stress.check_whole(items), info.ids)
    finally:
        config.disable_op_determinism()
        tf.random.set_seed(None)


def test_a_prioritized_draw_of_a_row_an_add_is_still_writing_is_read_again(monkeypatch):
    # An add gives its rows the largest priority in the same step as it writes them, before its counter moves.
    # Caught there, a ring not yet full has a row that sampling by priority can draw and that the counter does
    # not count: its fields may be half written. Every such read is torn, so reads give up (READ_BUSY); once
    # the add's counter moves, they read the whole row.
    monkeypatch.setattr(tfbuffers.execution._tf_concurrency, "READ_ATTEMPTS", 5)  # read when the graphs are traced
    monkeypatch.setattr(tfbuffers.execution._tf_concurrency, "READ_WAIT_SECONDS", 0.0)
    buffer = make("tf_prioritized", max_length=4)
    buffer.add_batch(stress.frames(np.arange(3, dtype=np.int64)))
    buffer.update_priorities(tf.constant([0, 1, 2], tf.int64), tf.constant([1e-9] * 3))  # the next rows dominate
    rows = tf.constant([3, 4, 5], tf.int64)  # the second add's block: frames 3, 4, 5
    buffer.sampler.on_add(tf.constant(1, tf.int64), rows)  # the add's first step; its rows and counter not written yet
    busy = READ_BUSY.format(buffer="TFPrioritizedReplayBuffer", attempts=5, seconds=0)
    dropped = READ_BUSY_DATASET.format(buffer="TFPrioritizedReplayBuffer", attempts=5)
    in_graph = tf.function(lambda: buffer.get_next(64, 1))
    dataset = buffer.as_dataset(64, 1)
    for read, message in (
        (lambda: buffer.get_next(64, 1), busy),
        (in_graph, busy),
        (lambda: next(iter(dataset)), dropped),
    ):
        with pytest.raises(tf.errors.InvalidArgumentError) as raised:
            read()
        assert message in raised.value.message
    buffer._table.write([rows] * len(buffer.fields), tf.nest.flatten(stress.frames(np.arange(3, 6, dtype=np.int64))))
    buffer._added.assign_add(1)  # the add ends: its rows are counted
    for read in (lambda: buffer.get_next(64, 1), in_graph, lambda: next(iter(dataset))):
        items, info = read()
        np.testing.assert_array_equal(stress.check_whole(items), info.ids)
        assert set(np.asarray(info.ids).ravel().tolist()) <= {3, 4, 5}


@pytest.mark.parametrize("kind", ["tf", "tf_prioritized"])
def test_an_eager_gather_all_waits_for_eager_writers_as_they_wait_for_it(kind):
    # gather_all reads every row, which every add overwrites: it holds the eager writers' lock while it reads.
    buffer = make(kind, max_length=4)
    buffer.add_batch(stress.frames(np.arange(3, dtype=np.int64)))
    gathered, finished = [], threading.Event()
    with buffer._concurrency.eager_lock:  # an eager writer in the middle of its add
        reader = threading.Thread(target=lambda: (gathered.append(buffer.gather_all()), finished.set()))
        reader.start()
        assert not finished.wait(0.5)
    reader.join()
    np.testing.assert_array_equal(gathered[0]["code"], [[0], [1], [2]])
    buffer.add_batch(stress.frames(np.arange(3, 6, dtype=np.int64)))
    np.testing.assert_array_equal(buffer.gather_all()["code"], [[0, 3], [1, 4], [2, 5]])


def test_a_dataset_drops_torn_reads_and_counts_them_in_a_row():
    # Three reads torn (then a whole one): the first element the iterator gives is the whole read's.
    buffer = make("tf", max_length=4)
    buffer.add_batch(stress.frames(np.arange(3, dtype=np.int64)))
    concurrency = buffer._concurrency
    attempts = tf.Variable(0, dtype=tf.int64)
    checked_read = type(concurrency).checked_read

    def torn_three_times(self, read, added, max_length):
        whole, tensors = checked_read(self, read, added, max_length)
        attempt = attempts.assign_add(1)
        return whole & (attempt > 3), tensors

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(concurrency), "checked_read", torn_three_times)
        dataset = buffer.as_dataset(2, 1)
    items, info = next(iter(dataset))
    assert int(attempts.numpy()) == 4
    assert int(concurrency.torn.numpy()) == 0  # reset by the whole read
    np.testing.assert_array_equal(stress.check_whole(items), info.ids)
    np.testing.assert_array_equal(info.probabilities, np.full(2, 1 / 3, np.float32))


def hold_the_writers_lock(buffer):
    """A thread holding `buffer`'s writers' lock until `release` is set (5 minutes at most), once it returns.

    The holder's function is traced here, before its thread starts, and has two minutes to reach the lock: on
    CI's loaded machine a graph call traced in its thread took more than 30 s to get there (2026-11-29), and a
    test's own graph call may take that long to trace before it tries the lock the holder must still hold.
    """
    inside, release = threading.Event(), threading.Event()

    def slow_write() -> tuple[list[tf.Tensor], tf.Tensor]:
        done = tf.numpy_function(lambda: (inside.set(), release.wait(300), np.int64(0))[-1], [], tf.int64)
        return [done], done

    hold = tf.function(lambda: buffer._concurrency.exclusive([], slow_write, "add_batch"))
    hold.get_concrete_function()
    holder = threading.Thread(target=hold)
    holder.start()
    if not inside.wait(120):
        release.set()  # not left waiting, holding an inter-op thread, when it gets there
        raise AssertionError(f"the holder's graph call did not reach the writers' lock in 120 s; {where_threads_are()}")
    return holder, release


def test_graph_calls_waiting_in_an_op_leave_the_others_running():
    # As many graph calls blocked in a numpy_function as the machine has cores (TensorFlow's default count of
    # inter-op threads, which they would all hold), as a test's holders are, and one more runs: the tests run with
    # more threads (tests/conftest.py; docs/concurrency.md, "Threads"). Both functions are traced first, and the
    # calls have two minutes to reach their ops: CI's machine, loaded by the other worker's Ray processes, once
    # took more than 30 s (2026-11-29); on failure the message says how many did and where every thread was.
    blocking = os.cpu_count() or 1
    entered, release, ran = threading.Semaphore(0), threading.Event(), threading.Event()
    blocked = tf.function(
        lambda: tf.numpy_function(lambda: (entered.release(), release.wait(300), np.int64(0))[-1], [], tf.int64),
        autograph=False,
    )
    another = tf.function(
        lambda: tf.numpy_function(lambda: (ran.set(), np.int64(1))[-1], [], tf.int64), autograph=False
    )
    blocked.get_concrete_function(), another.get_concrete_function()
    threads = [threading.Thread(target=blocked) for _ in range(blocking)]
    try:
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 120
        reached = sum(entered.acquire(timeout=max(0.0, deadline - time.monotonic())) for _ in range(blocking))
        assert reached == blocking, f"{reached} of {blocking} calls reached their op in 120 s; {where_threads_are()}"
        threads.append(threading.Thread(target=another))
        threads[-1].start()
        assert ran.wait(120), f"the call beside them did not run in 120 s; {where_threads_are()}"
    finally:
        release.set()
        for thread in threads:
            thread.join()


def where_threads_are() -> str:
    """Every thread's innermost Python frames, for a failure's message."""
    import sys
    import traceback

    stacks = []
    for ident, frame in sys._current_frames().items():
        inner = traceback.extract_stack(frame)[-3:]
        stacks.append(f"thread {ident}: " + " < ".join(f"{f.name} ({f.filename}:{f.lineno})" for f in inner[::-1]))
    return f"{len(stacks)} Python threads: " + "; ".join(stacks)


def waiting(kind: str = "tf", max_length: int = 5) -> tfbuffers.ReplayBuffer:
    """A TF buffer of 3 segments whose graph writers wait their turn."""
    if kind == "tf_prioritized":
        return tfbuffers.TFPrioritizedReplayBuffer(stress.SPEC, 3, max_length)  # waits by default
    return tfbuffers.TFUniformReplayBuffer(stress.SPEC, 3, max_length, wait_for_writers=True)


def test_a_second_graph_writer_waits_its_turn_then_writes():
    buffer = waiting()
    buffer.add_batch(stress.frames(np.arange(3, dtype=np.int64)))
    holder, release = hold_the_writers_lock(buffer)
    returned, finished = [], threading.Event()
    writer = threading.Thread(
        target=lambda: (returned.append(tf.function(buffer.add_batch)(stress.frames(np.arange(3, 6)))), finished.set())
    )
    writer.start()
    # The writer tries the lock, finds it held, and tries again: it cannot finish while the holder holds it.
    assert not finished.wait(0.5)
    release.set()
    holder.join()
    writer.join()
    np.testing.assert_array_equal(returned[0], [3, 4, 5])
    np.testing.assert_array_equal(buffer.gather_all()["code"], [[0, 3], [1, 4], [2, 5]])


@pytest.mark.parametrize("waits", [False, True], ids=["refused at once (default)", "waited past its limit"])
def test_a_graph_writer_that_cannot_take_the_lock_raises_and_stores_nothing(monkeypatch, waits):
    monkeypatch.setattr(tfbuffers.execution._tf_concurrency, "WRITE_WAIT_SECONDS", 0.2)  # read when the graph is traced
    buffer = waiting() if waits else make("tf", max_length=5)
    buffer.add_batch(stress.frames(np.arange(3, dtype=np.int64)))
    holder, release = hold_the_writers_lock(buffer)
    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        tf.function(buffer.add_batch)(stress.frames(np.arange(3, 6, dtype=np.int64)))
    release.set()
    holder.join()
    if waits:
        expected = WAITED_TOO_LONG.format(buffer="TFUniformReplayBuffer", name="add_batch", seconds=0.2)
    else:
        expected = CONCURRENT_WRITERS.format(buffer="TFUniformReplayBuffer", name="add_batch")
    assert expected in raised.value.message
    np.testing.assert_array_equal(buffer.gather_all()["code"], [[0], [1], [2]])  # nothing stored
    buffer.add_batch(stress.frames(np.arange(6, 9, dtype=np.int64)))  # the lock is free again
    np.testing.assert_array_equal(buffer.gather_all()["code"], [[0, 6], [1, 7], [2, 8]])


@pytest.mark.parametrize("kind", ["tf", "tf_prioritized"])
def test_graph_writers_in_several_threads_take_turns(kind):
    # Two driver threads adding inside graphs and, on the prioritized buffer, samplers that update
    # priorities inside graphs (a learner's train step): every writer waits its turn, none is refused.
    buffer = waiting(kind, max_length=3)
    update = tf.function(buffer.update_priorities) if kind == "tf_prioritized" else None
    report = stress.run(
        buffer, seconds=SECONDS, writers=2, add=tf.function(buffer.add_batch), update=update, min_operations=5
    )
    assert min(report.adds, report.samples, report.dataset_batches, report.gathers) >= 5
    assert report.priority_updates >= 5 if update else report.priority_updates == 0


def test_wait_for_writers_must_be_a_bool():
    with pytest.raises(TypeError, match="wait_for_writers: expected a bool, got int 1"):
        tfbuffers.TFUniformReplayBuffer(stress.SPEC, 3, 5, wait_for_writers=1)
