"""Test harnesses for buffers: a concurrency stress run, writer and reader threads, every frame checked.

Frames are integer-coded: every field of a frame derives from one int64 code,
unique to the frame, so a returned frame that mixes two writes (torn), or was
never written, is caught. Writers add batches of fresh codes; readers sample
with `get_next`, iterate `as_dataset`, call `gather_all` and `num_frames`; an
optional thread clears the buffer now and then. With no clears, each sampled
frame's id must also be the id its add returned, so windows are consecutive
frames of one segment.

    >>> import tfbuffers
    >>> from tfbuffers import testing as stress
    >>> buffer = tfbuffers.PyUniformReplayBuffer(stress.SPEC, batch_size=2, max_length=8, seed=0)
    >>> report = stress.run(buffer, seconds=0.2)
    >>> report.frames_checked > 0 and report.writers == 2
    True

Used by the test suite (seconds) and by `scripts/soak.py` (a soak run that
also records memory). `tfbuffers.testing.contract` is the other harness: the contract every buffer passes,
a pytest suite to run against a storage or sampler of your own (the `testing` extra).
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

SPEC = {
    "code": tf.TensorSpec([], tf.int64, "code"),
    "observation": tf.TensorSpec([3], tf.float32, "observation"),
    "pixels": tf.TensorSpec([4, 4], tf.uint8, "pixels"),
    "action": tf.TensorSpec([], tf.int32, "action"),
}


class StressError(AssertionError):
    """A buffer returned a frame that is torn, unwritten, or not where its id says."""


def frames(codes: Any) -> dict[str, np.ndarray]:
    """Items whose every field derives from the int64 `codes` (any shape)."""
    codes = np.asarray(codes, np.int64)
    small = codes % 1_000_003  # exact in float32
    return {
        "code": codes,
        "observation": np.stack([small, -small, small % 7], axis=-1).astype(np.float32),
        "pixels": np.broadcast_to((codes % 251).astype(np.uint8)[..., None, None], (*codes.shape, 4, 4)).copy(),
        "action": (codes % 2_147_483_647).astype(np.int32),
    }


def check_whole(items: Any) -> np.ndarray:
    """The codes of `items`; raises `StressError` if any frame's fields disagree with its code."""
    items = {key: np.asarray(value) for key, value in items.items()}
    expected = frames(items["code"])
    for key, value in items.items():
        if not np.array_equal(value, expected[key]):
            bad = np.argwhere(np.any((value != expected[key]).reshape(*items["code"].shape, -1), axis=-1))
            raise StressError(f"torn frame: field {key!r} disagrees with its code at {bad[:3].tolist()}")
    return items["code"]


@dataclasses.dataclass
class StressReport:
    """What a stress run did. Counts are operations completed; frames are frames checked."""

    seconds: float
    writers: int
    samplers: int
    dataset_readers: int
    adds: int = 0
    samples: int = 0
    dataset_batches: int = 0
    gathers: int = 0
    clears: int = 0
    priority_updates: int = 0
    frames_checked: int = 0

    @property
    def threads(self) -> int:
        """Threads that ran operations on the buffer (the gather/num_frames thread included)."""
        return self.writers + self.samplers + self.dataset_readers + 1

    @property
    def operations(self) -> int:
        """All calls on the buffer."""
        return self.adds + self.samples + self.dataset_batches + self.gathers + self.clears + self.priority_updates


def run(
    buffer: Any,
    *,
    seconds: float = 2.0,
    writers: int = 2,
    samplers: int = 2,
    dataset_readers: int = 1,
    sample_batch_size: int = 8,
    num_steps: int = 2,
    clear_every: float | None = None,
    add: Callable[[Any], Any] | None = None,
    update: Callable[[Any, Any], Any] | None = None,
    min_operations: int = 0,
    timeout: float = 600.0,
) -> StressReport:
    """Runs writer and reader threads on `buffer` (spec `SPEC`) for `seconds`; checks everything returned.

    Args:
      buffer: An empty buffer whose `data_spec` is `SPEC`.
      seconds: How long the threads run (the run ends once each thread's last call returns).
      writers: Threads calling `add`.
      samplers: Threads calling `get_next(sample_batch_size, num_steps)`; on a prioritized buffer each
        sample is followed by `update_priorities` of its windows' first frames, racing the writers.
      dataset_readers: Threads iterating `as_dataset(sample_batch_size, num_steps, num_parallel_calls=2)`.
      sample_batch_size: Samples per call.
      num_steps: Window length.
      clear_every: If set, a thread calls `clear()` this often (seconds); ids are then not checked
        against the ids adds returned, since a clear restarts them.
      add: How writers add a batch, default `buffer.add_batch` (pass `tf.function(buffer.add_batch)`
        for graph adds).
      update: How samplers of a prioritized buffer update priorities, default `buffer.update_priorities`
        (pass `tf.function(buffer.update_priorities)` for a learner's graph updates: graph writers of both kinds).
      min_operations: After `seconds`, the run goes on until every kind of thread that runs
        (adds, samples, dataset batches, gathers, clears) has completed this many calls, so a
        test's counts hold on any machine, however slow.
      timeout: Seconds after which a run still short of `min_operations` raises `StressError`.

    Returns:
      A `StressReport`.

    Raises:
      StressError: If a returned frame was torn, never written, or (without clears) not the
        frame its id names, or a window was not consecutive frames of one segment.
      Exception: The first error any thread raised.
    """
    add = add or buffer.add_batch
    prioritized = buffer.prioritized
    update = update or (buffer.update_priorities if prioritized else lambda ids, priorities: None)
    batch_size = buffer.batch_size
    counter = itertools.count()
    written: dict[int, int] = {}  # code -> id its add returned; -1 until the add returns
    errors: list[BaseException] = []
    report = StressReport(seconds, writers, samplers, dataset_readers)
    lock = threading.Lock()  # guards the report and `checked`
    checked: list[tuple[np.ndarray, np.ndarray]] = []
    stop = threading.Event()

    def add_one() -> None:
        codes = next(counter) * batch_size + np.arange(batch_size, dtype=np.int64)
        for c in codes.tolist():
            written[c] = -1
        ids = np.asarray(add(frames(codes)))
        for c, i in zip(codes.tolist(), ids.tolist()):
            written[c] = i

    def check(items: Any, ids: Any) -> None:
        codes, ids = check_whole(items), np.asarray(ids)
        if num_steps > 1 and ids.ndim == 2 and not np.all(np.diff(ids, axis=-1) == batch_size):
            raise StressError(f"window not consecutive in one segment: ids {ids[:3].tolist()}")
        with lock:
            checked.append((codes, ids))
            report.frames_checked += codes.size

    def loop(body: Callable[[], None], count: str) -> Callable[[], None]:
        def thread() -> None:
            try:
                while not stop.is_set():
                    body()
                    with lock:
                        setattr(report, count, getattr(report, count) + 1)
            except BaseException as error:  # reported by the caller
                errors.append(error)
                stop.set()

        return thread

    def emptied_by_clear(error: tf.errors.InvalidArgumentError) -> bool:
        # Sampling a buffer that a clear has just emptied raises, as documented.
        # Right after a clear, there may be nothing (or no window) to sample yet.
        return clear_every is not None and (
            "is empty. Make sure" in error.message or "per segment so far" in error.message
        )

    def sample() -> None:
        try:
            items, info = buffer.get_next(sample_batch_size, num_steps)
        except tf.errors.InvalidArgumentError as error:
            if emptied_by_clear(error):
                return
            raise
        check(items, info.ids)
        if prioritized:
            update_priorities(np.asarray(info.ids))

    def update_priorities(ids: np.ndarray) -> None:
        # As a learner does: the windows' first frames get new priorities (above 0, so the buffer stays
        # sampleable), while writers overwrite rows and the tree. Ids of frames overwritten since are skipped.
        first = ids[..., 0] if ids.ndim > 1 else ids
        try:
            update(first, (first % 7 + 1).astype(np.float64))
        except (ValueError, tf.errors.InvalidArgumentError) as error:
            if clear_every is not None and "stored since the last clear" in str(error):
                return  # the ids were drawn before a clear restarted them
            raise
        with lock:
            report.priority_updates += 1

    def read_dataset() -> None:
        while not stop.is_set():
            iterator = iter(buffer.as_dataset(sample_batch_size, num_steps, num_parallel_calls=2))
            while not stop.is_set():
                try:
                    items, info = next(iterator)
                except tf.errors.InvalidArgumentError as error:
                    if emptied_by_clear(error):
                        break  # the iterator is spent: start another
                    raise
                check(items, info.ids)
                with lock:
                    report.dataset_batches += 1

    def gather() -> None:
        frames_before = int(buffer.num_frames())
        if frames_before % batch_size or frames_before > buffer.capacity:
            raise StressError(f"num_frames {frames_before}: not a multiple of {batch_size} within capacity")
        items = buffer.gather_all()
        codes = check_whole(items)
        if codes.shape[0] != batch_size:
            raise StressError(f"gather_all: {codes.shape[0]} segments, expected {batch_size}")
        with lock:
            report.frames_checked += codes.size
        time.sleep(0.01)

    def clear() -> None:
        time.sleep(clear_every or 0)
        buffer.clear()

    for _ in range(num_steps):
        add_one()  # so that sampling can start at once
    threads = [threading.Thread(target=loop(add_one, "adds")) for _ in range(writers)]
    threads += [threading.Thread(target=loop(sample, "samples")) for _ in range(samplers)]
    threads += [threading.Thread(target=_until(read_dataset, errors, stop)) for _ in range(dataset_readers)]
    threads.append(threading.Thread(target=loop(gather, "gathers")))
    if clear_every is not None:
        threads.append(threading.Thread(target=loop(clear, "clears")))
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    stop.wait(seconds)
    counts = ["adds"] * bool(writers) + ["samples"] * bool(samplers) + ["dataset_batches"] * bool(dataset_readers)
    counts += (
        ["gathers"] + ["clears"] * (clear_every is not None) + ["priority_updates"] * (prioritized and samplers > 0)
    )
    while not stop.is_set() and min(getattr(report, count) for count in counts) < min_operations:
        if time.perf_counter() - started > timeout:
            stop.set()
            for thread in threads:
                thread.join()
            raise StressError(f"fewer than {min_operations} of each operation in {timeout} s: {report}")
        stop.wait(0.05)
    stop.set()
    for thread in threads:
        thread.join()
    report.seconds = time.perf_counter() - started
    report.adds += num_steps
    if errors:
        raise errors[0]
    for codes, ids in checked:
        missing = [c for c in codes.ravel().tolist() if c not in written]
        if missing:
            raise StressError(f"returned frames that were never written: codes {missing[:3]}")
        if clear_every is None:
            wrong = [(c, i) for c, i in zip(codes.ravel().tolist(), ids.ravel().tolist()) if written[c] != i]
            if wrong:
                raise StressError(f"frames returned under another id: (code, id) {wrong[:3]}")
    return report


def _until(body: Callable[[], None], errors: list[BaseException], stop: threading.Event) -> Callable[[], None]:
    def thread() -> None:
        try:
            body()
        except BaseException as error:  # reported by the caller
            errors.append(error)
            stop.set()

    return thread
