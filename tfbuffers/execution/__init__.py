"""Execution modes: how a buffer's calls run, in the graph or on the host.

- `host`: a host-side buffer's calls as graph ops (`tf.numpy_function`), and `HostExecution`, the host mode
  the py buffers, the Reverb buffer and the Ray buffer are made of. Users import it as `tfbuffers.execution.host` too.
- `_tf_concurrency`: the TF writers' lock and the bounded seqlock read (the graph mode's concurrency).
- `_graph_calls`: a TF buffer's eager calls through its `tf.function`s, made once each.
- `_graph_reads`: a TF buffer's reads, compiled once, that a torn read reads again.
- `_states`: snapshots, restores and clears over either mode's primitives (`States`, `GraphStates`,
  `HostStates`).
"""
