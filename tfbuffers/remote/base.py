"""`RemoteReplayBuffer`: the base of the buffers whose frames live in another process (a Reverb server, a Ray actor)."""

from __future__ import annotations

from tfbuffers.replay_buffer import ReplayBuffer


class RemoteReplayBuffer(ReplayBuffer):
    """A replay buffer whose table lives in another process, reached through a handle.

    Such a buffer is sampled by its host (the server or the actor draws, by the `sampler` named when it was
    made), its `BufferInfo.ids` are its host's keys, and its `as_dataset(num_steps=...)` yields one window
    at a time, so several of them mix window by window (`tfbuffers.sharded_dataset`).
    """
