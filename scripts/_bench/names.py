"""The benchmark's names, known before TensorFlow is imported.

What `--systems`, `--workloads` and `--actor-backends` take, so that bad arguments and `--help` are answered at once.
"""

from __future__ import annotations

import dataclasses

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


@dataclasses.dataclass(frozen=True)
class OwnEnvPeer:
    """A peer measured in a process of its own environment (`_bench.own_env`): `scripts/_<key>_peer.py` run by it."""

    name: str
    key: str  # the script's, the requirements file's and the flags' name: `--<key>-env`, `--<key>-setup`
    runs_on: str  # what the environment holds, for --help
    module: str  # what must import there for the peer to run
    systems: tuple[str, ...]
    calls: int  # calls per timed run of each measure (quick: a tenth)
    build: tuple[str, ...] = ()  # scripts run by that interpreter after the requirements are installed
    builds: str = ""  # what they make, for --help
    environ: tuple[tuple[str, str], ...] = ()  # set for the peer's process


FLASHBAX = OwnEnvPeer(
    "Flashbax",
    "flashbax",
    "Flashbax (JAX)",
    "flashbax",
    ("Flashbax uniform", "Flashbax prioritized"),
    calls=200,
    environ=(("JAX_PLATFORMS", "cpu"),),
)
TORCHRL = OwnEnvPeer(
    "TorchRL",
    "torchrl",
    "TorchRL (PyTorch on the CPU)",
    "torchrl._torchrl",  # its C++ extension too: the prioritized sampler's sum tree
    ("TorchRL uniform", "TorchRL prioritized", "TorchRL memmap", "TorchRL slices"),
    calls=200,
    build=("_torchrl_extension.py",),
    builds="TorchRL's C++ extension",
    environ=(("RL_WARNINGS", "0"),),
)
OWN_ENV_PEERS = (FLASHBAX, TORCHRL)
"""The peers measured in processes of their own environment, not in this one."""
OUT_OF_PROCESS = tuple(name for peer in OWN_ENV_PEERS for name in peer.systems)
# The buffers actor processes add to (--actor-backends), each with the module it needs.
ACTOR_BACKENDS = {"tfbuffers Reverb": "reverb", "tfbuffers Ray": "ray"}
