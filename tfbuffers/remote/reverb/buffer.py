"""`ReverbReplayBuffer`: the tfbuffers API over one table of a DeepMind Reverb server.

Needs dm-reverb (the pinned stack: Python 3.11, `pip install tfbuffers[reverb]`);
importing `tfbuffers` does not. Users import it from `tfbuffers.reverb_replay_buffer`.
"""

from __future__ import annotations

import logging
import tempfile
import weakref
from typing import Any

import numpy as np
import tensorflow as tf

from tfbuffers import prioritized
from tfbuffers.remote.base import RemoteReplayBuffer
from tfbuffers.remote.options import check_sampler, optional_seconds
from tfbuffers.remote.reverb.server import (
    check_served_table,
    import_reverb,
    make_rate_limiter,
    make_table,
    served_sampler,
    start_server,
    table_signature,
)
from tfbuffers.remote.reverb.writers import EnvironmentWriters
from tfbuffers.replay_buffer import BufferInfo, positive_int, weak_method

logger = logging.getLogger(__name__)

EMPTY = (
    "{buffer} is empty: table {table!r} holds {items} item(s), fewer than the {needed} it needs before sampling. "
    "Make sure to add items before sampling the buffer."
)
NO_GATHER_ALL = (
    "ReverbReplayBuffer.gather_all: a Reverb table can be sampled, not read whole in order; use get_next or "
    "as_dataset, or a local buffer (TFUniformReplayBuffer, PyUniformReplayBuffer)"
)
NO_DETERMINISTIC_PASS = (
    "ReverbReplayBuffer.as_dataset: single_deterministic_pass: a Reverb table has no order to pass through; "
    "use a local buffer for a deterministic pass"
)
NOT_PRIORITIZED = (
    "ReverbReplayBuffer.update_priorities: table {table!r} samples uniformly; create the buffer with "
    "sampler='prioritized' to sample by priority"
)
OTHER_SAMPLER = (
    "sampler: table {table!r} at {address} samples {served} (as its server was started), but this buffer was "
    "created with sampler={received!r}"
)
STARTED = (
    "tfbuffers started an embedded Reverb server for table %r on port %d. It listens on every network interface "
    "without authentication: anyone who can reach this machine on that port can read, write and clear the buffer. "
    "It stops when the buffer is closed."
)


class ReverbReplayBuffer(RemoteReplayBuffer):
    """A replay buffer on one table of a Reverb server: the local buffers' API, Reverb's storage.

    Each environment of the batch (a segment, as in the local buffers) has its own
    Reverb trajectory writer (`remote.reverb.writers.EnvironmentWriters`). Every frame it adds ends a window of the last
    `sequence_length` frames of that environment; once the environment has that
    many frames since its episode began, the window is written to the table as
    one item (every `stride` frames). So the table holds windows, never frames
    alone, and sampling draws windows, uniformly (Reverb's `Uniform` sampler) or
    by priority (`sampler="prioritized"`, with `update_priorities`), the oldest
    removed first (`Fifo`) once the table holds `capacity` items.

    Episodes: when `data_spec` is a TF-Agents `Trajectory` (it has a `step_type`),
    a frame whose step type is FIRST begins a new episode: no item spans a
    LAST → FIRST boundary. A frame whose step type is LAST flushes its writer, so
    an episode's items are in the table when it ends. Other specs have no
    episodes: windows run across everything an environment adds. `flush()` sends
    every item made so far, and so does `close()` (waiting up to
    `CLOSE_FLUSH_SECONDS` for the server), or the buffer's finalizer when it is
    dropped without `close()` or alive when its process exits. A process killed
    before any of them loses the items not yet sent (items go out as they are
    made, up to `MAX_PENDING_ITEMS` unconfirmed) and its unfinished episodes',
    never those already in the table.

    Differences from the local buffers, all because Reverb stores items, not a ring:

    * `num_frames()` is the number of items (windows) in the table.
    * `get_next`/`as_dataset` take `num_steps` up to `sequence_length`: the first
      `num_steps` frames of each drawn window (None: its first frame, no time axis).
      `BufferInfo.ids` are the items' keys (int64), one per window;
      `BufferInfo.probabilities` Reverb's probability of each draw.
    * `gather_all` and the deterministic pass raise: a table has no order to read.
    * `add_batch` returns each environment's count of frames added so far, minus
      one (ids of frames, not of items; items are made later, once windows fill).

    With no `address`, the buffer starts an in-process Reverb server on a free
    port, says so in one log line, and stops it in `close()` (or when the buffer
    is garbage collected). Reverb serves gRPC on every interface without
    authentication: keep the machine's port private (see docs/scaling.md). With an
    `address` ("host:port"), it connects to a server that already serves
    `table_name` with this buffer's signature.

    Example:
    >>> spec = {"x": tf.TensorSpec([], tf.int64)}
    >>> with ReverbReplayBuffer(spec, sequence_length=2, capacity=100) as buffer:
    ...     for step in range(4):
    ...         _ = buffer.add_batch({"x": np.array([step])})
    ...     buffer.flush()
    ...     items, info = buffer.get_next(sample_batch_size=5, num_steps=2)
    ...     int(buffer.num_frames()), {tuple(w) for w in items["x"].tolist()} <= {(0, 1), (1, 2), (2, 3)}
    (3, True)
    """

    NO_PASS = NO_DETERMINISTIC_PASS
    IDS_PER_STEP = False  # an item's key per window

    def __init__(
        self,
        data_spec: Any,
        sequence_length: int = 2,
        *,
        batch_size: int = 1,
        capacity: int = 100_000,
        stride: int = 1,
        address: str | None = None,
        table_name: str = "tfbuffers",
        sampler: str = "uniform",
        priority_exponent: float = 0.6,
        min_size_to_sample: int = 1,
        samples_per_insert: float | None = None,
        error_buffer: float | None = None,
        checkpoint_dir: str | None = None,
        fallback_checkpoint: str | None = None,
        timeout: float | None = None,
    ) -> None:
        """Creates the buffer, and a server when no `address` is given.

        Args:
          data_spec: A nest of `tf.TensorSpec` (or `ArraySpec`) describing one frame,
            usually `agent.collect_data_spec`.
          sequence_length: Frames per item (window): the longest `num_steps` sampled.
          batch_size: Environments: the leading dimension of every `add_batch`.
          capacity: Items the table holds; the oldest is removed first beyond it.
          stride: Frames between the starts of consecutive items of one environment.
          address: "host:port" of a running server that has `table_name`; None starts
            an embedded one.
          table_name: The table's name.
          sampler: "uniform" (Reverb's `Uniform`) or "prioritized" (`Prioritized`: items
            drawn with probability proportional to `priority ** priority_exponent`; see
            `update_priorities`). The table draws with Reverb's selectors, so it takes the names only,
            not the sampler callables the local and Ray buffers take.
          priority_exponent: Alpha, for the prioritized sampler.
          min_size_to_sample: Items the table must hold before it can be sampled.
          samples_per_insert: None for Reverb's `MinSize` rate limiter (sampling never
            waits once the table holds `min_size_to_sample` items). A number for
            `SampleToInsertRatio`: once the table holds `min_size_to_sample` items,
            inserts and samples wait for each other to keep about this many samples per
            inserted item. A program that adds and samples in one thread then blocks for
            good when the ratio is off: use it with actors and learners in threads or
            processes.
          error_buffer: How far the ratio may drift (Reverb's `error_buffer`), at least
            `max(1.0, samples_per_insert)`; default 10% of `min_size_to_sample *
            samples_per_insert`, and no less than that minimum.
          checkpoint_dir: The embedded server's checkpoint directory (Reverb's
            `DefaultCheckpointer`: `py_client.checkpoint()` writes there, keeping the newest
            only, and a server started on it restores that one). None: a temporary one.
          fallback_checkpoint: A checkpoint the embedded server restores when
            `checkpoint_dir` holds none. `tfbuffers.ReplayBufferManager` drives both.
          timeout: Seconds `add_batch`, `flush` and `clear` wait for the server to confirm items (a
            `samples_per_insert` limiter holds inserts until learners sample) before `TimeoutError`,
            whose message says what was done; None: as long as it takes. An add's wait comes after
            every environment took its frame: its frames are taken and sent once the server admits
            them (do not add them again); `flush()` waits again. An episode's FIRST frame and `clear`
            wait first for the items before them: past the timeout, nothing was taken or changed. The
            waits are made in half-second slices, so that a process's signal handlers run while it
            waits (`scripts/collect.py` stops on SIGTERM).

        Raises:
          ImportError: If dm-reverb cannot be imported.
          TypeError, ValueError: If an argument has the wrong type or is out of range.
          ValueError: With an `address`, if the server has no table `table_name`, or
            its table stores other items (spec, `sequence_length`) or samples otherwise
            (`sampler`): said naming both sides, before anything is written.
        """
        reverb = import_reverb()
        sequence_length = positive_int("sequence_length", sequence_length)
        batch_size = positive_int("batch_size", batch_size)
        capacity = positive_int("capacity", capacity)
        stride = positive_int("stride", stride)
        min_size_to_sample = positive_int("min_size_to_sample", min_size_to_sample)
        sampler = check_sampler(sampler, callables=False)
        priority_exponent = prioritized.check_exponent(priority_exponent)
        rate_limiter = make_rate_limiter(min_size_to_sample, samples_per_insert, error_buffer)
        timeout = optional_seconds("timeout", timeout)
        if address is not None and (checkpoint_dir is not None or fallback_checkpoint is not None):
            raise ValueError(
                "checkpoint_dir, fallback_checkpoint: only for the embedded server (address=None); "
                "a running server checkpoints as it was started"
            )
        if address is not None and not isinstance(address, str):
            raise TypeError(f"address: expected a 'host:port' string or None, got {type(address).__name__}")
        if not isinstance(table_name, str) or not table_name:
            raise TypeError(f"table_name: expected a non-empty string, got {table_name!r}")
        super().__init__(data_spec, capacity)
        self._sequence_length = sequence_length
        self._batch_size = batch_size
        self._table_name = table_name
        self._min_size = min_size_to_sample
        self._sampler = sampler
        self._server = None
        if address is None:
            table = make_table(
                self._data_spec, sequence_length, table_name, capacity, sampler, priority_exponent, rate_limiter
            )
            checkpointer = None
            if checkpoint_dir is not None or fallback_checkpoint is not None:
                checkpointer = reverb.checkpointers.DefaultCheckpointer(
                    checkpoint_dir or tempfile.mkdtemp(), fallback_checkpoint_path=fallback_checkpoint
                )
            self._server = start_server([table], checkpointer=checkpointer)
            address = f"localhost:{self._server.port}"
            logger.warning(STARTED, table_name, self._server.port)
            # The embedded server does not outlive its buffer, closed or not.
            self._finalizer = weakref.finalize(self, self._server.stop)
        self._address = address
        self._client = reverb.Client(address)
        if self._server is None:
            signature = table_signature(self._data_spec, sequence_length)
            check_served_table(self._client, address, table_name, signature, sequence_length)
            served = served_sampler(self._client, table_name)
            if served != sampler:
                raise ValueError(
                    OTHER_SAMPLER.format(table=table_name, address=address, served=served, received=sampler)
                )
        paths = [field.path for field in self._fields]
        self._writers = EnvironmentWriters(
            self._client,
            table_name,
            batch_size=batch_size,
            sequence_length=sequence_length,
            stride=stride,
            step_type_index=paths.index("step_type") if hasattr(self._data_spec, "step_type") else None,
            check_open=weak_method(self._check_open),  # held weakly: dropping the buffer stops its server
            timeout=timeout,
            address=address,
        )
        # A buffer dropped without close() (or alive at exit) sends its writers' items first, as close() does:
        # a Reverb writer destroyed unflushed drops them.
        if self._server is not None:
            self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _dropped, self._writers, address, self._server)

    @property
    def batch_size(self) -> int:
        """The number of environments: the leading dimension `add_batch` expects."""
        return self._batch_size

    @property
    def sequence_length(self) -> int:
        """Frames per item: the longest window `get_next` and `as_dataset` sample."""
        return self._sequence_length

    @property
    def sampler(self) -> str:
        """How the table draws items: "uniform" or "prioritized"."""
        return self._sampler

    @property
    def table_name(self) -> str:
        """The Reverb table the buffer reads and writes."""
        return self._table_name

    @property
    def server_address(self) -> str:
        """The server's "host:port"."""
        return self._address

    @property
    def py_client(self) -> Any:
        """The `reverb.Client` of the server (for example `py_client.checkpoint()`)."""
        self._check_open()
        return self._client

    def flush(self) -> None:
        """Sends every item written so far to the server and waits until it has them."""
        self._check_open()
        self._writers.flush()

    # Hooks of ReplayBuffer.

    def _max_num_steps(self) -> int:
        return self._sequence_length

    def _num_frames_value(self) -> np.int64:
        self._check_open()
        return np.int64(self._client.server_info()[self._table_name].current_size)

    def _add_value(self, arrays: list[np.ndarray]) -> np.ndarray:
        return self._writers.append(arrays)

    def update_priorities(self, ids: Any, priorities: Any) -> Any:
        """Sets the priorities of the items `ids` (the keys `BufferInfo.ids` returned).

        Only for `sampler="prioritized"`. New items get the largest priority given
        here so far (1.0 at first and after `clear`), as in the PER paper. Reverb
        ignores keys no longer in the table (removed since they were sampled, normal
        when collecting while training) and does not say how many: this returns None.
        Eagerly, and inside `tf.function` when the graph runs.

        Raises:
          TypeError: If `ids` are not integers.
          ValueError: If the table samples uniformly, the shapes differ, or a priority
            is negative, NaN or infinite. Nothing is changed then.
        """
        self._send_priorities(ids, priorities)
        return None

    def _not_prioritized(self) -> str:
        return NOT_PRIORITIZED.format(table=self._table_name)

    def _update_value(self, ids: np.ndarray, priorities: np.ndarray) -> np.int64:
        ids, priorities = prioritized.check_update(ids, priorities, None)
        keys = ids.view(np.uint64)
        self._client.mutate_priorities(self._table_name, updates=dict(zip(keys.tolist(), priorities.tolist())))
        if priorities.size:
            self._writers.raise_priority(priorities.max())
        return np.int64(0)

    def _check_sampleable(self) -> None:
        items = int(self._num_frames_value())
        if items < self._min_size:
            message = EMPTY.format(
                buffer=type(self).__name__, table=self._table_name, items=items, needed=self._min_size
            )
            raise tf.errors.InvalidArgumentError(None, None, message)

    def _sample_arrays(
        self, sample_batch_size: int | None, num_steps: int | None
    ) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        self._check_open()
        self._check_sampleable()
        count = 1 if sample_batch_size is None else sample_batch_size
        samples = list(
            self._client.sample(self._table_name, count, emit_timesteps=False, unpack_as_table_signature=True)
        )
        leaves = [
            np.stack([_window(leaf, num_steps) for leaf in column])
            for column in zip(*(tf.nest.flatten(sample.data) for sample in samples))
        ]
        keys = np.array([sample.info.key for sample in samples], np.uint64).view(np.int64)
        probabilities = np.array([sample.info.probability for sample in samples], np.float32)
        if sample_batch_size is None:
            return [leaf[0] for leaf in leaves], keys[0], probabilities[0]
        return leaves, keys, probabilities

    def _as_dataset(
        self, sample_batch_size: int | None, num_steps: int | None, num_parallel_calls: int | None
    ) -> tf.data.Dataset:
        reverb = import_reverb()
        dataset = reverb.TrajectoryDataset.from_table_signature(
            server_address=self._address,
            table=self._table_name,
            max_in_flight_samples_per_worker=2 * (sample_batch_size or 1),
        )
        # Batched before anything else, so that the windows are cut and the fields packed once per batch.
        batched = sample_batch_size is not None
        if batched:
            dataset = dataset.batch(sample_batch_size, drop_remainder=True)

        def element(sample: Any) -> tuple[Any, BufferInfo]:
            def window(leaf: tf.Tensor) -> tf.Tensor:
                if num_steps is None:
                    return leaf[:, 0] if batched else leaf[0]
                return leaf[:, :num_steps] if batched else leaf[:num_steps]

            items = tf.nest.map_structure(window, sample.data)
            info = BufferInfo(tf.bitcast(sample.info.key, tf.int64), tf.cast(sample.info.probability, tf.float32))
            return self._pack_for_dataset(tf.nest.flatten(items)), info

        return dataset.map(element, num_parallel_calls=num_parallel_calls)

    def _gather_all(self) -> Any:
        return self._gather_all_arrays()  # refused when traced too, not when the graph runs

    def _gather_all_arrays(self) -> list[np.ndarray]:
        raise NotImplementedError(NO_GATHER_ALL)

    def _clear_value(self) -> np.int64:
        self._writers.clear(lambda: self._client.reset(self._table_name))  # pending items written, then emptied
        return np.int64(0)

    def _close(self) -> None:
        self._finalizer()  # sends the writers' items, then stops an embedded server; once
        self._server = None


def _dropped(writers: EnvironmentWriters, address: str, server: Any) -> None:
    """Closes `writers` (their items sent, or a warning naming `address`), then stops `server` if any."""
    try:
        writers.close(address)
    finally:
        if server is not None:
            server.stop()


def _window(leaf: np.ndarray, num_steps: int | None) -> np.ndarray:
    """The first `num_steps` frames of an item (None: its first frame, no time axis)."""
    return leaf[0] if num_steps is None else leaf[:num_steps]
