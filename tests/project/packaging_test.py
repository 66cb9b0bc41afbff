"""The package as users install it: the wheel and the sdist built from this checkout, the core in a fresh venv.

The fresh environment gets the wheel with `pip install --no-deps --no-index` and, for its three dependencies
(tensorflow, numpy and numba), exactly the distributions that pip would resolve for them: their dependency closure,
taken from this environment and linked into a directory that the venv reads. Nothing is downloaded, and the
extras' packages (safetensors, tf-agents, Reverb, gymnasium, ...) are absent there, as after `pip install tfbuffers`.
"""

from __future__ import annotations

import email
import importlib.metadata
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile

import pytest
from packaging.requirements import Requirement

CHECKOUT = pathlib.Path(__file__).resolve().parents[2]

EXTRAS_PACKAGES = [
    "safetensors", "tf_agents", "reverb", "ray", "gymnasium", "gym", "tqdm", "matplotlib", "tf_keras",
    "tensorflow_datasets", "minari",
]  # fmt: skip


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, pathlib.Path]:
    """The sdist and wheel, built without isolation (nothing downloaded) from a copy of the checkout."""
    source = tmp_path_factory.mktemp("source") / "tfbuffers"
    ignore = shutil.ignore_patterns(".git", ".venv*", "out", "build", "dist", "*.egg-info", "__pycache__", ".*cache")
    shutil.copytree(CHECKOUT, source, ignore=ignore)
    dist = tmp_path_factory.mktemp("dist")
    command = [sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel", "-o", str(dist), str(source)]
    subprocess.run(command, check=True, capture_output=True, timeout=600)
    (wheel,) = dist.glob("tfbuffers-*.whl")
    (sdist,) = dist.glob("tfbuffers-*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


def wheel_metadata(wheel: pathlib.Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        return email.message_from_bytes(archive.read(name))


def test_the_wheel_and_sdist_carry_the_license_the_typing_marker_and_the_classifiers(built):
    with zipfile.ZipFile(built["wheel"]) as archive:
        names = archive.namelist()
        licenses = [name for name in names if re.search(r"\.dist-info/(licenses/)?LICENSE$", name)]
        assert len(licenses) == 1
        assert archive.read(licenses[0]) == (CHECKOUT / "LICENSE").read_bytes()
        assert "tfbuffers/py.typed" in names
    with tarfile.open(built["sdist"]) as archive:
        assert any(name.endswith("/LICENSE") for name in archive.getnames())
    metadata = wheel_metadata(built["wheel"])
    classifiers = metadata.get_all("Classifier")
    for version in ("3.11", "3.12", "3.13"):
        assert f"Programming Language :: Python :: {version}" in classifiers
    assert "License :: OSI Approved :: Apache Software License" in classifiers
    core = [requirement for requirement in metadata.get_all("Requires-Dist") if "extra ==" not in requirement]
    assert sorted(Requirement(requirement).name for requirement in core) == ["numba", "numpy", "tensorflow"]
    # Extra names that the pip of Python 3.12's venv matches (it compares them unnormalized).
    assert sorted(metadata.get_all("Provides-Extra")) == [
        "agents", "all", "dev", "files", "gymnasium", "offline", "ray", "reverb", "scripts", "test", "testing"
    ]  # fmt: skip


def dependency_closure(requirements: list[str]) -> list[importlib.metadata.Distribution]:
    """The installed distributions that pip would resolve for `requirements` (no extras), each once."""
    found: dict[str, importlib.metadata.Distribution] = {}
    pending = [Requirement(text) for text in requirements]
    while pending:
        requirement = pending.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        if name in found:
            continue
        distribution = importlib.metadata.distribution(name)
        assert distribution.version in requirement.specifier or not requirement.specifier, requirement
        found[name] = distribution
        pending.extend(Requirement(text) for text in distribution.requires or [])
    return list(found.values())


def link_distributions(distributions: list[importlib.metadata.Distribution], into: pathlib.Path) -> None:
    """Links each distribution's top-level modules, packages and metadata into `into`."""
    into.mkdir()
    for distribution in distributions:
        site = pathlib.Path(distribution.locate_file(""))
        tops = {file.parts[0] for file in distribution.files or [] if file.parts[0] != ".."}
        for top in sorted(tops):
            target = into / top
            if top.endswith(".pth") or target.exists():
                continue  # namespace packages (google/) are linked whole once
            target.symlink_to(site / top)


def wheel_venv(
    built: dict[str, pathlib.Path], tmp_path: pathlib.Path, *extras: str, also: tuple[str, ...] = ()
) -> pathlib.Path:
    """A fresh venv holding the wheel and what pip would resolve for its core (and `extras`') requirements.

    `also`: distributions added without their dependencies (TF-Agents past Python 3.11, which the README installs
    with --no-deps).
    """
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    install = [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(built["wheel"])]
    subprocess.run(install, check=True, timeout=300)
    requirements = []
    for text in wheel_metadata(built["wheel"]).get_all("Requires-Dist"):
        requirement = Requirement(text)
        if "extra ==" not in text:
            requirements.append(text)
        elif requirement.marker is not None and any(requirement.marker.evaluate({"extra": extra}) for extra in extras):
            requirements.append(f"{requirement.name}{requirement.specifier}")  # the extra's, as pip resolves them
    without_dependencies = [importlib.metadata.distribution(name) for name in also]
    link_distributions(dependency_closure(requirements) + without_dependencies, tmp_path / "dependencies")
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    (pathlib.Path(site) / "dependencies.pth").write_text(str(tmp_path / "dependencies") + "\n")
    return python


def test_the_core_wheel_alone_imports_and_runs_a_tf_and_a_py_buffer(built, tmp_path):
    python = wheel_venv(built, tmp_path)
    venv = python.parent.parent
    script = textwrap.dedent(
        f"""
        import importlib.util
        missing = [name for name in {EXTRAS_PACKAGES!r} if importlib.util.find_spec(name) is None]
        print("extras absent:", missing == {EXTRAS_PACKAGES!r})
        import numpy as np
        import tensorflow as tf
        import tfbuffers
        print("from the wheel:", tfbuffers.__file__.startswith({str(venv)!r}))
        spec = {{"step": tf.TensorSpec([], tf.int64)}}
        for kind in (tfbuffers.TFUniformReplayBuffer, tfbuffers.PyUniformReplayBuffer):
            buffer = kind(spec, batch_size=2, max_length=3)
            for step in range(4):
                buffer.add_batch({{"step": tf.constant([step, 100 + step], tf.int64)}})
            items, info = buffer.get_next(sample_batch_size=5, num_steps=2)
            windows = np.asarray(items["step"])
            print(kind.__name__, np.asarray(buffer.gather_all()["step"]).tolist(), windows.shape,
                  bool(np.all(windows[:, 1] - windows[:, 0] == 1)))
            path = buffer.save({str(tmp_path)!r} + "/" + kind.__name__ + ".safetensors")
            print("loaded", np.asarray(tfbuffers.load(path).gather_all()["step"]).tolist())
        from tfbuffers.sampling import _sum_tree
        buffer = tfbuffers.PyPrioritizedReplayBuffer(spec, batch_size=1, max_length=4, priority_exponent=1.0)
        for step in range(4):
            buffer.add_batch({{"step": np.array([step])}})
        buffer.update_priorities(np.arange(4), np.array([0.0, 1.0, 3.0, 0.0]))
        items, info = buffer.get_next(sample_batch_size=100)
        print("prioritized, compiled:", _sum_tree.compiled() is not None, sorted(set(items["step"].tolist())),
              sorted(set(info.probabilities.tolist())))
        try:
            tfbuffers.RayReplayBuffer(spec, capacity=4)
        except ImportError as error:
            print(str(error).split(". ")[-1])
        """
    )
    run = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [
        "extras absent: True",
        "from the wheel: True",
        "TFUniformReplayBuffer [[1, 2, 3], [101, 102, 103]] (5, 2) True",
        "loaded [[1, 2, 3], [101, 102, 103]]",
        "PyUniformReplayBuffer [[1, 2, 3], [101, 102, 103]] (5, 2) True",
        "loaded [[1, 2, 3], [101, 102, 103]]",
        "prioritized, compiled: True [1, 2] [0.25, 0.75]",
        "Install the extra: pip install 'tfbuffers[ray]'",
    ]


def test_the_wheel_with_the_ray_extra_runs_a_ray_buffer_on_a_local_cluster(built, tmp_path):
    python = wheel_venv(built, tmp_path, "ray")
    others = [name for name in EXTRAS_PACKAGES if name != "ray"]
    script = textwrap.dedent(
        f"""
        import importlib.util
        print("other extras absent:", all(importlib.util.find_spec(name) is None for name in {others!r}))
        import numpy as np
        import tensorflow as tf
        import tfbuffers
        spec = {{"step": tf.TensorSpec([], tf.int64)}}
        buffer = tfbuffers.RayReplayBuffer(spec, batch_size=2, max_length=3, name="from-the-wheel")
        with buffer.writer(1) as writer:
            for step in range(4):
                writer.add_batch({{"step": np.array([step])}})
        buffer.add_batch({{"step": np.array([7, 107])}})
        print(buffer.frames_per_segment(), np.asarray(buffer.gather_segment(0)["step"]).tolist())
        items, info = buffer.get_next(sample_batch_size=5, num_steps=2)
        print(np.asarray(items["step"]).shape, sorted(set(np.asarray(info.probabilities).tolist())))
        handle = tfbuffers.RayReplayBuffer.connect("from-the-wheel", data_spec=spec)
        print(int(handle.num_frames()))
        buffer.close()
        """
    )
    run = subprocess.run(
        [str(python), "-c", script], capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={key: value for key, value in os.environ.items() if not key.startswith("RAY_")},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-5000:]
    assert run.stdout.splitlines() == [
        "other extras absent: True",
        # The elastic layout: the segments share the 6 frames, so segment 0 keeps the writer's 0..3 and the buffer's 7.
        "[5, 1] [0, 1, 2, 3, 7]",
        "(5, 2) [0.3333333432674408]",  # 3 windows, the writer's: its close ended its stream, so none joins 3 to 7
        "6",
    ]


USER_CONTRACT = """
import numpy as np

import tfbuffers.storage
from tfbuffers.testing import contract
from tfbuffers.testing.contract.suite import *  # noqa: F403


class ListStorage(tfbuffers.storage.Storage):
    # A user's storage: each field's rows in a list of arrays, one per row.
    def __init__(self, fields, num_rows):
        super().__init__(fields, num_rows)
        self.rows = [
            [np.zeros(f.spec.shape.as_list(), f.spec.dtype.as_numpy_dtype) for _ in range(num_rows)] for f in fields
        ]

    def write_rows(self, index, first_row, rows):
        for offset, row in enumerate(rows):
            self.rows[index][first_row + offset] = np.array(row)

    def read(self, rows, fields=None):
        chosen = range(len(self.fields)) if fields is None else fields
        found = []
        for i in chosen:
            spec = self.fields[i].spec
            out = np.empty([*np.shape(rows), *spec.shape.as_list()], spec.dtype.as_numpy_dtype)
            flat = out.reshape(-1, *spec.shape.as_list())
            for k, row in enumerate(np.ravel(rows)):
                flat[k] = self.rows[i][row]
            found.append(out)
        return found

    def nbytes(self):
        return sum(row.nbytes for rows in self.rows for row in rows)


CONTRACT_KINDS = contract.register(contract.with_storage("py_list", "py_uniform", ListStorage))
"""


def test_the_wheel_with_the_testing_extra_runs_the_contract_on_a_users_storage(built, tmp_path):
    python = wheel_venv(built, tmp_path, "testing")
    (tmp_path / "users_contract_test.py").write_text(USER_CONTRACT)
    command = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "users_contract_test.py"]
    collected = subprocess.run([*command, "--collect-only"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert collected.returncode == 0, collected.stdout[-5000:]
    items = [line for line in collected.stdout.splitlines() if line.startswith("users_contract_test.py::")]
    assert len(items) > 100 and all("py_list_eager" in item or "py_list_function" in item for item in items)
    run = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-5000:]
    assert f"{len(items)} passed" in run.stdout.splitlines()[-1], run.stdout[-2000:]  # every case, none skipped


def test_the_wheel_with_the_offline_and_agents_extras_round_trips_rlds_and_minari(built, tmp_path):
    also = ("tf-agents",) if sys.version_info >= (3, 12) else ()  # the README's `pip install --no-deps tf-agents`
    python = wheel_venv(built, tmp_path, "offline", "agents", also=also)
    others = ["safetensors", "reverb", "ray", "matplotlib"]
    script = textwrap.dedent(
        f"""
        import importlib.util
        print("other extras absent:", all(importlib.util.find_spec(name) is None for name in {others!r}))
        import setuptools  # its distutils shim, which its .pth (not linked here) loads in an installed venv
        import numpy as np
        import tensorflow as tf
        from tf_agents.trajectories import trajectory
        import tfbuffers
        from tfbuffers import offline
        spec = trajectory.Trajectory(
            tf.TensorSpec([], tf.int32), tf.TensorSpec([2], tf.float32), tf.TensorSpec([], tf.int64), (),
            tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.float32))
        buffer = tfbuffers.PyUniformReplayBuffer(spec, batch_size=1, max_length=10)
        for t, (step_type, discount) in enumerate(zip([0, 1, 2, 0, 1], [1, 0, 1, 1, 1])):
            buffer.add_batch(trajectory.Trajectory(
                np.int32([step_type]), np.float32([[t, -t]]), np.int64([t]), (), np.int32([[1, 2, 0, 1, 1][t]]),
                np.float32([t]), np.float32([discount])))
        print(offline.to_rlds(buffer, {str(tmp_path / "rlds")!r}))
        print(offline.to_minari(buffer, "wheel/test-v0", description="from the wheel"))
        for source in ({str(tmp_path / "rlds")!r}, "minari"):
            target = tfbuffers.TFUniformReplayBuffer(spec, batch_size=1, max_length=10)
            (offline.from_minari(target, "wheel/test-v0") if source == "minari" else offline.from_rlds(target, source))
            frames = target.gather_all()
            print(np.asarray(frames.step_type).tolist(), np.asarray(frames.discount).tolist())
        """
    )
    environment = {key: value for key, value in os.environ.items() if key != "MINARI_DATASETS_PATH"}
    environment["MINARI_DATASETS_PATH"] = str(tmp_path / "minari")
    run = subprocess.run(
        [str(python), "-W", "ignore", "-c", script], capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env=environment,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-5000:]
    assert run.stdout.splitlines() == [
        "other extras absent: True",
        "Converted(episodes=1, frames=3, left_out_frames=2)",
        "Converted(episodes=1, frames=3, left_out_frames=2)",
        "[[0, 1, 2]] [[1.0, 0.0, 1.0]]",
        "[[0, 1, 2]] [[1.0, 0.0, 1.0]]",
    ]
