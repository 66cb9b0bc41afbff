"""The results as people read them: ratios, the markdown tables, the bar chart, the machine and stack."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import pathlib
import platform
import statistics
from typing import Any

import numpy as np
import psutil

from _bench.names import ACTOR_BACKENDS, OUT_OF_PROCESS, SYSTEM_NAMES
from _bench.systems import MEASURES, OURS, REFERENCES


def ratios(result: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Ratios of medians, tfbuffers / peer, per measure."""
    table: dict[str, dict[str, float]] = {}
    for measure, by_system in result["measures"].items():
        row = {}
        for ours, theirs in OURS.items():
            if ours in by_system and theirs in by_system:
                row[f"{ours} / {theirs}"] = by_system[ours]["median"] / by_system[theirs]["median"]
            for peer in REFERENCES[ours]:
                if ours in by_system and peer in by_system:
                    row[f"{ours} / {peer}"] = by_system[ours]["median"] / by_system[peer]["median"]
        table[measure] = row
    return table


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _ratio(value: float) -> str:
    """A ratio to two decimals, or to two significant digits below 0.1 (never `0.00x`)."""
    return f"{value:.2f}x" if value >= 0.1 or value == 0 else f"{value:.2g}x"


def markdown(results: dict[str, Any]) -> str:
    """The results as markdown tables: frames/s (median, range) and ratios."""
    names = results["systems"]
    lines = []
    for workload_name, result in results["workloads"].items():
        payload = result["workload"]["payload_bytes"]
        lines += [f"### {workload_name} ({result['workload']['frames']:,} frames, {payload} payload bytes/frame)", ""]
        total = result["workload"]["frames"]
        fewer = {name: count for name, count in result.get("frames", {}).items() if count < total}
        for count in sorted(set(fewer.values())):
            held = ", ".join(name for name, n in fewer.items() if n == count)
            lines += [f"{held}: filled with {count:,} frames (their writers' pace; benchmark's `max_frames`).", ""]
        lines += ["| measure | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for measure, label in MEASURES.items():
            cells = []
            for name in names:
                entry = result["measures"][measure].get(name)
                cells.append(
                    "-" if entry is None else f"{_fmt(entry['median'])} ({_fmt(entry['min'])}–{_fmt(entry['max'])})"
                )
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        for key, label in (
            ("stored_bytes_per_frame", "stored bytes/frame"),
            ("resident_bytes_per_frame", "resident bytes/frame (RSS)"),
            ("anonymous_bytes_per_frame", "anonymous resident bytes/frame (RssAnon)"),
        ):
            cells = [_fmt(result["memory"].get(name, {}).get(key)) for name in names]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        if result.get("ops"):
            lines += [
                "",
                "Ops of one in-graph call: those it runs (`benchmark.executed_ops`), and the nodes of its graph with",
                "the functions they call (`benchmark.graph_ops`: both branches of a cond, a loop body once):",
                "",
                "| system | `get_next` ops run | `add_batch` ops run | `get_next` nodes | `add_batch` nodes |",
                "|---|---|---|---|---|",
            ]
            for name, counted in result["ops"].items():
                cells = [counted[key] for key in ("sample", "add", "sample_nodes", "add_nodes")]
                lines.append(f"| {name} | " + " | ".join(map(str, cells)) + " |")
        if result.get("files"):
            lines += [
                "",
                "Buffer files: bytes per stored frame, and the peak resident memory each call needs beyond the",
                "buffer's own storage, as a multiple of that storage (loads in fresh processes):",
                "",
                "| system | file bytes/frame | save | <class>.load | files.load into an empty buffer |",
                "|---|---|---|---|---|",
            ]
            for name, entry in result["files"].items():
                stored = entry["stored_bytes"]
                peaks = [
                    entry[key] / stored for key in ("save_peak_bytes", "load_new_peak_bytes", "load_into_peak_bytes")
                ]
                cells = [_fmt(entry["file_bytes_per_frame"])] + [f"{peak:.2f}x" for peak in peaks]
                lines.append(f"| {name} | " + " | ".join(cells) + " |")
        if result.get("open"):
            lines += [
                "",
                "Memory-mapped buffers: `tfbuffers.open` (median of 3, page cache warm) on full buffers of two",
                "sizes, and the anonymous resident memory (RssAnon) their fill took, against the bytes they store:",
                "",
                "| system | frames: open seconds | RssAnon / stored bytes |",
                "|---|---|---|",
            ]
            for name, times in result["open"].items():
                opens = ", ".join(f"{int(frames):,}: {seconds * 1e3:.1f} ms" for frames, seconds in times.items())
                entry = result["memory"].get(name, {})
                anonymous, stored = entry.get("anonymous_bytes_per_frame"), entry.get("stored_bytes_per_frame")
                share = "-" if anonymous is None or not stored else _ratio(max(anonymous, 0.0) / stored)
                lines.append(f"| {name} | {opens} | {share} |")
        if result.get("actors"):
            lines += ["", *actor_table(result["actors"])]
        lines += ["", "Ratios (tfbuffers / peer, medians of the same run):", ""]
        lines += ["| measure | ratio | value |", "|---|---|---|"]
        for measure, row in ratios(result).items():
            for pair, value in row.items():
                lines.append(f"| {MEASURES[measure]} | {pair} | {_ratio(value)} |")
        for ours, theirs in OURS.items():
            resident = [result["memory"].get(name, {}).get("resident_bytes_per_frame") for name in (ours, theirs)]
            if all(resident):
                ratio = resident[0] / resident[1]
                lines.append(f"| resident bytes/frame (RSS) | {ours} / {theirs} | {_ratio(ratio)} |")
        lines.append("")
    if results.get("tree_memory_peaks"):
        lines += [tree_memory_line(results["tree_memory_peaks"]), ""]
    return "\n".join(lines)


def tree_memory_line(peaks: dict[str, dict[str, Any]]) -> str:
    """What the run's processes held at most, summed (`TreeMemory`): proportionally (each page once) and by RSS."""
    parts = [
        f"{label} {peak['bytes'] / 1e9:.2f} GB during {peak['during']} ({peak['processes']} processes)"
        for key, label in (("pss", "proportional (PSS, each page once)"), ("rss", "resident sets (RSS)"))
        if (peak := peaks.get(key)) is not None
    ]
    return "The run's processes summed, at most: " + "; ".join(parts) + "."


def plot(results: dict[str, Any], path: pathlib.Path) -> None:
    """Small multiples: a panel per workload and measure, a horizontal bar per system (median frames/s, log scale).

    Systems keep one order (`SYSTEM_NAMES`) and one colour in every panel; each bar is labelled with its
    value; a system that did not run a measure has no bar there.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    measures = [m for m in MEASURES if m not in ("save", "load")]
    everyone = SYSTEM_NAMES + OUT_OF_PROCESS
    names = [name for name in everyone if name in results["systems"]]
    palette = [plt.get_cmap("tab20")(i) for i in range(20)] + [plt.get_cmap("tab20b")(i) for i in range(20)]
    colours = {name: palette[i % len(palette)] for i, name in enumerate(everyone)}
    workloads = list(results["workloads"].items())
    shown = [
        [m for m in measures if any(result["measures"].get(m, {}).get(name) for name in names)]
        for _, result in workloads
    ]
    columns = max(3, min(4, max(len(row) for row in shown)))
    rows = sum(-(-len(row) // columns) for row in shown)
    height = 0.22 * len(names) + 1.2
    figure, axes = plt.subplots(rows, columns, figsize=(5.2 * columns, height * rows), squeeze=False)
    for axis in axes.flat:
        axis.set_visible(False)
    row = 0
    for (workload_name, result), workload_measures in zip(workloads, shown):
        for index, measure in enumerate(workload_measures):
            axis = axes[row + index // columns, index % columns]
            axis.set_visible(True)
            entries = result["measures"].get(measure, {})
            values = [entries[name]["median"] if entries.get(name) else 0.0 for name in names]
            positions = np.arange(len(names))
            axis.barh(positions, values, color=[colours[name] for name in names])
            for position, value in zip(positions, values):
                if value > 0:
                    axis.text(value, position, f" {_fmt(value)}", va="center", fontsize=7)
            axis.set_yticks(positions, names if index % columns == 0 else [""] * len(names), fontsize=8)
            axis.invert_yaxis()
            axis.set_xscale("log")
            top = max(values) if max(values) > 0 else 1.0
            axis.set_xlim(right=top * 20)  # room for the labels
            axis.set_title(f"{workload_name}: {MEASURES[measure].replace(' (frames/s)', '')}", fontsize=9)
            axis.tick_params(axis="x", labelsize=7)
            axis.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # decades only: no crowded labels
            axis.grid(axis="x", alpha=0.3)
        row += -(-len(workload_measures) // columns)
    figure.suptitle("Median frames/s (log scale; higher is better)", fontsize=11)
    figure.tight_layout(rect=(0, 0, 1, 0.98))  # the title above the panels' own
    figure.savefig(path, dpi=110)
    plt.close(figure)


def machine() -> str:
    """The machine, in words."""
    memory = psutil.virtual_memory().total / 2**30
    return (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {memory:.0f} GiB; "
        f"Python {platform.python_version()}, " + ", ".join(f"{name} {version}" for name, version in stack())
    )


def stack() -> list[tuple[str, str]]:
    """The installed versions of what the benchmark runs on (the pinned and the current stack differ here)."""
    names = ("tensorflow", "numpy", "tf-agents", "tf-keras", "dm-reverb")
    versions = []
    for name in names:
        try:
            versions.append((name, importlib.metadata.version(name)))
        except importlib.metadata.PackageNotFoundError:
            versions.append((name, "not installed"))
    return versions


def actor_table(actors: dict[str, Any]) -> list[str]:
    """The markdown lines of `actor_rates`' results: items/s by actor count and backend, the learners' rates."""
    backends = [name for name in ACTOR_BACKENDS if name in actors]
    lines = [
        "Actor processes adding to one buffer at once (items/s, all actors; per actor in brackets; an item per "
        "frame), then a learner drawing from it through `as_dataset` (windows/s, the buffer quiet; "
        "tfbuffers py: a local buffer in the learner's process):",
        "",
        "| actors | " + " | ".join(backends) + (" | Ray / Reverb |" if len(backends) == 2 else " |"),
        "|---|" + "---|" * (len(backends) + (len(backends) == 2)),
    ]
    for count in actors[backends[0]]["adds"]:
        cells = []
        for backend in backends:
            entry = actors[backend]["adds"][count]
            each = ", ".join(_fmt(rate) for rate in entry["per_actor"])
            cells.append(f"{_fmt(entry['frames_per_second'])} ({each})")
        if len(backends) == 2:
            pair = [actors[backend]["adds"][count]["frames_per_second"] for backend in backends]
            cells.append(_ratio(pair[1] / pair[0]))
        lines.append(f"| {count} | " + " | ".join(cells) + " |")
    learners = [actors[backend]["learner"] for backend in backends]
    ratio = [_ratio(learners[1] / learners[0])] if len(backends) == 2 else []
    lines.append("| learner | " + " | ".join([*map(_fmt, learners), *ratio]) + " |")
    if "tfbuffers py" in actors and "tfbuffers Ray" in actors:
        local = actors["tfbuffers py"]["learner"]
        lines += [
            "",
            f"Learner's `as_dataset` against a local py buffer's ({_fmt(local)} windows/s): tfbuffers Ray "
            f"{_ratio(actors['tfbuffers Ray']['learner'] / local)}"
            + (
                f", tfbuffers Reverb {_ratio(actors['tfbuffers Reverb']['learner'] / local)}"
                if "tfbuffers Reverb" in actors
                else ""
            )
            + ".",
        ]
    return lines


def summarize(values: list[float]) -> dict[str, float]:
    """A measure's runs as the tables show them: median, range, count."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": len(values)}
