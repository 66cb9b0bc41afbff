"""Peers measured in a process of their own environment: Flashbax (JAX) and TorchRL (PyTorch), on the CPU.

Neither can be imported beside TensorFlow, so each has a virtual environment made from its requirements
file and a script (`scripts/_<key>_peer.py`) that its interpreter runs: it reads the workload as one JSON
object on stdin and prints one JSON line (`scripts/_peer_runs.py`): the versions it ran on, its resident
high-water mark (`resident_peak_bytes`) and `"rates"`, frames per second of each run by system and measure
(the benchmark's measure names).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys
from typing import Any

from _bench.measure import BLOCK_FRAMES, SCRIPTS
from _bench.names import OwnEnvPeer
from _bench.workloads import Workload
from tfbuffers import specs


def requirements(peer: OwnEnvPeer) -> pathlib.Path:
    """The pinned requirements `peer`'s environment is made from."""
    return SCRIPTS / f"{peer.key}-requirements.txt"


def peer_python(peer: OwnEnvPeer, env: pathlib.Path, setup: bool) -> tuple[pathlib.Path | None, str]:
    """The interpreter of `peer`'s environment `env`, made first if `setup`; or None and why it is left out."""
    python = env / "bin" / "python"
    if not python.exists() and setup:
        print(f"Creating the {peer.name} environment {env} from {requirements(peer).name} (a few minutes) ...")
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-r", str(requirements(peer))], check=True)
        for script in peer.build:
            subprocess.run([str(python), str(SCRIPTS / script)], check=True)
    if not python.exists():
        return None, f"needs its own environment {env}, not made here (--{peer.key}-setup makes it)"
    found = subprocess.run([str(python), "-c", f"import {peer.module}"], capture_output=True, text=True)
    if found.returncode:
        return None, f"{peer.module} does not import in {env}: {found.stderr.strip().splitlines()[-1]}"
    return python, ""


def peer_rates(
    peer: OwnEnvPeer, python: pathlib.Path, workload: Workload, systems: list[str], repetitions: int, quick: bool
) -> dict[str, Any]:
    """`systems` of `peer` measured on `workload` by its script under `python`: its versions, and rates by system."""
    fields = [
        {"name": field.path, "shape": field.spec.shape.as_list(), "dtype": field.spec.dtype.name}
        for field in specs.flatten_spec(workload.spec)
    ]
    request = dataclasses.asdict(workload) | {"fields": fields, "repetitions": repetitions, "systems": systems}
    request |= {"calls": peer.calls // 10 if quick else peer.calls, "block_frames": BLOCK_FRAMES}
    for key in ("observation", "action"):
        del request[key]
    done = subprocess.run(
        [str(python), str(SCRIPTS / f"_{peer.key}_peer.py")],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        env={**os.environ, **dict(peer.environ)},
    )
    if done.returncode:
        raise RuntimeError(f"the {peer.name} process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
