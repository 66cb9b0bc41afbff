"""Observers that make any tfbuffers buffer the sink of a TF-Agents driver.

* `TFObserver` for TF drivers (`DynamicStepDriver`, `DynamicEpisodeDriver`):
  called with batched `Trajectory` tensors inside the driver's `tf.function` /
  `tf.while_loop`. In-graph buffers add there; numpy buffers are reached
  through `tf.numpy_function`, so the same driver code serves every buffer.
* `PyObserver` for `PyDriver` and `tf_agents.train.Actor`: called with numpy
  trajectories, unbatched from a single environment (it adds the batch
  dimension that TF-Agents makes users add by hand) or batched from a
  `BatchedPyEnvironment`.

Both take a block of steps too, leaves `[batch_size, T, ...]` (a rollout of `T`
steps of each environment, an n-step collector's output): one `extend`, one
write per field, instead of `T` adds. A `RayWriter` takes them as one call.

>>> import tfbuffers, tensorflow as tf
>>> buffer = tfbuffers.PyUniformReplayBuffer({"x": tf.TensorSpec([2], tf.float32)}, capacity=10)
>>> observer = PyObserver(buffer)
>>> observer({"x": [1.0, 2.0]})  # one environment: no batch dimension
>>> buffer.gather_all()["x"].tolist()
[[[1.0, 2.0]]]
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import tensorflow as tf

from tfbuffers import specs
from tfbuffers.replay_buffer import ReplayBuffer

WRONG_BATCH_SIZE = (
    "{observer}: the driver's trajectories have batch size {received} but the buffer has batch_size={expected} "
    "(one segment per environment): create the buffer with batch_size=env.batch_size"
)
UNKNOWN_RANK = (
    "{observer}: {path}: expected rank {unbatched} (one environment), {batched} (batched) or {block} (a block of "
    "steps, [batch_size, T, ...]), got {received}"
)
NOT_A_BUFFER = "{observer}: expected a tfbuffers.ReplayBuffer, got {received}"
NOT_A_BUFFER_OR_WRITER = "{observer}: expected a tfbuffers.ReplayBuffer or RayWriter, got {received}"
WRONG_WRITER_SIZE = (
    "{observer}: the driver's trajectories have batch size {received} but the writer adds to {expected} segments "
    "(one per environment): claim them with buffer.writer(env.batch_size)"
)


def _check_buffer(observer: str, buffer: Any) -> ReplayBuffer:
    if not isinstance(buffer, ReplayBuffer):
        raise TypeError(NOT_A_BUFFER.format(observer=observer, received=type(buffer).__name__))
    return buffer


def _check_batch_size(observer: str, buffer: ReplayBuffer, batch_size: int | None) -> None:
    expected = getattr(buffer, "batch_size", None)
    if batch_size is not None and expected is not None and batch_size != expected:
        raise ValueError(WRONG_BATCH_SIZE.format(observer=observer, received=batch_size, expected=expected))


class TFObserver:
    """Adds the batched trajectories of a TF driver to a buffer.

    Pass it in a driver's `observers`; it returns the stored frames' ids, a
    tensor, as drivers `tf.group` their observers' results. Every buffer adds
    inside the driver's graph when it runs: the TF buffer natively, the py
    buffer through `tf.numpy_function`.
    """

    def __init__(self, buffer: ReplayBuffer) -> None:
        """Observes into `buffer` (any tfbuffers buffer).

        Raises:
          TypeError: If `buffer` is not a tfbuffers buffer.
        """
        self._buffer = _check_buffer("TFObserver", buffer)

    @property
    def buffer(self) -> ReplayBuffer:
        """The buffer this observer adds to."""
        return self._buffer

    @tf.autograph.experimental.do_not_convert
    def __call__(self, trajectory: Any) -> tf.Tensor:
        """Adds `trajectory` (a batched nest of tensors) and returns the stored ids.

        Raises:
          ValueError: If the trajectory's batch size is not the buffer's, or (from
            `add_batch`) a field does not match the buffer's spec.
          TypeError: If the structure does not match the buffer's spec.
        """
        leaves = tf.nest.flatten(trajectory)
        if leaves:
            shape = tf.TensorShape(getattr(leaves[0], "shape", np.shape(leaves[0])))
            _check_batch_size("TFObserver", self._buffer, shape[0] if shape.rank else None)
            fields = self._buffer.fields
            if fields and shape.rank is not None and shape.rank == fields[0][1].shape.rank + 2:
                return self._buffer.extend(trajectory)  # a block of T steps per environment, [B, T, ...]
        return self._buffer.add_batch(trajectory)


class PyObserver:
    """Adds the trajectories of a `PyDriver` or `Actor` to a buffer, batched or not.

    A trajectory whose leaves have the rank of the buffer's spec comes from one
    environment and gets a batch dimension of 1; one with an extra leading
    dimension comes from a batched environment and is added as it is; one with
    two, `[batch_size, T, ...]`, is a block of `T` steps, added by `extend`.
    """

    def __init__(self, buffer: Any) -> None:
        """Observes into `buffer`: any tfbuffers buffer, or a `RayWriter` (`RayReplayBuffer.writer(num_envs)`).

        A writer adds to the segments it claimed, one per environment; an actor process observes into
        its own writer while others add to theirs.

        Raises:
          TypeError: If `buffer` is neither.
        """
        ray_module = sys.modules.get("tfbuffers.remote.ray.writer")  # a RayWriter exists only once it is imported
        self._writer = ray_module is not None and isinstance(buffer, ray_module.RayWriter)
        if not self._writer and not isinstance(buffer, ReplayBuffer):
            raise TypeError(NOT_A_BUFFER_OR_WRITER.format(observer="PyObserver", received=type(buffer).__name__))
        self._buffer = buffer
        self._first_field = buffer.fields[0] if buffer.fields else None
        self._pack = specs.packer(specs.unwrap(buffer.data_spec))

    @property
    def buffer(self) -> Any:
        """The buffer (or `RayWriter`) this observer adds to."""
        return self._buffer

    def __call__(self, trajectory: Any) -> None:
        """Adds `trajectory`, adding a batch dimension when it has none.

        Raises:
          ValueError: If the batch size is not the buffer's, the rank fits
            neither form, or (from `add_batch`) a field does not match the spec.
          TypeError: If the structure does not match the buffer's spec.
        """
        if self._first_field is None:
            self._buffer.add_batch(trajectory)
            return
        spec = self._buffer.data_spec
        leaves = specs.flatten_like(trajectory, spec)
        path, field_spec = self._first_field
        rank = np.ndim(leaves[0])
        if rank == field_spec.shape.rank:
            # Python values stay Python (in a list) so that add_batch converts them by the spec's dtype.
            leaves = [x[None] if isinstance(x, np.ndarray | np.generic) or tf.is_tensor(x) else [x] for x in leaves]
            trajectory = self._pack(leaves)
            batch_size = 1
        elif rank in (field_spec.shape.rank + 1, field_spec.shape.rank + 2):
            batch_size = int(np.shape(leaves[0])[0])
        else:
            raise ValueError(
                UNKNOWN_RANK.format(
                    observer="PyObserver",
                    path=path,
                    unbatched=field_spec.shape.rank,
                    batched=field_spec.shape.rank + 1,
                    block=field_spec.shape.rank + 2,
                    received=rank,
                )
            )
        if self._writer and batch_size != self._buffer.batch_size:
            raise ValueError(
                WRONG_WRITER_SIZE.format(observer="PyObserver", received=batch_size, expected=self._buffer.batch_size)
            )
        _check_batch_size("PyObserver", self._buffer, batch_size)
        if rank == field_spec.shape.rank + 2:  # a block of T steps per environment: one write
            self._buffer.extend(trajectory)
        else:
            self._buffer.add_batch(trajectory)
