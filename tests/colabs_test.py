"""The notebooks in colabs/ run top to bottom against this checkout."""

from __future__ import annotations

import configparser
import contextlib
import io
import json
import pathlib
import shlex
import subprocess
import sys

import pytest

CHECKOUT = pathlib.Path(__file__).resolve().parent.parent
COLABS = sorted((CHECKOUT / "colabs").glob("*.ipynb"))
REPOSITORY = configparser.ConfigParser()
REPOSITORY.read(CHECKOUT / "setup.cfg")
PACKAGE = f"tfbuffers[current] @ git+{REPOSITORY['metadata']['url']}"
# Every notebook's first code cell installs tfbuffers as a Colab user would, on Colab's runtime (Python 3.12,
# current TensorFlow). Here it is rewritten to this checkout and run on Python 3.12+ (the current stack,
# which it leaves as it was: everything it asks for is installed); the pinned stack is Python 3.11, not
# Colab's runtime, and skips it.
INSTALL = f'%pip install -q "{PACKAGE}"\n%pip install -q --no-deps tf-agents==0.19.0'
COLAB_RUNTIME = sys.version_info >= (3, 12)


def code_cells(path: pathlib.Path) -> list[str]:
    notebook = json.loads(path.read_text())
    return ["".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "code"]


def test_there_are_notebooks():
    assert [path.name for path in COLABS] == ["replay_buffers_tutorial.ipynb"]


def run_pip(line: str) -> None:
    """Runs one `%pip ...` line as IPython does: pip of the running interpreter."""
    command, _, arguments = line.partition(" ")
    assert command == "%pip", line
    subprocess.run([sys.executable, "-m", "pip", *shlex.split(arguments)], check=True, stdout=subprocess.DEVNULL)


@pytest.mark.parametrize("path", COLABS, ids=[path.name for path in COLABS])
def test_notebook_runs(path):
    install, *cells = code_cells(path)
    assert install == INSTALL
    if COLAB_RUNTIME:
        for line in install.replace(f'"{PACKAGE}"', "-e " + shlex.quote(f"{CHECKOUT}[current]")).splitlines():
            run_pip(line)
    namespace: dict = {}
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        for source in cells:
            exec(compile(source, f"{path.name}", "exec"), namespace)  # noqa: S102
    printed = output.getvalue()
    assert "[[2, 3], [4, 5], [102, 103], [104, 105]]" in printed
    assert "0: expected leading batch size 32, got 1 (shape (1, 3))" in printed
