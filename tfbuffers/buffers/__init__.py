"""What the segmented buffers (`TFUniformReplayBuffer`, `PyUniformReplayBuffer`) are built on.

- `_segmented`: `SegmentedReplayBuffer`, the options, the sampler's wiring and random access.
- `_segmented_states`: states, row sources and sinks, files and configurations of a segmented buffer.
- `_datasets`: the `tf.data` pipelines: sampled, the deterministic pass, shuffled epochs.

The buffers themselves stay where TF-Agents users import them (`tfbuffers.tf_uniform_replay_buffer`, ...).
"""
