"""The scripts end to end, in short versions: the full-length runs are the scripts' job."""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import json
import pathlib
import sys
import types

import numpy as np
import pytest
import tensorflow as tf

SCRIPTS = pathlib.Path(__file__).resolve().parents[2] / "scripts"


def load_script(name):
    sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


train_dqn = load_script("train_dqn")
populate_starter_buffer = load_script("populate_starter_buffer")
benchmark = load_script("benchmark")
soak = load_script("soak")
tf_agents_examples = load_script("tf_agents_examples")
replay_server = load_script("replay_server")
collect = load_script("collect")
compare_runs = load_script("compare_runs")
her_bit_flipping = load_script("her_bit_flipping")
rate_limit = load_script("rate_limit")
shards = load_script("shards")

NEEDS_RAY = pytest.mark.ray  # conftest skips them where the extra is missing
NEEDS_REVERB = pytest.mark.reverb


def assert_refused(capsys, parse, argv, message):
    """`parse(argv)` exits with status 2 and says `message` on stderr (argparse's way)."""
    with pytest.raises(SystemExit) as exited:
        parse(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("script", "flags"),
    [
        (
            "train_dqn",
            {
                "--env",
                "--buffer",
                "--num-iterations",
                "--num-envs",
                "--initial-collect-frames",
                "--collect-steps-per-iteration",
                "--replay-capacity",
                "--batch-size",
                "--learning-rate",
                "--gamma",
                "--n-step",
                "--epsilon",
                "--target-update-period",
                "--fc-layers",
                "--eval-interval",
                "--eval-episodes",
                "--beta",
                "--seed",
                "--output-dir",
                "--starter-buffer",
                "--replay-server",
                "--backend",
                "--policy-dir",
                "--policy-interval",
                "--num-bits",
                "--her",
                "--her-strategy",
                "--relabel-fraction",
                "--her-horizon",
                "--jit",
                "--no-progress",
            },
        ),
        (
            "her_bit_flipping",
            {"--bits", "--seeds", "--num-iterations", "--eval-episodes", "--quick", "--output-dir", "--no-progress"},
        ),
        (
            "populate_starter_buffer",
            {
                "--buffer-name",
                "--capacity",
                "--steps-per-run",
                "--num-runs",
                "--env",
                "--policy",
                "--buffer",
                "--num-envs",
                "--output-dir",
                "--seed",
                "--overwrite",
                "--reverb",
                "--no-progress",
            },
        ),
        (
            "soak",
            {
                "--buffer",
                "--minutes",
                "--round-seconds",
                "--batch-size",
                "--max-length",
                "--graph-writer",
                "--output-dir",
                "--no-progress",
            },
        ),
        ("tf_agents_examples", {"--buffers", "--root-dir", "--timeout"}),
        (
            "rate_limit",
            {
                "--writers",
                "--envs-per-writer",
                "--seconds",
                "--samples-per-insert",
                "--error-buffer",
                "--min-size",
                "--sample-batch-size",
                "--env-seconds",
                "--train-seconds",
                "--poll-seconds",
                "--output-dir",
                "--no-progress",
            },
        ),
        (
            "shards",
            {
                "--shards",
                "--writers",
                "--envs-per-writer",
                "--seconds",
                "--obs-floats",
                "--capacity",
                "--sample-batch-size",
                "--num-steps",
                "--total-actors",
                "--actor-rate",
                "--total-frames",
                "--samples-per-insert",
                "--machine-gib",
                "--output-dir",
                "--no-progress",
            },
        ),
        (
            "replay_server",
            {
                "--env",
                "--spec-file",
                "--backend",
                "--port",
                "--capacity",
                "--sequence-length",
                "--segments",
                "--sampler",
                "--table-name",
                "--min-size-to-sample",
                "--samples-per-insert",
                "--checkpoint-dir",
                "--checkpoint-interval",
            },
        ),
        (
            "collect",
            {
                "--replay-server",
                "--backend",
                "--env",
                "--num-envs",
                "--sequence-length",
                "--table-name",
                "--frames",
                "--policy-dir",
                "--policy-poll-seconds",
                "--epsilon",
                "--fc-layers",
                "--seed",
                "--record",
                "--no-progress",
            },
        ),
    ],
)
def test_help_documents_every_flag(script, flags, capsys):
    scripts = {
        "train_dqn": train_dqn,
        "populate_starter_buffer": populate_starter_buffer,
        "benchmark": benchmark,
        "soak": soak,
        "tf_agents_examples": tf_agents_examples,
        "replay_server": replay_server,
        "collect": collect,
        "her_bit_flipping": her_bit_flipping,
        "rate_limit": rate_limit,
        "shards": shards,
    }
    module = scripts[script]
    parser = module.build_parser()
    documented = {a.option_strings[0]: a.help for a in parser._actions if a.option_strings[:1] not in ([], ["-h"])}
    assert set(documented) == flags
    assert all(documented.values())
    with pytest.raises(SystemExit) as exited:
        module.main(["--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert all(flag in text for flag in flags)


def _short_dqn(tmp_path, **options) -> train_dqn.Config:
    """A short DQN run's configuration: 100 frames collected first, one evaluation episode, no progress bars."""
    return train_dqn.Config(
        initial_collect_frames=100, eval_episodes=1, output_dir=str(tmp_path), progress=False, **options
    )


def test_short_dqn_run_with_a_compiled_train_step(tmp_path):
    """--jit: the sample and the train step in one XLA program, trained from the frames collected."""
    config = _short_dqn(tmp_path, jit=True, num_iterations=60, eval_interval=30)
    result = train_dqn.train(config)
    assert result.train_steps == 60 and result.train_seconds > 0 and np.isfinite(result.last_loss)
    assert result.frames_in_buffer == result.frames_collected >= 100 + 60
    assert train_dqn.buffer_label(config) == "tfbuffers tf_uniform, compiled train step (XLA)"


@pytest.mark.parametrize("buffer", ["tf_uniform", "py_uniform", "tf_prioritized", "py_prioritized"])
def test_short_dqn_run_end_to_end(buffer, tmp_path):
    config = _short_dqn(tmp_path, buffer=buffer, num_iterations=200, eval_interval=100)
    result = train_dqn.train(config)
    assert result.train_steps == 200
    assert result.priority_updates == (200 if "prioritized" in buffer else 0)
    assert result.frames_in_buffer == result.frames_collected >= 100 + 200
    assert result.iterations == [0, 100, 200] and len(result.returns) == 3
    assert isinstance(result.last_loss, float) and np.isfinite(result.last_loss)  # train steps ran on samples
    assert pathlib.Path(result.curve_png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads(pathlib.Path(result.summary_json).read_text())
    assert summary["config"]["buffer"] == buffer and summary["result"]["train_steps"] == 200
    assert result.success_rates is None  # CartPole has no goal


@pytest.mark.parametrize("her", [False, True])
def test_a_short_bit_flipping_run_counts_its_successes(her, tmp_path):
    config = train_dqn.parse_args(["--num-bits", "4", "--output-dir", str(tmp_path), "--no-progress"] + ["--her"] * her)
    import tfbuffers
    from tfbuffers.envs import BIT_FLIPPING_ID

    assert config.env == "tfbuffers/BitFlipping-v0" == BIT_FLIPPING_ID
    assert train_dqn.HER_STRATEGIES == tfbuffers.her.STRATEGIES  # named before TensorFlow is imported
    config = dataclasses.replace(
        config, num_iterations=100, initial_collect_frames=100, eval_interval=50, eval_episodes=4, replay_capacity=500
    )
    result = train_dqn.train(config)
    assert result.train_steps == 100 and np.isfinite(result.last_loss)
    assert len(result.success_rates) == 3 and all(rate in (0.0, 0.25, 0.5, 0.75, 1.0) for rate in result.success_rates)
    # An episode of 4 bits lasts 1 to 4 steps: its return is -(steps - 1) if it reached its goal, else -4.
    assert all(-4.0 <= value <= 0.0 for value in result.returns)
    summary = json.loads(pathlib.Path(result.summary_json).read_text())
    assert summary["config"]["her"] is her and summary["result"]["success_rates"] == result.success_rates


def test_her_on_an_environment_without_goals_is_refused(tmp_path):
    config = train_dqn.Config(
        env="CartPole-v1", her=True, num_iterations=1, initial_collect_frames=10, output_dir=str(tmp_path)
    )
    with pytest.raises(ValueError) as raised:
        train_dqn.train(dataclasses.replace(config, progress=False))
    assert str(raised.value) == (
        "--her: expected a goal-conditioned environment (a dict observation with achieved_goal and desired_goal, "
        "and compute_reward), got --env CartPole-v1"
    )


def test_the_her_comparison_writes_its_table_and_figure(tmp_path):
    import subprocess

    # In a process of its own: main() makes TensorFlow's ops deterministic for the whole process.
    argv = [sys.executable, str(SCRIPTS / "her_bit_flipping.py"), "--quick", "--output-dir", str(tmp_path)]
    done = subprocess.run([*argv, "--no-progress"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("python scripts/her_bit_flipping.py --quick --output-dir ")
    results = json.loads((tmp_path / "her.json").read_text())
    runs = [(run["bits"], run["her"], run["seed"]) for run in results["runs"]]
    assert runs == [(3, False, 0), (3, True, 0), (4, False, 0), (4, True, 0)]
    assert all(len(run["success_rates"]) == 6 and 0 <= run["success_rates"][-1] <= 1 for run in results["runs"])
    table = (tmp_path / "her.md").read_text().splitlines()
    assert table[2] == "| n (bits) | DQN: final success rate (mean; per seed) | DQN + HER (future, 0.8) |"
    assert [line.split(" | ")[0] for line in table[4:]] == ["| 3", "| 4"]
    assert (tmp_path / "her.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_short_n_step_dqn_run_trains_on_n_step_transitions(tmp_path):
    config = _short_dqn(tmp_path, buffer="py_prioritized", n_step=3, num_iterations=60, eval_interval=60)
    result = train_dqn.train(config)
    assert (result.train_steps, result.priority_updates) == (60, 60)
    assert np.isfinite(result.last_loss)
    summary = json.loads(pathlib.Path(result.summary_json).read_text())
    assert summary["config"]["n_step"] == 3


@NEEDS_REVERB
def test_the_learner_trains_from_two_prioritized_servers_and_updates_both(tmp_path):
    from scripts_test_helpers import cartpole_trajectory_spec
    from tf_agents.policies import random_tf_policy

    import tfbuffers
    from tfbuffers.collect import warm
    from tfbuffers.envs import load_gymnasium

    spec = cartpole_trajectory_spec()
    with (
        tfbuffers.ReverbReplayBuffer(spec, 2, sampler="prioritized") as first,
        tfbuffers.ReverbReplayBuffer(spec, 2, sampler="prioritized") as second,
    ):
        for seed, shard in enumerate((first, second)):
            env = load_gymnasium("CartPole-v1", seed=seed, tf_environment=True)
            warm(shard, env, random_tf_policy.RandomTFPolicy(env.time_step_spec(), env.action_spec()), 100)
            shard.flush()
        held = int(first.num_frames()) + int(second.num_frames())
        config = train_dqn.Config(
            replay_server=f"{first.server_address},{second.server_address}",
            policy_dir=str(tmp_path / "policy"),
            policy_interval=10,
            initial_collect_frames=150,
            num_iterations=30,
            batch_size=16,
            eval_interval=30,
            eval_episodes=1,
            output_dir=str(tmp_path / "dqn"),
            progress=False,
        )
        result = train_dqn.train(config)
        assert (result.train_steps, result.priority_updates, result.frames_collected) == (30, 30, 0)
        assert result.frames_in_buffer == held  # the learner added nothing
        for shard in (first, second):  # both shards got new priorities from TD errors (new items get 1.0)
            samples = shard.py_client.sample(shard.table_name, 400, emit_timesteps=False)
            assert any(sample.info.priority != 1.0 for sample in samples)
        published = sorted(path.name for path in (tmp_path / "policy").glob("q_network-*.index"))
        assert published == ["q_network-10.index", "q_network-20.index", "q_network-30.index"]  # the newest 3


@NEEDS_REVERB
def test_the_learner_refuses_servers_that_sample_differently():
    from scripts_test_helpers import cartpole_trajectory_spec

    import tfbuffers

    spec = cartpole_trajectory_spec()
    with (
        tfbuffers.ReverbReplayBuffer(spec, 2) as uniform,
        tfbuffers.ReverbReplayBuffer(spec, 2, sampler="prioritized") as prioritized,
    ):
        addresses = [uniform.server_address, prioritized.server_address]
        samplers = {addresses[0]: "uniform", addresses[1]: "prioritized"}
        expected = f"replay_server: expected servers that sample alike, got {samplers}"
        with pytest.raises(ValueError) as raised:
            train_dqn._connect(addresses, spec, "reverb")
        assert str(raised.value) == expected


@NEEDS_REVERB
def test_a_reverb_starter_buffer_is_checkpointed_refused_twice_and_loaded(tmp_path, capsys):
    from scripts_test_helpers import cartpole_trajectory_spec

    import tfbuffers

    argv = ["--buffer-name", "reverb", "--reverb", "--capacity", "500", "--steps-per-run", "60", "--num-runs", "2"]
    argv += ["--num-envs", "2", "--output-dir", str(tmp_path), "--no-progress"]
    assert populate_starter_buffer.main(argv) == 0
    out = capsys.readouterr().out
    items = int(out.split("Checkpointed ")[1].split(" items")[0])
    # Windows of 2 frames of one episode: fewer than the 240 frames collected (each episode's first has none).
    assert 0 < items < 2 * 2 * 60
    assert populate_starter_buffer.main(argv) == 2
    assert "already holds a checkpoint" in capsys.readouterr().err
    assert populate_starter_buffer.main([*argv, "--overwrite"]) == 0
    spec = cartpole_trajectory_spec()
    with tfbuffers.ReplayBufferManager(spec, 500, tmp_path / "reverb", batch_size=2) as manager:
        manager.load_replay_buffer()
        assert int(manager.num_frames()) == int(capsys.readouterr().out.split("Checkpointed ")[1].split(" items")[0])


def test_starter_buffer_is_made_refused_twice_and_trained_from(tmp_path, capsys):
    argv = ["--buffer-name", "scripted", "--policy", "scripted", "--capacity", "600", "--steps-per-run", "100"]
    argv += ["--num-runs", "3", "--output-dir", str(tmp_path), "--no-progress"]
    assert populate_starter_buffer.main(argv) == 0
    directory = tmp_path / "scripted"
    metadata = populate_starter_buffer._common.read_starter_metadata(directory)
    assert sorted(path.name for path in directory.iterdir()) == ["buffer.safetensors"]
    assert metadata["frames_collected"] >= 300 and metadata["frames"] == min(metadata["frames_collected"], 600)
    assert (metadata["buffer"], metadata["batch_size"], metadata["max_length"]) == ("tf_uniform", 1, 600)
    assert "Saved" in capsys.readouterr().out

    assert populate_starter_buffer.main(argv) == 2
    assert "already holds a buffer named 'scripted'; pass --overwrite" in capsys.readouterr().err
    assert populate_starter_buffer.main([*argv, "--overwrite"]) == 0

    config = train_dqn.Config(
        starter_buffer=str(directory),
        replay_capacity=200,  # the training buffer's size, not the starter's: its newest 200 frames
        num_iterations=50,
        eval_interval=50,
        eval_episodes=1,
        output_dir=str(tmp_path / "dqn"),
        progress=False,
    )
    result = train_dqn.train(config)
    assert result.frames_from_starter == 200 < metadata["frames"]
    assert result.frames_in_buffer == 200
    assert result.train_steps == 50


FLASHBAX_ENV = pathlib.Path(__file__).resolve().parents[2] / ".venv-flashbax"


@pytest.mark.skipif(not (FLASHBAX_ENV / "bin" / "python").exists(), reason="make flashbax-env makes .venv-flashbax")
def test_the_benchmark_measures_flashbax_in_its_own_env(tmp_path):
    """Flashbax (JAX) in a process of its own environment, on its published workload, beside tfbuffers and cpprb."""
    systems = "tfbuffers py prioritized,cpprb PER,Flashbax uniform,Flashbax prioritized"
    argv = ["--quick", "--workloads", "flashbax", "--systems", systems, "--actors", "0", "--repetitions", "2"]
    assert benchmark.main([*argv, "--output-dir", str(tmp_path), "--no-progress"]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    present = {"tfbuffers py prioritized", "Flashbax uniform", "Flashbax prioritized"}
    present |= {"cpprb PER"} if importlib.util.find_spec("cpprb") else set()  # wheels up to Python 3.12
    assert set(results["systems"]) == present
    (result,) = results["workloads"].values()
    assert result["workload"]["name"] == "flashbax" and result["workload"]["frames"] == 16_000
    assert result["workload"]["payload_bytes"] == 32 * 32 * 3 + 4 * 5  # uint8[32, 32, 3]; action, reward, ...
    assert result["flashbax_jax"] == "0.4.38"  # scripts/flashbax-requirements.txt's
    measures = result["measures"]
    assert {"Flashbax uniform", "Flashbax prioritized"} <= set(measures["add_eager"]) & set(measures["get_next"])
    assert "Flashbax prioritized" in measures["sample_update"] and "Flashbax uniform" not in measures["sample_update"]
    assert all(measures[m][name]["runs"] == 2 for m in ("get_next", "add_eager") for name in present)
    assert "tfbuffers py prioritized / Flashbax prioritized" in result["ratios"]["sample_update"]
    assert (
        "| sample + update_priorities, direct (frames/s) | tfbuffers py prioritized / Flashbax prioritized |"
        in (tmp_path / "results.md").read_text()
    )


TORCHRL_ENV = pathlib.Path(__file__).resolve().parents[2] / ".venv-torchrl"


@pytest.mark.skipif(not (TORCHRL_ENV / "bin" / "python").exists(), reason="make torchrl-env makes .venv-torchrl")
def test_the_benchmark_measures_torchrl_in_its_own_env(tmp_path):
    """TorchRL (PyTorch) in a process of its own environment, beside the tfbuffers buffers it is compared with."""
    torchrl = ["TorchRL uniform", "TorchRL prioritized", "TorchRL memmap", "TorchRL slices"]
    ours = ["tfbuffers py", "tfbuffers py prioritized", "tfbuffers py memmap", "tfbuffers py episodes"]
    argv = ["--quick", "--workloads", "torchrl", "--systems", ",".join(ours + torchrl), "--actors", "0"]
    argv += ["--repetitions", "2", "--frames", "2048", "--output-dir", str(tmp_path), "--no-progress"]
    assert benchmark.main(argv) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    local = [name for name in benchmark.SYSTEM_NAMES if name in ours]  # the tables' order, then the peer's own
    # None of these is left out (the Reverb systems are, past Python 3.11: not asked for, not installed there).
    assert results["systems"] == local + torchrl and set(results["left_out"]).isdisjoint(ours + torchrl)
    (result,) = results["workloads"].values()
    assert result["workload"]["name"] == "torchrl" and result["workload"]["frames"] == 2048
    assert result["workload"]["payload_bytes"] == 3 * 32 * 32 + 5 * 4 + 16  # TorchRL's item, with the Trajectory's
    pins = dict(
        line.split("==") for line in (SCRIPTS / "torchrl-requirements.txt").read_text().splitlines() if "==" in line
    )
    assert {package: result[f"torchrl_{package}"] for package in ("torch", "torchrl", "tensordict")} == {
        package: pins[package] for package in ("torch", "torchrl", "tensordict")
    }
    measures = result["measures"]
    for name in torchrl:
        asked = ["add_eager", "add_block", "get_next"] + (["sample_update"] if name == "TorchRL prioritized" else [])
        assert [m for m in measures if name in measures[m]] == asked
        assert all(measures[m][name]["runs"] == 2 and measures[m][name]["min"] > 0 for m in asked)
    pairs = [f"{mine} / {theirs}" for mine, theirs in zip(ours, torchrl)]
    assert all(pair in result["ratios"]["get_next"] and pair in result["ratios"]["add_block"] for pair in pairs)
    assert "tfbuffers py prioritized / TorchRL prioritized" in result["ratios"]["sample_update"]
    table = (tmp_path / "results.md").read_text()
    assert "| sample, direct get_next (frames/s) | tfbuffers py episodes / TorchRL slices |" in table
    # The kernel's high-water marks (VmHWM), in bytes: this process's, and the TorchRL process's own, which it reports
    # (importing torch alone holds over 100 MiB resident). Not its parent's mark at the fork (what getrusage gave).
    assert result["resident_peak_bytes"] >= 2048 * result["workload"]["payload_bytes"]
    assert result["torchrl_resident_peak_bytes"] > 100 * 2**20 and "children_resident_peak_bytes" not in result
    assert result["torchrl_resident_peak_bytes"] != result["resident_peak_bytes"]
    assert (tmp_path / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_quick_sweep_measures_every_local_kind_at_every_point(tmp_path):
    """`--sweep --quick`: every kind's add, sample (and sample + update) at each capacity and batch; no timing."""
    argv = ["--sweep", "--quick", "--repetitions", "2", "--output-dir", str(tmp_path), "--no-progress"]
    assert benchmark.main(argv) == 0
    sweep = benchmark._sweep
    results = json.loads((tmp_path / "sweep.json").read_text())
    points = {(p["kind"], p["measure"], p["capacity"], p["batch"]): p["seconds"] for p in results["points"]}
    expected = set()
    for kind in sweep.KINDS:
        measures = ["sample", "sample + update"] if "prioritized" in kind else ["sample"]
        for capacity in sweep.QUICK_CAPACITIES:
            expected.add((kind, "add", capacity, 8))
            expected.add((kind, "add block", capacity, sweep.QUICK_BLOCK_FRAMES))
            expected |= {(kind, measure, capacity, sweep.CAPACITY_BATCH) for measure in measures}
        expected |= {(kind, m, sweep.QUICK_BATCH_CAPACITY, b) for m in measures for b in sweep.QUICK_BATCH_SIZES}
    assert set(points) == expected
    assert all(len(seconds) == 2 and min(seconds) > 0 for seconds in points.values())
    assert [(row["measure"], row["kind"]) for row in results["growth"]] == [
        key for key in itertools.product(sweep.MEASURES, sweep.KINDS) if key in sweep.EXPECTED
    ]
    for name in ("sweep_add.png", "sweep_add_block.png", "sweep_sample.png", "sweep_sample_update.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| sample + update | tfbuffers py prioritized | O(log n) |" in (tmp_path / "sweep.md").read_text()
    assert "| add block | tfbuffers py memmap | O(1) |" in (tmp_path / "sweep.md").read_text()


def test_beyond_cache_quick_reads_the_files_from_cold_and_checks_every_window(tmp_path):
    """`--beyond-cache --quick`: a 64 MiB buffer filled by blocks, each window's frames its ids', the files removed."""
    files = tmp_path / "files"
    files.mkdir()
    argv = ["--beyond-cache", "--quick", "--beyond-cache-dir", str(files), "--output-dir", str(tmp_path)]
    assert benchmark.main([*argv, "--no-progress"]) == 0
    results = json.loads((tmp_path / "beyond_cache.json").read_text())
    # 64 MiB of 28,232-byte frames in 4 segments, rounded up to whole blocks of 256 frames a segment: 768 a segment.
    assert results["frames"] == 4 * 768 and results["frame_bytes"] == 84 * 84 * 4 + 8
    assert results["file_bytes"] > results["frames"] * results["frame_bytes"]  # and the header, state, journal
    assert results["times_free_page_cache"] == results["file_bytes"] / results["mem_available_bytes"]
    measures = results["measures"]
    assert list(measures) == ["tfbuffers py memmap get_next", "numpy memmap gather", "sequential read"]
    for entry in measures.values():
        assert entry["frames_per_second"] > 0 and min(entry["per_second_frames"]) > 0
        assert entry["bytes_per_second"] == pytest.approx(entry["frames_per_second"] * 84 * 84 * 4)
    # The windows read whole batches of 32 windows of 2 frames; the sequential read, the observation file once (its
    # .npy header too), in the second it is given.
    assert measures["tfbuffers py memmap get_next"]["bytes_read"] % (64 * 84 * 84 * 4) == 0
    assert measures["sequential read"]["bytes_read"] == pytest.approx(results["frames"] * 84 * 84 * 4 + 128, abs=1)
    assert results["seconds"] == 1.0 and results["open_seconds"] > 0
    assert list(files.iterdir()) == []  # the buffer's files removed
    assert (tmp_path / "beyond_cache.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (tmp_path / "beyond_cache.md").read_text()
    assert "| tfbuffers py memmap get_next |" in table and "against the plain numpy gather of the same files" in table


def test_the_sweep_fits_the_growth_it_reports():
    sweep = benchmark._sweep
    assert sweep.slope([1e4, 1e5, 1e6], [2.0, 20.0, 200.0]) == pytest.approx(1.0, abs=1e-12)
    # A cost growing as log2(capacity): the ratio of its ends is the ratio of the logs, whatever the base.
    points = [sweep.Point("tfbuffers py prioritized", "sample", n, 256, [np.log2(n) * 1e-6]) for n in (10_000, 10**7)]
    points.append(sweep.Point("tfbuffers py prioritized", "sample", 10**7, 32, [1.0]))  # off the capacity line
    (row,) = sweep.growth(points)
    assert row["ratio"] == pytest.approx(np.log(1e7) / np.log(1e4), rel=1e-12) == pytest.approx(row["log_ratio"])
    assert row["expected"] == "O(log n)" and row["first"] == (10_000, np.log2(10_000) * 1e-6)


def test_quick_benchmark_completes_and_writes_its_outputs(tmp_path, capsys, monkeypatch):
    """A smoke run of every system and measure on the control workload: it completes and writes what it should.

    Timings are never asserted. The atari workload runs the same code on other shapes, and frame stacks, which
    only it has: `test_the_atari_workload_stores_frame_stacks_and_compares_them` runs those systems on it.
    """
    missing = tmp_path / "no-env"  # the peers' own runs: test_the_benchmark_measures_{flashbax,torchrl}_in_its_own_env
    capped = [cls for cls in benchmark.SYSTEMS if cls.max_frames is not None]
    assert {cls.name for cls in capped} == {"tfbuffers Reverb", "TF-Agents Reverb"}
    for cls in capped:  # filled with half the run's frames (the full run's 250k of control's 1M)
        monkeypatch.setattr(cls, "max_frames", 2048)
    argv = ["--quick", "--repetitions", "1", "--workloads", "control", "--output-dir", str(tmp_path), "--no-progress"]
    argv += ["--frames", "4096"]  # a quarter of --quick's: every system filled, in a quarter of the time
    assert benchmark.main([*argv, "--flashbax-env", str(missing), "--torchrl-env", str(missing)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["workloads"]) == {"control"}
    classes, left_out = benchmark.available_systems()  # all of them on the pinned stack; no Reverb past 3.11
    systems = {cls.name for cls in classes}
    for peer in benchmark.OWN_ENV_PEERS:
        why = f"needs its own environment {missing}, not made here (--{peer.key}-setup makes it)"
        left_out |= {name: why for name in peer.systems}
    assert set(left_out) >= set(benchmark.OUT_OF_PROCESS)
    assert results["systems"] == [cls.name for cls in classes] and results["left_out"] == left_out
    episodes = {"tfbuffers TF episodes", "tfbuffers TF prioritized episodes"}
    actor_backends = [name for name, module in benchmark.ACTOR_BACKENDS.items() if importlib.util.find_spec(module)]
    assert actor_backends  # Ray installs on both stacks (the test extras), Reverb on the pinned one
    for name, result in results["workloads"].items():
        measures = result["measures"]
        # Frame stacks need stacked observations: the atari workload only.
        stacks = {"tfbuffers py frame stacks", "tfbuffers py frame stacks memmap"}
        present = systems - (stacks if name == "control" else set())
        assert set(measures["add_eager"]) == present - {"tf.data ceiling"}
        # A block of 1,024 frames in one call (`extend`; one add per frame where a system has no block add).
        assert set(measures["add_block"]) == present - {"tf.data ceiling"} - stacks
        assert {"tfbuffers py / numpy limit", "tfbuffers TF / TF-Agents TF"} <= set(result["ratios"]["add_block"])
        assert (
            set(measures["add_graph"])
            == {
                "tfbuffers TF",
                "TF-Agents TF",
                "tfbuffers TF prioritized",
                "bare tf.Variable",
            }
            | episodes
        )
        # cpprb where it installs (wheels up to Python 3.12).
        assert set(measures["sample_update"]) == {
            "tfbuffers TF prioritized",
            "tfbuffers py prioritized",
            "tfbuffers TF prioritized episodes",
            "tfbuffers py prioritized episodes",
            "tfbuffers py prioritized memmap",
        } | (systems & {"cpprb PER"})
        # The memory-mapped buffers: opened at two sizes (the smaller an eighth), their own memory measured.
        memmap = {"tfbuffers py memmap", "tfbuffers py prioritized memmap"}
        memmap |= {"tfbuffers py frame stacks memmap"} if name != "control" else set()
        assert set(result["open"]) == memmap
        envs, stored = result["workload"]["num_envs"], result["workload"]["frames"]
        sizes = [envs * (stored // envs // 8), stored]
        assert all(
            [int(size) for size in times] == sizes and min(times.values()) > 0 for times in result["open"].values()
        )
        assert all(result["memory"][name]["anonymous_bytes_per_frame"] is not None for name in memmap)
        assert result["workload"]["frames"] == 4096
        # A save and two loads in fresh processes, for each of our buffers but the variants: files and memory.
        files = result["files"]
        assert set(files) == {"tfbuffers TF", "tfbuffers py", "tfbuffers TF prioritized", "tfbuffers py prioritized"}
        payload = result["workload"]["payload_bytes"]
        assert files["tfbuffers TF"]["stored_bytes"] == files["tfbuffers py"]["stored_bytes"] == 4096 * payload + 8
        for entry in files.values():  # the frames and a header: more than the payload, less than twice it
            assert payload < entry["file_bytes_per_frame"] < 2 * entry["stored_bytes"] / 4096
        assert "tfbuffers py memmap / tfbuffers py" in result["ratios"]["get_next"]
        assert set(measures["sample_dataset"]) == present - {"numpy limit", "cpprb uniform", "cpprb PER"}
        assert set(measures["get_next"]) == present - {"TF-Agents Reverb", "tf.data ceiling"}
        in_graph = {"tfbuffers TF", "TF-Agents TF", "tfbuffers TF prioritized", "bare tf.Variable"} | episodes
        assert set(measures["sample_dataset_graph"]) == in_graph | {"tf.data ceiling"}
        assert "tfbuffers TF / bare tf.Variable" in result["ratios"]["sample_dataset_graph"]
        assert set(result["ops"]) == in_graph
        keys = {"sample", "add", "sample_nodes", "add_nodes"}
        assert all(min(counted.values()) > 0 and set(counted) == keys for counted in result["ops"].values())
        # The bare sampler is the floor: every buffer's sample runs at least its ops.
        assert all(
            counted["sample"] >= result["ops"]["bare tf.Variable"]["sample"] for counted in result["ops"].values()
        )
        # The variants (an option against the same buffer) run no deterministic pass and no files.
        assert set(measures["deterministic_pass"]) == {"tfbuffers TF", "TF-Agents TF", "tfbuffers py"}
        assert "tfbuffers TF episodes / tfbuffers TF" in result["ratios"]["sample_dataset"]
        assert all(entry["median"] > 0 and entry["runs"] == 1 for m in measures.values() for entry in m.values())
        payload, frames = result["workload"]["payload_bytes"], result["workload"]["frames"]
        # The payload and nothing else, but each buffer's one int64 add counter (its `nbytes`).
        assert result["memory"]["tfbuffers TF"]["stored_bytes_per_frame"] == pytest.approx(payload + 8 / frames)
        assert result["memory"]["tfbuffers py"]["stored_bytes_per_frame"] == pytest.approx(payload + 8 / frames)
        assert result["memory"]["bare tf.Variable"]["stored_bytes_per_frame"] == payload
        assert "tfbuffers TF / TF-Agents TF" in result["ratios"]["sample_dataset"]
        assert "tfbuffers TF / bare tf.Variable" in result["ratios"]["add_graph"]
        assert "tfbuffers py / bare tf.Variable" not in result["ratios"]["add_graph"]
        assert ("tfbuffers py prioritized / cpprb PER" in result["ratios"]["sample_update"]) == ("cpprb PER" in systems)
        assert "tfbuffers TF prioritized / tfbuffers TF" in result["ratios"]["get_next"]
        reverb = "tfbuffers Reverb" in systems  # the pinned stack
        assert ("tfbuffers Reverb / TF-Agents Reverb" in result["ratios"]["sample_dataset"]) == reverb
        assert ("tfbuffers Reverb / TF-Agents Reverb" in result["ratios"]["add_eager"]) == reverb
        # --quick: one actor process adding to each buffer that imports here, then a learner sampling it.
        assert set(result["actors"]) == {*actor_backends, "tfbuffers py"}
        for backend in actor_backends:
            adds = result["actors"][backend]["adds"]
            assert list(adds) == ["1"] and len(adds["1"]["per_actor"]) == 1 and adds["1"]["frames_per_second"] > 0
            assert result["actors"][backend]["learner"] > 0
        assert result["actors"]["tfbuffers py"]["learner"] > 0
        reverbs = {"tfbuffers Reverb", "TF-Agents Reverb"} & systems
        assert result["frames"] == {name: 2048 if name in reverbs else 4096 for name in present}
        assert set(result["seconds"]) == present | {f"{backend} actors" for backend in actor_backends}
        assert set(result["phase_seconds"]) == present
        assert set(result["peaks_after"]) == set(result["seconds"])
        # The peers ran in a process apart (--quick: one for them all, in turn): that process's high-water mark after
        # each (TensorFlow and TF-Agents imported there), beside this process's.
        apart = [cls.name for cls in classes if cls.own_process]
        peers = {"TF-Agents TF", "TF-Agents py", "TF-Agents Reverb", "cpprb uniform", "cpprb PER"}
        assert set(apart) == peers & systems
        assert all(("own_process_peak_bytes" in result["peaks_after"][name]) == (name in apart) for name in present)
        own = [result["peaks_after"][name]["own_process_peak_bytes"] for name in apart]
        assert min(own) > 100 * 2**20
        assert list(result["ops"]) == [name for name in benchmark.SYSTEM_NAMES if name in in_graph]
    assert (tmp_path / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (tmp_path / "results.md").read_text()
    reverb_note = "tfbuffers Reverb, TF-Agents Reverb: filled with 2,048 frames (their writers' pace"
    assert (reverb_note in table) == ("tfbuffers Reverb" in systems)
    header = "| actors | " + " | ".join(actor_backends) + (" | Ray / Reverb |" if len(actor_backends) == 2 else " |")
    assert "Actor processes adding to one buffer at once" in table and header in table
    assert "| sample, as_dataset + prefetch (frames/s) |" in table and "numpy limit" in table
    assert "### control" in capsys.readouterr().out
    # Which stack it ran on, in the results and on the results page: the two supported stacks differ in speed.
    stack = f"Python {sys.version.split()[0]}, tensorflow {tf.__version__}, numpy {np.__version__}, tf-agents 0.19.0"
    assert stack in results["machine"] and results["machine"] in table
    # The run's processes summed (this one, the peers', the actors', Ray's): each page once (PSS) and by RSS.
    peaks = results["tree_memory_peaks"]
    assert set(peaks) == {"rss", "pss"}
    assert peaks["rss"]["bytes"] >= peaks["pss"]["bytes"] > 100 * 2**20  # a TensorFlow process at least
    assert all(peak["during"].startswith("control: ") and peak["processes"] >= 1 for peak in peaks.values())
    summed = f"{peaks['pss']['bytes'] / 1e9:.2f} GB during {peaks['pss']['during']}"
    assert f"The run's processes summed, at most: proportional (PSS, each page once) {summed}" in table


def test_the_tree_memory_counts_a_childs_pages_in_both_sums():
    """`TreeMemory` sums a process and its children: a child's written pages raise both sums by at least their size.

    Run in a fresh process, whose only child is the one made here (a test worker may hold Ray's processes).
    """
    import subprocess

    size = 256 * 2**20
    child = f"import sys; block = bytes([1]) * {size}; print('held', flush=True); sys.stdin.read()"
    script = f"""
import json, subprocess, sys
sys.path.insert(0, {str(SCRIPTS)!r})
from _bench.memory import TreeMemory
with TreeMemory(interval=0.05) as tree:
    before = tree.peaks()
    tree.phase("the child")
    child = subprocess.Popen([sys.executable, "-c", {child!r}], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdout.readline() == b"held\\n"
    tree.sample()
    child.communicate(b"")
print(json.dumps([before, tree.peaks()]))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    before, after = json.loads(done.stdout)
    assert set(before) == set(after) == {"rss", "pss"}
    for key in ("rss", "pss"):
        assert before[key]["during"] == "start" and before[key]["processes"] == 1
        assert after[key]["during"] == "the child" and after[key]["processes"] == 2
        assert after[key]["bytes"] - before[key]["bytes"] >= size


def test_the_atari_workload_stores_frame_stacks_and_compares_them(tmp_path):
    """The atari workload (stacked uint8 frames), on the systems its frame stacks are compared with."""
    systems = "tfbuffers py,tfbuffers py frame stacks,tfbuffers py frame stacks memmap"
    argv = ["--quick", "--repetitions", "1", "--workloads", "atari", "--systems", systems, "--actors", "0"]
    assert benchmark.main([*argv, "--output-dir", str(tmp_path), "--no-progress"]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    (result,) = results["workloads"].values()
    assert result["workload"]["name"] == "atari" and set(results["systems"]) == set(systems.split(","))
    assert set(result["measures"]["get_next"]) == set(systems.split(","))
    assert all(entry["median"] > 0 for m in result["measures"].values() for entry in m.values())
    for name in ("tfbuffers py frame stacks", "tfbuffers py frame stacks memmap"):  # in RAM, and over the files
        stacked = result["memory"][name]["stored_bytes_per_frame"]
        assert stacked < 0.3 * result["workload"]["payload_bytes"], name
    # One system is held at a time; the process at its fullest held at least the largest one's storage.
    largest = max(memory["stored_bytes_per_frame"] or 0.0 for memory in result["memory"].values())
    assert result["resident_peak_bytes"] >= largest * result["workload"]["frames"] > 0
    assert set(result["seconds"]) == set(systems.split(",")) and all(t > 0 for t in result["seconds"].values())
    # Where each system's seconds went: its phases, in turn within them.
    assert set(result["phase_seconds"]) == set(systems.split(",")) == set(result["peaks_after"])
    for name, phases in result["phase_seconds"].items():
        assert {"build", "fill", "add_eager", "get_next", "graph_ops", "file_memory", "close"} <= set(phases), name
        assert 0.5 * result["seconds"][name] < sum(phases.values()) <= result["seconds"][name], name
    assert "save_load" not in result["phase_seconds"]["tfbuffers py frame stacks"]  # a variant saves nothing
    assert "tfbuffers py frame stacks / tfbuffers py" in result["ratios"]["get_next"]
    assert "tfbuffers py frame stacks memmap / tfbuffers py frame stacks" in result["ratios"]["get_next"]
    assert "actors" not in result  # --actors 0
    assert (tmp_path / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@NEEDS_RAY
def test_the_rate_limit_run_keeps_the_ratio_within_its_bounds_and_stores_every_returned_add(tmp_path):
    import subprocess

    argv = ["--writers", "2", "--envs-per-writer", "1", "--seconds", "6", "--min-size", "64", "--error-buffer", "32"]
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "rate_limit.py"), *argv, "--output-dir", str(tmp_path), "--no-progress"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "rate_limit.json").read_text())
    assert result["bounds"] == [64 * 4.0 - 32, 64 * 4.0 + 32]  # min_size * R -+ E
    assert result["share_inside_bounds"] == 1.0
    assert result["bounds"][0] <= result["lowest_difference"] <= result["highest_difference"] <= result["bounds"][1]
    assert result["learner_batches"] > 0 and result["inserts_counted"] > 64
    # Every add that returned is stored: none dropped, none doubled.
    assert result["adds_returned"] == result["adds_at_close"] == result["frames_stored"] == result["inserts_counted"]
    assert (tmp_path / "rate_limit.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "inside [224, 288]" in done.stdout


COSTS = {"r1": 1000.0, "s": 2e-4, "w": 3e-4, "m": 8e-4, "L": 1e5, "t": 1e-6, "l": 1e-5, "n": 1e-5}
COSTS.update(L_mix=2000.0, t_mix=1e-4, l_mix=5e-4, n_mix=2e-3)


def test_the_shards_model_takes_the_first_bound_and_extrapolates_with_exact_counts():
    assert shards.predict_inserts(COSTS, 1, 1, 2.0) == (1000.0, "writers' round trips")  # 1000, 5000, 2500
    assert shards.predict_inserts(COSTS, 1, 8, 2.0) == (2500.0, "machine's cores")  # 8000, 5000, 2500
    assert shards.predict_inserts(COSTS, 1, 8, 64.0) == (5000.0, "shards")  # 8000, 5000, 80000
    # A shard whose CPU clock did not move in a short run bounds nothing: 8000, inf, 80000.
    assert shards.predict_inserts({**COSTS, "s": 0.0}, 1, 8, 64.0) == (8000.0, "writers' round trips")
    assert shards.predict_windows(COSTS, 4, True, 2.0) == (1000.0, "machine's cores")  # 2000, 40000, 1000
    assert shards.predict_windows(COSTS, 1, False, 2.0) == (1e5, "learner")  # 1e5, 1e6, 2e5
    args = shards.parse_args(["--machine-gib", "24"])  # 1,000 actors x 100 frames/s, 1e9 frames, 8 windows each
    scale = shards.extrapolate(args, COSTS, 280.0)
    # 1e5 inserts/s x 200 us / 0.7; 8e5 windows/s x 100 us / 0.7; 2.8e11 bytes / (0.7 x 24 GiB); learners:
    # 8e5 windows/s / (0.7 x 2,000) mixed, / (0.7 x 1e5) batched
    assert scale["shards_needed_for"] == {"insert calls": 29, "sampling": 115, "memory": 16}
    assert scale["shards"] == 115 and scale["first_bottleneck"] == "sampling"
    assert scale["learners_needed"] == 572 and scale["if_batched"] == {"shards_for_sampling": 2, "learners_needed": 12}
    assert scale["per_shard"]["memory_gib"] == pytest.approx(1e9 * 280 / 115 / 2**30)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--shards", "2,4"], "--shards: expected 1 among the counts (the model is fitted to one shard), got [2, 4]"),
        (["--writers", "2,1"], "expected positive ints separated by commas, increasing, got '2,1'"),
        (["--writers", "0,1"], "expected positive ints separated by commas, increasing, got '0,1'"),
        (["--shards", "a"], "expected positive ints separated by commas, got 'a'"),
        (["--capacity", "1"], "--capacity: expected at least --num-steps (2), got 1"),
    ],
)
def test_the_shards_script_refuses_bad_arguments_naming_them(argv, message, capsys):
    with pytest.raises(SystemExit):
        shards.parse_args(argv)
    assert message in capsys.readouterr().err


@NEEDS_RAY
def test_the_shards_run_measures_every_shard_and_writer_count_and_fits_its_model(tmp_path):
    import subprocess

    argv = ["--shards", "1,2", "--writers", "1,2", "--seconds", "0.5", "--capacity", "20000", "--no-progress"]
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "shards.py"), *argv, "--output-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "shards.json").read_text())
    assert [(run["shards"], run["writers"]) for run in result["runs"]] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    for run in result["runs"]:
        assert run["frames"] > 0 and len(run["per_writer"]) == len(run["writer_cpu_seconds"]) == run["writers"]
        # Every frame a writer added is held (and each writer's one frame before the clock started).
        assert sum(run["frames_held"]) == run["frames"] + run["writers"] and len(run["frames_held"]) == run["shards"]
        bounds = [run["writers"] * result["costs"]["r1"], run["shards"] / result["costs"]["s"]]
        assert run["predicted"] == min(*bounds, result["cores"] / result["costs"]["m"])
    assert [(entry["shards"], entry["mixed"]) for entry in result["learners"]] == [(1, True), (1, False), (2, True)]
    assert all(entry["windows"] > 0 and entry["predicted"] > 0 for entry in result["learners"])
    scale = result["extrapolation"]
    assert scale["shards"] == max(scale["shards_needed_for"].values())
    assert scale["shards_needed_for"]["insert calls"] == int(np.ceil(1000 * 100 * result["costs"]["s"] / 0.7))
    assert (tmp_path / "shards.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (tmp_path / "shards.md").read_text()
    assert "| 2 | 2 |" in table and "| 1 | mixed (`sharded_dataset`) |" in table and table in done.stdout


@pytest.mark.parametrize(("buffer", "graph_writer"), [("py_uniform", False), ("tf_uniform", True)])
def test_a_short_soak_checks_frames_and_records_memory(tmp_path, capsys, buffer, graph_writer):
    argv = ["--buffer", buffer, "--minutes", "0.05", "--round-seconds", "1", "--output-dir", str(tmp_path)]
    assert soak.main([*argv, "--no-progress", *(["--graph-writer"] if graph_writer else [])]) == 0
    result = json.loads((tmp_path / "soak.json").read_text())
    assert result["rounds"] == 3 and len(result["memory_mb"]) == 3
    assert result["threads"] == (5 if graph_writer else 6)  # writers, 2 samplers, a dataset, a gatherer
    # Every thread completes a call in each round (min_operations=1): the gatherer checks frames.
    assert result["totals"]["frames_checked"] > 0 and result["totals"]["adds"] >= 3
    assert set(result) >= {"python_blocks_per_operation_after_first_quarter", "tensorflow_blocks_per_tensor"}
    assert (tmp_path / "soak.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "frames checked, none torn" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--capacity", "0"], "argument --capacity: expected a positive int, got 0"),
        (["--capacity", "-5"], "argument --capacity: expected a positive int, got -5"),
        (["--num-runs", "0"], "argument --num-runs: expected a positive int, got 0"),
        (["--steps-per-run", "x"], "argument --steps-per-run: expected a positive int, got 'x'"),
        (["--num-envs", "4", "--capacity", "2"], "argument --capacity: expected at least --num-envs=4, got 2"),
    ],
)
def test_populate_refuses_bad_numbers(tmp_path, capsys, argv, message):
    argv = ["--buffer-name", "b", "--output-dir", str(tmp_path), *argv]
    assert_refused(capsys, populate_starter_buffer.main, argv, message)
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize("name", ["../x", "a/b", "/tmp/x", ".hidden", ""])
def test_populate_refuses_buffer_names_that_leave_the_output_dir(tmp_path, capsys, name):
    output = tmp_path / "out"
    argv = ["--buffer-name", name, "--output-dir", str(output), "--num-runs", "1"]
    assert_refused(capsys, populate_starter_buffer.main, argv, "argument --buffer-name: expected a plain name")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--num-iterations", "0"], "argument --num-iterations: expected a positive int, got 0"),
        (["--batch-size", "-1"], "argument --batch-size: expected a positive int, got -1"),
        (["--epsilon", "1.5"], "argument --epsilon: expected a number in [0, 1], got 1.5"),
        (["--n-step", "0"], "argument --n-step: expected a positive int, got 0"),
        (
            ["--n-step", "9", "--replay-capacity", "16", "--num-envs", "2"],
            "argument --n-step: expected windows of N + 1 frames to fit a segment of --replay-capacity / "
            "--num-envs = 8 frames, got 9",
        ),
        (["--fc-layers", "100,0"], "argument --fc-layers: expected a positive int, got 0"),
        (["--learning-rate", "0"], "argument --learning-rate: expected a positive number, got 0.0"),
        (["--num-bits", "0"], "argument --num-bits: expected a positive int, got 0"),
        (
            ["--num-bits", "5", "--env", "CartPole-v1"],
            "argument --num-bits: only with --env tfbuffers/BitFlipping-v0, got --env CartPole-v1",
        ),
        (["--relabel-fraction", "0.5"], "argument --relabel-fraction: only with --her"),
        (["--her-strategy", "final"], "argument --her-strategy: only with --her"),
        (["--her", "--relabel-fraction", "2"], "argument --relabel-fraction: expected a number in [0, 1], got 2"),
        (["--her", "--her-strategy", "random"], "argument --her-strategy: invalid choice: 'random'"),
        (
            ["--her", "--buffer", "tf_prioritized"],
            "argument --her: expected a local uniform buffer (tf_uniform or py_uniform) and one-step transitions, "
            "got --buffer tf_prioritized",
        ),
        (
            ["--her", "--n-step", "3"],
            "argument --her: expected a local uniform buffer (tf_uniform or py_uniform) and one-step transitions, "
            "got --n-step",
        ),
        (
            ["--jit", "--buffer", "tf_prioritized"],
            "argument --jit: expected --buffer tf_uniform in this process and one-step transitions, got --buffer "
            "tf_prioritized",
        ),
        (
            ["--jit", "--n-step", "3"],
            "argument --jit: expected --buffer tf_uniform in this process and one-step transitions, got --n-step",
        ),
        (
            ["--jit", "--replay-server", "a:1"],
            "argument --jit: expected --buffer tf_uniform in this process and one-step transitions, got "
            "--replay-server",
        ),
    ],
)
def test_train_dqn_refuses_bad_numbers(capsys, argv, message):
    assert_refused(capsys, train_dqn.parse_args, argv, message)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--replay-server", "localhost"],
            "argument --replay-server: expected HOST:PORT[,HOST:PORT...], got 'localhost'",
        ),
        (["--replay-server", "a:1,b"], "argument --replay-server: expected HOST:PORT[,HOST:PORT...], got 'b'"),
        (["--replay-server", "a:1", "--starter-buffer", "x"], "argument --starter-buffer: not with --replay-server"),
        (["--policy-interval", "0"], "argument --policy-interval: expected a positive int, got 0"),
        (["--backend", "ray"], "argument --backend: only with --replay-server"),
        (["--replay-server", "a:1", "--backend", "kafka"], "argument --backend: invalid choice: 'kafka'"),
        pytest.param(
            ["--replay-server", "a:1,b:2", "--backend", "ray"],
            "argument --replay-server: expected one HOST:PORT with --backend ray (a process joins one Ray cluster), "
            "got 'a:1,b:2'",
            marks=NEEDS_RAY,
        ),
    ],
)
def test_train_dqn_refuses_bad_replay_server_arguments(capsys, argv, message):
    assert_refused(capsys, train_dqn.parse_args, argv, message)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "the following arguments are required: --replay-server"),
        (["--replay-server", "host"], "argument --replay-server: expected HOST:PORT, got 'host'"),
        (["--replay-server", "h:1", "--frames", "-1"], "argument --frames: expected an int >= 0, got -1"),
        (
            ["--replay-server", "h:1", "--policy-poll-seconds", "0"],
            "argument --policy-poll-seconds: expected a positive",
        ),
        (["--replay-server", "h:1", "--policy-poll-seconds", "inf"], "expected a positive number, got inf"),
        (["--replay-server", "h:1", "--fc-layers", "10,x"], "argument --fc-layers: expected a positive int, got 'x'"),
        (["--replay-server", "h:1", "--table-name", "../t"], "argument --table-name: expected a plain name"),
        pytest.param(
            ["--replay-server", "h:1", "--backend", "ray", "--sequence-length", "3"],
            "argument --sequence-length: Reverb only (a Ray buffer holds frames; learners pick windows)",
            marks=NEEDS_RAY,
        ),
    ],
)
def test_collect_refuses_bad_arguments(capsys, argv, message):
    assert_refused(capsys, collect.parse_args, argv, message)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(
            ["--backend", "ray", "--sequence-length", "3"],
            "argument --sequence-length: Reverb only (a Ray buffer holds frames; learners pick windows)",
            marks=NEEDS_RAY,
        ),
        pytest.param(
            ["--backend", "reverb", "--segments", "4"],
            "argument --segments: Ray only (a Reverb table takes any number of actors)",
            marks=NEEDS_REVERB,
        ),
        pytest.param(
            ["--backend", "reverb"],
            "argument --backend: reverb: dm-reverb cannot be imported here; it installs on Python 3.11",
            marks=pytest.mark.skipif(importlib.util.find_spec("reverb") is not None, reason="Reverb imports here"),
        ),
        (["--backend", "ray", "--segments", "0"], "argument --segments: expected a positive int, got 0"),
    ],
)
def test_the_server_refuses_flags_of_the_other_backend(capsys, argv, message):
    assert_refused(capsys, replay_server.parse_args, ["--port", "1", *argv], message)


def test_the_default_backend_is_reverb_where_it_imports_else_ray(monkeypatch, capsys):
    real = importlib.util.find_spec
    expected = "reverb" if real("reverb") is not None else "ray" if real("ray") is not None else None
    if expected is not None:
        assert replay_server.parse_args(["--port", "1"]).backend == expected
        assert collect.parse_args(["--replay-server", "h:1"]).backend == expected
        assert train_dqn.parse_args(["--replay-server", "h:1"]).backend == expected
    assert train_dqn.parse_args([]).backend is None  # no server: the buffer is in the process
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name in ("reverb", "ray") else real(name))
    message = "argument --backend: neither engine imports here (dm-reverb cannot be imported here"
    assert_refused(capsys, replay_server.parse_args, ["--port", "1"], message)
    assert_refused(capsys, collect.parse_args, ["--replay-server", "h:1", "--backend", "ray"], "ray cannot be imported")


def test_the_server_reads_a_spec_file_or_a_policy_saver_s_and_refuses_what_is_not_one(tmp_path, capsys):
    from scripts_test_helpers import cartpole_trajectory_spec
    from tf_agents.specs import tensor_spec

    spec = cartpole_trajectory_spec()
    tensor_spec.to_pbtxt_file(str(tmp_path / "spec.pbtxt"), spec)
    # A PolicySaver's policy_specs.pbtxt: a dict that holds collect_data_spec.
    tensor_spec.to_pbtxt_file(
        str(tmp_path / "policy_specs.pbtxt"), {"collect_data_spec": spec, "policy_state_spec": ()}
    )
    for name in ("spec.pbtxt", "policy_specs.pbtxt"):
        read = replay_server.spec_from_file(str(tmp_path / name))
        assert type(read).__name__ == "Trajectory"
        assert [(s.shape, s.dtype) for s in tf.nest.flatten(read)] == [
            (s.shape, s.dtype) for s in tf.nest.flatten(spec)
        ]
    (tmp_path / "bad.pbtxt").write_text("not a spec")
    for path in (tmp_path / "bad.pbtxt", tmp_path / "missing.pbtxt"):
        message = f"argument --spec-file: expected a TF-Agents spec file (.pbtxt), got {str(path)!r}"
        assert_refused(capsys, replay_server.main, ["--port", "1", "--spec-file", str(path)], message)
    argv = ["--port", "1", "--spec-file", "x", "--env", "CartPole-v1"]
    assert_refused(capsys, replay_server.main, argv, "not allowed with argument")


WITHOUT_TENSORFLOW = """
import runpy, sys
sys.modules["tensorflow"] = None  # importing it raises ImportError
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
SCRIPT_NAMES = ["train_dqn", "populate_starter_buffer", "benchmark", "soak", "tf_agents_examples", "replay_server"]
SCRIPT_NAMES += ["collect", "tf_agents_tests", "compare_runs", "her_bit_flipping", "rate_limit", "shards"]
BAD_ARGUMENTS = {
    "train_dqn": (["--num-envs", "0"], "argument --num-envs: expected a positive int, got 0"),
    "populate_starter_buffer": (
        ["--buffer-name", "b", "--capacity", "1", "--num-envs", "2"],
        "argument --capacity: expected at least",
    ),
    "benchmark": (
        ["--workloads", "mujoco"],
        "argument --workloads: expected names among control, atari, flashbax, torchrl, got 'mujoco'",
    ),
    "soak": (["--minutes", "x"], "argument --minutes: invalid float value: 'x'"),
    "tf_agents_examples": (["--timeout", "0"], "--timeout: expected a positive number of seconds, got 0"),
    "replay_server": (["--port", "0"], "argument --port: expected a positive int, got 0"),
    "collect": (["--replay-server", "h:1", "--epsilon", "2"], "argument --epsilon: expected a number in [0, 1], got"),
    "tf_agents_tests": (["--buffers", "reverb"], "argument --buffers: invalid choice: 'reverb'"),
    "compare_runs": (["run", "--output", "a.png"], "argument LABEL=PATH: expected a label, '=' and a path, got 'run'"),
    "her_bit_flipping": (["--bits", "4,0"], "argument --bits: expected positive ints, got [4, 0]"),
    "rate_limit": (["--seconds", "1", "--poll-seconds", "2"], "--poll-seconds: expected less than --seconds (1.0)"),
    "shards": (["--writers", "1,0"], "argument --writers: expected positive ints separated by commas, increasing"),
}


@pytest.mark.parametrize("script", SCRIPT_NAMES)
def test_help_and_bad_arguments_are_answered_before_tensorflow_is_imported(script):
    import subprocess

    def run(*argv):
        command = [sys.executable, "-c", WITHOUT_TENSORFLOW, str(SCRIPTS / f"{script}.py"), *argv]
        return subprocess.run(command, capture_output=True, text=True, timeout=300)

    helped = run("--help")
    assert helped.returncode == 0, helped.stderr[-2000:]
    assert "usage:" in helped.stdout and helped.stderr == ""
    assert "(default: " in helped.stdout  # every option with a default shows it
    argv, message = BAD_ARGUMENTS[script]
    refused = run(*argv)
    assert refused.returncode == 2 and message in refused.stderr, refused.stderr[-2000:]
    assert "ImportError" not in refused.stderr


def test_a_seeded_dqn_run_repeats_exactly_and_prints_only_its_results(tmp_path):
    import subprocess

    def run(directory):
        argv = ["--num-iterations", "300", "--eval-interval", "100", "--eval-episodes", "2"]
        argv += ["--initial-collect-frames", "200", "--seed", "3", "--no-progress", "--output-dir", str(directory)]
        result = subprocess.run(
            [sys.executable, str(SCRIPTS / "train_dqn.py"), *argv], capture_output=True, text=True, timeout=600
        )
        assert result.returncode == 0, result.stderr[-3000:]
        # Quiet: TensorFlow's start-up lines, gym's notice and third-party deprecations are kept off the terminal.
        assert result.stderr == ""
        assert result.stdout.startswith("DQN on CartPole-v1 with tfbuffers tf_uniform: average return ")
        return json.loads((directory / "summary.json").read_text())["result"]

    first, second = run(tmp_path / "first"), run(tmp_path / "second")
    assert first["train_steps"] == 300 and len(first["returns"]) == 4
    for key in ("returns", "last_loss", "frames_collected", "frames_in_buffer"):
        assert first[key] == second[key], key


def test_the_benchmark_leaves_out_what_cannot_be_imported_and_says_why(monkeypatch):
    real = benchmark.importlib.util.find_spec
    monkeypatch.setattr(benchmark.importlib.util, "find_spec", lambda name: None if name == "reverb" else real(name))
    classes, left_out = benchmark.available_systems()
    # cpprb has wheels up to Python 3.12: where it is missing, its two systems are left out too, saying so.
    cpprb = {"cpprb uniform", "cpprb PER"} if real("cpprb") is None else set()
    reverb = {"tfbuffers Reverb", "TF-Agents Reverb"}
    kept = [cls.name for cls in benchmark.SYSTEMS if cls.name not in reverb and cls.name not in cpprb]
    assert [cls.name for cls in classes] == kept
    why_cpprb = (
        "needs cpprb, not installed here (the 'all', 'current' and 'scripts' extras install it; "
        "cpprb 11.0 has wheels for Python 3.12 and older)"
    )
    assert left_out == {
        **{
            name: "needs reverb, not installed here (dm-reverb has wheels for Python 3.11 and older only)"
            for name in reverb
        },
        **{name: why_cpprb for name in sorted(cpprb)},
    }
    monkeypatch.undo()
    if real("reverb") is not None:  # the pinned stack has everything
        assert benchmark.available_systems() == (benchmark.SYSTEMS, {})


def test_graph_ops_counts_the_nodes_of_a_graph_and_of_the_functions_it_calls():
    assert benchmark.graph_ops(lambda: tf.constant(1) + tf.constant(2)) == 4  # two constants, the add, the output
    double = tf.function(lambda x: x * 2)
    # The call, its argument and the output; inside the called function: the 2, the product and its output.
    assert benchmark.graph_ops(lambda: double(tf.constant(3))) == 3 + 3


def test_executed_ops_counts_what_one_call_runs():
    assert benchmark.executed_ops(lambda: tf.constant(1) + tf.constant(2)) == 1  # the add; constants left out

    def pick(flag: bool) -> tf.Tensor:
        return tf.cond(tf.constant(flag), lambda: tf.constant(1) * 2, lambda: tf.constant(2) + 3 + 4)

    # One branch runs: the product, or the two sums; the graph holds both branches and their constants.
    assert [benchmark.executed_ops(lambda flag=flag: pick(flag)) for flag in (True, False)] == [1, 2]
    assert benchmark.graph_ops(lambda: pick(True)) == 14


@pytest.mark.parametrize(
    ("system", "sample", "add"),
    [
        # The counts docs/benchmarks.md explains the in-graph rates with (its "Ops of one in-graph call"):
        # a change that adds ops to a sample or an add shows here. 6 gathers per sample, 6 scatters per add
        # (not seen by the debugger); the prioritized sample's count grows with the tree's depth (14 levels),
        # and is counted with no weight on the newest frames: no draw lands there to be drawn again. Its tree
        # in rows of 16 nodes made it 148 from 140 (each node read by (row, column)), with far fewer indices;
        # checking its drawn ids against the counter (a row an add is still writing is read again), 154.
        ("tfbuffers TF", 38, 7),
        ("tfbuffers TF prioritized", 154, 28),
        # With episode_boundaries: the record of episode ends read by the sample and kept by the add (docs/
        # benchmarks.md's 137 and 51), pinned before issue 49 makes that record the sampler's state.
        ("tfbuffers TF episodes", 137, 51),
        ("bare tf.Variable", 11, 5),
    ],
)
def test_the_tf_buffers_in_graph_calls_run_the_ops_the_guide_counts(system, sample, add):
    workload = dataclasses.replace(benchmark.WORKLOADS["control"], frames=16_000)
    buffer = {cls.name: cls for cls in benchmark.SYSTEMS}[system](workload)
    buffer.fill(benchmark.numpy_batches(workload, 2), types.SimpleNamespace(update=lambda frames: None))
    if getattr(buffer.buffer, "prioritized", False):  # a bare reference has no buffer API
        buffer.buffer.update_priorities(np.arange(15_992, 16_000), np.zeros(8))  # the newest add's frames
    counts = buffer.graph_ops()
    assert (counts["sample"], counts["add"]) == (sample, add)


@pytest.mark.parametrize("steps", [100, 125, 150])  # 800 of its 1,000 frames; exactly full; 200 overwritten
def test_tf_agents_py_buffer_filled_in_place_holds_what_its_adds_leave(steps):
    from _bench import peers

    workload = dataclasses.replace(benchmark.WORKLOADS["control"], frames=1_000)
    batches = benchmark.numpy_batches(workload, 64)
    added, filled = peers.TFAgentsPy(workload), peers.TFAgentsPy(workload)
    for t in range(steps):
        added.add(batches[t % len(batches)])
    peers.fill_storage(filled.buffer, batches, steps)
    for index in range(len(tf.nest.flatten(workload.spec))):
        np.testing.assert_array_equal(filled.buffer._storage._array(index), added.buffer._storage._array(index))
    for counter in ("size", "cur_id", "item_count"):
        kept = getattr(filled.buffer._np_state, counter)
        assert kept == getattr(added.buffer._np_state, counter) and kept.dtype == np.int64, counter
    assert (int(filled.buffer._np_state.size), int(filled.buffer._np_state.cur_id)) == (
        min(8 * steps, 1_000),
        8 * steps % 1_000,
    )


@pytest.mark.parametrize("system", ["tfbuffers TF prioritized episodes", "tfbuffers py prioritized memmap"])
def test_the_benchmark_fills_by_blocks_what_its_adds_one_by_one_store(monkeypatch, system):
    from _bench import ours

    workload = dataclasses.replace(benchmark.WORKLOADS["control"], frames=8 * 500)
    # Blocks of 192 frames per environment (3 turns of the 64 batches): two of them, then one of the last 116.
    monkeypatch.setattr(ours, "BLOCK_BYTES", 3 * 64 * 8 * workload.payload_bytes)
    cls = {cls.name: cls for cls in benchmark.SYSTEMS}[system]
    blocks, adds = cls(workload), cls(workload)
    given = blocks.prepare(benchmark.numpy_batches(workload, 64))
    bar = types.SimpleNamespace(frames=0)
    bar.update = lambda frames: setattr(bar, "frames", bar.frames + frames)
    blocks.fill(given, bar)
    benchmark.System.fill(adds, given, bar)
    assert bar.frames == 2 * workload.frames
    kept, expected = blocks.buffer.state(), adds.buffer.state()
    assert kept.counters == expected.counters and kept.counters["added"] == workload.max_length
    assert set(kept.arrays) == set(expected.arrays) and set(kept.extras) == set(expected.extras)
    for name, array in {**expected.arrays, **expected.extras}.items():
        np.testing.assert_array_equal({**kept.arrays, **kept.extras}[name], array, err_msg=name)
    blocks.close()
    adds.close()


def test_the_benchmark_refuses_unknown_systems(capsys):
    message = "argument --systems: expected names among tfbuffers TF, TF-Agents TF"
    assert_refused(capsys, benchmark.main, ["--systems", "tfbuffers py,fastest buffer"], message)


def test_the_benchmark_names_its_systems_before_importing_them():
    assert tuple(system.name for system in benchmark.SYSTEMS) == benchmark.SYSTEM_NAMES


def test_the_scripts_know_the_buffer_kinds_and_samplers_before_importing_tfbuffers():
    import _args
    import _common

    from tfbuffers.remote.options import SAMPLERS

    assert _common.BUFFERS == _args.BUFFER_KINDS and _args.REVERB_SAMPLERS == SAMPLERS


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--actors", "1,x"], "argument --actors: expected process counts separated by commas, e.g. 1,2,4, got '1,x'"),
        (["--actors", "-1"], "argument --actors: expected process counts separated by commas, e.g. 1,2,4, got '-1'"),
        (["--actor-seconds", "-2"], "argument --actor-seconds: expected a positive number, got -2.0"),
        (["--actor-seconds", "0"], "argument --actor-seconds: expected a positive number, got 0.0"),
        (["--frames", "100"], "argument --frames: expected a multiple of 8, at least 512, got 100"),
        (["--beyond-cache-factor", "0"], "argument --beyond-cache-factor: expected a positive number, got 0.0"),
        (["--beyond-cache-seconds", "-1"], "argument --beyond-cache-seconds: expected a positive number, got -1.0"),
        (
            ["--beyond-cache-dir", "/no/such/directory"],
            "argument --beyond-cache-dir: expected an existing directory, got '/no/such/directory'",
        ),
        (["--frames", "1004"], "argument --frames: expected a multiple of 8, at least 512, got 1004"),
        (
            ["--actor-backends", "tfbuffers Ray,kafka"],
            "argument --actor-backends: expected names among tfbuffers Reverb, tfbuffers Ray, got "
            "'tfbuffers Ray,kafka'",
        ),
        (
            ["--sweep", "--systems", "cpprb PER,Flashbax prioritized"],
            "argument --systems: --sweep measures tfbuffers TF, tfbuffers py, tfbuffers TF prioritized, "
            "tfbuffers py prioritized, tfbuffers py memmap, numpy limit, got 'cpprb PER,Flashbax prioritized'",
        ),
    ],
)
def test_the_benchmark_refuses_bad_actor_options(capsys, argv, message):
    assert_refused(capsys, benchmark.main, argv, message)


@pytest.mark.parametrize(
    ("module", "argv"),
    [
        ("collect", ["--replay-server", "h:1"]),
        ("train_dqn", ["--replay-server", "h:1"]),
        ("replay_server", ["--port", "1"]),
    ],
)
def test_server_actor_and_learner_say_where_reverb_is_missing(monkeypatch, capsys, module, argv):
    script = {"collect": collect, "train_dqn": train_dqn, "replay_server": replay_server}[module]
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *args: None if name == "reverb" else real(name, *args)
    )
    message = "argument --backend: reverb: dm-reverb cannot be imported here; it installs on Python 3.11"
    assert_refused(capsys, script.parse_args, [*argv, "--backend", "reverb"], message)
    if real("ray") is not None:  # without --backend: Ray
        assert script.parse_args(argv).backend == "ray"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--samples-per-insert", "0"], "argument --samples-per-insert: expected a positive number, got 0.0"),
        (["--samples-per-insert", "nan"], "argument --samples-per-insert: expected a positive number, got nan"),
        (["--min-size-to-sample", "0"], "argument --min-size-to-sample: expected a positive int, got 0"),
    ],
)
def test_the_server_refuses_bad_pacing(capsys, argv, message):
    assert_refused(capsys, replay_server.main, ["--port", "1", *argv], message)


def test_compare_runs_plots_the_curves_and_tabulates_each_run(tmp_path, capsys):
    for name, returns, seed in (("a", [10.0, 480.0, 500.0], 0), ("b", [9.0, 200.0, 300.0], 1)):
        result = {"iterations": [0, 1000, 2000], "returns": returns, "final_return": returns[-1], "seconds": 61.4}
        (tmp_path / f"{name}.json").write_text(json.dumps({"config": {"seed": seed}, "result": result}))
    output = tmp_path / "figure" / "runs.png"
    argv = [f"n=1/seed 0={tmp_path / 'a.json'}", f"n=3/seed 1={tmp_path / 'b.json'}", "--output", str(output)]
    assert compare_runs.main(argv) == 0
    assert output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().out.splitlines()[2:4] == [
        "| n=1/seed 0 | 0 | 330.0 | 500.0 | 1,000 | 61 |",
        "| n=3/seed 1 | 1 | 169.7 | 300.0 | never | 61 |",
    ]
