"""An actor: collects a gymnasium environment's frames into a replay server (Reverb or Ray).

Start a server (scripts/replay_server.py), a learner (scripts/train_dqn.py
--replay-server) and any number of these, on one machine or many:

    python scripts/replay_server.py --env CartPole-v1 --port 8000 &
    python scripts/train_dqn.py --replay-server localhost:8000 --policy-dir runs/policy &
    python scripts/collect.py --replay-server localhost:8000 --policy-dir runs/policy --seed 1 &
    python scripts/collect.py --replay-server localhost:8000 --policy-dir runs/policy --seed 2 &

Each actor writes through `tfbuffers.ReverbReplayBuffer(spec, address=...)`: one
Reverb trajectory writer per environment, items of --sequence-length frames that
never span an episode boundary, sent when each episode ends. With --policy-dir
it acts epsilon-greedily with the newest Q-network the learner published there
(checked every --policy-poll-seconds); until one exists, and without
--policy-dir, it acts at random. It runs until it has added --frames frames
(0: until SIGTERM or SIGINT), then sends what it holds and exits. An actor
killed outright loses the items of its unfinished episodes only.

With --backend ray (the server's; the default where dm-reverb does not import)
--replay-server is the Ray cluster's HOST:PORT that the server printed, and the
actor adds through a `tfbuffers.RayWriter`: it claims --num-envs of the
buffer's free segments (`buffer.writer(num_envs)`, said at start), adds every
frame as it is made (sent in order, the frames made meanwhile together), and
releases them when it exits. Every frame it added is kept; an actor killed
outright loses only the frames it had not sent yet, and its segments stay
claimed until its lease runs out (30 s: a restarted actor claims them again;
start the server with --segments for every actor's environments). On a server
with --samples-per-insert, an actor waits for the learner as long as it takes;
stopped while it waits (the learner gone), it exits within seconds and hands the
frames the rate limiter holds to the buffer, which stores them once a learner
samples again (the count is printed). A Reverb actor waits the same way, and
stopped while it waits it exits once its close() has tried to send what it holds
(up to 10 s a writer; Reverb drops what its server did not take then, said in a
warning).

    python scripts/replay_server.py --backend ray --port 6379 --segments 1 &
    python scripts/train_dqn.py --backend ray --replay-server localhost:6379 --policy-dir runs/policy &
    python scripts/collect.py --backend ray --replay-server localhost:6379 --policy-dir runs/policy --seed 1 &

A Reverb server has no authentication, and Ray's ports listen on every
interface: see docs/scaling.md before opening either.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import pathlib
import sys
import threading
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import _args  # noqa: E402


@dataclasses.dataclass
class Config:
    """Every setting of an actor; the command-line flags mirror these fields."""

    replay_server: str
    backend: str = "reverb"
    env: str = "CartPole-v1"
    num_envs: int = 1
    sequence_length: int = 2
    table_name: str = "tfbuffers"
    frames: int = 0
    policy_dir: str | None = None
    policy_poll_seconds: float = 10.0
    epsilon: float = 0.1
    fc_layers: tuple[int, ...] = (100, 50)
    seed: int = 0
    record: str | None = None
    progress: bool = True


def build_parser() -> argparse.ArgumentParser:
    """The command line: one flag per `Config` field."""
    defaults = Config(replay_server="")
    parser = _args.new_parser(__doc__)
    parser.add_argument(
        "--replay-server", required=True, help="HOST:PORT of scripts/replay_server.py (Ray: the cluster's)"
    )
    _args.add_backend(parser)
    parser.add_argument("--env", default=defaults.env, help="gymnasium environment id (the server's --env)")
    parser.add_argument("--num-envs", type=_args.positive_int, default=defaults.num_envs, help="environments")
    parser.add_argument(
        "--sequence-length",
        type=_args.positive_int,
        default=None,
        help=f"the server's (Reverb; default {defaults.sequence_length})",
    )
    parser.add_argument(
        "--table-name", type=_args.plain_name, default=defaults.table_name, help="the server's (Ray: the buffer's)"
    )
    parser.add_argument(
        "--frames", type=_args.non_negative_int, default=defaults.frames, help="frames to add (0: until stopped)"
    )
    parser.add_argument("--policy-dir", default=None, help="where the learner publishes its Q-network")
    parser.add_argument(
        "--policy-poll-seconds",
        type=_args.positive_float,
        default=defaults.policy_poll_seconds,
        help="seconds between looks at --policy-dir",
    )
    parser.add_argument("--epsilon", type=_args.probability, default=defaults.epsilon, help="epsilon-greedy")
    parser.add_argument(
        "--fc-layers", default=",".join(map(str, defaults.fc_layers)), help="the learner's Q-network layers"
    )
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed of the environments and the policy")
    parser.add_argument(
        "--record",
        default=None,
        help="append each added frame (environment, step type, observation) to this float64 file, for checks",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def parse_args(argv: list[str] | None = None) -> Config:
    """The command line as a `Config`."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not _args.ADDRESS.fullmatch(args.replay_server):
        parser.error(f"argument --replay-server: expected HOST:PORT, got {args.replay_server!r}")
    values = _args.config_values(parser, args, Config)
    values["backend"] = _args.backend(parser, args)  # the arguments are checked first, on every stack
    if args.sequence_length is None:
        values["sequence_length"] = Config.sequence_length
    elif values["backend"] == "ray":
        parser.error("argument --sequence-length: Reverb only (a Ray buffer holds frames; learners pick windows)")
    return Config(**values)


if __name__ == "__main__":
    parse_args()  # --help and bad arguments answered before TensorFlow is imported

import _quiet  # noqa: E402, F401 (first: TensorFlow imported with its known start-up notices filtered)

# isort: split
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tf_agents.drivers import py_driver  # noqa: E402
from tf_agents.networks import q_network  # noqa: E402
from tf_agents.policies import epsilon_greedy_policy, py_tf_eager_policy, q_policy, random_py_policy  # noqa: E402
from tf_agents.specs import tensor_spec  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

import tfbuffers  # noqa: E402
from tfbuffers.envs import load_gymnasium  # noqa: E402
from tfbuffers.observers import PyObserver  # noqa: E402

STEPS_PER_CALL = 50  # driver steps between checks of the stop signal and the policy directory
WAIT_SLICE_SECONDS = 5.0  # Ray: a paced actor waits for the learner in slices this long, checking for a stop
RECORD_COLUMNS = 2  # a --record row: environment index, step type, then the observation's values


class StoppedError(Exception):
    """The actor was stopped while the rate limiter held its add."""


class PacedAdd:
    """Adds through `add`, waiting for the rate limiter as long as the learner needs, until `stop` is set.

    Each add waits in slices of `WAIT_SLICE_SECONDS` (the buffer's timeout), `TimeoutError` past each:
    - without `wait` (a `RayWriter`), the add did not take its frame: it is tried again, or, once stopped,
      `StoppedError` is raised (that frame was not added);
    - with `wait` (a `ReverbReplayBuffer`'s `flush`), the add took its frame: `count` counts it, and `wait`
      is tried again until the server confirmed it, or, once stopped, `StoppedError` is raised.
    `count` is called with each frame taken.
    """

    def __init__(self, add: Any, stop: threading.Event, count: Any, wait: Any = None) -> None:
        self._add, self._stop, self._count, self._wait = add, stop, count, wait

    def __call__(self, trajectory: Any) -> None:
        while True:
            try:
                self._add(trajectory)
                break
            except TimeoutError:
                if self._wait is not None:  # taken: what is left is the wait
                    self._count(trajectory)
                    return self._wait_confirmed()
                if self._stop.is_set():
                    raise StoppedError from None
        self._count(trajectory)

    def _wait_confirmed(self) -> None:
        while True:
            if self._stop.is_set():
                raise StoppedError
            try:
                return self._wait()
            except TimeoutError:
                pass


class PolicySource:
    """The actor's policy: random until the learner publishes a Q-network, then epsilon-greedy with the newest."""

    def __init__(self, env: Any, config: Config) -> None:
        self._directory = config.policy_dir
        self._poll_seconds = config.policy_poll_seconds
        outer_dims = (env.batch_size,) if env.batched else ()
        self._random = random_py_policy.RandomPyPolicy(env.time_step_spec(), env.action_spec(), outer_dims=outer_dims)
        self.policy: Any = self._random
        self.trajectory_spec = self._random.trajectory_spec  # the Q-network's policy writes the same frames
        self.restored: str | None = None
        self._last_poll = -float("inf")
        if self._directory is None:
            return
        time_step_spec = tensor_spec.from_spec(env.time_step_spec())
        action_spec = tensor_spec.from_spec(env.action_spec())
        self._q_net = q_network.QNetwork(time_step_spec.observation, action_spec, fc_layer_params=config.fc_layers)
        self._q_net.create_variables()
        greedy = q_policy.QPolicy(time_step_spec, action_spec, q_network=self._q_net)
        explore = epsilon_greedy_policy.EpsilonGreedyPolicy(greedy, epsilon=config.epsilon)
        self._q_policy = py_tf_eager_policy.PyTFEagerPolicy(
            explore, use_tf_function=True, batch_time_steps=not env.batched
        )
        self._checkpoint = tf.train.Checkpoint(q_network=self._q_net)

    def poll(self) -> bool:
        """Loads the newest published Q-network if there is a new one; True when it did."""
        if self._directory is None or time.monotonic() - self._last_poll < self._poll_seconds:
            return False
        self._last_poll = time.monotonic()
        newest = tf.train.latest_checkpoint(self._directory)
        if newest is None or newest == self.restored:
            return False
        try:
            self._checkpoint.read(newest).expect_partial()
        except (tf.errors.NotFoundError, tf.errors.DataLossError) as error:  # replaced while being read
            print(f"policy {newest} could not be read ({type(error).__name__}); keeping the current one", flush=True)
            return False
        self.restored = newest
        self.policy = self._q_policy
        return True


class Recorder:
    """Writes one row per environment per added frame (index, step type, observation) to a float64 file.

    Rows are written before the frame is added, so the file always holds every
    frame the buffer was given, even when the actor is killed.
    """

    def __init__(self, path: str) -> None:
        self._file = open(path, "ab")  # noqa: SIM115 (closed in close())

    def __call__(self, trajectory: Any) -> None:
        step_type = np.reshape(trajectory.step_type, [-1]).astype(np.float64)
        observation = np.reshape(trajectory.observation, [step_type.size, -1]).astype(np.float64)
        index = np.arange(step_type.size, dtype=np.float64)
        self._file.write(np.column_stack([index, step_type, observation]).tobytes())
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_record(path: str | pathlib.Path, observation_size: int) -> np.ndarray:
    """The rows a `Recorder` wrote: float64 [frames, 2 + observation_size]."""
    return np.fromfile(path, np.float64).reshape(-1, RECORD_COLUMNS + observation_size)


def collect(config: Config, stop: threading.Event) -> dict[str, Any]:
    """Adds frames to the server until `config.frames` are added or `stop` is set; returns a summary."""
    env = load_gymnasium(config.env, num_envs=config.num_envs, seed=config.seed)
    np.random.seed(config.seed)
    tf.random.set_seed(config.seed)
    source = PolicySource(env, config)
    writer: tfbuffers.RayWriter | None = None
    if config.backend == "ray":
        try:  # a buffer of other frames refused, naming each field that differs
            buffer: Any = tfbuffers.RayReplayBuffer.connect(
                config.table_name,
                data_spec=source.trajectory_spec,
                address=config.replay_server,
                timeout=WAIT_SLICE_SECONDS,
            )
        finally:
            _args.stop_on_signals(stop)  # again: Ray's connection made SIGTERM exit at once
        writer = claimed = buffer.writer(config.num_envs)
        print(f"adding to segments {claimed.segments} of RayReplayBuffer {config.table_name!r}", flush=True)
    else:
        buffer = tfbuffers.ReverbReplayBuffer(
            source.trajectory_spec,
            config.sequence_length,
            batch_size=config.num_envs,
            address=config.replay_server,
            table_name=config.table_name,
            timeout=WAIT_SLICE_SECONDS,
        )
    recorder = Recorder(config.record) if config.record else None
    added = [0]
    episodes = [0]

    def count(trajectory: Any) -> None:
        added[0] += config.num_envs
        episodes[0] += int(np.sum(trajectory.is_last()))

    if writer is not None:
        add = PacedAdd(PyObserver(writer), stop, count)
    else:
        add = PacedAdd(PyObserver(buffer), stop, count, wait=buffer.flush)
    observers = ([recorder] if recorder else []) + [add]  # recorded before its add: a killed actor's too
    bar = tqdm(total=config.frames or None, unit="frame", desc="collect", disable=not config.progress)
    started = time.perf_counter()
    policies = 0
    held = 0
    try:
        time_step = env.reset()
        state = source.policy.get_initial_state(env.batch_size)
        while not stop.is_set() and (config.frames == 0 or added[0] < config.frames):
            if source.poll():
                policies += 1
                print(f"acting with {source.restored}", flush=True)
                state = source.policy.get_initial_state(env.batch_size)
            steps = STEPS_PER_CALL
            if config.frames:
                steps = min(steps, -(-(config.frames - added[0]) // config.num_envs))
            before = added[0]
            driver = py_driver.PyDriver(env, source.policy, observers, max_steps=steps)
            with contextlib.suppress(StoppedError):  # stopped while the rate limiter held an add
                time_step, state = driver.run(time_step, state)
            bar.update(added[0] - before)
            bar.set_postfix(episodes=episodes[0])
    finally:
        bar.close()
        if writer is not None:
            while True:  # sends every frame made so far (waiting for the learner), and releases the segments
                try:
                    writer.close()
                    break
                except TimeoutError:  # the rate limiter holds them; stopped: dropped, handed to the actor
                    if stop.is_set():
                        held = writer.pending
                        break
        buffer.close()  # sends every item made so far
        if recorder is not None:
            recorder.close()
    seconds = time.perf_counter() - started
    return {
        "frames": added[0],
        "episodes": episodes[0],
        "seconds": seconds,
        "frames_per_second": added[0] / seconds if seconds else 0.0,
        "policies_loaded": policies,
        "held": held,
    }


def main(argv: list[str] | None = None) -> int:
    """Collects as the command line says until done or stopped, and prints what it added."""
    config = parse_args(argv)
    stop = threading.Event()
    _args.stop_on_signals(stop)
    try:
        summary = collect(config, stop)
    except ValueError as error:  # the server's table is not this actor's (spec, sequence length, name)
        print(f"collect.py: error: {error}", file=sys.stderr)
        return 2
    print(
        f"added {summary['frames']} frames ({summary['episodes']} episodes ended) to {config.replay_server} "
        f"in {summary['seconds']:.1f} s: {summary['frames_per_second']:.0f} frames/s",
        flush=True,
    )
    if summary["held"]:
        print(
            f"{summary['held']} of them were not known to be stored (the rate limiter held them): handed to the "
            "buffer, which stores them once a learner samples",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
