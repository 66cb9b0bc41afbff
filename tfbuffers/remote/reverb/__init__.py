"""The Reverb-hosted buffer, one module per part.

The client (`ReverbReplayBuffer`, in `buffer`), its per-environment trajectory writers (`writers`), and the
server side (`server`: tables, rate limiters, servers started in process); `tfbuffers.reverb_replay_buffer` is
where users import them from. Each module imports dm-reverb only when a buffer or a server is made.
"""
