"""Flashbax's trajectory buffers, measured for `scripts/benchmark.py` in their own process and environment.

Run by the benchmark with the interpreter of the Flashbax environment (JAX on the CPU;
`scripts/benchmark.py --flashbax-setup` makes it from `scripts/flashbax-requirements.txt`),
never imported beside TensorFlow. It reads one JSON workload on stdin and prints one JSON
object of rates: frames per second of each run, for each measure and system.

The buffers are laid out as the benchmark's own: `add_batch_size` environments, a time
axis of `frames / environments`, windows (`sample_sequence_length`) of `num_steps`
consecutive frames with period 1. `make_trajectory_buffer` is the uniform one;
`make_prioritised_trajectory_buffer` (priority exponent 0.6, as the others) is sampled
and given new priorities with `set_priorities`. Every call is jitted, as Flashbax's
documentation has it, and waited for (`block_until_ready`), so the time is the work's.
"""

from __future__ import annotations

import sys
from typing import Any

import _peer_runs
import jax
import jax.numpy as jnp
import numpy as np

FILL_CHUNK = 1_000  # time steps per add while filling


def _leaves(fields: list[dict[str, Any]], batch: int, steps: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    out = {}
    for field in fields:
        shape = [batch, steps, *field["shape"]]
        dtype = np.dtype(field["dtype"])
        values = rng.integers(0, 255, shape) if dtype.kind in "iu" else rng.standard_normal(shape)
        out[field["name"]] = jnp.asarray(values.astype(dtype))
    return out


def measure(workload: dict[str, Any]) -> dict[str, dict[str, list[float]]]:
    """Frames per second of each run of each measure: `add_eager`, `get_next`, `sample_update`, by system."""
    import flashbax

    envs, batch, steps = workload["num_envs"], workload["sample_batch_size"], workload["num_steps"]
    length = workload["frames"] // envs
    common = dict(
        add_batch_size=envs,
        sample_batch_size=batch,
        sample_sequence_length=steps,
        period=1,
        min_length_time_axis=steps,
        max_length_time_axis=length,
    )
    buffers = {
        "Flashbax uniform": flashbax.make_trajectory_buffer(**common),
        "Flashbax prioritized": flashbax.make_prioritised_trajectory_buffer(**common, priority_exponent=0.6),
    }
    one_step = _leaves(workload["fields"], envs, 1, seed=1)
    chunk = _leaves(workload["fields"], envs, FILL_CHUNK, seed=2)
    first = jax.tree_util.tree_map(lambda leaf: leaf[0, 0], one_step)
    priorities = jnp.asarray(np.random.default_rng(0).uniform(0.1, 2.0, batch))
    keys = jax.random.split(jax.random.PRNGKey(0), workload["calls"])
    setup = {"first": first, "chunk": chunk, "one_step": one_step, "priorities": priorities, "keys": keys}
    return {name: _rates(buffer, setup, length, workload) for name, buffer in buffers.items()}


def _rates(buffer: Any, setup: dict[str, Any], length: int, workload: dict[str, Any]) -> dict[str, list[float]]:
    """One buffer filled, then each measure's frames per second in each of `repetitions` runs."""
    calls, frames = workload["calls"], workload["sample_batch_size"] * workload["num_steps"]
    add = jax.jit(buffer.add, donate_argnums=0)
    sample = jax.jit(buffer.sample)
    state = buffer.init(setup["first"])
    for _ in range(-(-length // FILL_CHUNK)):
        state = add(state, setup["chunk"])
    holder = {"state": jax.block_until_ready(state)}
    keys, one_step = setup["keys"], setup["one_step"]

    def adds(count: int) -> None:
        for _ in range(count):
            holder["state"] = add(holder["state"], one_step)
        jax.block_until_ready(holder["state"])

    def samples(count: int) -> None:
        drawn = None
        for i in range(count):
            drawn = sample(holder["state"], keys[i])
        jax.block_until_ready(drawn)

    measures: list[_peer_runs.Measure] = [("add_eager", adds, workload["num_envs"]), ("get_next", samples, frames)]
    if hasattr(buffer, "set_priorities"):
        set_priorities = jax.jit(buffer.set_priorities, donate_argnums=0)

        def sample_updates(count: int) -> None:
            for i in range(count):
                drawn = sample(holder["state"], keys[i])
                holder["state"] = set_priorities(holder["state"], drawn.indices, setup["priorities"])
            jax.block_until_ready(holder["state"])

        measures.append(("sample_update", sample_updates, frames))
    # Two warm-ups of two calls: each call compiled, for the states every other call leaves.
    return _peer_runs.rates(measures, calls, workload["repetitions"], warm_ups=2, warm_up_calls=2)


def main() -> int:
    return _peer_runs.print_result({"jax": jax.__version__}, measure(_peer_runs.read_workload()))


if __name__ == "__main__":
    sys.exit(main())
