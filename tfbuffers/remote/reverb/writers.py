"""`EnvironmentWriters`: a Reverb trajectory writer per environment, cutting its frames into the table's items."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from tfbuffers.remote.reverb.server import import_reverb

logger = logging.getLogger(__name__)

# TF-Agents' `StepType` values (tf_agents.trajectories.time_step.StepType), read off a Trajectory's `step_type`.
FIRST, LAST = 0, 2

CLOSE_FLUSH_SECONDS = 10
MAX_PENDING_ITEMS = 16  # items a writer may have sent and not yet seen confirmed, in the middle of an episode
WAIT_SLICE_MS = 500  # a wait for the server is made of waits this long, so that signal handlers run between them
UNCONFIRMED = (
    "ReverbReplayBuffer: the server at {address} did not confirm the items within timeout={timeout} s (a rate "
    "limiter holds inserts until learners sample): {what}"
)
TAKEN = (
    "the frames of this call were taken and are sent once the server admits them; do not add them again "
    "(flush() waits again)"
)
KEPT = "the items are kept and sent once the server admits them (flush() waits again)"
NOT_TAKEN = "nothing of this call was taken or changed: the items before it wait to be confirmed first"
UNSENT_AT_CLOSE = "ReverbReplayBuffer.close: items written since the last flush could not be sent to %s: %s"


class EnvironmentWriters:
    """The writing side of a `ReverbReplayBuffer`: one `reverb.TrajectoryWriter` per environment of the batch.

    Every frame an environment appends ends a window of its last `sequence_length` frames; once the
    environment has that many frames since its episode began, every `stride`-th window is written to the
    table as one item, with the largest priority given so far (`max_priority`). A frame whose step type
    (the field at `step_type_index`, None for specs without episodes) is FIRST ends the last episode, so no
    item spans two; a LAST one flushes, so an episode's items are in the table when it ends. Every call
    holds one lock (a writer is used by one thread at a time) and calls `check_open` inside it.

    A wait for the server (a LAST frame's flush, the bound of `MAX_PENDING_ITEMS` unconfirmed items, `flush`)
    comes after every environment took its frame, in slices of `WAIT_SLICE_MS` (so that the process's signal
    handlers run), up to `timeout` seconds (None: as long as it takes); past it, `TimeoutError`
    (`UNCONFIRMED`; `TAKEN`, `flush`: `KEPT`): the call's frames are taken all the same, and the next wait goes
    on where it stopped. The waits an episode's end or `clear` need before anything changes (every item of the episode
    confirmed) come first: past the timeout there, nothing was taken or changed (`NOT_TAKEN`).

    Attributes:
      writers: The environments' `reverb.TrajectoryWriter`s, in batch order.
      max_priority: The priority new items get: 1.0 at first and after `clear`, raised by `raise_priority`.
    """

    def __init__(
        self,
        client: Any,
        table_name: str,
        *,
        batch_size: int,
        sequence_length: int,
        stride: int,
        step_type_index: int | None,
        check_open: Callable[[], None] = lambda: None,
        timeout: float | None = None,
        address: str = "",
    ) -> None:
        self._table_name = table_name
        self._timeout = timeout
        self._address = address
        self._sequence_length = sequence_length
        self._stride = stride
        self._step_type_index = step_type_index
        self._check_open = check_open
        self._lock = threading.Lock()
        self._deadline_exceeded = import_reverb().errors.DeadlineExceededError  # a wait's slice ran out
        self.writers = [client.trajectory_writer(num_keep_alive_refs=sequence_length) for _ in range(batch_size)]
        self.max_priority = 1.0
        self._episode_frames = np.zeros(batch_size, np.int64)  # frames each environment added since its episode began
        self._added = np.zeros(batch_size, np.int64)  # frames each environment added in all
        self._items = np.zeros(batch_size, np.int64)  # items each environment's writer made

    def append(self, arrays: list[np.ndarray]) -> np.ndarray:
        """Appends one frame per environment (each array's row `env`); returns each one's frame count before it."""
        with self._lock:
            self._check_open()
            if self._step_type_index is not None:
                for env in np.flatnonzero((arrays[self._step_type_index] == FIRST) & (self._episode_frames > 0)):
                    self._wait(self.writers[env], 0, NOT_TAKEN)  # what end_episode would wait for, unbounded
            waits = [
                self._append_locked(env, writer, [array[env] for array in arrays])
                for env, writer in enumerate(self.writers)
            ]
            ids = self._added.copy()
            self._added += 1
            for writer, pending in zip(self.writers, waits):  # every frame taken first: a timeout leaves none out
                if pending is not None:
                    self._wait(writer, pending, TAKEN)
        return ids

    def _append_locked(self, env: int, writer: Any, frame: list[np.ndarray]) -> int | None:
        """Appends `frame` to `writer` and writes the window it ends; returns the wait it calls for, or None.

        The wait: the count of items that may stay unconfirmed (0 after an episode's LAST frame).
        """
        step_type = None if self._step_type_index is None else int(frame[self._step_type_index])
        if step_type == FIRST and self._episode_frames[env]:
            writer.end_episode(clear_buffers=False)  # no item reaches back into the last episode
            self._episode_frames[env] = 0
        # The writer gets the fields as a flat list, in the order of the table signature's flattened columns
        # (which is what the server checks and the samplers unpack): packing the nest costs more than the write.
        writer.append(frame)
        self._episode_frames[env] += 1
        length = self._sequence_length
        made = self._episode_frames[env] >= length and (self._episode_frames[env] - length) % self._stride == 0
        if made:
            window = [column[-length:] for column in writer.history]
            writer.create_item(self._table_name, priority=self.max_priority, trajectory=window)
            self._items[env] += 1
        if step_type == LAST:
            return 0
        if made and self._items[env] % MAX_PENDING_ITEMS == 0:
            # Long episodes: wait until the server confirmed all but the last MAX_PENDING_ITEMS, so that
            # unconfirmed items cannot pile up in memory (Reverb warns beyond about 50).
            return MAX_PENDING_ITEMS
        return None

    def _wait(self, writer: Any, pending: int, what: str) -> None:
        """Waits until the server confirmed all but `pending` of `writer`'s items, in slices, up to the timeout.

        Raises:
          TimeoutError: Past the timeout, saying `what` (`TAKEN`, `KEPT`, `NOT_TAKEN`).
        """
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        while True:
            left_ms = WAIT_SLICE_MS if deadline is None else int((deadline - time.monotonic()) * 1000)
            try:
                writer.flush(block_until_num_items=pending, timeout_ms=max(1, min(WAIT_SLICE_MS, left_ms)))
                return
            except self._deadline_exceeded:
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(
                        UNCONFIRMED.format(address=self._address, timeout=self._timeout, what=what)
                    ) from None

    def raise_priority(self, priority: float) -> None:
        """New items get `priority` from now on if it is larger than `max_priority`."""
        self.max_priority = max(self.max_priority, float(priority))

    def flush(self) -> None:
        """Sends every item made so far and waits until the server has them."""
        with self._lock:
            self._check_open()
            for writer in self.writers:
                self._wait(writer, 0, KEPT)

    def clear(self, reset: Callable[[], None]) -> None:
        """Ends every environment's episode (its pending items written), then calls `reset` (emptying the table)."""
        with self._lock:
            self._check_open()
            for writer in self.writers:
                self._wait(writer, 0, NOT_TAKEN)  # what end_episode would wait for, unbounded
            for writer in self.writers:
                writer.end_episode(clear_buffers=True)
            reset()
            self._episode_frames[:] = 0
            self.max_priority = 1.0

    def close(self, address: str) -> None:
        """Sends what is unsent (waiting up to `CLOSE_FLUSH_SECONDS`; a warning names `address` if it cannot)."""
        reverb = import_reverb()
        with self._lock:
            for writer in self.writers:
                try:
                    writer.flush(timeout_ms=int(CLOSE_FLUSH_SECONDS * 1000))  # close() alone drops unsent items
                except (reverb.errors.DeadlineExceededError, RuntimeError) as error:
                    logger.warning(UNSENT_AT_CLOSE, address, error)
                writer.close()
            self.writers = []
