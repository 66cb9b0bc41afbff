"""The notebooks in colabs/ run top to bottom against this checkout, on each stack where their features exist.

Each notebook's first code cell installs tfbuffers as its reader would: on Colab's runtime (Python 3.12,
current TensorFlow) from the repository with the `all` extra, or, for Reverb, on a Python 3.11 runtime
from the repository's constraints. Here nothing is installed: each `%pip` line is checked against this
environment instead (every requirement it names is installed, in a version it allows), where the notebook's
runtime is this interpreter's; a `git clone` of the repository becomes a link to the checkout. The other cells run
in one namespace, in order, in a temporary directory, with `TFBUFFERS_NOTEBOOK_SMALL=1` (smaller sizes) and
every figure that `plt.show()` shows saved. Then each notebook's own checks look at what it computed.
"""

from __future__ import annotations

import configparser
import contextlib
import dataclasses
import importlib.metadata
import importlib.util
import io
import json
import os
import pathlib
import re
import shlex
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tfbuffers import _noise

CHECKOUT = pathlib.Path(__file__).resolve().parents[2]
COLABS = sorted((CHECKOUT / "colabs").glob("*.ipynb"))
REPOSITORY = configparser.ConfigParser()
REPOSITORY.read(CHECKOUT / "setup.cfg")
URL = REPOSITORY["metadata"]["url"]  # https://github.com/tfbuffers/tfbuffers
RAW = URL.replace("https://github.com/", "https://raw.githubusercontent.com/") + "/main"
BADGE = "https://colab.research.google.com/github/" + URL.removeprefix("https://github.com/") + "/blob/main/colabs/"

COLAB_PACKAGE = f'"tfbuffers[all] @ git+{URL}"'
COLAB_INSTALL = f"%pip install -q {COLAB_PACKAGE}\n%pip install -q --no-deps tf-agents==0.19.0"
PINNED_PACKAGE = f'-c {RAW}/constraints.txt "tfbuffers[all] @ git+{URL}"'
CLONE = f"!git clone -q --depth 1 {URL} tfbuffers-src"
EITHER_INSTALL = f"""import sys

if sys.version_info[:2] == (3, 11):  # dm-reverb's last Python: the pinned stack, Reverb and Ray
    %pip install -q {PINNED_PACKAGE}
else:  # Colab's runtime: the current stack, Ray
    {COLAB_INSTALL.replace(chr(10), chr(10) + "    ")}"""

COLAB_RUNTIME = sys.version_info >= (3, 12)  # the current stack: Colab's hosted runtime
HAS_REVERB = importlib.util.find_spec("reverb") is not None  # the pinned stack (Python 3.11)


def check_tutorial(namespace: dict[str, Any], printed: str, figures: list[pathlib.Path]) -> None:
    assert "[[2, 3], [4, 5], [102, 103], [104, 105]]" in printed
    assert "0: expected leading batch size 32, got 1 (shape (1, 3))" in printed
    assert namespace["replay_buffer"].num_frames().numpy() == 6 * 32  # the refused add stored nothing


def check_collect_and_train(namespace: dict[str, Any], printed: str, figures: list[pathlib.Path]) -> None:
    assert int(namespace["train_step"].numpy()) == namespace["ITERATIONS"] == 300
    assert namespace["iterations"] == [0, 100, 200, 300]
    assert all(1.0 <= value <= 500.0 for value in namespace["returns"])  # CartPole-v1 returns
    buffer, stored = namespace["buffer"], namespace["stored"]
    environments, frames, observation = stored.observation.shape
    assert (environments, observation) == (4, 4)
    assert namespace["added"] == environments * frames >= 1_000  # warm's frames, one segment per environment
    assert namespace["windows"] == environments * (frames - 1)
    assert f"{1 / namespace['windows']:.3e} = 1 / {namespace['windows']} windows" in printed
    assert int(buffer.num_frames()) % environments == 0  # every add writes one frame to each segment
    assert len(figures) == 1


def check_prioritized_replay(namespace: dict[str, Any], printed: str, figures: list[pathlib.Path]) -> None:
    assert int(namespace["skipped"]) == 0
    drawn, expected = namespace["drawn"], namespace["expected"]
    assert drawn.shape == (namespace["DRAWS"],) and not np.any(drawn == 0)  # priority 0: never drawn
    assert "frame 0 (priority 0) drawn 0 times" in printed
    np.testing.assert_allclose(namespace["probabilities"][1:], expected[1:], rtol=1e-6)  # float32 probabilities
    np.testing.assert_allclose(expected, [0] + [p**0.6 / sum(q**0.6 for q in range(8)) for p in range(1, 8)])
    # 20,000 draws: each frequency is within 7 standard deviations (0.02) of its probability.
    np.testing.assert_allclose(namespace["frequencies"], expected, atol=0.02)
    info, weights = namespace["info"], namespace["weights"].numpy()
    reference = (8 * info.probabilities.numpy().astype(np.float64)) ** -0.4
    np.testing.assert_allclose(weights, reference / reference.max(), rtol=1e-6)
    assert weights.max() == 1.0
    assert {label: curve[0] for label, curve in namespace["curves"].items()} == {
        "uniform": [0, 50, 100],
        "prioritized": [0, 50, 100],
    }
    assert len(figures) == 2


def check_reverb_and_scaling(namespace: dict[str, Any], printed: str, figures: list[pathlib.Path]) -> None:
    backend = namespace["BACKEND"]
    assert backend == os.environ["TFBUFFERS_BACKEND"]
    assert "FileExistsError create_replay_buffer:" in printed and "already holds a checkpoint" in printed
    assert (namespace["first"], namespace["second"]) == ("0", "1")
    assert namespace["start_items"] == namespace["saved_items"] > 0  # the loaded checkpoint held every item
    assert [actor.returncode for actor in namespace["actors"]] == [0, 0]
    grown = namespace["table"][-1] - namespace["start_items"]
    frames = namespace["ACTOR_FRAMES"]
    if backend == "reverb":  # each actor's frames become items of 2 frames within an episode: fewer, but most
        assert re.search(r"^ReverbReplayBuffer holds \d+ items$", printed, re.MULTILINE)
        assert frames < grown < 2 * frames
    else:  # every frame of both actors: the driver's steps, and one more per episode (its boundary frame)
        assert re.search(r"^RayReplayBuffer holds \d+ frames$", printed, re.MULTILINE)
        assert namespace["saved_items"] % 3 == 0  # an add writes a frame to each of the 3 segments
        assert 2 * frames < grown < 2.2 * frames
    assert f"after clear: 0 {'items' if backend == 'reverb' else 'frames'}" in printed  # windows on Reverb
    assert namespace["restored_items"] == namespace["table"][-1]  # the second checkpoint, after the actors
    assert int(namespace["agent"].train_step_counter.numpy()) == namespace["TRAIN_STEPS"]
    assert len(figures) == 1


def check_save_load_and_episodes(namespace: dict[str, Any], printed: str, figures: list[pathlib.Path]) -> None:
    assert int(namespace["starter"].num_frames()) == 2_000
    assert namespace["identical"] is True
    assert namespace["training"].capacity == 20_000 and int(namespace["training"].num_frames()) == 2_000
    assert "damaged.safetensors: field/" in printed and "the file is corrupted" in printed
    # The starter's frames in memory-mapped files, reopened after a child process added 100 and was killed.
    assert "PyPrioritizedReplayBuffer 2000 frames | killed by SIGKILL: True" in printed
    assert type(namespace["reopened"]).__name__ == "PyPrioritizedReplayBuffer"
    assert int(namespace["reopened"].num_frames()) == 2_100
    grown, stored = namespace["grown"], namespace["stored_mib"]
    assert stored == (namespace["MEMMAP_ADDS"] * 4 * (84 * 84 * 4 + 8) + 8) / 2**20  # rows and the counter
    assert grown["directory="] < 0.1 * stored < 0.9 * stored < grown["in RAM"]
    counts = namespace["counts"]
    assert counts["episode_boundaries=True"] == 0 < counts["plain"]
    # n-step with gamma 0.99 and rewards of 1: within the episode, cut by a termination after m steps, or a
    # window starting on LAST (one step, reward 0, discount 1).
    allowed = {(2.9701, 0.9801), (2.9701, 0.0), (1.99, 0.0), (1.0, 0.0), (0.0, 1.0)}
    found = {(round(float(reward), 4), round(float(discount), 4)) for reward, discount in namespace["values"]}
    assert (2.9701, 0.9801) in found and found <= allowed
    adds, frame = namespace["STACK_ADDS"], 84 * 84
    assert namespace["same_stacks"]
    assert namespace["full"].nbytes == adds * (4 * frame + 8) + 8
    # Handles (4 per stack), actions, the counter; then the frame pool's slots (a frame, its count and hash):
    # the empty rows' zero frame, the stacks' first frame, one new frame per add.
    assert namespace["stacked"].nbytes == adds * (4 * 8 + 8) + 8 + (2 + adds) * (frame + 16)
    assert len(figures) == 3


def check_offline_and_hindsight(namespace: dict[str, Any], printed: str, figures: list[pathlib.Path]) -> None:
    written, filled = namespace["written_rlds"], namespace["filled"]
    assert written == namespace["written_minari"] and written.episodes >= 50  # random CartPole: ~22 steps each
    assert written.frames + written.left_out_frames == namespace["DATASET_FRAMES"] == 2_000
    assert filled == (written.episodes, written.frames, 0) and namespace["identical"] is True
    assert f"{written.episodes} episodes; the first:" in printed and "is_terminal at" in printed
    assert "environment: CartPole-v1" in printed
    assert namespace["offline_iterations"] == [0, 40, 80, 120, 160, 200]
    assert all(1.0 <= value <= 500.0 for value in namespace["offline_returns"])  # CartPole-v1 returns
    curves = namespace["curves"]
    assert sorted(curves) == ["DQN", "DQN + HER (future, 0.8)"]
    for curve in curves.values():
        assert [iteration for iteration, _ in curve] == [0, 20, 40, 60, 80, 100]
        assert all(rate in {k / 20 for k in range(21)} for _, rate in curve)  # shares of 20 episodes
    assert len(figures) == 2


def check_performance(namespace: dict[str, Any], printed: str, figures: list[pathlib.Path]) -> None:
    results = json.loads((pathlib.Path("benchmark") / "results.json").read_text())
    assert results["quick"] and sorted(results["systems"]) == sorted(namespace["SYSTEMS"].split(","))
    rows, quick, full = namespace["rows"], namespace["quick"], namespace["full"]
    docs = (CHECKOUT / "docs" / "benchmarks.md").read_text()
    assert {pair for _, pair in rows} == {"tfbuffers TF / TF-Agents TF", "tfbuffers py / TF-Agents py"}
    assert len(rows) >= 8
    for measure, pair in rows:
        assert quick[measure, pair] > 0
        assert f"| {measure} | {pair} | {full[measure, pair]:.2f}x |" in docs  # the full run, as docs holds it
    assert len(figures) == 1


def check_concurrency(namespace: dict[str, Any], printed: str, figures: list[pathlib.Path]) -> None:
    batches = namespace["batches"]
    assert batches >= namespace["MIN_BATCHES"] == 20  # however slow the machine
    assert namespace["within"] == 64 * batches  # every transition: one environment, in order
    assert not namespace["collector"].is_alive()
    added, held, newest = namespace["added"], namespace["held"], namespace["newest"]
    assert added == sorted(added) and held == sorted(held) and max(held) <= 2_000
    assert max(newest) < namespace["collected"][0]  # ids name frames added, counted from 0
    reports = namespace["reports"]
    assert list(reports) == [
        "TFUniformReplayBuffer",
        "PyUniformReplayBuffer",
        "TFPrioritizedReplayBuffer",
        "PyPrioritizedReplayBuffer",
    ]
    for name, report in reports.items():
        assert min(report.adds, report.samples, report.dataset_batches, report.gathers) >= 5, name
        assert report.frames_checked > 0 and report.threads == 6, name
        assert (report.priority_updates > 0) == ("Prioritized" in name), name
    assert len(figures) == 2


@dataclasses.dataclass(frozen=True)
class Notebook:
    install: list[str]  # its first code cell, line by line
    check: Callable[[dict[str, Any], str, list[pathlib.Path]], None]
    backends: tuple[str, ...] = ()  # each run in turn, as `TFBUFFERS_BACKEND` (none: the notebook's own choice)


# The scaling notebook's engines on this stack: Reverb (its default where dm-reverb imports) and Ray.
SCALING_BACKENDS = ("reverb", "ray") if HAS_REVERB else ("ray",)


NOTEBOOKS = {
    "replay_buffers_tutorial.ipynb": Notebook(COLAB_INSTALL.splitlines(), check_tutorial),
    "collect_and_train.ipynb": Notebook(COLAB_INSTALL.splitlines(), check_collect_and_train),
    "concurrency.ipynb": Notebook(COLAB_INSTALL.splitlines(), check_concurrency),
    "prioritized_replay.ipynb": Notebook(COLAB_INSTALL.splitlines(), check_prioritized_replay),
    "reverb_and_scaling.ipynb": Notebook(EITHER_INSTALL.splitlines(), check_reverb_and_scaling, SCALING_BACKENDS),
    "save_load_and_episodes.ipynb": Notebook(COLAB_INSTALL.splitlines(), check_save_load_and_episodes),
    "offline_and_hindsight.ipynb": Notebook(COLAB_INSTALL.splitlines(), check_offline_and_hindsight),
    "performance.ipynb": Notebook([*COLAB_INSTALL.splitlines(), CLONE], check_performance),
}


def cells(path: pathlib.Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text())["cells"]


def code_cells(path: pathlib.Path) -> list[str]:
    return ["".join(cell["source"]) for cell in cells(path) if cell["cell_type"] == "code"]


def test_there_is_a_notebook_per_capability():
    assert [path.name for path in COLABS] == sorted(NOTEBOOKS)


@pytest.mark.parametrize("path", COLABS, ids=[path.name for path in COLABS])
def test_notebook_opens_in_colab_installs_and_stores_no_outputs(path):
    first = cells(path)[0]
    assert first["cell_type"] == "markdown"
    assert f"]({BADGE}{path.name})" in "".join(first["source"])  # the "Open in Colab" badge, to this notebook
    assert code_cells(path)[0].splitlines() == NOTEBOOKS[path.name].install
    for cell in cells(path):
        if cell["cell_type"] == "code":
            assert (cell["outputs"], cell["execution_count"]) == ([], None)


def run_install_line(line: str, directory: pathlib.Path, namespace: dict[str, Any]) -> None:
    """One line of an install cell: `%pip` lines checked against this environment (never run), others run."""
    if line == CLONE:
        (directory / "tfbuffers-src").symlink_to(CHECKOUT, target_is_directory=True)
        return
    indent = line[: len(line) - len(line.lstrip())]
    line = line.lstrip()
    if not line.startswith("%pip"):
        namespace.setdefault("__install__", []).append(indent + line)
        return
    namespace.setdefault("__install__", []).append(indent + "pass")  # in an `if` for one runtime or another
    if PINNED_PACKAGE in line:
        if COLAB_RUNTIME:
            return  # the pinned stack's line: a Python 3.11 runtime
        assert_installed(line.replace(PINNED_PACKAGE, "-c constraints.txt tfbuffers[all]"))
    elif COLAB_RUNTIME:
        assert_installed(line.replace(COLAB_PACKAGE, "tfbuffers[all]"))
    # else: Colab's lines, for Python 3.12+; the pinned stack was set up by the README's command


def assert_installed(line: str) -> None:
    """Asserts that what a `%pip install` line asks for is installed here, in versions it allows.

    `tfbuffers[EXTRA]` stands for the extras' requirements in setup.cfg (markers evaluated here), `-c FILE` for
    the checkout's constraints file, `--no-deps NAME==VERSION` for that version alone.
    """
    from packaging.requirements import Requirement

    arguments = shlex.split(line)[2:]
    requirements: list[Requirement] = []
    constraints = pathlib.Path()
    while arguments:
        argument = arguments.pop(0)
        if argument == "-c":
            constraints = CHECKOUT / arguments.pop(0)
            requirements += [Requirement(text) for text in constraints.read_text().splitlines() if "==" in text]
        elif argument.startswith("tfbuffers["):
            for extra in Requirement(argument).extras:
                texts = REPOSITORY["options.extras_require"][extra].strip().splitlines()
                requirements += [Requirement(text) for text in texts]
        elif not argument.startswith("-"):
            requirements.append(Requirement(argument))
    assert requirements, line
    for requirement in requirements:
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        try:
            version = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            if constraints.name and requirement.name not in line:
                continue  # a constraint limits versions; it installs nothing by itself
            raise AssertionError(f"{line}: {requirement.name} is not installed") from None
        assert requirement.specifier.contains(version, prereleases=True), f"{line}: {requirement} (found {version})"


WRITEFILE = re.compile(r"%%writefile (\S+)\n")


def run_cell(source: str, namespace: dict[str, Any]) -> None:
    """One code cell: Python, or IPython's `%%writefile NAME` (the rest of the cell, written to NAME)."""
    match = WRITEFILE.match(source)
    if match:
        pathlib.Path(match[1]).write_text(source[match.end() :] + "\n")
        return
    magics = [line for line in source.splitlines() if line.startswith(("%", "!"))]
    assert not magics, f"only the first cell and %%writefile cells may hold IPython magics: {magics}"
    exec(compile(source, "<cell>", "exec"), namespace)  # noqa: S102


def run_small(path: pathlib.Path, directory: pathlib.Path, monkeypatch: Any) -> tuple[dict[str, Any], str, list]:
    """Runs the notebook at reduced sizes in this process, in `directory`: its namespace, printed text, figures."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures: list[pathlib.Path] = []

    def show(*args: Any, **kwargs: Any) -> None:
        for number in plt.get_fignums():
            figures.append(directory / f"figure-{len(figures)}.png")
            plt.figure(number).savefig(figures[-1])
        plt.close("all")

    monkeypatch.setattr(plt, "show", show)
    monkeypatch.setenv("TFBUFFERS_NOTEBOOK_SMALL", "1")
    monkeypatch.chdir(directory)
    install, *sources = code_cells(path)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    for line in install.splitlines():
        run_install_line(line, directory, namespace)
    exec(compile("\n".join(namespace.pop("__install__", [])), "<install cell>", "exec"), namespace)  # noqa: S102
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        for source in sources:
            run_cell(source, namespace)
    plt.close("all")
    return namespace, output.getvalue(), figures


TRAINING = {  # what a notebook's training leaves: compared exactly between two runs
    "collect_and_train.ipynb": lambda namespace: (namespace["returns"], float(namespace["loss"])),
    "prioritized_replay.ipynb": lambda namespace: namespace["curves"],
}


@pytest.mark.parametrize("path", COLABS, ids=[path.name for path in COLABS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    """Each notebook's cells and checks; a notebook that trains (`TRAINING`) runs twice and repeats exactly."""
    notebook = NOTEBOOKS[path.name]
    for backend in notebook.backends or (None,):
        directory = tmp_path / (backend or "run")
        directory.mkdir()
        if backend is not None:
            monkeypatch.setenv("TFBUFFERS_BACKEND", backend)
        namespace, printed, figures = run_small(path, directory, monkeypatch)
        notebook.check(namespace, printed, figures)
        assert all(figure.stat().st_size > 10_000 for figure in figures)  # drawn, not blank
        if path.name in TRAINING:
            (tmp_path / "again").mkdir()
            again, _, _ = run_small(path, tmp_path / "again", monkeypatch)
            assert TRAINING[path.name](namespace) == TRAINING[path.name](again)


# In a kernel: each notebook as a Colab or Jupyter runtime executes it (nbclient, one IPython kernel of this
# interpreter). The install cell's `%pip` lines are left out (this environment is set up; they are checked above);
# its other lines run. At the tests' small sizes (TFBUFFERS_NOTEBOOK_SMALL), or with `--full-size-notebooks` (`make
# notebooks`) at the sizes the notebook ships with: 15 CPU-minutes, run when a notebook or what it shows changes, not
# in every CI run. CI runs them on the pinned stack.

CELL_TIMEOUT = 900  # seconds; a notebook that hangs fails here, naming its cell
# A kernel as Colab's and Jupyter's are: ipykernel sends what C++ writes to the process's stdout and stderr (through
# a pipe) to the cells, except where it sees PYTEST_CURRENT_TEST.
KERNEL_UNSET = {"TFBUFFERS_NOTEBOOK_SMALL", "PYTEST_CURRENT_TEST"}


def executed(path: pathlib.Path, directory: pathlib.Path, small: bool) -> Any:
    """The notebook at `path`, executed top to bottom in a fresh kernel in `directory`, at small sizes or full."""
    import nbclient
    import nbformat

    notebook = nbformat.reads(path.read_text(), as_version=4)
    install = next(cell for cell in notebook.cells if cell.cell_type == "code")
    lines = install.source.splitlines()
    if CLONE in lines:
        (directory / "tfbuffers-src").symlink_to(CHECKOUT, target_is_directory=True)
    install.source = "\n".join(
        line.replace(line.lstrip(), "pass") if line.lstrip().startswith("%pip") else line
        for line in lines
        if not line.startswith("!git clone")
    )
    environment = {key: value for key, value in os.environ.items() if key not in KERNEL_UNSET}
    environment |= {"TFBUFFERS_NOTEBOOK_SMALL": "1"} if small else {}
    client = nbclient.NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT,
        kernel_name="python3",
        resources={"metadata": {"path": str(directory)}},
    )
    client.execute(env=environment)
    return notebook


@pytest.mark.parametrize("path", COLABS, ids=[path.name for path in COLABS])
def test_notebook_runs_in_a_kernel(path, tmp_path, request):
    ran = executed(path, tmp_path, small=not request.config.getoption("--full-size-notebooks"))
    outputs = [output for cell in ran.cells if cell.cell_type == "code" for output in cell.outputs]
    errors = [output for output in outputs if output.output_type == "error"]
    assert errors == []
    stderr = "".join(output.text for output in outputs if output.get("name") == "stderr")
    assert "Gym has been unmaintained" not in stderr  # tfbuffers.envs, imported before TF-Agents, kept it off
    start_up = re.compile("|".join(_noise.TENSORFLOW_START_UP))
    assert [line for line in stderr.splitlines() if start_up.search(line)] == []  # tfbuffers imported TensorFlow
    assert "IProgress not found" not in stderr  # the kernel has the widgets Colab's and Jupyter's have
    assert "__autograph_generated_file" not in stderr  # autograph's repeats of TF-Agents' SyntaxWarnings
    figures = [output for output in outputs if "image/png" in output.get("data", {})]
    assert len(figures) == len(notebook_figures(path))  # every figure the notebook draws, drawn
    counts = [cell.execution_count for cell in ran.cells if cell.cell_type == "code" and cell.source.strip()]
    assert counts == list(range(1, len(counts) + 1))  # every cell ran, in order


def notebook_figures(path: pathlib.Path) -> list[str]:
    """The cells of the notebook that show a figure."""
    return [source for source in code_cells(path) if "plt.show()" in source]
