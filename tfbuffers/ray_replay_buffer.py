"""`RayReplayBuffer`: a py buffer hosted by a Ray actor, shared by processes and machines.

The buffer's frames live in one Ray actor (`RayHost`): by default in one storage of `capacity`
frames that every segment's writers share, oldest frames out (`ElasticStore`, `layout="elastic"`),
or in `batch_size` rings of `max_length` frames, one per segment, each a `PyUniformReplayBuffer` or
`PyPrioritizedReplayBuffer` of one segment (in RAM, or memory-mapped under `directory`). Segments
fill on their own: a process that claims some (`RayReplayBuffer.writer`) adds to them at its own
pace, and one that dies stops only its own, until its claim's lease runs out and they are free
again (`Claims`). A writer dropped without `close()` hands its adds to the actor, which stores them
and frees its segments. A sample draws among every stream's windows (elastic), or each segment in
proportion to the weight of the windows it can draw (their count, or the sum of their priorities'
weights), then a window within it: the probabilities are exactly those of one buffer holding every
window.

Only the modules of `tfbuffers.remote.ray` import Ray (the `ray` extra), and only when a buffer is made or
connected: the cluster (`ensure_ray`), the rate limiter, the actor (`RayHost`), the writers' claims (`Claims`),
the writer (`RayWriter`), the manifest, the configuration (its arguments checked) and the client
(`RayReplayBuffer`, with its files and writers in `RayHosting`), each a module of its own;
this module is where they are imported from.
"""

from tfbuffers.remote.ray.actor import RayHost
from tfbuffers.remote.ray.claims import CLAIM_LOST, NOT_ENOUGH_SEGMENTS, Claims
from tfbuffers.remote.ray.client import RayReplayBuffer
from tfbuffers.remote.ray.cluster import NAMESPACE, ensure_ray, listening, private_token, ray_processes
from tfbuffers.remote.ray.config import WRITER_LEASE
from tfbuffers.remote.ray.elastic import LAYOUTS, ElasticStore
from tfbuffers.remote.ray.manifest import read_manifest, write_manifest
from tfbuffers.remote.ray.prefetch import PREFETCH_BYTES, PREFETCH_ITEMS, fetch_batches
from tfbuffers.remote.ray.rate_limiter import RateLimiter
from tfbuffers.remote.ray.writer import DROPPED, FLUSH_WAITED, WAITED, RayWriter

__all__ = [
    "CLAIM_LOST",
    "DROPPED",
    "LAYOUTS",
    "FLUSH_WAITED",
    "NAMESPACE",
    "NOT_ENOUGH_SEGMENTS",
    "PREFETCH_BYTES",
    "PREFETCH_ITEMS",
    "WAITED",
    "WRITER_LEASE",
    "Claims",
    "ElasticStore",
    "RateLimiter",
    "RayHost",
    "RayReplayBuffer",
    "RayWriter",
    "ensure_ray",
    "fetch_batches",
    "listening",
    "private_token",
    "ray_processes",
    "read_manifest",
    "write_manifest",
]
