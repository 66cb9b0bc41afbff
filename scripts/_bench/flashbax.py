"""Flashbax's buffers (JAX on the CPU), measured in a process of their own environment."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys
from typing import Any

from _bench.measure import SCRIPTS
from _bench.workloads import Workload
from tfbuffers import specs

FLASHBAX_REQUIREMENTS = SCRIPTS / "flashbax-requirements.txt"
FLASHBAX_CALLS = 200  # calls per timed run of each Flashbax measure (quick: a tenth)


def flashbax_python(env: pathlib.Path, setup: bool) -> tuple[pathlib.Path | None, str]:
    """The interpreter of the Flashbax environment `env`, made first if `setup`; or None and why it is left out."""
    python = env / "bin" / "python"
    if not python.exists() and setup:
        print(f"Creating the Flashbax environment {env} from {FLASHBAX_REQUIREMENTS.name} (a few minutes) ...")
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-r", str(FLASHBAX_REQUIREMENTS)], check=True)
    if not python.exists():
        return None, f"needs its own environment {env}, not made here (--flashbax-setup makes it)"
    found = subprocess.run([str(python), "-c", "import flashbax"], capture_output=True, text=True)
    if found.returncode:
        return None, f"flashbax does not import in {env}: {found.stderr.strip().splitlines()[-1]}"
    return python, ""


def flashbax_rates(python: pathlib.Path, workload: Workload, repetitions: int, quick: bool) -> dict[str, Any]:
    """Flashbax's buffers measured on `workload` by `scripts/_flashbax_peer.py` under `python`: rates by system."""
    fields = [
        {"name": field.path, "shape": field.spec.shape.as_list(), "dtype": field.spec.dtype.name}
        for field in specs.flatten_spec(workload.spec)
    ]
    request = dataclasses.asdict(workload) | {"fields": fields, "repetitions": repetitions}
    request |= {"calls": FLASHBAX_CALLS // 10 if quick else FLASHBAX_CALLS}
    for key in ("observation", "action"):
        del request[key]
    done = subprocess.run(
        [str(python), str(SCRIPTS / "_flashbax_peer.py")],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    if done.returncode:
        raise RuntimeError(f"the Flashbax process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
