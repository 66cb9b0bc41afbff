"""Fill a starter buffer from a baseline policy and save it for training runs to start from.

Runs --num-runs runs of --steps-per-run driver steps each (the environment is
reset at the start of every run) with a random or a scripted policy, adds them to
a tfbuffers buffer through a driver observer, and saves the buffer as one
crash-safe file, --output-dir/--buffer-name/buffer.safetensors, whose header holds
the layout and the run's metadata (policy, environment, runs, frames collected,
seed). `train_dqn.py --starter-buffer DIR` starts from it.

With --reverb the buffer is a `tfbuffers.ReplayBufferManager`'s instead: windows of 2
frames on an embedded Reverb server, checkpointed into --output-dir/--buffer-name, which
`ReplayBufferManager(spec, capacity, DIR).load_replay_buffer()` restores (dm-reverb: the
pinned stack only).

    python scripts/populate_starter_buffer.py --buffer-name cartpole-scripted --policy scripted --num-runs 10
    python scripts/populate_starter_buffer.py --buffer-name cartpole-reverb --reverb
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import _args  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = _args.new_parser(__doc__)
    parser.add_argument(
        "--buffer-name",
        required=True,
        type=_args.plain_name,
        help="name of the buffer's directory under --output-dir (no '/')",
    )
    parser.add_argument(
        "--capacity", type=_args.positive_int, default=50_000, help="frames the buffer holds (all segments)"
    )
    parser.add_argument(
        "--steps-per-run", type=_args.positive_int, default=500, help="driver steps per run (per environment)"
    )
    parser.add_argument("--num-runs", type=_args.positive_int, default=10, help="runs, each from a reset environment")
    parser.add_argument("--env", default="CartPole-v1", help="gymnasium environment id")
    parser.add_argument("--policy", default="random", choices=["random", "scripted"], help="baseline policy")
    parser.add_argument("--buffer", default="tf_uniform", choices=list(_args.BUFFER_KINDS), help="buffer kind")
    parser.add_argument(
        "--num-envs", type=_args.positive_int, default=1, help="parallel environments (buffer segments)"
    )
    parser.add_argument("--output-dir", default="out/starter", help="directory that holds starter buffers")
    parser.add_argument("--seed", type=int, default=0, help="seed of TF and the environments")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing buffer of the same name")
    parser.add_argument(
        "--reverb",
        action="store_true",
        help="fill a ReplayBufferManager's Reverb buffer (windows of 2 frames, --capacity items) and checkpoint "
        "it into --output-dir/--buffer-name (needs dm-reverb: the pinned stack)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked (nothing here imports TensorFlow)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.capacity < args.num_envs:
        parser.error(f"argument --capacity: expected at least --num-envs={args.num_envs}, got {args.capacity}")
    if args.reverb and importlib.util.find_spec("reverb") is None:
        parser.error(
            "argument --reverb: dm-reverb cannot be imported here; it installs on Python 3.11 (the pinned stack)"
        )
    return args


if __name__ == "__main__":
    parse_args()  # --help and bad arguments answered before TensorFlow is imported

import _quiet  # noqa: E402, F401 (first: TensorFlow imported with its known start-up notices filtered)

# isort: split
import _common  # noqa: E402
import tensorflow as tf  # noqa: E402
from tf_agents.policies import random_tf_policy, tf_policy  # noqa: E402
from tf_agents.trajectories import policy_step  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

import tfbuffers  # noqa: E402
from tfbuffers.collect import warm  # noqa: E402
from tfbuffers.envs import load_gymnasium  # noqa: E402

EXISTS = "{path} already holds a buffer named {name!r}; pass --overwrite to replace it"


class ScriptedCartPolePolicy(tf_policy.TFPolicy):
    """Pushes the cart towards where the pole falls: a baseline that balances for a while."""

    def _action(self, time_step: Any, policy_state: Any, seed: Any) -> policy_step.PolicyStep:
        observation = time_step.observation
        falling_right = observation[..., 2] + 0.5 * observation[..., 3] > 0
        action = tf.cast(falling_right, self.action_spec.dtype)
        return policy_step.PolicyStep(action, policy_state, ())


def make_policy(name: str, env: Any) -> Any:
    """The baseline policy `name` ('random' or 'scripted') for `env`."""
    if name == "random":
        return random_tf_policy.RandomTFPolicy(env.time_step_spec(), env.action_spec())
    if name == "scripted":
        observation_shape = env.observation_spec().shape.as_list()
        if observation_shape != [4]:
            raise ValueError(f"policy: 'scripted' is for CartPole observations of shape [4], got {observation_shape}")
        return ScriptedCartPolePolicy(env.time_step_spec(), env.action_spec())
    raise ValueError(f"policy: expected 'random' or 'scripted', got {name!r}")


def populate(
    *,
    buffer_name: str,
    capacity: int,
    steps_per_run: int,
    num_runs: int,
    env_id: str = "CartPole-v1",
    policy_name: str = "random",
    buffer_kind: str = "tf_uniform",
    num_envs: int = 1,
    output_dir: str = "out/starter",
    seed: int = 0,
    overwrite: bool = False,
    progress: bool = True,
    reverb: bool = False,
) -> tuple[pathlib.Path, dict[str, Any]]:
    """Fills and saves a starter buffer; returns its directory and metadata.

    With `reverb`, the buffer is a `ReplayBufferManager`'s (windows of 2 frames on an embedded
    Reverb server, `capacity` items), checkpointed into the directory; `buffer_kind` is ignored.

    Raises:
      FileExistsError: If a buffer of that name exists and `overwrite` is False.
    """
    directory = pathlib.Path(output_dir) / buffer_name
    if (directory / _common.FILE).exists() and not overwrite:
        raise FileExistsError(EXISTS.format(path=output_dir, name=buffer_name))
    tf.random.set_seed(seed)
    env = load_gymnasium(env_id, num_envs=num_envs, seed=seed, tf_environment=True)
    policy = make_policy(policy_name, env)
    if reverb:
        return _populate_reverb(directory, capacity, steps_per_run, num_runs, env, policy, overwrite, progress)
    buffer = _common.make_buffer(buffer_kind, policy.trajectory_spec, num_envs, max(capacity // num_envs, 2))
    frames = 0
    with tqdm(total=steps_per_run * num_runs * num_envs, unit="frame", desc=buffer_name, disable=not progress) as bar:
        for _ in range(num_runs):
            frames += warm(buffer, env, policy, steps_per_run * num_envs, reset=True, progress=bar)
    metadata = {
        "buffer_name": buffer_name,
        "buffer": buffer_kind,
        "env": env_id,
        "policy": policy_name,
        "steps_per_run": steps_per_run,
        "num_runs": num_runs,
        "frames_collected": frames,
        "seed": seed,
    }
    _common.save_starter_buffer(buffer, directory, metadata)
    return directory, _common.read_starter_metadata(directory)


def _populate_reverb(
    directory: pathlib.Path,
    capacity: int,
    steps_per_run: int,
    num_runs: int,
    env: Any,
    policy: Any,
    overwrite: bool,
    progress: bool,
) -> tuple[pathlib.Path, dict[str, Any]]:
    manager = tfbuffers.ReplayBufferManager(
        policy.trajectory_spec, capacity, directory, sequence_length=2, batch_size=env.batch_size, use_reverb=True
    )
    with manager:
        buffer, _ = manager.create_replay_buffer(overwrite=overwrite)
        frames = 0
        with tqdm(total=steps_per_run * num_runs * env.batch_size, unit="frame", disable=not progress) as bar:
            for _ in range(num_runs):
                frames += warm(buffer, env, policy, steps_per_run * env.batch_size, reset=True, progress=bar)
        items = int(manager.num_frames())
        checkpoint = manager.checkpoint()
    return directory, {"frames_collected": frames, "items": items, "checkpoint": checkpoint}


def main(argv: list[str] | None = None) -> int:
    """Parses the command line, populates, saves and prints where."""
    args = parse_args(argv)
    try:
        directory, metadata = populate(
            buffer_name=args.buffer_name,
            capacity=args.capacity,
            steps_per_run=args.steps_per_run,
            num_runs=args.num_runs,
            env_id=args.env,
            policy_name=args.policy,
            buffer_kind=args.buffer,
            num_envs=args.num_envs,
            output_dir=args.output_dir,
            seed=args.seed,
            overwrite=args.overwrite,
            progress=not args.no_progress,
            reverb=args.reverb,
        )
    except FileExistsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.reverb:
        print(
            f"Checkpointed {metadata['items']} items (windows of 2 frames; {metadata['frames_collected']} frames "
            f"collected by the {args.policy} policy in {args.num_runs} runs) to {directory}. Load it: "
            f"tfbuffers.ReplayBufferManager(spec, {args.capacity}, {str(directory)!r}, "
            f"batch_size={args.num_envs}).load_replay_buffer()"
        )
        return 0
    print(
        f"Saved {metadata['frames']} frames ({metadata['frames_collected']} collected by the {args.policy} policy "
        f"in {args.num_runs} runs) to {directory}. Train from it: "
        f"python scripts/train_dqn.py --starter-buffer {directory}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
