"""The notebooks in colabs/ run top to bottom against this checkout."""

from __future__ import annotations

import contextlib
import io
import json
import pathlib

import pytest

COLABS = sorted((pathlib.Path(__file__).parent.parent / "colabs").glob("*.ipynb"))


def code_cells(path: pathlib.Path) -> list[str]:
    notebook = json.loads(path.read_text())
    return ["".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "code"]


def test_there_are_notebooks():
    assert [path.name for path in COLABS] == ["replay_buffers_tutorial.ipynb"]


@pytest.mark.parametrize("path", COLABS, ids=[path.name for path in COLABS])
def test_notebook_runs(path):
    namespace: dict = {}
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        for source in code_cells(path):
            exec(compile(source, f"{path.name}", "exec"), namespace)  # noqa: S102
    printed = output.getvalue()
    assert "[[2, 3], [4, 5], [102, 103], [104, 105]]" in printed
    assert "0: expected leading batch size 32, got 1 (shape (1, 3))" in printed
