"""What the remote buffers share: the buffers hosted on a Reverb server or a Ray actor, and their options.

`tfbuffers.remote.base.RemoteReplayBuffer` is the base of `ReverbReplayBuffer` and `RayReplayBuffer`;
`tfbuffers.remote.options` checks the options they take alike (sampler names, rate limits);
`tfbuffers.remote.sharding.sharded_dataset` samples several of them through one dataset. Importing this
package imports neither Reverb nor Ray.
"""
