"""The benchmark's names, known before TensorFlow is imported.

What `--systems`, `--workloads` and `--actor-backends` take, so that bad arguments and `--help` are answered at once.
"""

from __future__ import annotations

SYSTEM_NAMES = (
    "tfbuffers TF", "TF-Agents TF", "tfbuffers py", "TF-Agents py", "tfbuffers TF prioritized",
    "tfbuffers py prioritized", "tfbuffers TF episodes", "tfbuffers py episodes",
    "tfbuffers TF prioritized episodes", "tfbuffers py prioritized episodes", "tfbuffers py frame stacks",
    "tfbuffers py memmap", "tfbuffers py prioritized memmap", "tfbuffers py frame stacks memmap",
    "cpprb uniform", "cpprb PER", "tfbuffers Reverb", "TF-Agents Reverb", "numpy limit", "bare tf.Variable",
    "tf.data ceiling",
)  # fmt: skip
"""Every system in the tables' order (`_bench.systems.SYSTEMS` holds their classes in it)."""

WORKLOAD_NAMES = ("control", "atari", "flashbax", "torchrl")
# Systems measured in processes of their own environment, not in this one (`_bench.own_env`), by peer.
FLASHBAX_SYSTEMS = ("Flashbax uniform", "Flashbax prioritized")
TORCHRL_SYSTEMS = ("TorchRL uniform", "TorchRL prioritized", "TorchRL memmap", "TorchRL slices")
OUT_OF_PROCESS = FLASHBAX_SYSTEMS + TORCHRL_SYSTEMS
# The buffers actor processes add to (--actor-backends), each with the module it needs.
ACTOR_BACKENDS = {"tfbuffers Reverb": "reverb", "tfbuffers Ray": "ray"}
