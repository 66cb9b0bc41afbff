"""Serve one tfbuffers replay buffer (a Reverb table, or a Ray-hosted buffer) to actors and learners elsewhere.

With --backend reverb (the default where dm-reverb imports: Python 3.11) the
table is the one `tfbuffers.ReverbReplayBuffer` makes (windows of
--sequence-length frames of the environment's TF-Agents trajectories, or of the
spec in --spec-file, FIFO
removal beyond --capacity items, uniform or prioritized sampling). Processes
reach it with `tfbuffers.ReverbReplayBuffer(spec, ..., address="HOST:PORT")`.

With --samples-per-insert, actors and learners are paced to about that many
samples per item once the table holds --min-size-to-sample items (Reverb's
SampleToInsertRatio): actors wait for a slow learner and the learner for slow
actors.

With --checkpoint-dir the server restores the newest checkpoint there when it
starts, checkpoints every --checkpoint-interval seconds, and once more when it
gets SIGTERM or SIGINT, then exits.

NO AUTHENTICATION: Reverb serves gRPC on every network interface of this
machine. Anyone who can reach --port can read, write and clear the buffer. Run
it on a private network, behind a firewall rule that admits only your actors and
learners, or reach it through an SSH tunnel (see docs/scaling.md).

    python scripts/replay_server.py --env CartPole-v1 --port 8000 --checkpoint-dir runs/replay

With --backend ray (the default elsewhere: Python 3.12+; the ray extra) the
server starts a local Ray cluster whose GCS listens on --port and, in it, a
`tfbuffers.RayReplayBuffer` named --table-name: --capacity frames shared by up
to --segments actor environments at a time (each actor claims its own with
`buffer.writer(num_envs)`; actors come and go, and the oldest frames go first,
whichever actor made them: the buffer's elastic layout), windows kept within
one actor environment's episodes, paced as above. Actors and learners reach it with
`tfbuffers.RayReplayBuffer.connect(NAME, address="HOST:PORT")` (scripts/collect.py
and scripts/train_dqn.py with --backend ray do); on another machine, join the
cluster first (`ray start --address HOST:PORT`). Its checkpoints under
--checkpoint-dir are `tfbuffers.ReplayBufferManager`'s: the newest restored at
start, the newest three kept; if the buffer's actor dies, Ray restarts it from
its own last checkpoint under --checkpoint-dir/ray (every 60 s). Ray's token
authentication is on: a process needs the cluster's token (~/.ray/auth_token) to
connect, but Ray's ports listen on every interface, listed at start: keep them
private (docs/scaling.md).

    python scripts/replay_server.py --backend ray --port 6379 --segments 4 --checkpoint-dir runs/replay

A spec file is what `tf_agents.specs.tensor_spec.to_pbtxt_file(path, agent.collect_data_spec)`
writes, or the policy_specs.pbtxt of a policy saved by TF-Agents' `PolicySaver`
(its collect_data_spec is used).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import threading
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import _args  # noqa: E402

RAY_SEGMENTS = 16
KEEP_CHECKPOINTS = 3  # with --backend ray


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = _args.new_parser(__doc__)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--env", default="CartPole-v1", help="gymnasium environment id: the frames' spec")
    source.add_argument("--spec-file", default=None, help="the frames' spec from a TF-Agents .pbtxt spec file")
    _args.add_backend(parser)
    parser.add_argument(
        "--port", type=_args.positive_int, required=True, help="TCP port to serve on (Ray: the cluster's GCS port)"
    )
    parser.add_argument(
        "--capacity", type=_args.positive_int, default=100_000, help="items the table holds (Ray: frames, in all)"
    )
    parser.add_argument(
        "--sequence-length",
        type=_args.positive_int,
        default=None,
        help="frames per item (Reverb; default 2). A Ray buffer holds frames: each learner picks its windows",
    )
    parser.add_argument(
        "--segments",
        type=_args.positive_int,
        default=None,
        help=f"Ray: the environments all actors may add from at once, sharing --capacity (default {RAY_SEGMENTS})",
    )
    parser.add_argument("--sampler", choices=_args.REVERB_SAMPLERS, default="uniform", help="how items are drawn")
    parser.add_argument(
        "--table-name", default="tfbuffers", type=_args.plain_name, help="the table's name (Ray: the buffer's)"
    )
    parser.add_argument(
        "--min-size-to-sample", type=_args.positive_int, default=1, help="items the table holds before sampling"
    )
    parser.add_argument(
        "--samples-per-insert",
        type=_args.positive_float,
        default=None,
        help="pace actors and learners to about this many samples per item (Reverb's SampleToInsertRatio; "
        "default: no pacing, Reverb's MinSize)",
    )
    parser.add_argument("--checkpoint-dir", default=None, help="restore from and checkpoint to this directory")
    parser.add_argument(
        "--checkpoint-interval",
        type=_args.positive_int,
        default=600,
        help="seconds between checkpoints (with --checkpoint-dir)",
    )
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked as far as it can be without TensorFlow (the spec file is read later)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.backend = _args.backend(parser, args)
    if args.backend == "ray":
        if args.sequence_length is not None:
            parser.error("argument --sequence-length: Reverb only (a Ray buffer holds frames; learners pick windows)")
        args.segments = args.segments or RAY_SEGMENTS
    else:
        if args.segments is not None:
            parser.error("argument --segments: Ray only (a Reverb table takes any number of actors)")
        args.sequence_length = args.sequence_length or 2
    return args


if __name__ == "__main__":
    parse_args()  # --help and bad arguments answered before TensorFlow is imported

import _quiet  # noqa: E402, F401 (first: TensorFlow imported with its known start-up notices filtered)

# isort: split
from tf_agents.policies import random_tf_policy  # noqa: E402

from tfbuffers.envs import load_gymnasium  # noqa: E402
from tfbuffers.reverb_replay_buffer import make_rate_limiter, make_table, start_server  # noqa: E402

NO_AUTHENTICATION = (
    "NO AUTHENTICATION: Reverb serves gRPC on every network interface; anyone who can reach port {port} can read, "
    "write and clear this buffer. Keep the port private (a private network, a firewall rule, an SSH tunnel)."
)


RAY_AUTHENTICATION = (
    "Ray's token authentication is on: a process needs this cluster's token (~/.ray/auth_token here) to connect, "
    "and one that has it can run any code on the cluster. Ray's ports listen on every interface (listed above): "
    "keep them private (a firewall rule, a private network)."
)


def spec_from_file(path: str) -> Any:
    """The frames' spec in a TF-Agents spec file (`tensor_spec.to_pbtxt_file`; a PolicySaver's policy_specs.pbtxt)."""
    from tf_agents.specs import tensor_spec

    spec = tensor_spec.from_pbtxt_file(path)
    if isinstance(spec, dict) and "collect_data_spec" in spec:
        spec = spec["collect_data_spec"]
    return spec


def trajectory_spec(env_id: str) -> Any:
    """The TF-Agents trajectory spec of a gymnasium environment (what its drivers and actors add)."""
    env = load_gymnasium(env_id, tf_environment=True)
    return random_tf_policy.RandomTFPolicy(env.time_step_spec(), env.action_spec()).trajectory_spec


def serve(args: argparse.Namespace, stop: threading.Event) -> int:
    """Serves until `stop` is set; checkpoints on the way and at the end. Returns the exit status."""
    spec = spec_from_file(args.spec_file) if args.spec_file else trajectory_spec(args.env)
    if args.backend == "ray":
        return serve_ray(args, spec, stop)
    import reverb

    rate_limiter = make_rate_limiter(args.min_size_to_sample, args.samples_per_insert)
    table = make_table(
        spec, args.sequence_length, args.table_name, args.capacity, args.sampler, rate_limiter=rate_limiter
    )
    checkpointer = None
    if args.checkpoint_dir is not None:
        pathlib.Path(args.checkpoint_dir).mkdir(parents=True, exist_ok=True)
        checkpointer = reverb.checkpointers.DefaultCheckpointer(args.checkpoint_dir)
    server = start_server([table], port=args.port, checkpointer=checkpointer)
    client = reverb.Client(f"localhost:{args.port}")
    items = client.server_info()[args.table_name].current_size
    print(f"serving table {args.table_name!r} on port {args.port} ({items} items restored)", flush=True)
    print(NO_AUTHENTICATION.format(port=args.port), file=sys.stderr, flush=True)
    last = time.monotonic()
    while not stop.wait(1.0):
        if checkpointer is not None and time.monotonic() - last >= args.checkpoint_interval:
            print(f"checkpoint: {client.checkpoint()}", flush=True)
            last = time.monotonic()
    if checkpointer is not None:
        items = client.server_info()[args.table_name].current_size
        print(f"final checkpoint of {items} items: {client.checkpoint()}", flush=True)
    server.stop()
    print("stopped", flush=True)
    return 0


def serve_ray(args: argparse.Namespace, spec: Any, stop: threading.Event) -> int:
    """`serve` with --backend ray: a RayReplayBuffer in a local cluster whose GCS is on --port."""
    import ray

    import tfbuffers

    os.environ["RAY_GCS_SERVER_PORT"] = str(args.port)  # read by the local cluster the buffer starts
    options = {
        "name": args.table_name,
        "episode_boundaries": True,  # as Reverb's items: a window never spans two episodes
        "min_size_to_sample": args.min_size_to_sample,
        "samples_per_insert": args.samples_per_insert,
    }
    manager = None
    if args.checkpoint_dir is None:
        buffer = tfbuffers.RayReplayBuffer(
            spec,
            batch_size=args.segments,
            max_length=-(-args.capacity // args.segments),
            sampler=args.sampler,
            **options,
        )
    else:
        manager = tfbuffers.ReplayBufferManager(
            spec,
            args.capacity,
            args.checkpoint_dir,
            batch_size=args.segments,
            sampler=args.sampler,
            keep_checkpoints=KEEP_CHECKPOINTS,
            backend="ray",
            ray_options=options,
        )
        try:
            buffer, _ = manager.load_replay_buffer()
        except FileNotFoundError:
            buffer, _ = manager.create_replay_buffer()
        except ValueError as error:  # made with other flags
            print(
                f"replay_server.py: error: {error} (here: start the server with the flags the checkpoints were "
                "made with, or with another --checkpoint-dir)",
                file=sys.stderr,
                flush=True,
            )
            return 2
    _args.stop_on_signals(stop)  # again: Ray's start made SIGTERM exit at once
    address = ray.get_runtime_context().gcs_address
    frames = int(buffer.num_frames())
    print(
        f"serving RayReplayBuffer {args.table_name!r} on port {args.port} ({frames} frames restored); "
        f"connect with --backend ray --replay-server {address}",
        flush=True,
    )
    print(RAY_AUTHENTICATION, file=sys.stderr, flush=True)
    last = time.monotonic()
    while not stop.wait(1.0):
        if manager is not None and time.monotonic() - last >= args.checkpoint_interval:
            print(f"checkpoint: {manager.checkpoint()}", flush=True)
            last = time.monotonic()
    if manager is not None:
        frames = int(buffer.num_frames())
        print(f"final checkpoint of {frames} frames: {manager.checkpoint()}", flush=True)
        manager.close()
    else:
        buffer.close()
    print("stopped", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parses the command line and serves until SIGTERM or SIGINT."""
    parser = build_parser()
    args = parse_args(argv)
    if args.spec_file is not None:
        from google.protobuf import text_format  # type: ignore[import-untyped, unused-ignore]
        from tensorflow import errors

        try:
            spec_from_file(args.spec_file)
        except (errors.OpError, text_format.Error, ValueError) as error:  # missing, unreadable, not a spec
            parser.error(
                f"argument --spec-file: expected a TF-Agents spec file (.pbtxt), got {args.spec_file!r}: {error}"
            )
    stop = threading.Event()
    _args.stop_on_signals(stop)
    return serve(args, stop)


if __name__ == "__main__":
    sys.exit(main())
