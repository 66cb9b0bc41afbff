"""The HER paper's bit-flipping comparison: DQN with and without hindsight goals, success rate against n.

Andrychowicz et al. (2017) report that DQN fails on bit flipping beyond about 13-15
bits, and that DQN with hindsight experience replay solves far longer strings. This
script trains `scripts/train_dqn.py`'s DQN on `tfbuffers/BitFlipping-v0` for each
--bits and --seeds, once on the stored goals and once with `--her` (future goals,
0.8 relabeled), and writes the final success rates (the share of --eval-episodes
greedy episodes that reached their goal) as a table (her.md), a JSON and a figure
of success rate against n (her.png) to --output-dir.

    python scripts/her_bit_flipping.py                    # n = 5, 10, 15, 20; 3 seeds: about 40 minutes on 2 cores
    python scripts/her_bit_flipping.py --quick            # n = 3, 4; 1 seed; a few hundred iterations
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import _args  # noqa: E402

QUICK: dict[str, Any] = {"bits": "3,4", "seeds": "0", "num_iterations": 400, "eval_episodes": 10}
# DQN's settings for every run, with and without HER: one hidden layer of 256 units, gamma 0.98, Adam 1e-3.
TRAINING: dict[str, Any] = {
    "gamma": 0.98,
    "fc_layers": (256,),
    "learning_rate": 1e-3,
    "epsilon": 0.1,
    "batch_size": 128,
}


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from None
    if not values or any(value < 0 for value in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated ints >= 0, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = _args.new_parser(__doc__)
    parser.add_argument("--bits", type=_int_list, default=[5, 10, 15, 20], help="bit-string lengths, e.g. 5,10,15,20")
    parser.add_argument("--seeds", type=_int_list, default=[0, 1, 2], help="seeds of each configuration")
    parser.add_argument(
        "--num-iterations", type=_args.positive_int, default=10_000, help="collect+train iterations per run"
    )
    parser.add_argument(
        "--eval-episodes", type=_args.positive_int, default=50, help="greedy episodes the final success rate counts"
    )
    parser.add_argument("--quick", action="store_true", help=f"a small run for tests: {QUICK}")
    parser.add_argument("--output-dir", default="out/her", help="where her.md, her.json and her.png go")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with --quick's sizes in place."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.quick:
        args.bits, args.seeds = _int_list(QUICK["bits"]), _int_list(QUICK["seeds"])
        args.num_iterations, args.eval_episodes = QUICK["num_iterations"], QUICK["eval_episodes"]
    if any(bits < 1 for bits in args.bits):
        parser.error(f"argument --bits: expected positive ints, got {args.bits}")
    return args


if __name__ == "__main__":
    parse_args()  # --help and bad arguments answered before TensorFlow is imported

import _quiet  # noqa: E402, F401 (first: TensorFlow imported with its known start-up notices filtered)

# isort: split
import tensorflow as tf  # noqa: E402
import train_dqn  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every run's final success rate, by n and method."""
    output = pathlib.Path(args.output_dir)
    runs = [(bits, her, seed) for bits in args.bits for her in (False, True) for seed in args.seeds]
    results: dict[str, Any] = {
        "command": " ".join(["python", "scripts/her_bit_flipping.py", *sys.argv[1:]]),
        "num_iterations": args.num_iterations,
        "eval_episodes": args.eval_episodes,
        "training": {key: list(value) if isinstance(value, tuple) else value for key, value in TRAINING.items()},
        "runs": [],
    }
    started = time.perf_counter()
    for bits, her, seed in tqdm(runs, desc="her_bit_flipping", unit="run", disable=args.no_progress):
        name = f"n{bits}-{'her' if her else 'dqn'}-s{seed}"
        config = train_dqn.Config(
            env=train_dqn.BIT_FLIPPING,
            num_bits=bits,
            her=her,
            num_iterations=args.num_iterations,
            initial_collect_frames=1_000,
            eval_interval=max(args.num_iterations // 5, 1),
            eval_episodes=args.eval_episodes,
            seed=seed,
            output_dir=str(output / name),
            progress=False,
            **TRAINING,
        )
        result = train_dqn.train(config)
        assert result.success_rates is not None  # a goal-conditioned environment
        results["runs"].append(
            {
                "bits": bits,
                "her": her,
                "seed": seed,
                "success_rates": result.success_rates,
                "iterations": result.iterations,
                "seconds": result.seconds,
            }
        )
    results["seconds"] = time.perf_counter() - started
    return results


def table(results: dict[str, Any]) -> str:
    """Markdown: final success rate per n, without and with HER (mean over seeds, then each seed)."""
    lines = [
        "| n (bits) | DQN: final success rate (mean; per seed) | DQN + HER (future, 0.8) |",
        "|---|---|---|",
    ]
    for bits in sorted({run["bits"] for run in results["runs"]}):
        cells = []
        for her in (False, True):
            finals = [run["success_rates"][-1] for run in results["runs"] if run["bits"] == bits and run["her"] == her]
            cells.append(f"{statistics.mean(finals):.2f} ({', '.join(f'{value:.2f}' for value in finals)})")
        lines.append(f"| {bits} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: dict[str, Any], path: pathlib.Path) -> None:
    """Final success rate against n: each seed a dot, the mean a line, for DQN and DQN + HER."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6.5, 4))
    for her, colour, label in ((False, "tab:gray", "DQN"), (True, "tab:blue", "DQN + HER (future)")):
        runs = [run for run in results["runs"] if run["her"] == her]
        bits = sorted({run["bits"] for run in runs})
        means = [statistics.mean(run["success_rates"][-1] for run in runs if run["bits"] == n) for n in bits]
        axis.plot(bits, means, marker="o", color=colour, label=label)
        axis.scatter(
            [run["bits"] for run in runs], [run["success_rates"][-1] for run in runs], color=colour, alpha=0.35, s=18
        )
    axis.set_xlabel("number of bits n")
    axis.set_ylabel(f"final success rate ({results['eval_episodes']} greedy episodes)")
    axis.set_ylim(-0.05, 1.05)
    axis.set_title(f"Bit flipping: DQN with and without HER, {results['num_iterations']:,} iterations a run")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    """Runs the comparison and writes her.md, her.json and her.png."""
    args = parse_args(argv)
    tf.config.experimental.enable_op_determinism()
    results = run(args)
    output = pathlib.Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    (output / "her.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results, output / "her.png")
    markdown = f"{results['command']}\n\n{table(results)}\n"
    (output / "her.md").write_text(markdown)
    print(markdown)
    print(f"{len(results['runs'])} runs in {results['seconds']:.0f} s. Outputs in {output}/: her.md, her.json, her.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
