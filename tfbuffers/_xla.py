"""Whether the graph being traced is compiled by XLA, and what a TF buffer's graph does differently then.

`tf.function(jit_compile=True)` (and every function it calls) compiles to one XLA program: static shapes,
numeric types only, and nothing that fails when it runs (XLA compiles `tf.debugging.Assert` to nothing). A TF
buffer traced there keeps every check it can make when traced (a batch's structure, dtypes and shapes, which XLA
knows in full) and turns the checks only the running graph can make into results:

* a sample that the graph would refuse (an empty buffer, fewer than `num_steps` frames per segment, no window
  within an episode or every window at priority 0, or a read torn by a writer outside XLA) returns ids -1,
  probabilities 0 and zeros for its items (`INVALID_ID`): a batch whose probabilities are all 0 is not a sample;
* `update_priorities` with a priority negative or not finite, or an id never stored, changes no priority and
  returns -1 (not its count of updates skipped).

Episode-aware samples take the pass over the step types, of static shapes, rather than the record of episode
ends' draws (as many as the running graph keeps); a prioritized sample of windows leaves the newest frames out
by the masked descent of the sum tree rather than by redrawing. Both give the plain graph's probabilities.

TensorFlow runs a compiled program holding the locks of the variables it reads and writes: compiled programs
never interleave with each other, nor with any op of a reader elsewhere (whose lock-free reads check it as they
check any writer). A compiled write does not try the writers' lock (XLA has no atomic count, and a branch on
the lock loses the order of the program's later reads, `Concurrency.compiled_exclusive`): it must not run while
another thread writes the same buffer outside XLA.
"""

from __future__ import annotations

import tensorflow as tf

INVALID_ID = -1
"""The ids a compiled sample or write returns where the running graph would have raised."""


def compiling() -> bool:
    """Whether the graph being traced is compiled by XLA: inside `tf.function(jit_compile=True)`, or a call of it."""
    if tf.executing_eagerly():
        return False
    # TensorFlow exports no reader of it: a jit-compiled function traces its body under an XLA control-flow
    # context, which nested functions' graphs see through their outer graphs (TensorFlow's own gradients and
    # conds ask it so). Where a TensorFlow lacks it, nothing is compiled differently and XLA names what it
    # cannot compile.
    try:
        from tensorflow.python.ops import control_flow_util  # noqa: PLC0415
    except ImportError:  # pragma: no cover - present from TensorFlow 2.0 to the newest tested
        return False
    return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))
