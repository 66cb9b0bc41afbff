"""Where a buffer's frames live: the storage interfaces, and the storages tfbuffers has.

A buffer of `batch_size` segments of `max_length` frames stores them in `num_rows = batch_size *
max_length` rows per field of its data spec, time-major: add number `t` writes one row per segment,
rows `(t % max_length) * batch_size + segment`, each field's into that field's rows.

    row:        0     1     2     3     4     5        (batch_size 2, max_length 3)
    add t=0:   s0    s1                                 rows 0-1
    add t=1:               s0    s1                     rows 2-3
    add t=2:                           s0    s1         rows 4-5
    add t=3:   s0    s1                                 rows 0-1 again: the oldest frames go

A storage keeps those rows, `added`, the number of adds since the last clear (which fixes which
rows hold which frames: `tfbuffers._ring`), and the buffer's named extras: arrays it keeps beside
the rows and changes with them (a prioritized buffer's `"priority"`, `"max_priority"` and
`"sum_tree"`, an episode-aware buffer's `"episodes/distance"`, `"episodes/near"` and
`"episodes/last_end"`), which the buffer asks the storage for once with `extra(name, initial)`. So a
storage that keeps its rows somewhere (a file on disk) keeps everything the buffer holds there too.
The buffer picks the rows (ring arithmetic is the buffer's; the record of episode ends and the
priorities are its sampler's state, `tfbuffers.sampling.Sampler.bind`) and takes its lock around
every call; states, checkpoints and files carry the rows, the counter and the extras whatever the
storage.

Two interfaces, one per way a buffer runs, one module each:

* `Storage` (`tfbuffers.storage.base`), numpy on the host, for the py buffers (`PyUniformReplayBuffer`,
  `PyPrioritizedReplayBuffer`), which take any: `storage=` a callable `(fields, num_rows) -> Storage`.
  tfbuffers has numpy arrays in RAM (`NumpyTable`, the default: `tables`) and memory-mapped files
  (`storage=tfbuffers.storage.memmap.MemmapStorage(directory)`, or `directory=` for short); frame stacks
  (`FrameStackTable`, made by `frame_stacks=`: `frame_stacks`) wrap any of them, the stacks kept as handles
  among its rows and each distinct frame once, in the storage's `pool` (a sparse file beside memory-mapped
  rows) or in RAM. A new one (files on disk, another process) implements the three abstract methods; the
  contract, files, state and fuzz tests run on it through one entry in the test registry. A storage that
  outlives its buffer uses two hooks: `attach` (the buffer's segments) and `ready` (the buffer built: a
  `Recovery`), and keeps the frame stacks' frames with its rows by `pool`.
* `GraphStorage` (`tfbuffers.storage.graph`), in the graph, for the TF buffers (`TFUniformReplayBuffer`,
  `TFPrioritizedReplayBuffer`), which take any: `storage=` a callable `(fields, num_rows, device) ->
  GraphStorage`, its reads and writes ops. tfbuffers has one `tf.Variable` per field
  (`VariableStorage`, the default); a new one implements three abstract methods too.

>>> import numpy as np, tensorflow as tf
>>> from tfbuffers import PyUniformReplayBuffer, TFUniformReplayBuffer
>>> spec = {"x": tf.TensorSpec([], tf.int64)}
>>> buffer = PyUniformReplayBuffer(spec, batch_size=2, max_length=3, storage=NumpyTable)
>>> _ = buffer.add_batch({"x": np.array([7, 8])})
>>> buffer.gather_all()["x"].tolist()
[[7], [8]]
>>> buffer = TFUniformReplayBuffer(spec, batch_size=2, max_length=3, storage=VariableStorage)
>>> _ = buffer.add_batch({"x": tf.constant([7, 8], tf.int64)})
>>> buffer.gather_all()["x"].numpy().tolist(), buffer.storage.device
([[7], [8]], 'cpu:*')
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tfbuffers._factories import made
from tfbuffers.specs import Field
from tfbuffers.storage.base import Recovery, Storage, StorageFactory
from tfbuffers.storage.frame_stacks import (
    FRAME_STACK_AXIS,
    FRAME_STACKS,
    FrameStackTable,
    frame_stack_axes,
    handle_fields,
)
from tfbuffers.storage.graph import GraphStorage, GraphStorageFactory, VariableStorage
from tfbuffers.storage.tables import NumpyTable

__all__ = [
    "FRAME_STACKS",
    "FRAME_STACK_AXIS",
    "NOT_A_GRAPH_STORAGE",
    "NOT_A_STORAGE",
    "STORAGE_AND_STACKS",
    "Recovery",
    "FrameStackTable",
    "GraphStorage",
    "GraphStorageFactory",
    "NumpyTable",
    "Storage",
    "StorageFactory",
    "VariableStorage",
    "frame_stack_axes",
    "handle_fields",
    "make",
    "make_graph",
]

NOT_A_STORAGE = "storage: expected a callable (fields, num_rows) -> tfbuffers.storage.Storage, got {received}"
NOT_A_GRAPH_STORAGE = (
    "storage: expected a callable (fields, num_rows, device) -> tfbuffers.storage.GraphStorage, got {received}"
)
# No longer raised: frame stacks wrap any storage (issue 49); kept, as every public name is.
STORAGE_AND_STACKS = "storage: expected None with frame_stacks (frame stacks are a storage of their own), got both"


def make(storage: StorageFactory | None, fields: Sequence[Field], num_rows: int, frame_stacks: Any = None) -> Storage:
    """The storage of a py buffer's `storage=` and `frame_stacks=` (see `PyUniformReplayBuffer`), checked.

    With both, the stacks wrap the storage (`FrameStackTable`), which `storage=` makes for their handle fields.

    Raises:
      TypeError, ValueError: Naming the option, if either is not what the py buffers take.
    """
    stacks = frame_stack_axes(fields, frame_stacks)
    if getattr(storage, "stores_frame_stacks_whole", False):
        stacks = {}  # checked above; a directory written before frame stacks composed keeps the stacks whole
    inner = handle_fields(fields, stacks)  # the fields the storage holds: handles in place of stacks
    if storage is None:
        table: Storage = NumpyTable(inner, num_rows)
    else:
        table = made(storage, (inner, num_rows), Storage, NOT_A_STORAGE)
    return FrameStackTable(fields, num_rows, stacks, table) if stacks else table


def make_graph(
    storage: GraphStorageFactory | None, fields: Sequence[Field], num_rows: int, device: str
) -> GraphStorage:
    """The storage of a TF buffer's `storage=` (see `TFUniformReplayBuffer`), made in the current scope, checked.

    Raises:
      TypeError: Naming the option, if it is not a callable that makes a `GraphStorage`.
    """
    if storage is None:
        return VariableStorage(fields, num_rows, device)
    return made(storage, (fields, num_rows, device), GraphStorage, NOT_A_GRAPH_STORAGE)
