"""`PyHashedReplayBuffer`: TF-Agents' frame-deduplicating py buffer, by changing an import."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from tfbuffers._arguments import explained
from tfbuffers.n_step import TRAJECTORY_FIELDS
from tfbuffers.py_uniform_replay_buffer import PyUniformReplayBuffer
from tfbuffers.storage import FrameStackTable

NOT_A_TRAJECTORY_SPEC = (
    "data_spec: expected the spec of a tf_agents Trajectory (its observation's frames, along the last axis, are "
    "stored once each), got {received}"
)
_LOG = logging.getLogger("tfbuffers")


class PyHashedReplayBuffer(PyUniformReplayBuffer):
    """`PyUniformReplayBuffer` storing each distinct frame of the observations once, as TF-Agents' does.

    The data spec is a `Trajectory`'s; its observation is split along its last axis
    into frames (`[84, 84, 4]`: four `[84, 84]` frames), each stored once in a
    `tfbuffers.FrameBuffer` however many observations hold it. It is
    `PyUniformReplayBuffer(..., frame_stacks={"observation": -1})` with TF-Agents'
    constructor (`data_spec, capacity, log_interval`); everything else (segments,
    `seed`, `episode_boundaries`, files) is the py buffer's.

    Differences from `tf_agents.replay_buffers.PyHashedReplayBuffer`: frames are
    matched by their bytes (TF-Agents keys them by hash alone, so two frames of one
    hash become one), and the differences of `PyUniformReplayBuffer` (`get_next`
    and `as_dataset` return `(items, BufferInfo)`, ...).

    It takes no `directory=`: its frame pool is in RAM. For a buffer on the disk, use
    `PyUniformReplayBuffer(..., directory=...)` (`tfbuffers.storage.memmap`).

    Sampling it while it is empty returns items, as TF-Agents' does (code that
    builds its dataset iterator before the first add keeps working), but zeros
    rather than uninitialised memory, with ids -1 and probabilities 0 to mark them.
    `PyUniformReplayBuffer` raises instead.

    Example:
    >>> import numpy as np, tensorflow as tf
    >>> from tf_agents.specs import array_spec
    >>> from tf_agents.trajectories import policy_step, time_step as ts, trajectory
    >>> obs_spec = array_spec.ArraySpec([2, 2, 4], np.uint8)
    >>> spec = trajectory.from_transition(
    ...     ts.time_step_spec(obs_spec), policy_step.PolicyStep(array_spec.ArraySpec([], np.int32)),
    ...     ts.time_step_spec(obs_spec))
    >>> buffer = PyHashedReplayBuffer(spec, capacity=8)
    >>> frames = [np.full([2, 2], t, np.uint8) for t in range(1, 11)]
    >>> for t in range(6):  # each observation: frames t .. t + 3
    ...     observation = np.stack(frames[t : t + 4], axis=-1)
    ...     step = ts.transition(observation, reward=0.0)
    ...     traj = trajectory.from_transition(step, policy_step.PolicyStep(np.int32(0)), step)
    ...     _ = buffer.add_batch(tf.nest.map_structure(lambda x: np.asarray(x)[None], traj))
    >>> len(buffer.frame_buffer)  # 6 observations of 4 frames: 9 distinct frames (and the empty rows' zeros)
    10
    """

    @explained
    def __init__(
        self,
        data_spec: Any,
        capacity: int | None = None,
        log_interval: int | None = None,
        *,
        batch_size: int = 1,
        max_length: int | None = None,
        seed: int | None = None,
        dataset_drop_remainder: bool = False,
        dataset_window_shift: int | None = None,
        stateful_dataset: bool = False,
        episode_boundaries: bool | str = False,
    ) -> None:
        """Creates the buffer: TF-Agents' `(data_spec, capacity=None, log_interval=None)`, and the py buffer's options.

        Every argument of `PyUniformReplayBuffer` but `frame_stacks`, `storage`, `sampler` and `directory`
        (the observation's frames are its storage), under its name and default.

        Args:
          data_spec: The spec of a TF-Agents `Trajectory`.
          capacity: As in `PyUniformReplayBuffer`.
          log_interval: Log the number of distinct frames held (logger `tfbuffers`, level INFO) every
            `log_interval` adds; None: never.
          batch_size: As in `PyUniformReplayBuffer`.
          max_length: As in `PyUniformReplayBuffer`.
          seed: As in `PyUniformReplayBuffer`.
          dataset_drop_remainder: As in `PyUniformReplayBuffer`.
          dataset_window_shift: As in `PyUniformReplayBuffer`.
          stateful_dataset: As in `PyUniformReplayBuffer`.
          episode_boundaries: As in `PyUniformReplayBuffer`.

        Raises:
          ValueError: If `data_spec` is not a Trajectory's spec, and as `PyUniformReplayBuffer`.
        """
        if getattr(data_spec, "_fields", None) != TRAJECTORY_FIELDS:
            raise ValueError(NOT_A_TRAJECTORY_SPEC.format(received=type(data_spec).__name__))
        if log_interval is not None and (isinstance(log_interval, bool) or not isinstance(log_interval, int)):
            raise TypeError(
                f"log_interval: expected None or an int, got {type(log_interval).__name__} {log_interval!r}"
            )
        super().__init__(
            data_spec,
            capacity,
            batch_size=batch_size,
            max_length=max_length,
            seed=seed,
            dataset_drop_remainder=dataset_drop_remainder,
            dataset_window_shift=dataset_window_shift,
            stateful_dataset=stateful_dataset,
            episode_boundaries=episode_boundaries,
            frame_stacks={"observation": -1},
        )
        self._log_interval = log_interval

    @property
    def log_interval(self) -> int | None:
        """Adds between the logged counts of distinct frames (None: never logged)."""
        return self._log_interval

    @property
    def frame_buffer(self) -> Any:
        """The `tfbuffers.FrameBuffer` holding the observations' frames."""
        table = self._table
        assert isinstance(table, FrameStackTable)
        return next(iter(table.pools.values()))

    def _sample_arrays(
        self, sample_batch_size: int | None, num_steps: int | None
    ) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        with self._lock:
            empty = self._table.added == 0
        if not empty:
            return super()._sample_arrays(sample_batch_size, num_steps)
        shape = self._ids_shape(sample_batch_size, num_steps)
        leaves = [
            np.zeros(shape + field.spec.shape.as_list(), field.spec.dtype.as_numpy_dtype) for field in self._fields
        ]
        return leaves, np.full(shape, -1, np.int64), np.zeros(shape[:1] if sample_batch_size else [], np.float32)

    def _stored_locked(self, first: int, count: int) -> None:
        interval = self._log_interval
        if interval and (first + count) // interval > first // interval:  # add number k * interval - 1 among them
            _LOG.info("Effective replay buffer frame count: %d", len(self.frame_buffer))
