"""Train DQN on a gymnasium environment (CartPole-v1 by default) from a tfbuffers buffer.

The TF-Agents DQN tutorial's loop, with tfbuffers: a TF driver adds to the buffer
through `TFObserver`, and the agent trains on `buffer.as_dataset(batch, num_steps=2)`.
With a prioritized buffer, each step is weighted by `tfbuffers.importance_weights`
(beta annealed from --beta to 1) and the transitions' |TD errors| become their
priorities (`update_priorities`), as in the PER paper.
Writes a learning curve (PNG) and a summary (JSON) to --output-dir.

    python scripts/train_dqn.py                      # the defaults: about 2 minutes on 2 cores
    python scripts/train_dqn.py --buffer py_uniform --seed 1
    python scripts/train_dqn.py --buffer tf_prioritized
    python scripts/train_dqn.py --starter-buffer out/starter/cartpole-random
    python scripts/train_dqn.py --n-step 3           # 3-step returns (tfbuffers.n_step_dataset)
    python scripts/train_dqn.py --her --num-bits 15  # bit flipping with hindsight goals (tfbuffers.her_dataset)

With --her the agent learns from transitions relabeled with hindsight goals
(`tfbuffers.her_dataset`, --her-strategy, --relabel-fraction) on a goal-conditioned
environment: the HER paper's bit flipping (`tfbuffers/BitFlipping-v0`, --num-bits
bits) unless --env names another whose env has `compute_reward`. --num-bits alone
runs bit flipping without relabeling. On a goal-conditioned environment the
evaluations also count the success rate: the share of episodes that reached their
goal (terminated rather than truncated).

With --replay-server HOST:PORT the buffer is a Reverb table on that server
(scripts/replay_server.py), filled by actor processes (scripts/collect.py): this
process only learns. It waits for --initial-collect-frames items, samples the
table (several servers, comma-separated, are sampled through one dataset,
`tfbuffers.sharded_dataset`), follows the server's sampler (prioritized: importance
weights and priority updates as above), and publishes its Q-network to
--policy-dir every --policy-interval iterations for the actors to act with.

    python scripts/train_dqn.py --replay-server localhost:8000 --policy-dir runs/policy

With --backend ray (the server's; the default where dm-reverb does not import)
--replay-server is the Ray cluster's HOST:PORT that scripts/replay_server.py
printed (one: a process joins one Ray cluster), and the learner samples its
`tfbuffers.RayReplayBuffer` (`RayReplayBuffer.connect`), windows of 2 frames
within episodes, several batches fetched per call.

    python scripts/train_dqn.py --backend ray --replay-server localhost:6379 --policy-dir runs/policy
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import _args  # noqa: E402

BIT_FLIPPING = "tfbuffers/BitFlipping-v0"  # tfbuffers.envs.BIT_FLIPPING_ID (not imported before TensorFlow)
HER_STRATEGIES = ("future", "final", "episode")  # tfbuffers.her.STRATEGIES
RAY_BUFFER = "tfbuffers"  # the name scripts/replay_server.py gives its RayReplayBuffer (its --table-name)


@dataclasses.dataclass
class Config:
    """Every setting of a run; the command-line flags mirror these fields."""

    env: str = "CartPole-v1"
    buffer: str = "tf_uniform"
    num_iterations: int = 30_000
    num_envs: int = 1
    initial_collect_frames: int = 1_000
    collect_steps_per_iteration: int = 1
    replay_capacity: int = 100_000
    batch_size: int = 64
    learning_rate: float = 1e-3
    gamma: float = 0.99
    n_step: int = 1
    epsilon: float = 0.1
    target_update_period: int = 100
    fc_layers: tuple[int, ...] = (100, 50)
    eval_interval: int = 1_000
    eval_episodes: int = 10
    beta: float = 0.4
    seed: int = 0
    output_dir: str = "out/dqn"
    starter_buffer: str | None = None
    replay_server: str | None = None
    backend: str | None = None  # the replay server's: "reverb" or "ray"
    policy_dir: str | None = None
    policy_interval: int = 1_000
    num_bits: int | None = None  # bit flipping's size (its default, 10, when None)
    her: bool = False
    her_strategy: str = "future"
    relabel_fraction: float = 0.8
    her_horizon: int | None = None  # the environment's episode limit when None
    jit: bool = False  # the train step (sample, train, priorities) as one XLA program
    progress: bool = True


def build_parser() -> argparse.ArgumentParser:
    """The command line: one flag per `Config` field."""
    defaults = Config()
    parser = _args.new_parser(__doc__)
    parser.add_argument(
        "--env",
        default=None,
        help=f"gymnasium environment id with a Discrete action space; None: {defaults.env}, or {BIT_FLIPPING} with "
        "--her or --num-bits",
    )
    parser.add_argument(
        "--buffer",
        default=defaults.buffer,
        choices=list(_args.BUFFER_KINDS),
        help="buffer kind (a starter buffer keeps its own kind and segments; its frames fill --replay-capacity)",
    )
    parser.add_argument(
        "--num-iterations", type=_args.positive_int, default=defaults.num_iterations, help="collect+train iterations"
    )
    parser.add_argument(
        "--num-envs", type=_args.positive_int, default=defaults.num_envs, help="parallel environments (segments)"
    )
    parser.add_argument(
        "--initial-collect-frames",
        type=_args.non_negative_int,
        default=defaults.initial_collect_frames,
        help="random frames first",
    )
    parser.add_argument(
        "--collect-steps-per-iteration",
        type=_args.positive_int,
        default=defaults.collect_steps_per_iteration,
        help="driver steps",
    )
    parser.add_argument(
        "--replay-capacity", type=_args.positive_int, default=defaults.replay_capacity, help="buffer capacity"
    )
    parser.add_argument(
        "--batch-size", type=_args.positive_int, default=defaults.batch_size, help="sampled transitions per step"
    )
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate, help="Adam learning rate")
    parser.add_argument("--gamma", type=_args.probability, default=defaults.gamma, help="discount factor")
    parser.add_argument(
        "--n-step",
        type=_args.positive_int,
        default=defaults.n_step,
        help="learn from N-step returns (windows of N + 1 frames through tfbuffers.n_step_dataset); 1: plain DQN",
    )
    parser.add_argument(
        "--epsilon", type=_args.probability, default=defaults.epsilon, help="epsilon-greedy exploration"
    )
    parser.add_argument(
        "--target-update-period",
        type=_args.positive_int,
        default=defaults.target_update_period,
        help="train steps per target sync",
    )
    parser.add_argument(
        "--fc-layers", default=",".join(map(str, defaults.fc_layers)), help="Q-network hidden layer sizes, e.g. 100,50"
    )
    parser.add_argument(
        "--eval-interval", type=_args.positive_int, default=defaults.eval_interval, help="iterations between evals"
    )
    parser.add_argument(
        "--eval-episodes", type=_args.positive_int, default=defaults.eval_episodes, help="episodes per evaluation"
    )
    parser.add_argument(
        "--beta",
        type=_args.probability,
        default=defaults.beta,
        help="prioritized buffers: importance-weight exponent at the start, annealed to 1 by the last iteration",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=defaults.seed,
        help="seed of TF, numpy, the environments and the buffer: a run repeats on one machine and stack "
        "(not with --replay-server, whose actors add as they go)",
    )
    parser.add_argument("--output-dir", default=defaults.output_dir, help="where the PNG and JSON are written")
    parser.add_argument(
        "--starter-buffer",
        default=None,
        help="directory of a buffer made by populate_starter_buffer.py to start from: its frames seed a buffer of "
        "--replay-capacity (the newest that fit)",
    )
    parser.add_argument(
        "--replay-server",
        default=None,
        help="HOST:PORT of scripts/replay_server.py (or several, comma-separated; Ray: the cluster's, one): "
        "learn from actors' frames there",
    )
    _args.add_backend(parser)
    parser.add_argument(
        "--policy-dir", default=None, help="publish the Q-network here for scripts/collect.py --policy-dir"
    )
    parser.add_argument(
        "--policy-interval",
        type=_args.positive_int,
        default=defaults.policy_interval,
        help="iterations between publications to --policy-dir",
    )
    parser.add_argument(
        "--num-bits",
        type=_args.positive_int,
        default=None,
        help=f"bit flipping's length (--env {BIT_FLIPPING}, the default env with this flag or --her)",
    )
    parser.add_argument(
        "--her", action="store_true", help="hindsight experience replay: goals relabeled by tfbuffers.her_dataset"
    )
    parser.add_argument(
        "--her-strategy", default=defaults.her_strategy, choices=list(HER_STRATEGIES), help="where new goals come from"
    )
    parser.add_argument(
        "--relabel-fraction",
        type=_args.probability,
        default=defaults.relabel_fraction,
        help="--her: the share of transitions relabeled (the paper's k = 4 future goals: 0.8)",
    )
    parser.add_argument(
        "--her-horizon",
        type=_args.positive_int,
        default=None,
        help="--her: frames after a transition that goals come from; None: the environment's episode limit",
    )
    parser.add_argument(
        "--jit",
        action="store_true",
        help="one compiled train step, tf.function(jit_compile=True): the sample (get_next) and the train in one "
        "XLA program (tf_uniform, one-step transitions; TF's op determinism is left off: XLA runs in order on the CPU)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def parse_args(argv: list[str] | None = None) -> Config:
    """The command line as a `Config`."""
    parser = build_parser()
    args = parser.parse_args(argv)
    values = _args.config_values(parser, args, Config)
    if not args.learning_rate > 0:
        parser.error(f"argument --learning-rate: expected a positive number, got {args.learning_rate}")
    if args.n_step > 1 and args.replay_server:
        parser.error("argument --n-step: not with --replay-server (its tables hold windows of 2 frames)")
    if args.n_step + 1 > max(args.replay_capacity // args.num_envs, 2):
        parser.error(
            f"argument --n-step: expected windows of N + 1 frames to fit a segment of --replay-capacity / "
            f"--num-envs = {max(args.replay_capacity // args.num_envs, 2)} frames, got {args.n_step}"
        )
    if args.env is None:
        values["env"] = BIT_FLIPPING if args.her or args.num_bits is not None else Config.env
    if args.num_bits is not None and values["env"] != BIT_FLIPPING:
        parser.error(f"argument --num-bits: only with --env {BIT_FLIPPING}, got --env {args.env}")
    if not args.her:
        changed = [
            flag
            for flag, value, default in (
                ("--her-strategy", args.her_strategy, Config.her_strategy),
                ("--relabel-fraction", args.relabel_fraction, Config.relabel_fraction),
                ("--her-horizon", args.her_horizon, None),
            )
            if value != default
        ]
        if changed:
            parser.error(f"argument {changed[0]}: only with --her")
    elif args.replay_server or args.n_step > 1 or "prioritized" in args.buffer:
        received = (
            "--replay-server" if args.replay_server else "--n-step" if args.n_step > 1 else f"--buffer {args.buffer}"
        )
        parser.error(
            f"argument --her: expected a local uniform buffer (tf_uniform or py_uniform) and one-step "
            f"transitions, got {received}"
        )
    if args.jit:
        refused = (
            f"--buffer {args.buffer}"
            if args.buffer != "tf_uniform"
            else "--replay-server"
            if args.replay_server
            else "--starter-buffer"
            if args.starter_buffer
            else "--her"
            if args.her
            else "--n-step"
            if args.n_step > 1
            else None
        )
        if refused:
            parser.error(
                f"argument --jit: expected --buffer tf_uniform in this process and one-step transitions, got {refused}"
            )
    if args.replay_server:
        if args.starter_buffer:
            parser.error("argument --starter-buffer: not with --replay-server (the server holds the frames)")
        for address in args.replay_server.split(","):
            if not _args.ADDRESS.fullmatch(address):
                parser.error(f"argument --replay-server: expected HOST:PORT[,HOST:PORT...], got {address!r}")
        values["backend"] = _args.backend(parser, args)
        if values["backend"] == "ray" and "," in args.replay_server:
            parser.error(
                f"argument --replay-server: expected one HOST:PORT with --backend ray (a process joins one Ray "
                f"cluster), got {args.replay_server!r}"
            )
    elif args.backend is not None:
        parser.error("argument --backend: only with --replay-server (without, the buffer is in this process)")
    return Config(**values)


if __name__ == "__main__":
    parse_args()  # --help and bad arguments answered before TensorFlow is imported

import _quiet  # noqa: E402, F401 (first: TensorFlow imported with its known start-up notices filtered)

# isort: split
import _common  # noqa: E402
import gymnasium  # noqa: E402
import tensorflow as tf  # noqa: E402
from tf_agents.agents.dqn import dqn_agent  # noqa: E402
from tf_agents.drivers import dynamic_episode_driver, dynamic_step_driver  # noqa: E402
from tf_agents.metrics import tf_metrics  # noqa: E402
from tf_agents.networks import q_network  # noqa: E402
from tf_agents.policies import random_tf_policy  # noqa: E402
from tf_agents.utils import common  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

import tfbuffers  # noqa: E402
from tfbuffers.collect import warm  # noqa: E402
from tfbuffers.envs import load_gymnasium  # noqa: E402
from tfbuffers.observers import TFObserver  # noqa: E402

PRIORITY_FLOOR = 1e-6  # added to |TD error| so that no transition's priority is 0 (never drawn)


@dataclasses.dataclass
class Result:
    """What a run did and reached."""

    iterations: list[int]
    returns: list[float]
    final_return: float
    best_return: float
    success_rates: list[float] | None  # per evaluation, on a goal-conditioned environment (else None)
    frames_in_buffer: int
    frames_from_starter: int
    frames_collected: int
    train_steps: int
    priority_updates: int  # update_priorities calls that changed priorities (prioritized buffers; else 0)
    last_loss: float
    seconds: float
    train_seconds: float  # in the train steps but the first (which traces): sampling, training, priorities
    curve_png: str
    summary_json: str


def _evaluate(driver_run: Any, metric: Any, successes: _Successes) -> float:
    metric.reset()
    successes.reset()
    driver_run()
    return float(metric.result().numpy())


class _Successes:
    """A driver observer counting episodes, and those that terminated (reached their goal, on a goal task)."""

    def __init__(self) -> None:
        self.episodes = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.terminated = tf.Variable(0, dtype=tf.int64, trainable=False)

    def __call__(self, trajectory: Any) -> Any:
        ended = trajectory.is_last()  # the transition into an episode's LAST step: discount 0 if it terminated
        self.episodes.assign_add(tf.reduce_sum(tf.cast(ended, tf.int64)))
        return self.terminated.assign_add(tf.reduce_sum(tf.cast(ended & (trajectory.discount == 0), tf.int64)))

    def reset(self) -> None:
        self.episodes.assign(0)
        self.terminated.assign(0)

    def rate(self) -> float:
        """The share of the episodes counted since `reset` that terminated."""
        return float(self.terminated.numpy()) / max(int(self.episodes.numpy()), 1)


def _her_dataset(buffer: Any, config: Config, make_kwargs: dict[str, Any], segment: int) -> tf.data.Dataset:
    """`tfbuffers.her_dataset` for `config`, rewarding with the environment's own `compute_reward`."""
    goal_env = gymnasium.make(config.env, **make_kwargs)
    compute_reward = getattr(goal_env.unwrapped, "compute_reward", None)
    observation = goal_env.observation_space
    if (
        compute_reward is None
        or not isinstance(observation, gymnasium.spaces.Dict)
        or "desired_goal" not in observation.spaces
    ):
        raise ValueError(
            f"--her: expected a goal-conditioned environment (a dict observation with achieved_goal and "
            f"desired_goal, and compute_reward), got --env {config.env}"
        )
    limit = goal_env.spec.max_episode_steps if goal_env.spec is not None else None
    horizon = config.her_horizon or getattr(goal_env.unwrapped, "max_steps", None) or limit
    if horizon is None:
        raise ValueError(f"--her-horizon: expected a value: --env {config.env} has no episode limit to take it from")
    if horizon + 1 > segment:
        raise ValueError(
            f"--her-horizon: expected windows of {horizon + 1} frames to fit a segment of --replay-capacity / "
            f"--num-envs = {segment} frames"
        )
    return tfbuffers.her_dataset(
        buffer,
        config.batch_size,
        horizon=horizon,
        reward_fn=tfbuffers.her.numpy_reward(compute_reward),
        strategy=config.her_strategy,
        relabel_fraction=config.relabel_fraction,
        seed=config.seed,
    )


def seed_everything(seed: int) -> None:
    """TensorFlow's, numpy's and Python's random numbers from `seed` (`main` also makes TensorFlow's ops deterministic).

    With the environments (seeded by `load_gymnasium`), the py buffers' samplers (seeded by `make_buffer`) and
    the datasets read in step with collection (`train`), a run of one seed repeats on one machine and stack.
    """
    tf.keras.utils.set_random_seed(seed)  # Python's random, numpy's and TensorFlow's global seed


def train(config: Config) -> Result:
    """Runs DQN as `config` says and returns the learning curve and a summary."""
    started = time.perf_counter()
    seed_everything(config.seed)
    output_dir = pathlib.Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)

    starter_metadata = None
    num_envs = config.num_envs
    if config.starter_buffer:
        starter_metadata = _common.read_starter_metadata(pathlib.Path(config.starter_buffer))
        num_envs = starter_metadata["batch_size"]  # the buffer's segments are the collecting environments

    make_kwargs = {} if config.num_bits is None else {"num_bits": config.num_bits}
    env = load_gymnasium(config.env, num_envs=num_envs, seed=config.seed, tf_environment=True, **make_kwargs)
    eval_env = load_gymnasium(config.env, seed=config.seed + 10_000, tf_environment=True, **make_kwargs)
    goal_conditioned = isinstance(env.observation_spec(), dict) and "desired_goal" in env.observation_spec()

    # A dict of observations (a goal-conditioned environment's) enters the Q-network concatenated.
    combiner = None
    if isinstance(env.observation_spec(), dict):
        combiner = tf.keras.layers.Lambda(lambda parts: tf.concat(tf.nest.flatten(parts), axis=-1))
    q_net = q_network.QNetwork(
        env.observation_spec(),
        env.action_spec(),
        preprocessing_combiner=combiner,
        fc_layer_params=config.fc_layers,
    )
    train_step = tf.Variable(0, dtype=tf.int64, trainable=False)
    agent = dqn_agent.DqnAgent(
        env.time_step_spec(),
        env.action_spec(),
        q_network=q_net,
        optimizer=tf.keras.optimizers.Adam(learning_rate=config.learning_rate),
        epsilon_greedy=config.epsilon,
        target_update_period=config.target_update_period,
        td_errors_loss_fn=common.element_wise_squared_loss,
        gamma=config.gamma,
        train_step_counter=train_step,
    )
    agent.initialize()

    shards: list[Any] = []
    if config.replay_server:
        shards = _connect(config.replay_server.split(","), agent.collect_data_spec, config.backend)
        buffer = shards[0]
    elif starter_metadata is not None:
        # The starter seeds a training buffer of --replay-capacity (its newest frames, if it holds more).
        max_length = max(config.replay_capacity // num_envs, 2)
        buffer, _ = _common.load_starter_buffer(
            pathlib.Path(config.starter_buffer or ""), agent.collect_data_spec, max_length, config.seed
        )
    else:
        buffer = _common.make_buffer(
            config.buffer, agent.collect_data_spec, num_envs, max(config.replay_capacity // num_envs, 2), config.seed
        )
    frames_from_starter = 0 if shards else int(buffer.num_frames())

    frames_collected = tf.Variable(0, dtype=tf.int64, trainable=False)
    if shards:
        _wait_for_items(shards, config.initial_collect_frames, config.progress)
    elif frames_from_starter == 0:
        random_policy = random_tf_policy.RandomTFPolicy(env.time_step_spec(), env.action_spec())
        frames_collected.assign(
            warm(
                buffer,
                env,
                random_policy,
                config.initial_collect_frames,
                progress=config.progress,
                description="warm-up",
            )
        )

    def count(_: Any) -> tf.Tensor:
        return frames_collected.assign_add(env.batch_size)

    collect_driver = dynamic_step_driver.DynamicStepDriver(
        env,
        agent.collect_policy,
        observers=[TFObserver(buffer), count],
        num_steps=config.collect_steps_per_iteration,
    )
    collect = tf.function(collect_driver.run)
    average_return = tf_metrics.AverageReturnMetric(buffer_size=config.eval_episodes)
    successes = _Successes()
    eval_driver = dynamic_episode_driver.DynamicEpisodeDriver(
        eval_env, agent.policy, observers=[average_return, successes], num_episodes=config.eval_episodes
    )
    evaluate = tf.function(eval_driver.run)

    # Each batch is read when the train step asks, after that iteration's collection: which frames it can
    # draw, and the random numbers it draws them with, are then the same in every run of one seed. (Reading
    # ahead, with prefetch or parallel calls, would race the collector.)
    if config.jit:  # the compiled step samples inside it
        dataset = None
    elif shards:  # actors in other processes add: a run with a replay server is not repeatable
        dataset = tfbuffers.sharded_dataset(shards, config.batch_size, num_steps=2, seed=config.seed).prefetch(3)
    elif config.her:  # transitions relabeled with goals their episodes reached
        dataset = _her_dataset(buffer, config, make_kwargs, max(config.replay_capacity // num_envs, 2))
    elif config.n_step > 1:  # windows of n + 1 frames become n-step transitions, cut at episode ends
        windows = buffer.as_dataset(sample_batch_size=config.batch_size, num_steps=config.n_step + 1)
        dataset = tfbuffers.n_step_dataset(windows, config.gamma)
    else:
        dataset = buffer.as_dataset(sample_batch_size=config.batch_size, num_steps=2)
    experience = iter(dataset) if dataset is not None else None
    train_fn = common.function(agent.train)
    prioritized = buffer.prioritized
    compiled_step = _compiled_step(agent, buffer, config) if config.jit else None
    publisher = None
    if config.policy_dir:
        publisher = tf.train.CheckpointManager(
            tf.train.Checkpoint(q_network=q_net), config.policy_dir, max_to_keep=3, checkpoint_name="q_network"
        )
        publisher.save(checkpoint_number=0)

    iterations, returns = [0], [_evaluate(evaluate, average_return, successes)]
    success_rates = [successes.rate()]
    time_step, policy_state = env.reset(), collect_driver.policy.get_initial_state(env.batch_size)
    loss = float("nan")
    priority_updates = 0
    train_seconds = 0.0
    bar = tqdm(range(1, config.num_iterations + 1), desc="train", unit="it", disable=not config.progress)
    for iteration in bar:
        if not shards:  # with a replay server, actors collect
            time_step, policy_state = collect(time_step, policy_state)
        step_started = time.perf_counter()
        if compiled_step is not None:
            loss = float(compiled_step(tf.constant(_beta(config, iteration), tf.float32)))
        elif prioritized:
            trajectories, info = next(experience)
            loss = float(_prioritized_step(shards or [buffer], train_fn, trajectories, info, _beta(config, iteration)))
        else:
            trajectories, _ = next(experience)
            loss = float(train_fn(trajectories).loss)
        if iteration > 1:  # the first traces (and with --jit compiles) the step
            train_seconds += time.perf_counter() - step_started
        priority_updates += int(prioritized)
        if publisher is not None and (iteration % config.policy_interval == 0 or iteration == config.num_iterations):
            publisher.save(checkpoint_number=iteration)
        if iteration % config.eval_interval == 0 or iteration == config.num_iterations:
            iterations.append(iteration)
            returns.append(_evaluate(evaluate, average_return, successes))
            success_rates.append(successes.rate())
            postfix = {"avg_return": f"{returns[-1]:.1f}", "loss": f"{loss:.3g}"}
            bar.set_postfix(postfix | ({"success": f"{success_rates[-1]:.2f}"} if goal_conditioned else {}))

    curve_png = output_dir / "learning_curve.png"
    _plot(iterations, returns, config, curve_png)
    result = Result(
        iterations=iterations,
        returns=returns,
        final_return=returns[-1],
        best_return=max(returns),
        success_rates=success_rates if goal_conditioned else None,
        frames_in_buffer=sum(int(shard.num_frames()) for shard in shards or [buffer]),
        frames_from_starter=frames_from_starter,
        frames_collected=int(frames_collected.numpy()),
        train_steps=int(train_step.numpy()),
        priority_updates=priority_updates,
        last_loss=loss,
        seconds=time.perf_counter() - started,
        train_seconds=train_seconds,
        curve_png=str(curve_png),
        summary_json=str(output_dir / "summary.json"),
    )
    for shard in shards:
        shard.close()  # the servers keep their tables
    summary = {"config": dataclasses.asdict(config), "result": dataclasses.asdict(result)}
    pathlib.Path(result.summary_json).write_text(json.dumps(summary, indent=2) + "\n")
    return result


def _beta(config: Config, iteration: int) -> float:
    """The importance weights' exponent at `iteration`: `config.beta` annealed to 1 by the last iteration."""
    return config.beta + (1.0 - config.beta) * iteration / config.num_iterations


def _compiled_step(agent: Any, buffer: Any, config: Config) -> Any:
    """`step(beta) -> loss`: the train step as one XLA program (`--jit`), its sample drawn inside it.

    The buffer is filled before the first step, so no sample is refused (which a compiled one says by
    probabilities 0: `tfbuffers._xla`). A prioritized buffer's step (its `update_priorities` inside) compiles
    and runs in a plain program, but this script's took LLVM minutes to compile on the project's machine:
    `--jit` takes tf_uniform until that is understood.
    """

    @tf.function(jit_compile=True)
    def step(beta: tf.Tensor) -> tf.Tensor:
        trajectories, info = buffer.get_next(config.batch_size, num_steps=2)
        if buffer.prioritized:
            return _prioritized_step([buffer], agent.train, trajectories, info, beta)
        return agent.train(trajectories).loss

    return step


def _prioritized_step(buffers: list[Any], train_fn: Any, trajectories: Any, info: Any, beta: Any) -> Any:
    """One train step as the PER paper: importance weights of exponent `beta`, |TD errors| as priorities; the loss.

    A local buffer draws windows by their first frame (ids [batch, steps]); that frame takes the window's
    |TD error|. A Reverb table draws items (ids [batch], keys); every shard gets every key and changes its own.
    """
    size = sum(buffer.num_frames() for buffer in buffers)
    weights = tfbuffers.importance_weights(info.probabilities, size, beta)
    loss_info = train_fn(trajectories, weights=weights)
    td_errors = tf.abs(tf.reshape(loss_info.extra.td_error, [tf.shape(weights)[0], -1]))
    priorities = tf.reduce_mean(td_errors, axis=1) + PRIORITY_FLOOR  # never 0, as the paper's epsilon
    ids = info.ids if info.ids.shape.rank == 1 else info.ids[:, 0]
    for buffer in buffers:
        buffer.update_priorities(ids, priorities)
    return loss_info.loss


def _connect(addresses: list[str], spec: Any, backend: str | None) -> list[Any]:
    """A `ReverbReplayBuffer` on each server's table, sampling as the server does; or the Ray server's buffer."""
    if backend == "ray":
        return [tfbuffers.RayReplayBuffer.connect(RAY_BUFFER, data_spec=spec, address=addresses[0])]
    from tfbuffers.reverb_replay_buffer import served_sampler

    samplers = {address: served_sampler(address, "tfbuffers") for address in addresses}
    if len(set(samplers.values())) > 1:
        raise ValueError(f"replay_server: expected servers that sample alike, got {samplers}")
    return [tfbuffers.ReverbReplayBuffer(spec, 2, address=address, sampler=samplers[address]) for address in addresses]


def _wait_for_items(buffers: list[Any], items: int, progress: bool) -> None:
    """Waits until the servers' tables hold `items` items in all (the actors' warm-up)."""
    bar = tqdm(total=items, unit="item", desc="waiting for actors", disable=not progress)
    while True:
        held = sum(int(buffer.num_frames()) for buffer in buffers)
        bar.update(min(held, items) - bar.n)
        if held >= items:
            break
        time.sleep(0.5)
    bar.close()


def buffer_label(config: Config) -> str:
    """The buffer a run trained from, for its summary line and plot."""
    if config.replay_server and config.backend == "ray":
        return f"tfbuffers RayReplayBuffer at {config.replay_server}"
    if config.replay_server:
        return f"tfbuffers Reverb tables at {config.replay_server}"
    her = f", hindsight goals ({config.her_strategy}, {config.relabel_fraction:g} relabeled)" if config.her else ""
    jit = ", compiled train step (XLA)" if config.jit else ""
    return f"tfbuffers {config.buffer}" + (f", {config.n_step}-step returns" if config.n_step > 1 else "") + her + jit


def _plot(iterations: list[int], returns: list[float], config: Config, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    axis.plot(iterations, returns, marker="o")
    axis.set_xlabel("training iteration")
    axis.set_ylabel(f"average return over {config.eval_episodes} episodes")
    axis.set_title(f"DQN on {config.env}, {buffer_label(config)}, seed {config.seed}")
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    """Trains as the command line says and prints a short summary."""
    config = parse_args(argv)
    if not config.jit:  # op determinism rules TensorFlow's kernels; an XLA program runs in order on the CPU
        tf.config.experimental.enable_op_determinism()  # for the whole process: here, not in `train`
    result = train(config)
    print(
        f"DQN on {config.env} with {buffer_label(config)}: average return {result.final_return:.1f} "
        f"(best {result.best_return:.1f}) after {result.train_steps} train steps in {result.seconds:.0f} s; "
        f"{result.frames_in_buffer} frames in the buffer ({result.frames_from_starter} from the starter buffer); "
        f"{1e6 * result.train_seconds / max(config.num_iterations - 1, 1):.0f} us a train step after the first."
        + (f" Success rate {result.success_rates[-1]:.2f}." if result.success_rates is not None else "")
    )
    print(f"Learning curve: {result.curve_png}; summary: {result.summary_json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
