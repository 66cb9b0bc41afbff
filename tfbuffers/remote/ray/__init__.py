"""The Ray-hosted buffer, one module per part.

The cluster, the rate limiter, the actor, the writer, the manifest, and the client (`RayReplayBuffer`);
`tfbuffers.ray_replay_buffer` is where users import them from.
"""
