r"""Compare train_dqn.py runs: their learning curves in one figure and a markdown table of what each reached.

Each run is a `summary.json` that `scripts/train_dqn.py` wrote, named by a label (`LABEL=PATH`); runs that
share a label's prefix up to the first `/` share a colour (for example `n=1/seed 0`, `n=1/seed 1`). The
table gives, per run: its seed, the mean return over its evaluations, the final return, the first evaluation
at or above --threshold, and the seconds it took.

    python scripts/compare_runs.py "n=1/seed 0=out/nstep/n1-s0/summary.json" \\
        "n=3/seed 0=out/nstep/n3-s0/summary.json" --output docs/n_step_cartpole.png
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import _args  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = _args.new_parser(__doc__)
    parser.add_argument("runs", nargs="+", metavar="LABEL=PATH", help="a run's label and its summary.json")
    parser.add_argument("--output", required=True, help="the PNG to write")
    parser.add_argument("--title", default="DQN on CartPole-v1", help="the figure's title")
    parser.add_argument("--threshold", type=float, default=475.0, help="the return a run counts as solved at")
    return parser


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[tuple[str, dict[str, Any]]]]:
    """The command line, and each run's label and summary (read and checked)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    runs = []
    for text in args.runs:
        label, separator, path = text.rpartition("=")
        if not separator or not label:
            parser.error(f"argument LABEL=PATH: expected a label, '=' and a path, got {text!r}")
        try:
            summary = json.loads(pathlib.Path(path).read_text())
            summary["result"]["iterations"], summary["result"]["returns"]  # noqa: B018 (present)
        except (OSError, ValueError, KeyError, TypeError) as error:
            parser.error(f"argument LABEL=PATH: {path!r} is not a train_dqn.py summary.json ({error})")
        runs.append((label, summary))
    if pathlib.Path(args.output).suffix != ".png":
        parser.error(f"argument --output: expected a path ending in .png, got {args.output!r}")
    return args, runs


def table(runs: list[tuple[str, dict[str, Any]]], threshold: float) -> str:
    """Markdown: a row per run."""
    lines = [
        f"| run | seed | mean return over the evaluations | final return | first evaluation ≥ {threshold:g} "
        "| seconds |",
        "|---|---|---|---|---|---|",
    ]
    for label, summary in runs:
        result = summary["result"]
        returns, iterations = result["returns"], result["iterations"]
        first = next((f"{i:,}" for i, value in zip(iterations, returns) if value >= threshold), "never")
        mean = sum(returns) / len(returns)
        lines.append(
            f"| {label} | {summary['config']['seed']} | {mean:.1f} | {result['final_return']:.1f} | {first} | "
            f"{result['seconds']:.0f} |"
        )
    return "\n".join(lines)


def plot(runs: list[tuple[str, dict[str, Any]]], title: str, path: pathlib.Path) -> None:
    """The learning curves, one colour per label prefix, one line style per run within it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys(label.split("/")[0] for label, _ in runs))
    palette = [plt.get_cmap("tab10")(i) for i in range(10)]
    styles = ["-", "--", ":", "-."]
    seen: dict[str, int] = {}
    figure, axis = plt.subplots(figsize=(9, 4.8))
    for label, summary in runs:
        group = label.split("/")[0]
        index = seen[group] = seen.get(group, -1) + 1
        result = summary["result"]
        axis.plot(
            result["iterations"],
            result["returns"],
            styles[index % len(styles)],
            color=palette[groups.index(group) % len(palette)],
            label=label,
            linewidth=1.4,
        )
    axis.set_xlabel("iteration (one collect step and one train step)")
    axis.set_ylabel("average return")
    axis.set_title(title)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    """Writes the figure and prints the table."""
    args, runs = parse_args(argv)
    output = pathlib.Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    plot(runs, args.title, output)
    print(table(runs, args.threshold))
    print(f"\nFigure: {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
