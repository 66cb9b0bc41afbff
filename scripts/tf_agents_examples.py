"""Run TF-Agents' own example programs with tfbuffers in place of TF-Agents' buffer.

Each program is read from the installed TF-Agents (tf_agents/agents/*/examples/v2),
its one buffer import

    from tf_agents.replay_buffers import tf_uniform_replay_buffer

is replaced by `import tfbuffers as tf_uniform_replay_buffer` (the import change a
user makes), and its `train_eval()` runs for a few iterations in a child process of
its own, with small networks. Nothing else in the program changes. With
`--buffers tf-agents` the programs run unchanged, to tell a failure of tfbuffers
from one of TF-Agents on the installed stack.

The MuJoCo programs (PPO, DDPG, SAC) run on gym's Pendulum-v1 through
`suite_gym.load`, a continuous task as MuJoCo's; the RNN variants need dm_control
and are not run. `dqn-resumed` runs DQN a second time in the first run's
directory: the program restores its buffer from its own checkpoint and trains on.

    python scripts/tf_agents_examples.py                 # every program, tfbuffers' buffer
    python scripts/tf_agents_examples.py reinforce dqn   # some of them
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import linecache
import pathlib
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import _args  # noqa: E402

IMPORT = "from tf_agents.replay_buffers import tf_uniform_replay_buffer\n"
SWAPPED = "import tfbuffers as tf_uniform_replay_buffer\n"
PENDULUM = "Pendulum-v1"
HERE = pathlib.Path(__file__).resolve().parent
ERROR = re.compile(r"^[\w.]*(Error|Exception)\b")  # the line naming a failed program's exception
TAIL = 15  # lines of a failed program's output printed


@dataclasses.dataclass(frozen=True)
class Example:
    """One of TF-Agents' example programs: its path under tf_agents/agents and the `train_eval` arguments used."""

    path: str
    arguments: dict[str, Any]
    gym_task: bool = False  # runs on PENDULUM through suite_gym.load in place of MuJoCo
    resumes: str | None = None  # runs in that example's directory, after it


_DQN = Example(
    "dqn/examples/v2/train_eval.py",
    dict(
        num_iterations=200,
        initial_collect_steps=100,
        replay_buffer_capacity=1000,
        batch_size=32,
        fc_layer_params=(16,),
        num_eval_episodes=1,
        eval_interval=200,
        log_interval=100,
        summary_interval=100,
        train_checkpoint_interval=100,
        policy_checkpoint_interval=100,
        rb_checkpoint_interval=100,
    ),
)
_CONTINUOUS = dict(
    num_iterations=40,
    initial_collect_steps=64,
    replay_buffer_capacity=1000,
    batch_size=16,
    actor_fc_layers=(16,),
    critic_joint_fc_layers=(16,),
    num_eval_episodes=1,
    eval_interval=40,
    log_interval=20,
    summary_interval=20,
)
EXAMPLES = {
    "dqn": _DQN,
    "dqn-resumed": dataclasses.replace(_DQN, resumes="dqn"),
    "reinforce": Example(
        "reinforce/examples/v2/train_eval.py",
        dict(
            num_iterations=3,
            actor_fc_layers=(16,),
            collect_episodes_per_iteration=2,
            num_eval_episodes=1,
            eval_interval=3,
            log_interval=1,
            summary_interval=1,
        ),
    ),
    "ppo": Example(
        "ppo/examples/v2/train_eval_clip_agent.py",
        dict(
            num_environment_steps=800,  # two iterations of two 200-step episodes
            collect_episodes_per_iteration=2,
            num_parallel_environments=2,
            replay_buffer_capacity=201,
            num_epochs=2,
            actor_fc_layers=(16,),
            value_fc_layers=(16,),
            num_eval_episodes=1,
            eval_interval=2,
            train_checkpoint_interval=2,
            policy_checkpoint_interval=2,
            log_interval=1,
            summary_interval=1,
        ),
        gym_task=True,
    ),
    "ddpg": Example("ddpg/examples/v2/train_eval.py", dict(_CONTINUOUS, critic_obs_fc_layers=(16,)), gym_task=True),
    "sac": Example(
        "sac/examples/v2/train_eval.py",
        dict(_CONTINUOUS, train_checkpoint_interval=20, policy_checkpoint_interval=20, rb_checkpoint_interval=20),
        gym_task=True,
    ),
}
BUFFERS = ("tfbuffers", "tf-agents")


def program_source(example: Example, buffers: str) -> str:
    """The example's source, read from the installed TF-Agents; for `buffers='tfbuffers'`, its buffer import swapped."""
    found = importlib.util.find_spec("tf_agents")
    if found is None or found.origin is None:
        raise RuntimeError("tf_agents: expected TF-Agents installed (its example programs are read from it), got none")
    path = pathlib.Path(found.origin).parent / "agents" / example.path
    source = path.read_text()
    if source.count(IMPORT) != 1:
        raise RuntimeError(f"{path}: expected the line {IMPORT.strip()!r} once, found it {source.count(IMPORT)} times")
    return source.replace(IMPORT, SWAPPED) if buffers == "tfbuffers" else source


def run_child(name: str, buffers: str, root: str) -> None:
    """Runs example `name`'s `train_eval` in this process (a child of `run_programs`), writing under `root`."""
    import _quiet  # noqa: F401 (Keras 2 for TF-Agents, before TensorFlow loads)
    from absl import logging
    from tf_agents.environments import suite_gym
    from tf_agents.system import system_multiprocessing

    example = EXAMPLES[name]
    source = program_source(example, buffers)
    filename = f"<{example.path} with {buffers}' buffer>"
    # AutoGraph reads a function's source through linecache: the program's, as run.
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    namespace: dict[str, Any] = {"__name__": f"tf_agents_example_{name.replace('-', '_')}"}
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102
    logging.set_verbosity(logging.INFO)  # the program's own progress lines, as under absl's app.run
    arguments = dict(example.arguments)
    if example.gym_task:
        arguments.update(env_name=PENDULUM, env_load_fn=suite_gym.load)
    system_multiprocessing.enable_interactive_mode()  # PPO's parallel environments, without absl's app.run
    namespace["train_eval"](str(pathlib.Path(root) / (example.resumes or name)), **arguments)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How one program ended: exit status (None: timed out), seconds, the line saying why it failed, its log."""

    name: str
    returncode: int | None
    seconds: float
    why: str
    log: pathlib.Path

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def row(self) -> str:
        return f"{self.name:12s} {'ok' if self.ok else 'FAILED':7s} {self.seconds:6.1f} s  {self.why}".rstrip()


def run_programs(names: list[str], buffers: str, root: pathlib.Path, timeout: float) -> list[Outcome]:
    """Runs each example in a child process of its own, writing `root/<name>.log`, and says how each ended."""
    from tqdm.auto import tqdm

    root.mkdir(parents=True, exist_ok=True)
    outcomes = []
    for name in tqdm(names, desc="TF-Agents example programs", unit="program"):
        log = root / f"{name}.log"
        start = time.perf_counter()
        child = f"import sys; sys.path.insert(0, {str(HERE)!r}); import tf_agents_examples as programs; "
        command = [sys.executable, "-c", child + f"programs.run_child({name!r}, {buffers!r}, {str(root)!r})"]
        with log.open("w") as out:
            try:
                returncode = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=timeout).returncode
            except subprocess.TimeoutExpired:
                returncode = None
        seconds = time.perf_counter() - start
        lines = [line for line in log.read_text().splitlines() if line.strip()]
        errors = [line for line in lines if ERROR.match(line)]
        if returncode == 0:
            why = ""
        elif returncode is None:
            why = f"timed out after {timeout:g} s"
        else:
            why = (errors or lines or [f"exit {returncode}"])[-1]
        outcomes.append(Outcome(name, returncode, seconds, why, log))
    return outcomes


def report(outcomes: list[Outcome], buffers: str) -> str:
    """The failed programs' last lines, then one row per program."""
    tails = []
    for outcome in outcomes:
        if not outcome.ok:
            lines = [line for line in outcome.log.read_text().splitlines() if line.strip()]
            tails.append(f"--- {outcome.name}: the end of {outcome.log}\n" + "\n".join(lines[-TAIL:]))
    header = f"TF-Agents' example programs with {buffers}' buffer, on {_stack()}:"
    return "\n".join([*tails, header, *(outcome.row() for outcome in outcomes)])


def _stack() -> str:
    import importlib.metadata

    versions = [f"{name} {importlib.metadata.version(name)}" for name in ("tensorflow", "numpy", "tf-agents")]
    return f"Python {sys.version.split()[0]}, " + ", ".join(versions)


def build_parser() -> argparse.ArgumentParser:
    parser = _args.new_parser(__doc__)
    parser.add_argument(
        "examples", nargs="*", metavar="EXAMPLE", help=f"which programs to run, of {', '.join(EXAMPLES)} (default: all)"
    )
    parser.add_argument(
        "--buffers", choices=BUFFERS, default="tfbuffers", help="whose buffer the programs use (default: tfbuffers)"
    )
    parser.add_argument(
        "--root-dir",
        type=pathlib.Path,
        default=None,
        help="where the programs write checkpoints, summaries and logs (default: a temporary directory)",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per program")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error(f"--timeout: expected a positive number of seconds, got {args.timeout:g}")
    unknown = [name for name in args.examples if name not in EXAMPLES]
    if unknown:
        parser.error(f"examples: expected names of {', '.join(EXAMPLES)}, got {', '.join(map(repr, unknown))}")
    names = list(dict.fromkeys(args.examples)) or list(EXAMPLES)
    missing = sorted({resumes for name in names if (resumes := EXAMPLES[name].resumes)} - set(names))
    if missing:
        parser.error(f"examples: a resumed run needs its first run; add {', '.join(missing)}")
    names.sort(key=lambda name: EXAMPLES[name].resumes is not None)  # first runs before resumed ones
    with contextlib.ExitStack() as stack:
        if args.root_dir is None:
            root = pathlib.Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tf_agents_examples_")))
        else:
            root = args.root_dir
        outcomes = run_programs(names, args.buffers, root, args.timeout)
        print(report(outcomes, args.buffers))
    return 0 if all(outcome.ok for outcome in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
