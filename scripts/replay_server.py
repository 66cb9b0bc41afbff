"""Serve one tfbuffers Reverb table to actors and learners in other processes or on other machines.

The table is the one `tfbuffers.ReverbReplayBuffer` makes (windows of
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

A spec file is what `tf_agents.specs.tensor_spec.to_pbtxt_file(path, agent.collect_data_spec)`
writes, or the policy_specs.pbtxt of a policy saved by TF-Agents' `PolicySaver`
(its collect_data_spec is used).
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import signal
import sys
import threading
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import _args  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = _args.new_parser(__doc__)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--env", default="CartPole-v1", help="gymnasium environment id: the frames' spec")
    source.add_argument("--spec-file", default=None, help="the frames' spec from a TF-Agents .pbtxt spec file")
    parser.add_argument("--port", type=_args.positive_int, required=True, help="TCP port to serve on")
    parser.add_argument("--capacity", type=_args.positive_int, default=100_000, help="items the table holds")
    parser.add_argument("--sequence-length", type=_args.positive_int, default=2, help="frames per item")
    parser.add_argument("--sampler", choices=_args.REVERB_SAMPLERS, default="uniform", help="how items are drawn")
    parser.add_argument("--table-name", default="tfbuffers", type=_args.plain_name, help="the table's name")
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
    if importlib.util.find_spec("reverb") is None:
        parser.error("dm-reverb cannot be imported here; it installs on Python 3.11 (the pinned stack)")
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
    import reverb

    spec = spec_from_file(args.spec_file) if args.spec_file else trajectory_spec(args.env)
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
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    return serve(args, stop)


if __name__ == "__main__":
    sys.exit(main())
