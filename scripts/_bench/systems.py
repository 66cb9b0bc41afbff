"""Every system the benchmark measures, in the tables' order, and which of them this environment can run."""

from __future__ import annotations

import importlib.metadata
import importlib.util

from _bench import limits, ours, peers
from _bench.measure import System
from _bench.names import SYSTEM_NAMES

MEASURES = {
    "add_eager": "add, eager call per step (frames/s)",
    "add_graph": "add, inside one tf.function loop (frames/s)",
    "add_block": "add, a block of 1,024 frames in one call (frames/s; one add per frame where there is no block add)",
    "sample_dataset": "sample, as_dataset + prefetch (frames/s)",
    "sample_dataset_graph": "sample, as_dataset consumed in a tf.function loop (frames/s)",
    "get_next": "sample, direct get_next (frames/s)",
    "sample_update": "sample + update_priorities, direct (frames/s)",
    "deterministic_pass": "deterministic pass (frames/s)",
    "save": "save (MB/s)",
    "load": "load (MB/s)",
}
OURS = {
    "tfbuffers TF": "TF-Agents TF",
    "tfbuffers py": "TF-Agents py",
    "tfbuffers TF prioritized": "tfbuffers TF",  # what prioritizing costs, against the uniform buffer
    "tfbuffers py prioritized": "cpprb PER",
    "tfbuffers Reverb": "TF-Agents Reverb",
    # What each option costs, against the same buffer without it.
    "tfbuffers TF episodes": "tfbuffers TF",
    "tfbuffers py episodes": "tfbuffers py",
    "tfbuffers TF prioritized episodes": "tfbuffers TF prioritized",
    "tfbuffers py prioritized episodes": "tfbuffers py prioritized",
    "tfbuffers py frame stacks": "tfbuffers py",
    "tfbuffers py memmap": "tfbuffers py",  # memory-mapped files against the same buffer in RAM
    "tfbuffers py prioritized memmap": "tfbuffers py prioritized",
    "tfbuffers py frame stacks memmap": "tfbuffers py frame stacks",  # the stacks over files, against in RAM
}
# The references each of ours is also compared with: peers, and limits that store or check nothing.
REFERENCES = {
    "tfbuffers TF": ("TF-Agents Reverb", "numpy limit", "bare tf.Variable", "tf.data ceiling", "Flashbax uniform"),
    "tfbuffers py": (
        "TF-Agents Reverb",
        "cpprb uniform",
        "numpy limit",
        "tf.data ceiling",
        "Flashbax uniform",
        "TorchRL uniform",
    ),
    "tfbuffers TF prioritized": ("TF-Agents TF", "cpprb PER", "Flashbax prioritized"),
    "tfbuffers py prioritized": ("tfbuffers py", "cpprb uniform", "Flashbax prioritized", "TorchRL prioritized"),
    "tfbuffers Reverb": ("tfbuffers py",),
    "tfbuffers TF episodes": (),
    "tfbuffers py episodes": ("TorchRL slices",),  # windows within episodes, against TorchRL's slices
    "tfbuffers TF prioritized episodes": (),
    "tfbuffers py prioritized episodes": (),
    "tfbuffers py frame stacks": (),
    "tfbuffers py memmap": ("TorchRL memmap",),
    "tfbuffers py prioritized memmap": (),
    "tfbuffers py frame stacks memmap": (),
}


# tfbuffers' systems are generated from its kinds (`ours.KINDS`, `ours.VARIANTS`); the peers and limits are written
# out. All of them by name, in the tables' order (`names.SYSTEM_NAMES`).
_MEASURED: list[type[System]] = [
    *ours.KINDS,
    *ours.VARIANTS,
    ours.TFBuffersReverb,
    peers.TFAgentsTF,
    peers.TFAgentsPy,
    peers.TFAgentsReverb,
    peers.Cpprb,
    peers.CpprbPER,
    limits.NumpyLimit,
    limits.BareVariables,
    limits.TFDataCeiling,
]
_BY_NAME = {cls.name: cls for cls in _MEASURED}
SYSTEMS: list[type[System]] = [_BY_NAME[name] for name in SYSTEM_NAMES]


WHY_MISSING = {
    "reverb": " (dm-reverb has wheels for Python 3.11 and older only)",
    "cpprb": " (the 'all', 'current' and 'scripts' extras install it; cpprb 11.0 has wheels for Python 3.12 and older)",
}


def available_systems() -> tuple[list[type[System]], dict[str, str]]:
    """The systems this environment can run, and why each other one is left out."""
    kept: list[type[System]] = []
    left_out: dict[str, str] = {}
    for cls in SYSTEMS:
        missing = [module for module in cls.requires if importlib.util.find_spec(module) is None]
        if missing:
            why = WHY_MISSING.get(missing[0], "")
            left_out[cls.name] = f"needs {', '.join(missing)}, not installed here{why}"
        else:
            kept.append(cls)
    return kept, left_out
