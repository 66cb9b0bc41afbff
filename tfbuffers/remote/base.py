"""`RemoteReplayBuffer`: the base of the buffers whose frames live in another process (a Reverb server, a Ray actor)."""

from __future__ import annotations

import abc
from typing import Any

import numpy as np
import tensorflow as tf

from tfbuffers.execution import host
from tfbuffers.replay_buffer import ReplayBuffer


class RemoteReplayBuffer(host.HostExecution, ReplayBuffer):
    """A replay buffer whose table lives in another process, reached through a handle.

    Such a buffer is sampled by its host (the server or the actor draws, by the `sampler` named when it was
    made), and its `BufferInfo.ids` are its host's keys: several of them mix window by window, each fetched a
    batch at a time (`tfbuffers.sharded_dataset`).

    Every call is one exchange with the host, made on numpy arrays: eagerly at once, inside a `tf.function`
    or `tf.data` when the graph runs (the host execution mode, `tfbuffers.execution.host.HostExecution`). A subclass
    says what each exchange is (`_add_value`, `_sample_arrays`, `_num_frames_value`, `_clear_value`,
    `_gather_all_arrays`, `_update_value`).
    """

    # What `single_deterministic_pass=True` raises: a remote table has no order a pass could follow.
    NO_PASS = "single_deterministic_pass: not supported by a remote buffer"
    # What `update_priorities` raises on a buffer that samples uniformly.
    NOT_PRIORITIZED = "update_priorities: the buffer samples uniformly"
    NO_PRIORITIES: str | None = None  # with a sampler given as a callable that keeps none (the Ray buffer's)

    @property
    @abc.abstractmethod
    def batch_size(self) -> int:
        """The leading dimension `add_batch` expects: the host's environments or segments."""

    @property
    @abc.abstractmethod
    def sampler(self) -> Any:
        """How the host draws: "uniform", "prioritized" or (on Ray) the sampler factory it was given."""

    @property
    def prioritized(self) -> bool:
        """Whether the host draws by priority (`sampler="prioritized"`, with `update_priorities`)."""
        return self.sampler == "prioritized"

    @abc.abstractmethod
    def _update_value(self, ids: np.ndarray, priorities: np.ndarray) -> np.int64:
        """Sends new priorities to the host (a prioritized one); returns what `update_priorities` reports."""

    # Hooks of ReplayBuffer beyond those of the host execution mode.

    def _add_batch_outer_dims(self) -> tuple[int, ...]:
        return (self.batch_size,)

    def _single_deterministic_pass_dataset(
        self, sample_batch_size: int | None, num_steps: int | None, num_parallel_calls: int | None
    ) -> tf.data.Dataset:
        raise ValueError(self.NO_PASS)

    def _not_prioritized(self) -> str:
        # A message may name the sampler; one given as a callable (not "uniform") may have its own message.
        message = self.NOT_PRIORITIZED if isinstance(self.sampler, str) else self.NO_PRIORITIES or self.NOT_PRIORITIZED
        return message.format(sampler=self.sampler)

    def _send_priorities(self, ids: Any, priorities: Any) -> Any:
        """`update_priorities`' exchange: an int eagerly; inside a graph an int64 scalar, when it runs.

        Raises:
          ValueError: If the host samples uniformly (`NOT_PRIORITIZED`), before anything is sent.
          tf.errors.OpError: Inside a graph, when it runs, for what the host refuses.
        """
        self._check_open()
        if not self.prioritized:
            raise ValueError(self._not_prioritized())
        if not tf.executing_eagerly():
            inputs = [tf.convert_to_tensor(ids), tf.convert_to_tensor(priorities, tf.float64)]
            return host.call(self._update_value, inputs, tf.int64, [])
        return int(self._update_value(np.asarray(ids), np.asarray(priorities)))
