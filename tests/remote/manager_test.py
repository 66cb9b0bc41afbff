"""ReplayBufferManager on a real Reverb server, a real local Ray cluster and a local buffer.

Create, checkpoint, load, refuse.
"""

from __future__ import annotations

import importlib.util
import os

import conftest
import numpy as np
import pytest
import tensorflow as tf
from conftest import NewestAdds

from tfbuffers.manager import (
    ALREADY_CHECKPOINTED,
    CONFIG_DIFFERS,
    NO_CHECKPOINT,
    NO_DIRECTORY,
    ReplayBufferManager,
)

SPEC = {"x": tf.TensorSpec([], tf.int64)}
HAS_REVERB = importlib.util.find_spec("reverb") is not None
BACKENDS = [
    pytest.param("reverb", id="reverb", marks=pytest.mark.reverb),
    pytest.param("ray", id="ray", marks=pytest.mark.ray),
    "local",
]


def manager(directory, backend, **kwargs):
    kwargs = {"capacity": 100, "checkpoint_dir": directory, **kwargs}
    return ReplayBufferManager(SPEC, backend=backend, **kwargs)


def add(observer, values):
    for value in values:
        observer({"x": np.int64(value)})  # one environment's frame, as an Actor passes it


def expected_frames(backend, frames):
    return frames - 1 if backend == "reverb" else frames  # Reverb counts items: windows of 2 frames


def windows(manager_, draws=200):
    items, _ = next(iter(manager_.get_dataset(batch_size=draws, num_steps=2)))
    return {tuple(w) for w in np.asarray(items["x"]).tolist()}


@pytest.mark.parametrize("backend", BACKENDS)
def test_create_checkpoint_close_and_load_restores_every_item(tmp_path, backend):
    with manager(tmp_path / "replay", backend) as first:
        _, observer = first.create_replay_buffer()
        add(observer, range(5))
        assert first.checkpoint() == "0"
        before = windows(first)
    with manager(tmp_path / "replay", backend) as second:
        buffer, observer = second.load_replay_buffer()
        assert int(second.num_frames()) == expected_frames(backend, 5)
        assert windows(second) == before == {(t, t + 1) for t in range(4)}
        # Collection goes on after a load; on Reverb, and on Ray's elastic layout (a new writer's stream), a window
        # never joins frames from before it.
        add(observer, [5, 6])
        assert int(second.num_frames()) == (5 if backend == "reverb" else 7)
        assert windows(second) == before | ({(4, 5), (5, 6)} if backend == "local" else {(5, 6)})


@pytest.mark.parametrize("backend", BACKENDS)
def test_create_refuses_a_directory_holding_a_checkpoint_unless_told_to_overwrite(tmp_path, backend):
    directory = tmp_path / "replay"
    with manager(directory, backend) as first:
        _, observer = first.create_replay_buffer()
        add(observer, range(3))
        first.checkpoint()
    with manager(directory, backend) as second:
        with pytest.raises(FileExistsError) as raised:
            second.create_replay_buffer()
        assert str(raised.value) == ALREADY_CHECKPOINTED.format(directory=directory, count=1)
        buffer, _ = second.create_replay_buffer(overwrite=True)
        assert int(buffer.num_frames()) == 0 and second.checkpoints() == []
        with pytest.raises(FileNotFoundError, match="holds no checkpoint"):
            second.load_replay_buffer()


@pytest.mark.parametrize("backend", BACKENDS)
def test_load_refuses_a_missing_directory_or_one_without_a_checkpoint(tmp_path, backend):
    with manager(tmp_path / "nowhere", backend) as missing:
        with pytest.raises(FileNotFoundError) as raised:
            missing.load_replay_buffer()
        assert str(raised.value) == NO_DIRECTORY.format(directory=tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with manager(tmp_path / "empty", backend) as empty:
        with pytest.raises(FileNotFoundError) as raised:
            empty.load_replay_buffer()
        assert str(raised.value) == NO_CHECKPOINT.format(directory=tmp_path / "empty")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_configuration_that_differs_is_refused_naming_both_values_or_taken_when_asked(tmp_path, backend):
    directory = tmp_path / "replay"
    with manager(directory, backend, capacity=50) as first:
        _, observer = first.create_replay_buffer()
        add(observer, range(4))
        first.checkpoint()
    with manager(directory, backend, capacity=80) as second:
        with pytest.raises(ValueError) as raised:
            second.load_replay_buffer()
        assert str(raised.value) == CONFIG_DIFFERS.format(name="capacity", directory=directory, saved=50, requested=80)
        buffer, _ = second.load_replay_buffer(take_checkpoint_config=True)
        assert int(second.num_frames()) == expected_frames(backend, 4)
        assert buffer.capacity == 50
    other_spec = {"x": tf.TensorSpec([2], tf.int64)}
    third = ReplayBufferManager(other_spec, 50, directory, backend=backend)
    with pytest.raises(ValueError, match="data_spec: the checkpoint in .* holds .*a buffer cannot change"):
        third.load_replay_buffer(take_checkpoint_config=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_newest_checkpoints_are_kept_and_any_of_them_loads(tmp_path, backend):
    directory = tmp_path / "replay"
    with manager(directory, backend, keep_checkpoints=2) as first:
        _, observer = first.create_replay_buffer()
        for step in range(3):
            add(observer, range(10 * step, 10 * step + 3))
            first.checkpoint()
        assert first.checkpoints() == ["1", "2"]
        on_disk = sorted(p.name for p in (directory / "checkpoints").iterdir() if not p.name.startswith("."))
        assert on_disk == (["1.safetensors", "2.safetensors"] if backend == "local" else ["1", "2"])
        # clear() empties the buffer and reloads nothing; the kept checkpoints stay.
        first.clear()
        assert int(first.num_frames()) == 0 and first.checkpoints() == ["1", "2"]
    with manager(directory, backend) as second:
        second.load_replay_buffer("1")
        assert int(second.num_frames()) == expected_frames(backend, 6)
        second.load_replay_buffer()  # the newest
        assert int(second.num_frames()) == expected_frames(backend, 9)
        with pytest.raises(ValueError, match=r"checkpoint: expected one of \['1', '2'\], got '0'"):
            second.load_replay_buffer("0")


def test_the_manager_says_its_backend_once(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="tfbuffers.manager"), manager(tmp_path / "replay", "local") as local:
        local.create_replay_buffer()
    assert caplog.text.count("backend local (a TFUniformReplayBuffer in this process only)") == 1
    assert not local.uses_reverb and local.backend == "local"
    caplog.clear()
    with caplog.at_level("WARNING", logger="tfbuffers.manager"):
        chosen = ReplayBufferManager(SPEC, 10, tmp_path / "default")
    assert chosen.backend == ("reverb" if HAS_REVERB else "ray")  # Reverb where it imports, else Ray
    assert caplog.text.count(f"backend {chosen.backend} (") == 1
    assert ReplayBufferManager(SPEC, 10, tmp_path / "old", use_reverb=False).backend == "local"  # the earlier form
    with pytest.raises(ValueError, match=r"backend: expected one of \['reverb', 'ray', 'local'\] or None, got 'x'"):
        ReplayBufferManager(SPEC, 10, tmp_path / "bad", backend="x")


def test_the_local_backend_samples_by_priority_when_asked_and_keeps_the_priorities(tmp_path, caplog):
    # sampler="prioritized" draws by priority on every backend: locally a TFPrioritizedReplayBuffer (it used to
    # build a uniform one whatever the sampler said).
    with caplog.at_level("WARNING", logger="tfbuffers.manager"):
        first = manager(tmp_path / "replay", "local", sampler="prioritized", priority_exponent=1.0)
    assert "backend local (a TFPrioritizedReplayBuffer in this process only)" in caplog.text
    with first:
        buffer, observer = first.create_replay_buffer()
        assert type(buffer).__name__ == "TFPrioritizedReplayBuffer" and buffer.priority_exponent == 1.0
        add(observer, range(4))
        buffer.update_priorities(tf.constant([0, 1, 2, 3], tf.int64), tf.constant([0.0, 0.0, 3.0, 1.0]))
        assert windows(first) == {(2, 3)}  # the only window of 2 whose first frame has a priority above 0
        first.checkpoint()
    with manager(tmp_path / "replay", "local", sampler="prioritized", priority_exponent=1.0) as second:
        buffer, _ = second.load_replay_buffer()
        items, info = buffer.get_next(sample_batch_size=100)
        assert set(np.asarray(items["x"]).tolist()) == {2, 3}
        probabilities = dict(zip(np.asarray(items["x"]).tolist(), np.asarray(info.probabilities).tolist()))
        assert probabilities == {2: 0.75, 3: 0.25}  # the priorities the checkpoint kept, exactly


@pytest.mark.parametrize("backend", [pytest.param("ray", id="ray", marks=pytest.mark.ray), "local"])
def test_a_sampler_factory_samples_on_the_local_and_ray_backends_and_its_checkpoint_keeps_it(tmp_path, backend):
    # sampler= takes what the local buffers take; the checkpoints record a factory by its import path.
    if backend == "ray":
        import ray

        from tfbuffers.ray_replay_buffer import ensure_ray

        ensure_ray()
        ray.cloudpickle.register_pickle_by_value(conftest)  # the test's sampler, which Ray's workers cannot import
    with manager(tmp_path / "replay", backend, sampler=NewestAdds) as first:
        buffer, observer = first.create_replay_buffer()
        assert buffer.sampler is NewestAdds if backend == "ray" else type(buffer.sampler) is NewestAdds
        add(observer, range(6))
        assert windows(first) == {(3, 4), (4, 5)}  # windows of 2 from the newest 2 adds that start one
        first.checkpoint()
    assert '"sampler": "conftest:NewestAdds"' in (tmp_path / "replay" / "tfbuffers_manager.json").read_text()
    with manager(tmp_path / "replay", backend, sampler=NewestAdds) as second:
        second.load_replay_buffer()
        assert windows(second) == {(3, 4), (4, 5)}
    for factory in (NewestAdds, lambda *args: NewestAdds(*args)):  # Reverb's reason first, recordable or not
        with pytest.raises(ValueError, match="sampler: .*a Reverb table draws with Reverb's selectors"):
            manager(tmp_path / "reverb", "reverb", sampler=factory)
    with pytest.raises(ValueError, match="sampler: expected a name of .* importable by its name .* checkpoint"):
        manager(tmp_path / "lambda", backend, sampler=lambda *args: NewestAdds(*args))
    assert ReplayBufferManager(SPEC, 10, tmp_path / "default", sampler=NewestAdds).backend != "reverb"


def test_without_reverb_or_ray_the_manager_is_local(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "reverb", None)
    monkeypatch.setitem(sys.modules, "ray", None)
    assert ReplayBufferManager(SPEC, 10, tmp_path / "replay").backend == "local"
    with pytest.raises(ImportError, match="backend='ray', but ray could not be imported"):
        ReplayBufferManager(SPEC, 10, tmp_path / "replay", backend="ray")


@pytest.mark.parametrize(
    ("backend", "kind"),
    [
        pytest.param("reverb", "a Reverb table", marks=pytest.mark.reverb),
        pytest.param("ray", "a RayReplayBuffer's files", marks=pytest.mark.ray),
    ],
)
def test_a_checkpoint_is_not_loaded_as_a_local_one(tmp_path, backend, kind):
    directory = tmp_path / "replay"
    with manager(directory, backend) as first:
        _, observer = first.create_replay_buffer()
        add(observer, range(3))
        first.checkpoint()
    second = manager(directory, "local")
    with pytest.raises(ValueError, match=f"is {kind}, this manager runs a local buffer file"):
        second.load_replay_buffer()


def test_methods_before_a_buffer_exists_say_what_to_call(tmp_path):
    nothing = manager(tmp_path / "replay", "local")
    with pytest.raises(ValueError, match="num_frames: no buffer yet: call create_replay_buffer"):
        nothing.num_frames()


CLOSE_WHILE_A_DATASET_WAITS = """
import pathlib, sys, threading, time
import numpy as np, tensorflow as tf, tfbuffers
spec = {"x": tf.TensorSpec([4], tf.float32)}
directory = pathlib.Path(sys.argv[1])
manager = tfbuffers.ReplayBufferManager(spec, 10_000, directory, backend=sys.argv[2])
buffer, observer = manager.create_replay_buffer()
for i in range(300):
    buffer.add_batch({"x": np.full([1, 4], i, np.float32)})
experience = iter(manager.get_dataset(batch_size=64, num_steps=2).prefetch(3))
drawn = [next(experience) for _ in range(50)]
manager.checkpoint()
manager.clear()  # the iterator's samplers now wait for items (Reverb) or fail (local)
waiting = threading.Thread(target=lambda: [next(experience) for _ in range(10)], daemon=True)
waiting.start()
time.sleep(1)
manager.close()
print("closed")
manager = tfbuffers.ReplayBufferManager(spec, 10_000, directory, backend=sys.argv[2])
manager.load_replay_buffer()
print("loaded", int(manager.num_frames()))
manager.close()
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_manager_closes_while_a_dataset_iterator_is_alive_and_waiting(tmp_path, backend):
    # The Reverb notebook's last cell (issue 29): the training iterator, with prefetch, outlives the manager.
    import subprocess
    import sys

    command = [sys.executable, "-c", CLOSE_WHILE_A_DATASET_WAITS, str(tmp_path / "replay"), backend]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    # Reverb's items are windows of 2 frames: 299 of 300 frames; the local buffer holds the 300 frames.
    assert run.stdout.splitlines()[-2:] == ["closed", f"loaded {299 if backend == 'reverb' else 300}"]


LOAD_IN_A_CELL = """
import pathlib
import tensorflow as tf
from tfbuffers import ReplayBufferManager
spec = {{"x": tf.TensorSpec([], tf.int64)}}
with ReplayBufferManager(spec, {capacity}, pathlib.Path({directory!r}), batch_size=8) as manager:
    manager.load_replay_buffer()
    print("loaded", int(manager.num_frames()))
"""


@pytest.mark.reverb
def test_a_large_reverb_checkpoint_loads_in_a_jupyter_kernel(tmp_path):
    # The Reverb notebook's hang (issue 29): Reverb logs a line per 100 chunks while its server loads a
    # checkpoint, holding the GIL; a kernel's stderr is a pipe a Python thread empties, so past about 64 KiB
    # (some 50,000 chunks: here 120,000) the log waited on the pipe and the cell never ended.
    import nbclient
    import nbformat

    directory, capacity = tmp_path / "replay", 120_000
    with manager(directory, "reverb", capacity=capacity, batch_size=8) as writer:
        buffer, _ = writer.create_replay_buffer()
        for start in range(0, capacity, 8):
            buffer.add_batch({"x": np.arange(start, start + 8, dtype=np.int64)})
        writer.checkpoint()
        saved = int(writer.num_frames())
    assert saved == capacity - 8  # windows of 2 frames: each of the 8 environments' first frame starts none
    code = LOAD_IN_A_CELL.format(capacity=capacity, directory=str(directory))
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    # A kernel as Jupyter's: ipykernel reads C++'s stderr through a pipe, except where it sees PYTEST_CURRENT_TEST.
    environment = {key: value for key, value in os.environ.items() if key != "PYTEST_CURRENT_TEST"}
    nbclient.NotebookClient(notebook, timeout=120, kernel_name="python3").execute(env=environment)
    outputs = notebook.cells[0].outputs
    stdout = "".join(output.text for output in outputs if output.get("name") == "stdout")
    stderr = "".join(output.text for output in outputs if output.get("name") == "stderr")
    assert stdout == f"loaded {saved}\n"
    assert "Successfully loaded 1 tables" in stderr  # Reverb's log, written on once the server started
    assert "Still reading compressed trajectory data" not in stderr  # less its per-100-chunks progress


def test_ray_options_reach_the_buffer_and_a_checkpoint_keeps_what_its_frames_are(tmp_path):
    import uuid

    from tfbuffers import RayReplayBuffer

    spec = {"step_type": tf.TensorSpec([], tf.int32), "x": tf.TensorSpec([], tf.int64)}
    name = f"managed-{uuid.uuid4().hex[:8]}"
    options = {"name": name, "episode_boundaries": True}
    episodes = {(0, 1), (1, 2), (3, 4), (4, 5)}  # two episodes of three frames: no window across them
    with ReplayBufferManager(spec, 10, tmp_path / "replay", backend="ray", ray_options=options) as first:
        _, observer = first.create_replay_buffer()
        for t, step_type in enumerate([0, 1, 2, 0, 1, 2]):
            observer({"step_type": np.int32(step_type), "x": np.int64(t)})
        with RayReplayBuffer.connect(name) as other:  # the name reached the actor
            assert int(other.num_frames()) == 6
        assert windows(first) == episodes
        first.checkpoint()
    other = {"name": name, "episode_boundaries": False}
    with ReplayBufferManager(spec, 10, tmp_path / "replay", backend="ray", ray_options=other) as second:
        expected = (
            "load_replay_buffer: ray_options['episode_boundaries']: the checkpoint in "
            f"{tmp_path / 'replay' / 'checkpoints' / '0'} was made with True, this manager asks for False; it says "
            "what the checkpoint's frames are, so a loaded buffer keeps it"
        )
        with pytest.raises(ValueError) as raised:
            second.load_replay_buffer()
        assert str(raised.value) == expected
    with ReplayBufferManager(spec, 10, tmp_path / "replay", backend="ray", ray_options=options) as third:
        _, observer = third.load_replay_buffer()
        assert windows(third) == episodes
        for t, step_type in ((6, 0), (7, 1)):  # a new episode: still kept apart from the last
            observer({"step_type": np.int32(step_type), "x": np.int64(t)})
        assert windows(third) == episodes | {(6, 7)}
    with pytest.raises(ValueError, match=r"ray_options: expected keys among .* got \['capacity'\]"):
        ReplayBufferManager(spec, 10, tmp_path / "bad", backend="ray", ray_options={"capacity": 4})
    with pytest.raises(ValueError, match="ray_options: only for backend='ray', got backend='local'"):
        ReplayBufferManager(spec, 10, tmp_path / "bad", backend="local", ray_options={"name": "x"})


def test_the_managers_ray_buffer_is_restarted_by_ray_from_its_last_checkpoint_under_the_managers_directory(tmp_path):
    # Issue 50: only the buffer's own checkpoint_dir= drove restarts; a manager's Ray buffer died with its actor.
    import signal

    import ray

    directory = tmp_path / "replay"
    options = {"checkpoint_frames": 10}
    with ReplayBufferManager(SPEC, 100, directory, backend="ray", ray_options=options) as managed:
        buffer, observer = managed.create_replay_buffer()
        add(observer, range(25))
        report = buffer.checkpoint_report()
        assert (report["latest"], report["checkpoints"]) == (str(directory / "ray" / "checkpoint-00000002"), 2)
        os.kill(ray.get(buffer.actor.ping.remote()), signal.SIGKILL)
        assert int(managed.num_frames()) == 20  # restarted by Ray (max_restarts=3) from the checkpoint of frames 0-19
        assert buffer.checkpoint_report()["restored_from"] == str(directory / "ray" / "checkpoint-00000002")
        add(observer, [25, 26])  # collection goes on
        # No window joins 19 to 25 across the frames the restart lost: the writer's adds start a new stream.
        assert windows(managed) == {(t, t + 1) for t in range(19)} | {(25, 26)}
        assert managed.checkpoint() == "0"  # and the manager's checkpoints
    with ReplayBufferManager(SPEC, 100, directory, backend="ray", ray_options=options) as managed:
        buffer, _ = managed.load_replay_buffer()
        assert int(managed.num_frames()) == 22
        assert buffer.checkpoint_report()["checkpoints"] == 0  # ray/ starts anew from the manager's checkpoint
        assert sorted(path.name for path in (directory / "ray").iterdir()) == []
    with ReplayBufferManager(SPEC, 100, tmp_path / "none", backend="ray", ray_options={"max_restarts": 0}) as managed:
        buffer, _ = managed.create_replay_buffer()
        assert buffer.checkpoint_report() is None  # no restarts asked for: no checkpoints under ray/
        assert not (tmp_path / "none" / "ray").exists()
    expected = (
        "ray_options: expected no checkpoint_frames or checkpoint_seconds with directory= (memory-mapped segments "
        "keep every add that returned: nothing to checkpoint), got {'checkpoint_frames': 10}"
    )
    with pytest.raises(ValueError) as raised:
        ReplayBufferManager(SPEC, 100, tmp_path / "bad", backend="ray", ray_options={**options, "directory": tmp_path})
    assert str(raised.value) == expected
