"""Resource hygiene: closing releases storage, loops of buffers do not grow memory, nothing warns."""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
import textwrap
import weakref

import numpy as np
import pytest
import tensorflow as tf

import tfbuffers
from tfbuffers import _noise
from tfbuffers import testing as stress


def test_closing_a_py_buffer_releases_its_arrays_and_later_calls_raise():
    with tfbuffers.PyUniformReplayBuffer(
        {"x": tf.TensorSpec([1000], tf.float32)}, batch_size=4, max_length=250
    ) as buffer:
        for _ in range(250):
            buffer.add_batch({"x": np.ones([4, 1000], np.float32)})
        arrays = [weakref.ref(array) for array in buffer._table.arrays]
    gc.collect()
    assert buffer.closed and [array() for array in arrays] == [None]  # nothing holds the storage
    for call in (buffer.num_frames, buffer.gather_all, buffer.clear, lambda: buffer.get_next(2)):
        with pytest.raises(ValueError) as raised:
            call()
        assert str(raised.value) == "PyUniformReplayBuffer: the buffer is closed"
    buffer.close()  # twice is fine


def test_closing_a_tf_buffer_drops_its_variables_and_later_calls_raise():
    buffer = tfbuffers.TFUniformReplayBuffer(stress.SPEC, batch_size=2, max_length=5)
    buffer.add_batch(stress.frames(np.arange(2)))
    buffer.get_next(2)
    table = weakref.ref(buffer.variables()[0])
    buffer.close()
    gc.collect()
    assert table() is None and buffer.variables() == ()
    with pytest.raises(ValueError, match="^TFUniformReplayBuffer: the buffer is closed$"):
        buffer.add_batch(stress.frames(np.arange(2)))


@pytest.mark.parametrize("kind", [tfbuffers.PyUniformReplayBuffer, tfbuffers.TFUniformReplayBuffer])
def test_making_and_dropping_buffers_in_a_loop_does_not_keep_them(kind):
    # Each buffer holds 32 MB of frames (written in full): 20 kept alive would be 640 MB. What
    # stays is the allocator's and TensorFlow's caches, which vary from run to run (0 to 30 MB).
    # Without the garbage collection in `close()`, the TF buffer's compiled functions and
    # datasets would keep its variables alive until some later collection.
    def cycle() -> weakref.ref:
        with kind(stress.SPEC, batch_size=4, max_length=200_000) as buffer:
            buffer.add_batch(stress.frames(np.arange(4)))
            buffer.get_next(8)
            buffer.gather_all()
            next(iter(buffer.as_dataset(8)))
            if kind is tfbuffers.PyUniformReplayBuffer:
                for array in buffer._table.arrays:
                    array.fill(1)  # numpy pages are only resident once written
        return weakref.ref(buffer)

    # Resident memory after the loop depends on the allocator and TensorFlow's caches; what is
    # exact is that no buffer (and so none of its storage) survives its block.
    buffers = [cycle() for _ in range(5)]
    gc.collect()
    assert [b for b in buffers if b() is not None] == []


EPISODE_SPEC = {"x": tf.TensorSpec([3], tf.float32), "step_type": tf.TensorSpec([], tf.int32)}
FREED_KINDS = {
    "py": (tfbuffers.PyUniformReplayBuffer, {}),
    "py episodes": (tfbuffers.PyUniformReplayBuffer, {"episode_boundaries": True}),
    "py prioritized": (tfbuffers.PyPrioritizedReplayBuffer, {}),
    "py prioritized episodes": (tfbuffers.PyPrioritizedReplayBuffer, {"episode_boundaries": True}),
    "py frame stacks": (tfbuffers.PyUniformReplayBuffer, {"frame_stacks": {"x": 0}}),
    "tf": (tfbuffers.TFUniformReplayBuffer, {}),
    "tf episodes": (tfbuffers.TFUniformReplayBuffer, {"episode_boundaries": True}),
    "tf prioritized": (tfbuffers.TFPrioritizedReplayBuffer, {}),
    "tf prioritized episodes": (tfbuffers.TFPrioritizedReplayBuffer, {"episode_boundaries": True}),
}


@pytest.mark.parametrize("name", list(FREED_KINDS))
def test_a_dropped_buffer_is_freed_at_once_without_the_cycle_collector(name):
    # Its parts (sampler, priorities, record of episode ends, datasets, states) hold it weakly: no reference
    # cycle keeps a dropped buffer's storage (gigabytes, for an Atari buffer) until some later collection.
    buffer_class, options = FREED_KINDS[name]
    gc.collect()
    gc.disable()
    try:
        buffer = buffer_class(EPISODE_SPEC, batch_size=2, max_length=8, **options)
        for t in range(5):
            buffer.add_batch({"x": np.full([2, 3], t, np.float32), "step_type": np.full([2], t % 3, np.int32)})
        buffer.get_next(sample_batch_size=4, num_steps=2)
        next(iter(buffer.as_dataset(sample_batch_size=4, num_steps=2)))
        if buffer.prioritized:
            buffer.update_priorities(np.array([2, 3]), np.array([2.0, 0.5]))
        dropped = weakref.ref(buffer)
        del buffer
        assert dropped() is None
    finally:
        gc.enable()


WORKFLOW = textwrap.dedent(
    """
    import tempfile, warnings
    import numpy as np
    # Other libraries' warnings (tf-agents' own deprecation notices on newer Pythons) are theirs.
    warnings.filterwarnings("ignore", module=r"(tf_agents|gym|tensorflow_probability|tensorflow|keras)(\\..*)?$")
    warnings.filterwarnings("error", module=r"tfbuffers(\\..*)?$")  # a warning from tfbuffers fails the run
    import tfbuffers
    tfbuffers.quiet_start_up()  # TensorFlow's start-up lines and gym's notice (tf-agents imports gym) kept off
    from tfbuffers import files, observers
    from tfbuffers import testing as stress
    from tfbuffers.envs import load_gymnasium
    from tf_agents.drivers import dynamic_step_driver
    from tf_agents.policies import random_tf_policy

    for _ in range(8):  # many buffers: no "excessive retracing" warning
        for kind in (tfbuffers.TFUniformReplayBuffer, tfbuffers.PyUniformReplayBuffer):
            with kind(stress.SPEC, batch_size=2, max_length=8) as buffer:
                for t in range(5):
                    buffer.add_batch(stress.frames(t * 2 + np.arange(2)))
                buffer.get_next(4, 2), buffer.gather_all(), buffer.num_frames()
                next(iter(buffer.as_dataset(4, 2, num_parallel_calls=2).prefetch(2)))
                list(buffer.as_dataset(2, 2, single_deterministic_pass=True))
                path = tempfile.mkdtemp() + "/b.safetensors"
                files.load(files.save(buffer, path), buffer)
    env = load_gymnasium("CartPole-v1", num_envs=2, seed=0, tf_environment=True)
    policy = random_tf_policy.RandomTFPolicy(env.time_step_spec(), env.action_spec())
    for kind in (tfbuffers.TFUniformReplayBuffer, tfbuffers.PyUniformReplayBuffer):
        buffer = kind(policy.trajectory_spec, batch_size=2, max_length=50)
        driver = dynamic_step_driver.DynamicStepDriver(env, policy, [observers.TFObserver(buffer)], num_steps=20)
        driver.run(env.reset())
    print("done")
    """
)


# TensorFlow's own C++ log lines: glog's (TF 2.15) and absl's (newer TensorFlow, which
# TF_CPP_MIN_LOG_LEVEL no longer silences at start-up), with absl's notice before its first line.
TENSORFLOW_LOG_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] \S+:\d+\]"  # glog
    r"|[IWEF]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ \S+:\d+\]"  # absl (its clock may be seconds since 1970)
    r"|WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$)"
)


def not_tensorflows(stderr: str) -> list[str]:
    """The lines of `stderr` that are not TensorFlow's C++ log lines."""
    return [line for line in stderr.splitlines() if not TENSORFLOW_LOG_LINE.match(line)]


def test_tensorflow_log_lines_are_told_apart_from_others():
    stderr = (
        "2026-11-23 12:05:20.257520: E external/local_xla/xla/stream_executor/cuda/cuda_dnn.cc:9261] Unable to\n"
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
        "I0000 00:00:1795441452.506322   29911 port.cc:153] oneDNN custom operations are on.\n"
        "W1123 12:00:00.000001    7 cudart_stub.cc:31] Could not find cuda drivers\n"
        "UserWarning: tfbuffers said something\n"
        "I0000 is not a log line\n"
    )
    assert not_tensorflows(stderr) == ["UserWarning: tfbuffers said something", "I0000 is not a log line"]


def test_a_whole_workflow_prints_nothing_but_its_own_output():
    # TensorFlow's C++ log lines are TensorFlow's; silence what can be, and see what else is left.
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    run = subprocess.run([sys.executable, "-c", WORKFLOW], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout == "done\n"
    left = not_tensorflows(run.stderr)
    assert left == [], "\n".join(left)


START_UP = re.compile("|".join(_noise.TENSORFLOW_START_UP))


def start_up_lines(code: str) -> list[str]:
    """The lines of TensorFlow's start-up about absent hardware that `code`, run alone, writes to stderr."""
    env = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return [line for line in run.stderr.splitlines() if START_UP.search(line)]


def test_quiet_start_up_keeps_tensorflows_start_up_lines_off():
    # What a notebook or a program that calls it first shows; TensorFlow imported without it prints them as it
    # always does (on this machine, without a GPU, it prints several), through tfbuffers too.
    assert start_up_lines("import tensorflow") != []
    assert start_up_lines("import tfbuffers; tfbuffers.TFUniformReplayBuffer") != []
    quiet = "import tfbuffers; tfbuffers.quiet_start_up(); import tensorflow as tf; print(tf.constant(1) + 1)"
    assert start_up_lines(quiet) == []


UNTOUCHED = textwrap.dedent(
    """
    import os, sys, warnings
    stderr, descriptor, filters = sys.stderr, os.fstat(2), list(warnings.filters)
    import tfbuffers
    print("tensorflow" in sys.modules, "gym" in sys.modules)
    from tfbuffers import PyUniformReplayBuffer, storage
    import tfbuffers.envs
    print(sys.stderr is stderr, os.fstat(2) == descriptor)
    print([f for f in warnings.filters if f not in filters and "autograph" in str(f[3])])
    print(tfbuffers.PyUniformReplayBuffer is PyUniformReplayBuffer, tfbuffers.storage is storage)
    """
)


def test_importing_tfbuffers_changes_nothing_in_the_process():
    # No TensorFlow imported by `import tfbuffers` itself, no stream or descriptor swapped, no warnings filter
    # added by its modules (quiet_start_up is the one call that does those, when made).
    run = subprocess.run([sys.executable, "-c", UNTOUCHED], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.splitlines() == ["False False", "True True", "[]", "True True"]


KEPT_FILTERS = textwrap.dedent(
    """
    import warnings
    warnings.filterwarnings("ignore", category=DeprecationWarning, module="mine")
    import tfbuffers
    tfbuffers.quiet_start_up()
    import gym  # imported by the call, quietly
    print(sorted({f[0] for f in warnings.filters if f[2] is DeprecationWarning and f[3] is None}))
    """
)


def test_quiet_start_up_keeps_the_programs_warnings_filters_in_front():
    # gym 0.23's import puts "show every DeprecationWarning once" first among the filters, over the program's own
    # (tf-agents' distutils notices then showed; gym 0.23.1, the current stack's): the call imports gym with the
    # filters restored after.
    run = subprocess.run([sys.executable, "-c", KEPT_FILTERS], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "once" not in run.stdout and run.stdout.startswith("[")  # Python's own "ignore" is there


def test_an_unknown_name_is_an_attribute_error_naming_it():
    with pytest.raises(AttributeError, match="module 'tfbuffers' has no attribute 'TFUniformBuffer'"):
        tfbuffers.TFUniformBuffer  # noqa: B018
    assert {"TFUniformReplayBuffer", "quiet_start_up", "load"} <= set(dir(tfbuffers))


FILTERED = textwrap.dedent(
    """
    import os, sys
    from tfbuffers import _noise
    with _noise.stderr_without(_noise.TENSORFLOW_START_UP):
        os.write(2, b"E0000 cuda_dnn.cc:9261] Unable to register cuDNN factory: already registered\\n")
        os.write(2, b"E0000 a real error from C++\\n")
        sys.stderr.write("a warning from Python\\n")
        print("meanwhile", flush=True)
    """
)


def test_the_start_up_filter_drops_only_the_known_lines():
    run = subprocess.run([sys.executable, "-c", FILTERED], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (run.stdout, run.stderr) == ("meanwhile\n", "E0000 a real error from C++\na warning from Python\n")


TRACED = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[1])
    import tfbuffers
    tfbuffers.quiet_start_up()
    import tensorflow as tf
    import literal  # Python warns about its source here, once
    print(int(tf.function(literal.step)(tf.constant(1))))
    """
)


def test_autographs_repeats_of_a_syntax_warning_are_ignored_and_the_original_stays(tmp_path):
    (tmp_path / "literal.py").write_text("def step(x, state=None):\n    return x + 1 if state is not () else x\n")
    run = subprocess.run([sys.executable, "-c", TRACED, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout == "2\n", run.stderr[-3000:]
    warned = [line for line in run.stderr.splitlines() if "SyntaxWarning" in line]
    # Python 3.11 says "with a literal", 3.12+ "with 'tuple' literal".
    assert len(warned) == 1 and warned[0].startswith(f'{tmp_path / "literal.py"}:2: SyntaxWarning: "is not" with')


ITERATE_THEN_EXIT = textwrap.dedent(
    """
    import numpy as np, tensorflow as tf, tfbuffers
    spec = {"x": tf.TensorSpec([17], tf.float32)}
    buffer = tfbuffers.PyUniformReplayBuffer(spec, batch_size=8, max_length=2000, seed=0)
    for _ in range(2000):
        buffer.add_batch({"x": np.ones([8, 17], np.float32)})
    dataset = iter(DATASET)
    for _ in range(ELEMENTS):
        next(dataset)
    print("iterated", flush=True)
    """
)
# Each kind of dataset of a py buffer, and how many elements a program reads of it (fewer than it has).
PY_DATASETS = {
    "sampled": ("buffer.as_dataset(256, 2)", 200),
    "deterministic pass": ("buffer.as_dataset(256, 2, single_deterministic_pass=True)", 20),
    "epoch": ("buffer.epoch_dataset(256, 2)", 20),
}


@pytest.mark.parametrize("kind", list(PY_DATASETS))
def test_a_program_that_iterates_a_py_buffers_dataset_exits(kind):
    # With tf.data's automatic prefetch, the interpreter freeing the iterator at exit (holding the GIL) waited for
    # the prefetch thread, which waited for the GIL to run the next host call: 2 of 3 such runs hung (TF-Agents'
    # py buffer: 3 of 3). Three runs, each given two minutes.
    dataset, elements = PY_DATASETS[kind]
    program = ITERATE_THEN_EXIT.replace("DATASET", dataset).replace("ELEMENTS", str(elements))
    for _ in range(3):
        run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
        assert (run.returncode, run.stdout) == (0, "iterated\n"), run.stderr[-3000:]
