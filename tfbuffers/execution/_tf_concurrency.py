"""How threads share a TF buffer: one writer at a time, lock-free readers that check what they read.

Writers (`add_batch`, `clear`, restoring a state, a prioritized buffer's
`update_priorities`) build their graph with `exclusive`, the
same graph for eager callers (through a compiled `tf.function`) and for graph
callers (a driver's `tf.while_loop`):

1. Everything that can fail runs first: the writer's inputs are computed and
   their shapes checked before the lock is tried, so a refused write never
   holds it.
2. The lock is `writers`, an int64 variable moved by `ResourceCountUpTo`, which
   TensorFlow documents as returning the value before its increment, atomically
   under the variable's mutex. A writer that finds it non-zero undoes its
   increment, then either raises `CONCURRENT_WRITERS` at once or, where the
   buffer waits for writers (`wait=True`), tries again (a `tf.while_loop` that
   only a contended write enters) for at most `WRITE_WAIT_SECONDS` (by
   `tf.timestamp`) before raising `WAITED_TOO_LONG`; either way without touching
   storage. TensorFlow has no sleep op, so a waiting graph writer spins; writes
   are short (a block of rows, a batch of priorities), so it spins briefly.
   Waiting costs every write a `tf.cond` (30% of an in-graph add, measured),
   which is why it is the prioritized buffer's default (its learner's updates
   are a second graph writer by design) and the uniform buffer's option; a
   waiting lock, `MutexLock` as under `tf.CriticalSection`, measured at four
   times a bare in-graph write. Eager writers also take a Python lock, so they
   wait for each other without spinning.
3. The write runs, then the lock is released (`AssignSubVariableOp`).

Writers that change what readers cannot tell from the counter (`clear`, a
restore, priority updates) keep `generation` odd while they write (`rewrite`).

Readers take no lock (a seqlock): they read `generation` and the counter,
gather, then read `writers`, the counter and `generation` again. What they
gathered is whole iff the generation is unchanged and even, and every add it read is at
least `added' + writers' - max_length`, i.e. no write that began before the
gather ended overwrote it. Otherwise they read again until at least `READ_ATTEMPTS`
reads and `READ_WAIT_SECONDS` (by `tf.timestamp`, read only when a read is
retried) have passed, then fail with `READ_BUSY`: no read waits without bound.
Both bounds, not either: a thousand attempts in a graph loop take milliseconds,
and a reader descheduled on a loaded machine while a writer keeps overwriting a
small ring could spend them all on torn reads. With op determinism enabled
(`tf.config.experimental.enable_op_determinism`, where `tf.timestamp` fails)
the bound is `READ_ATTEMPTS` alone.

A dataset's reads are not retried in place: a retry loop (`tf.while_loop`) in a
dataset's function costs about as much as the sample itself, torn or not. Each
element is one attempt (`checked_read`) that says whether it is whole; a torn one
is dropped (`Dataset.filter`) and the next element drawn instead, which is the
same as reading again. `count_torn` keeps the bound: `READ_ATTEMPTS` torn reads
in a row (counted over every dataset of the buffer) fail with `READ_BUSY`; each
is a whole dataset element, so a thousand take far longer than a graph loop's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from tfbuffers import _xla

CONCURRENT_WRITERS = (
    "{buffer}.{name}: another thread is writing to this buffer inside a graph; concurrent graph "
    "writers wait their turn only with wait_for_writers=True: pass it, call add_batch eagerly from each "
    "thread (serialized), use one buffer per writer, or guard the writers with your own lock"
)
WRITE_WAIT_SECONDS = 10.0
WAITED_TOO_LONG = (
    "{buffer}.{name}: another thread held the writers lock of this buffer for {seconds:g} s while this write "
    "waited inside a graph; a write that long (a restore?) must not overlap graph writers: serialize them with "
    "your own lock"
)
READ_ATTEMPTS = 1000
READ_WAIT_SECONDS = 5.0
READ_BUSY = (
    "{buffer}: no whole read in {attempts} attempts and {seconds:g} s: writes kept overwriting the frames being read; "
    "sample fewer frames per call or write less often"
)
READ_BUSY_DATASET = (
    "{buffer}: no whole read in {attempts} dataset elements in a row: writes kept overwriting the frames being read; "
    "sample fewer frames per call or write less often"
)

_NO_LIMIT = 2**62  # ResourceCountUpTo's limit: never reached, so it never fails


def op_determinism() -> bool:
    """Whether `tf.config.experimental.enable_op_determinism` is on (stateful clock ops then fail)."""
    from tensorflow.python.framework import config  # noqa: PLC0415 - TF exports no reader of the setting

    return bool(getattr(config, "is_op_determinism_enabled", lambda: False)())


class Concurrency:
    """The writers' lock and the counters lock-free readers check against.

    A plain object, not a `tf.Module`: none of this is checkpointed.
    """

    def __init__(self, buffer_name: str, *, wait: bool) -> None:
        """Creates the variables in the current device and name scope; `wait`: graph writers wait their turn."""
        self._buffer_name = buffer_name
        self._wait = wait
        self.eager_lock = threading.Lock()
        self.writers = tf.Variable(tf.constant(0, tf.int64), trainable=False, name="writers")
        self.generation = tf.Variable(tf.constant(0, tf.int64), trainable=False, name="generation")
        self.torn = tf.Variable(tf.constant(0, tf.int64), trainable=False, name="torn_reads_in_a_row")

    def writing(self) -> tf.Tensor:
        """How many writers hold or are trying the lock (0 at rest)."""
        return self.writers.read_value()

    def exclusive(self, inputs: Sequence[Any], write: Callable[[], tuple[list[Any], Any]], name: str) -> Any:
        """Builds `write()` holding the writers' lock, once every tensor in `inputs` is computed.

        Args:
          inputs: Tensors and ops the write reads or that check its input: the lock
            is tried only after all of them ran, so a failure there never holds it.
          write: Returns the ops that must run before the lock is released, and a
            nest of tensors to return once it is (a caller that ignores them, such
            as a driver's loop, then does not compute them).
          name: The method, for the error messages.

        Returns:
          `write()`'s nest, available once the lock is released.
        """
        if _xla.compiling():
            return self.compiled_exclusive(inputs, write)
        with tf.control_dependencies([x for x in inputs if x is not None]):
            held, undo = self._try_lock()
        with tf.control_dependencies([undo]):  # a failed try is undone before a retry or the assertion
            if self._wait:  # taken at once but under contention; then tried again, for a bounded time
                held = tf.cond(held, lambda: held, self._retry_lock)
                message = WAITED_TOO_LONG.format(buffer=self._buffer_name, name=name, seconds=WRITE_WAIT_SECONDS)
            else:
                message = CONCURRENT_WRITERS.format(buffer=self._buffer_name, name=name)
            refused = tf.debugging.Assert(held, [message])
        with tf.control_dependencies([refused]):
            effects, result = write()
        with tf.control_dependencies(effects):
            released = self.writers.assign_sub(tf.constant(1, tf.int64), read_value=False)
        with tf.control_dependencies([released]):
            return tf.nest.map_structure(tf.identity, result)

    def compiled_exclusive(self, inputs: Sequence[Any], write: Callable[[], tuple[list[Any], Any]]) -> Any:
        """`exclusive` in an XLA program (`tfbuffers._xla`): `write()` once `inputs` are computed, the lock untried.

        XLA has neither `ResourceCountUpTo` nor a way to wait or fail, and TensorFlow runs the program holding
        its variables' locks: compiled writers never interleave with each other, nor with an op of a reader.
        A branch on the lock (`tf.cond`) would lose the order between its writes and the program's later reads
        of the same variables (seen on TensorFlow 2.15: a sample after a compiled add read the counter from
        before it), so the lock is not looked at: a compiled write must not run while another thread writes
        the same buffer outside XLA (between that writer's ops).
        """
        with tf.control_dependencies([x for x in inputs if x is not None]):
            effects, result = write()
        with tf.control_dependencies(effects):
            return tf.nest.map_structure(tf.identity, result)

    def _try_lock(self) -> tuple[tf.Tensor, Any]:
        """One try of the writers' lock: whether it was taken, and the op that undoes a failed try."""
        before = tf.raw_ops.ResourceCountUpTo(resource=self.writers.handle, limit=_NO_LIMIT, T=tf.int64)
        held = tf.equal(before, 0)
        return held, self.writers.assign_sub(tf.where(held, tf.constant(0, tf.int64), tf.constant(1, tf.int64)))

    def _retry_lock(self) -> tf.Tensor:
        """Tries the lock again until taken or `WRITE_WAIT_SECONDS` passed: whether it was taken."""
        deadline = tf.timestamp() + WRITE_WAIT_SECONDS

        def retry(_: tf.Tensor) -> tuple[tf.Tensor]:
            held, undo = self._try_lock()
            with tf.control_dependencies([undo]):
                return (tf.identity(held),)

        (held,) = tf.while_loop(
            lambda held: tf.logical_and(tf.logical_not(held), tf.timestamp() < deadline),
            retry,
            (tf.constant(False),),
        )
        return held

    def rewrite(self, write: Callable[[], list[Any]]) -> list[Any]:
        """`write()`'s ops between two increments of `generation`: readers overlapping them read again.

        For writers that change what readers cannot tell from the counter (`clear`, a restore, priority
        updates). The generation is odd while they write, so a reader that begins during the write
        also reads again.
        """
        begin = self.generation.assign_add(1, read_value=False)
        with tf.control_dependencies([begin]):
            effects = write()
        with tf.control_dependencies(effects):
            return [self.generation.assign_add(1, read_value=False)]

    def checked_read(
        self, read: Callable[[], tuple[list[tf.Tensor], tf.Tensor]], added: tf.Variable, max_length: int
    ) -> tuple[tf.Tensor, list[tf.Tensor]]:
        """One attempt of `read()`, and whether no write overlapped it.

        `read` returns its tensors and the oldest add number they hold.
        """
        generation = self.generation.read_value()
        with tf.control_dependencies([generation]):
            tensors, oldest = read()
        with tf.control_dependencies(tensors):
            writing = self.writing()
        with tf.control_dependencies([writing]):
            now = added.read_value()
        with tf.control_dependencies([now]):
            # Unchanged and even in one test: the generation never decreases, so for an odd one `after + 1`
            # cannot equal it.
            unchanged = tf.equal(self.generation.read_value() + generation % 2, generation)
        return tf.logical_and(unchanged, oldest >= now + writing - max_length), tensors

    def count_torn(self, whole: tf.Tensor) -> tf.Tensor:
        """`whole`, once the count of torn reads in a row is updated: `READ_BUSY` at `READ_ATTEMPTS` of them.

        For reads that drop a torn attempt instead of reading again (a dataset's elements).
        Concurrent readers share the count: any whole read resets it.
        """
        torn = tf.where(whole, tf.constant(0, tf.int64), self.torn.read_value() + 1)
        busy = READ_BUSY_DATASET.format(buffer=self._buffer_name, attempts=READ_ATTEMPTS)
        with tf.control_dependencies([tf.debugging.Assert(torn < READ_ATTEMPTS, [busy])]):
            counted = self.torn.assign(torn, read_value=False)
        with tf.control_dependencies([counted]):
            return tf.identity(whole)

    def read_whole(
        self, read: Callable[[], tuple[list[tf.Tensor], tf.Tensor]], added: tf.Variable, max_length: int
    ) -> list[tf.Tensor]:
        """`read()`'s tensors, read again until no write overlapped the read.

        At most until `READ_ATTEMPTS` reads and `READ_WAIT_SECONDS` have both passed.
        """
        whole, tensors = self.checked_read(read, added, max_length)
        clock = not op_determinism()  # tf.timestamp fails under op determinism: then attempts alone
        seconds = READ_WAIT_SECONDS if clock else 0.0
        busy = READ_BUSY.format(buffer=self._buffer_name, attempts=READ_ATTEMPTS, seconds=seconds)

        def retry(attempt: tf.Tensor, since: tf.Tensor, whole: tf.Tensor, tensors: list[tf.Tensor]) -> tuple[Any, ...]:
            # Checked only on a retry, which is rare: a read that needs none runs no assertion nor clock.
            patient = attempt < READ_ATTEMPTS
            if clock:
                now = tf.timestamp()
                since = tf.where(attempt == 1, now, since)
                patient = tf.logical_or(patient, now - since < READ_WAIT_SECONDS)
            with tf.control_dependencies([tf.debugging.Assert(patient, [busy])]):
                whole, tensors = self.checked_read(read, added, max_length)
            return attempt + 1, since, whole, tensors

        _, _, _, retried = tf.while_loop(
            lambda attempt, since, whole, tensors: tf.logical_not(whole),
            retry,
            [tf.constant(1), tf.constant(0.0, tf.float64), whole, tensors],
            shape_invariants=[
                tf.TensorShape([]),
                tf.TensorShape([]),
                whole.shape,
                [tf.TensorShape([None] * t.shape.rank) for t in tensors],
            ],
        )
        for tensor, first in zip(retried, tensors):
            tensor.set_shape(first.shape)
        return retried
