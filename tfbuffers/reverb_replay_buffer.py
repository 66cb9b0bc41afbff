"""`ReverbReplayBuffer`: the tfbuffers API over one table of a DeepMind Reverb server.

Needs dm-reverb (the pinned stack: Python 3.11, `pip install tfbuffers[reverb]`); importing `tfbuffers` does not.

The buffer is made of the parts in `tfbuffers.remote.reverb`, a module each: the client
(`ReverbReplayBuffer`, `remote.reverb.buffer`), the per-environment trajectory writers that cut frames into
items (`remote.reverb.writers`), and the server side (`remote.reverb.server`: `make_table`,
`make_rate_limiter`, `start_server`, `served_sampler`); this module is where they are imported from.
"""

from tfbuffers.remote.options import SAMPLERS, check_ratio
from tfbuffers.remote.reverb.buffer import (
    EMPTY,
    NO_DETERMINISTIC_PASS,
    NO_GATHER_ALL,
    NOT_PRIORITIZED,
    OTHER_SAMPLER,
    STARTED,
    ReverbReplayBuffer,
)
from tfbuffers.remote.reverb.server import (
    CHECKPOINT_PROGRESS,
    NO_REVERB,
    NO_TABLE,
    OTHER_SIGNATURE,
    check_served_table,
    make_rate_limiter,
    make_table,
    served_sampler,
    start_server,
    table_signature,
)
from tfbuffers.remote.reverb.writers import (
    CLOSE_FLUSH_SECONDS,
    FIRST,
    LAST,
    MAX_PENDING_ITEMS,
    UNSENT_AT_CLOSE,
    EnvironmentWriters,
)
from tfbuffers.remote.sharding import sharded_dataset

__all__ = [
    "CHECKPOINT_PROGRESS",
    "CLOSE_FLUSH_SECONDS",
    "EMPTY",
    "FIRST",
    "LAST",
    "MAX_PENDING_ITEMS",
    "NOT_PRIORITIZED",
    "NO_DETERMINISTIC_PASS",
    "NO_GATHER_ALL",
    "NO_REVERB",
    "NO_TABLE",
    "OTHER_SAMPLER",
    "OTHER_SIGNATURE",
    "SAMPLERS",
    "STARTED",
    "UNSENT_AT_CLOSE",
    "EnvironmentWriters",
    "ReverbReplayBuffer",
    "check_ratio",
    "check_served_table",
    "make_rate_limiter",
    "make_table",
    "served_sampler",
    "sharded_dataset",
    "start_server",
    "table_signature",
]
