"""The README works as written: its quickstart runs, and every file and section it points to exists."""

from __future__ import annotations

import contextlib
import io
import pathlib
import re
import subprocess
import sys

import pytest

CHECKOUT = pathlib.Path(__file__).resolve().parents[2]
README = (CHECKOUT / "README.md").read_text()


def section(text: str, heading: str) -> str:
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_quickstart_runs(tmp_path, monkeypatch):
    (code,) = re.findall(r"```python\n(.*?)```", section(README, "Quickstart"), re.DOTALL)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__main__"}
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(code, "README quickstart", "exec"), namespace)  # noqa: S102
    buffer, items, info, training = (namespace[name] for name in ("buffer", "items", "info", "training"))
    frames = int(buffer.num_frames())
    assert frames >= 400 and frames % 4 == 0  # the driver's 400 steps and boundary steps, one frame per ring
    assert items.observation.shape == (64, 2, 4)
    windows = frames - 4  # every window of 2 frames within one of the 4 rings
    assert float(info.probabilities[0]) == pytest.approx(1 / windows, rel=1e-6)
    assert type(training).__name__ == "PyUniformReplayBuffer" and training.capacity == 50_000 * 4
    assert int(training.num_frames()) == frames
    assert output.getvalue().splitlines()[0] == str(frames)


def test_every_file_and_section_it_points_to_exists():
    links = re.findall(r"\]\(([^)\s]+)\)", README)
    paths = re.findall(r"`((?:tests|scripts|docs|colabs)/[\w./-]+)`", README)
    local = [link for link in links if not link.startswith(("http://", "https://", "#"))]
    assert len(local) >= 15 and len(paths) >= 15
    for target in local + paths:
        path, _, anchor = target.partition("#")
        assert (CHECKOUT / path).exists(), target
        if anchor:
            headings = re.findall(r"^#+ (.+)$", (CHECKOUT / path).read_text(), re.MULTILINE)
            assert anchor in {slug(heading) for heading in headings}, target
    for anchor in re.findall(r"\]\(#([\w-]+)\)", README):
        assert anchor in {slug(heading) for heading in re.findall(r"^#+ (.+)$", README, re.MULTILINE)}, anchor


@pytest.mark.parametrize(
    "page", sorted((CHECKOUT / "docs").rglob("*.md")), ids=lambda page: str(page.relative_to(CHECKOUT / "docs"))
)
def test_the_docs_links_resolve(page):
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        assert file.exists(), f"{page.name}: {target}"
        if anchor and file.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", file.read_text(), re.MULTILINE)
            assert anchor in {slug(heading) for heading in headings}, f"{page.name}: {target}"


def test_the_two_commands_are_make_targets_and_ci_runs_the_test_command():
    setup = section(README, "Setup, tests and the main job")
    assert "```bash\nmake run\n```" in setup and "```bash\nmake test\n```" in setup
    makefile = (CHECKOUT / "Makefile").read_text()
    recipes = dict(re.findall(r"^([\w-]+): ?[^\n]*\n((?:\t[^\n]*\n)+)", makefile, re.MULTILINE))
    assert "scripts/train_dqn.py" in recipes["run"] and "-m pytest" in recipes["test"]
    assert '-m "not slow"' in recipes["test-fast"]
    assert "--durations=15" in recipes["test"]  # make test ends with its 15 slowest tests
    assert "--cov" in recipes["coverage"] and "scripts/mutations.py" in recipes["mutations"]
    ci = (CHECKOUT / ".ci" / "run").read_text()
    assert "\nmake test\n" in ci and "\nmake test PYTHON=python3.12\n" in ci


def test_the_api_reference_builds_with_warnings_as_errors_and_covers_every_public_module(tmp_path):
    # make docs and CI build it too; here a broken docstring or directive fails make test as well.
    site = tmp_path / "site"
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=CHECKOUT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    pages = list((CHECKOUT / "docs" / "api").glob("*.md"))
    documented = {name for page in pages for name in re.findall(r"^::: (tfbuffers[\w.]*)$", page.read_text(), re.M)}
    package = CHECKOUT / "tfbuffers"
    public = {
        ".".join(["tfbuffers", *path.relative_to(package).with_suffix("").parts]).removesuffix(".__init__")
        for path in package.rglob("*.py")
        if not any(part.startswith("_") and part != "__init__.py" for part in path.relative_to(package).parts)
    }
    # Modules that re-export what others define (documented there).
    shims = {"tfbuffers.ray_replay_buffer", "tfbuffers.remote", "tfbuffers.remote.ray", "tfbuffers.remote.reverb"}
    assert sorted(public - documented - shims) == []
    assert "tfbuffers.TFUniformReplayBuffer" in (site / "api" / "buffers" / "index.html").read_text()
    # The guide and the reference link each other.
    assert "](api/index.md)" in (CHECKOUT / "docs" / "guide.md").read_text()
    assert "](../guide.md)" in (CHECKOUT / "docs" / "api" / "index.md").read_text()
