"""ReverbReplayBuffer against real Reverb servers on loopback: items, episodes, errors, lifetime."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest
import tensorflow as tf

reverb = pytest.importorskip("reverb", reason="dm-reverb installs on the pinned stack only (Python 3.11)")

from tf_agents.specs import tensor_spec  # noqa: E402
from tf_agents.trajectories import time_step, trajectory  # noqa: E402

from tfbuffers.reverb_replay_buffer import NO_DETERMINISTIC_PASS, NO_GATHER_ALL, ReverbReplayBuffer  # noqa: E402

SPEC = {"x": tf.TensorSpec([], tf.int64), "v": tf.TensorSpec([2], tf.float32)}


def frames(values):
    values = np.asarray(values, np.int64)
    return {"x": values, "v": np.stack([values, -values], -1).astype(np.float32)}


def drawn_windows(buffer, draws=300, num_steps=None):
    items, info = buffer.get_next(sample_batch_size=draws, num_steps=num_steps or buffer.sequence_length)
    np.testing.assert_array_equal(items["v"][..., 0], items["x"])  # whole frames
    return {tuple(window) for window in items["x"].tolist()}, info


def port_open(port):
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def buffer():
    with ReverbReplayBuffer(SPEC, sequence_length=3, batch_size=2, capacity=1000) as buffer:
        yield buffer


def test_items_are_windows_of_one_environment_and_sampled_uniformly(buffer):
    for t in range(5):
        ids = buffer.add_batch(frames([t, 100 + t]))
        np.testing.assert_array_equal(ids, [t, t])  # each environment's frame count so far
    buffer.flush()
    assert int(buffer.num_frames()) == 6  # items: 3 windows of 3 frames per environment of 5
    windows, info = drawn_windows(buffer)
    expected = {(e + t, e + t + 1, e + t + 2) for e in (0, 100) for t in range(3)}
    assert windows == expected
    assert info.ids.dtype == np.int64 and info.ids.shape == (300,)
    np.testing.assert_allclose(info.probabilities, np.full(300, 1 / 6, np.float32))


def test_num_steps_takes_the_first_frames_of_each_window(buffer):
    for t in range(4):
        buffer.add_batch(frames([t, 100 + t]))
    buffer.flush()
    pairs, _ = drawn_windows(buffer, num_steps=2)
    assert pairs == {(0, 1), (1, 2), (100, 101), (101, 102)}
    for sample in (buffer.get_next, tf.function(buffer.get_next)):
        items, info = sample()  # one window's first frame, no batch or time axis
        assert items["x"].shape == () and int(items["x"]) in {0, 1, 100, 101}
        assert info.ids.shape == () and info.probabilities.shape == ()
        items, info = sample(num_steps=2)  # one window, no batch axis
        assert items["x"].shape == (2,) and info.ids.shape == ()


def test_stride_spaces_the_windows_and_capacity_drops_the_oldest():
    with ReverbReplayBuffer(SPEC, sequence_length=2, stride=2, capacity=2) as buffer:
        for t in range(8):
            buffer.add_batch(frames([t]))
        buffer.flush()
        # Windows start every second frame: (0,1) (2,3) (4,5) (6,7); the table keeps the newest 2.
        assert int(buffer.num_frames()) == 2
        windows, _ = drawn_windows(buffer)
        assert windows == {(4, 5), (6, 7)}


def trajectory_spec():
    observation = tensor_spec.TensorSpec([], tf.int64, "observation")
    action = tensor_spec.TensorSpec([], tf.int64, "action")
    return trajectory.Trajectory(
        step_type=tensor_spec.TensorSpec([], tf.int32, "step_type"),
        observation=observation,
        action=action,
        policy_info=(),
        next_step_type=tensor_spec.TensorSpec([], tf.int32, "step_type"),
        reward=tensor_spec.TensorSpec([], tf.float32, "reward"),
        discount=tensor_spec.TensorSpec([], tf.float32, "discount"),
    )


def transition(step_type, next_step_type, observation):
    return trajectory.Trajectory(
        step_type=np.array([step_type], np.int32),
        observation=np.array([observation], np.int64),
        action=np.array([0], np.int64),
        policy_info=(),
        next_step_type=np.array([next_step_type], np.int32),
        reward=np.array([1.0], np.float32),
        discount=np.array([1.0], np.float32),
    )


def test_no_item_spans_an_episode_boundary_and_an_episode_end_flushes():
    first, mid, last = (int(s) for s in (time_step.StepType.FIRST, time_step.StepType.MID, time_step.StepType.LAST))
    with ReverbReplayBuffer(trajectory_spec(), sequence_length=2) as buffer:
        # Two episodes: observations 0..3 then 10..12; the boundary frame (LAST -> FIRST) ends each.
        episode_one = [(first, mid, 0), (mid, mid, 1), (mid, last, 2), (last, first, 3)]
        episode_two = [(first, mid, 10), (mid, last, 11), (last, first, 12)]
        for step_type, next_step_type, observation in episode_one + episode_two:
            buffer.add_batch(transition(step_type, next_step_type, observation))
        # No flush: the LAST frames flushed their episodes' items.
        assert int(buffer.num_frames()) == 5
        items, _ = buffer.get_next(sample_batch_size=300, num_steps=2)
        windows = {tuple(w) for w in items.observation.tolist()}
        assert windows == {(0, 1), (1, 2), (2, 3), (10, 11), (11, 12)}  # never (3, 10)


@pytest.mark.parametrize("in_function", [False, True])
def test_bad_input_changes_nothing_and_the_next_calls_work(buffer, in_function):
    add = tf.function(buffer.add_batch) if in_function else buffer.add_batch
    with pytest.raises((ValueError, TypeError), match="x: expected dtype int64, got int32"):
        add({"x": np.array([1, 2], np.int32), "v": np.zeros([2, 2], np.float32)})
    sample = tf.function(buffer.get_next) if in_function else buffer.get_next
    with pytest.raises(tf.errors.InvalidArgumentError, match="ReverbReplayBuffer is empty"):
        sample(sample_batch_size=2, num_steps=3)
    for t in range(3):
        add(frames([t, 100 + t]))
    buffer.flush()
    assert int(buffer.num_frames()) == 2
    windows, _ = drawn_windows(buffer)
    assert windows == {(0, 1, 2), (100, 101, 102)}
    buffer.clear()
    assert int(buffer.num_frames()) == 0


def test_inside_tf_function_every_method_runs_when_the_graph_runs(buffer):
    add, sample, count, clear = (
        tf.function(buffer.add_batch),
        tf.function(lambda: buffer.get_next(sample_batch_size=4, num_steps=3)),
        tf.function(buffer.num_frames),
        tf.function(buffer.clear),
    )
    for t in range(3):
        add(frames([t, 100 + t]))
    buffer.flush()
    assert int(count()) == 2
    items, info = sample()
    assert items["x"].shape == (4, 3) and info.ids.shape == (4,)
    assert {tuple(w) for w in items["x"].numpy().tolist()} <= {(0, 1, 2), (100, 101, 102)}
    clear()
    assert int(count()) == 0


def test_a_tensor_sample_batch_size_inside_a_function(buffer):
    for t in range(3):
        buffer.add_batch(frames([t, 100 + t]))
    buffer.flush()
    sample = tf.function(
        lambda size: buffer.get_next(sample_batch_size=size, num_steps=2), input_signature=[tf.TensorSpec([], tf.int32)]
    )
    assert sample.get_concrete_function().structured_outputs[0]["x"].shape.as_list() == [None, 2]
    for size in (1, 5):
        items, info = sample(tf.constant(size))
        assert items["x"].shape == (size, 2) and info.ids.shape == (size,) and info.probabilities.shape == (size,)
        assert {tuple(w) for w in items["x"].numpy().tolist()} <= {(0, 1), (100, 101)}
    with pytest.raises(tf.errors.InvalidArgumentError, match="sample_batch_size: expected a positive int or None"):
        sample(tf.constant(0))
    assert sample(tf.constant(2))[0]["x"].shape == (2, 2)


def test_clear_empties_the_table_and_windows_restart_after_it(buffer):
    for t in range(4):
        buffer.add_batch(frames([t, 100 + t]))
    buffer.clear()
    assert int(buffer.num_frames()) == 0
    with pytest.raises(tf.errors.InvalidArgumentError, match="is empty"):
        buffer.get_next(sample_batch_size=1, num_steps=3)
    for t in range(10, 13):
        buffer.add_batch(frames([t, 100 + t]))
    buffer.flush()
    windows, _ = drawn_windows(buffer)
    assert windows == {(10, 11, 12), (110, 111, 112)}  # nothing from before the clear


def test_as_dataset_batches_windows_with_keys_and_probabilities(buffer):
    for t in range(5):
        buffer.add_batch(frames([t, 100 + t]))
    buffer.flush()
    items, info = next(iter(buffer.as_dataset(sample_batch_size=8, num_steps=2)))
    assert items["x"].shape == (8, 2) and items["v"].shape == (8, 2, 2)
    assert {tuple(w) for w in items["x"].numpy().tolist()} <= {(e + t, e + t + 1) for e in (0, 100) for t in range(3)}
    assert info.ids.dtype == tf.int64 and info.ids.shape == (8,)
    np.testing.assert_allclose(info.probabilities.numpy(), np.full(8, 1 / 6, np.float32))


@pytest.mark.parametrize(
    ("sample_batch_size", "num_steps", "x_shape"),
    [(None, None, ()), (None, 2, (2,)), (4, None, (4,)), (4, 3, (4, 3)), (4, 1, (4, 1))],
)
def test_as_dataset_cuts_the_windows_it_is_asked_for(buffer, sample_batch_size, num_steps, x_shape):
    for t in range(5):
        buffer.add_batch(frames([t, 100 + t]))
    buffer.flush()
    starts = {e + t for e in (0, 100) for t in range(3)}  # windows of 3 frames
    dataset = buffer.as_dataset(sample_batch_size=sample_batch_size, num_steps=num_steps)
    for items, info in dataset.take(5):
        x = items["x"].numpy()
        assert x.shape == x_shape and items["v"].shape == (*x_shape, 2)
        np.testing.assert_array_equal(items["v"].numpy()[..., 0], x)  # whole frames
        np.testing.assert_array_equal(items["v"].numpy()[..., 1], -x)
        windows = x.reshape(sample_batch_size or 1, -1)
        assert set(windows[:, 0].tolist()) <= starts
        np.testing.assert_array_equal(windows, windows[:, :1] + np.arange(windows.shape[1]))  # consecutive frames
        assert info.ids.shape == (() if sample_batch_size is None else (sample_batch_size,))
        np.testing.assert_allclose(info.probabilities.numpy(), 1 / 6, rtol=1e-6)


def test_what_a_table_cannot_do_is_refused_saying_why(buffer):
    with pytest.raises(NotImplementedError) as raised:
        buffer.gather_all()
    assert str(raised.value) == NO_GATHER_ALL
    with pytest.raises(ValueError) as raised:
        buffer.as_dataset(sample_batch_size=2, num_steps=2, single_deterministic_pass=True)
    assert str(raised.value) == NO_DETERMINISTIC_PASS
    with pytest.raises(ValueError, match="num_steps: expected at most"):
        buffer.get_next(sample_batch_size=2, num_steps=4)


def test_the_embedded_server_listens_while_the_buffer_lives_and_stops_with_close(caplog):
    with caplog.at_level("WARNING", logger="tfbuffers.remote.reverb.buffer"):
        buffer = ReverbReplayBuffer(SPEC, sequence_length=2)
    port = int(buffer.server_address.rsplit(":", 1)[1])
    assert f"on port {port}" in caplog.text and "without authentication" in caplog.text
    assert port_open(port)
    assert buffer.py_client.server_info()["tfbuffers"].max_size == 100_000
    buffer.close()
    assert not port_open(port)
    with pytest.raises(ValueError, match="closed"):
        buffer.num_frames()
    buffer.close()  # twice is allowed


def test_a_buffer_on_an_existing_server_leaves_it_running_when_closed():
    signature = {"x": tf.TensorSpec([2], tf.int64), "v": tf.TensorSpec([2, 2], tf.float32)}
    table = reverb.Table(
        "shared",
        sampler=reverb.selectors.Uniform(),
        remover=reverb.selectors.Fifo(),
        max_size=50,
        rate_limiter=reverb.rate_limiters.MinSize(1),
        signature=signature,
    )
    server = reverb.Server([table])
    try:
        address = f"localhost:{server.port}"
        with ReverbReplayBuffer(SPEC, sequence_length=2, address=address, table_name="shared") as buffer:
            for t in range(3):
                buffer.add_batch(frames([t]))
            buffer.flush()
            windows, _ = drawn_windows(buffer)
            assert windows == {(0, 1), (1, 2)}
        assert port_open(server.port)
        assert reverb.Client(address).server_info()["shared"].current_size == 2
    finally:
        server.stop()


def served_table(spec, sequence_length=2):
    from tfbuffers.reverb_replay_buffer import make_table

    return reverb.Server([make_table(spec, sequence_length, "tfbuffers", 100)])


def test_a_dropped_buffer_stops_its_embedded_server_without_waiting_for_the_garbage_collector():
    import gc

    gc.disable()  # no reference cycle may hold the buffer (and its open port) until a collection
    try:
        buffer = ReverbReplayBuffer(SPEC, sequence_length=2)
        port = int(buffer.server_address.rsplit(":", 1)[1])
        buffer.add_batch(frames([0]))
        assert port_open(port)
        del buffer
        assert not port_open(port)
    finally:
        gc.enable()


@pytest.mark.parametrize("end", ["close", "drop"])
def test_close_or_a_drop_sends_the_items_written_since_the_last_flush(end):
    # Issue 50, the Reverb side: a Reverb writer destroyed unflushed drops the items it has not sent; a buffer
    # dropped without close() sends them first (its finalizer).
    server = served_table(SPEC)
    try:
        address = f"localhost:{server.port}"
        buffer = ReverbReplayBuffer(SPEC, sequence_length=2, address=address)
        for t in range(5):
            buffer.add_batch(frames([t]))
        writers = buffer._writers
        if end == "close":
            buffer.close()
        else:
            del buffer  # its finalizer flushed and closed every writer (the items may have been sent already)
        assert writers.writers == []
        with ReverbReplayBuffer(SPEC, sequence_length=2, address=address) as reader:
            assert int(reader.num_frames()) == 4
            windows, _ = drawn_windows(reader)
            assert windows == {(0, 1), (1, 2), (2, 3), (3, 4)}
    finally:
        server.stop()


def test_a_process_that_exits_without_close_sends_its_items_first():
    import subprocess
    import sys

    server = served_table(SPEC)
    try:
        address = f"localhost:{server.port}"
        client = reverb.Client(address)
        script = (
            "import sys, numpy as np, tensorflow as tf\n"
            "from tfbuffers.reverb_replay_buffer import ReverbReplayBuffer\n"
            "spec = {'x': tf.TensorSpec([], tf.int64), 'v': tf.TensorSpec([2], tf.float32)}\n"
            "buffer = ReverbReplayBuffer(spec, sequence_length=2, address=sys.argv[1])\n"
            "for t in range(100, 110):\n"
            "    buffer.add_batch({'x': np.array([t]), 'v': np.array([[t, -t]], np.float32)})\n"
        )  # and the process exits: the finalizer runs at exit
        done = subprocess.run([sys.executable, "-c", script, address], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert client.server_info()["tfbuffers"].current_size == 9  # every window its 10 frames end
        with ReverbReplayBuffer(SPEC, sequence_length=2, address=address) as reader:
            windows, _ = drawn_windows(reader, draws=1000)
        assert windows == {(t, t + 1) for t in range(100, 109)}
    finally:
        server.stop()


def test_a_long_episode_never_holds_more_than_max_pending_items_unconfirmed():
    from tfbuffers.reverb_replay_buffer import MAX_PENDING_ITEMS, EnvironmentWriters, make_table

    class Recording:
        """A real trajectory writer, recording how it is flushed."""

        def __init__(self, writer):
            self.writer, self.flushes = writer, []

        def flush(self, block_until_num_items=0, timeout_ms=None):  # each wait that ended, once
            result = self.writer.flush(block_until_num_items, timeout_ms)  # a slice past its time raises
            self.flushes.append(block_until_num_items)
            return result

        def __getattr__(self, name):
            return getattr(self.writer, name)

    server = reverb.Server([make_table(SPEC, 2, "tfbuffers", 1000)])
    try:
        client = reverb.Client(f"localhost:{server.port}")
        writers = EnvironmentWriters(
            client, "tfbuffers", batch_size=1, sequence_length=2, stride=1, step_type_index=None
        )
        writer = writers.writers[0] = Recording(writers.writers[0])
        for t in range(200):  # one episode: no LAST, no flush() by the caller
            ids = writers.append(tf.nest.flatten(frames([t])))
            np.testing.assert_array_equal(ids, [t])
        # 199 items made: after every MAX_PENDING_ITEMS-th, the writer waited for all but that many.
        assert writer.flushes == [MAX_PENDING_ITEMS] * (199 // MAX_PENDING_ITEMS)
        items = client.server_info()["tfbuffers"].current_size
        assert items >= (199 // MAX_PENDING_ITEMS - 1) * MAX_PENDING_ITEMS
        writers.flush()
        assert writer.flushes[-1] == 0 and client.server_info()["tfbuffers"].current_size == 199
        writers.close(f"localhost:{server.port}")
    finally:
        server.stop()


def test_close_after_the_server_is_gone_returns_and_says_what_was_not_sent(monkeypatch, caplog):
    from tfbuffers.remote.reverb import writers

    monkeypatch.setattr(writers, "CLOSE_FLUSH_SECONDS", 0.2)
    server = served_table(SPEC)
    buffer = ReverbReplayBuffer(SPEC, sequence_length=2, address=f"localhost:{server.port}")
    buffer.add_batch(frames([0]))
    server.stop()
    for t in range(1, 4):
        buffer.add_batch(frames([t]))  # items made after the server stopped: none can be sent
    buffer.close()
    assert buffer.closed
    assert f"items written since the last flush could not be sent to localhost:{server.port}" in caplog.text


def test_a_server_table_of_other_items_or_name_is_refused_when_connecting_and_left_unchanged():
    with ReverbReplayBuffer(SPEC, sequence_length=2, table_name="served") as served:
        address = served.server_address
        served.add_batch(frames([7]))
        served.add_batch(frames([8]))
        served.flush()
        no_table = r"table_name: the server at .* has no table 'other'; it serves \['served'\]"
        with pytest.raises(ValueError, match=no_table):
            ReverbReplayBuffer(SPEC, sequence_length=2, address=address, table_name="other")
        expected = (
            r"data_spec, sequence_length: table 'served' at .* stores items \{v: float32\[2, 2\], x: int64\[2\]\}; "
            r"this buffer's items, windows of 3 frames of its data_spec, are \{v: float32\[3, 2\], x: int64\[3\]\}"
        )
        with pytest.raises(ValueError, match=expected):
            ReverbReplayBuffer(SPEC, sequence_length=3, address=address, table_name="served")
        other_dtype = {"x": tf.TensorSpec([], tf.int32), "v": tf.TensorSpec([2], tf.float32)}
        with pytest.raises(ValueError, match=r"stores items \{v: float32\[2, 2\], x: int64\[2\]\}.* x: int32\[2\]"):
            ReverbReplayBuffer(other_dtype, sequence_length=2, address=address, table_name="served")
        with ReverbReplayBuffer(SPEC, sequence_length=2, address=address, table_name="served") as same:
            assert int(same.num_frames()) == 1
            windows, _ = drawn_windows(same)
            assert windows == {(7, 8)}


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"sequence_length": 0}, ValueError, "sequence_length: expected a positive int"),
        ({"capacity": "10"}, TypeError, "capacity: expected a positive int"),
        ({"stride": -1}, ValueError, "stride: expected a positive int"),
        ({"address": 5}, TypeError, "address: expected a 'host:port' string or None, got int"),
        ({"table_name": ""}, TypeError, "table_name: expected a non-empty string"),
    ],
)
def test_bad_arguments_are_refused_naming_the_field(kwargs, error, message):
    with pytest.raises(error, match=message):
        ReverbReplayBuffer(SPEC, **kwargs)


def test_a_tf_driver_collects_into_it_through_the_observer():
    from tf_agents.drivers import dynamic_step_driver
    from tf_agents.policies import random_tf_policy
    from tf_agents.replay_buffers import tf_uniform_replay_buffer

    from tfbuffers import observers
    from tfbuffers.envs import load_gymnasium

    env = load_gymnasium("CartPole-v1", num_envs=2, seed=3, tf_environment=True)
    policy = random_tf_policy.RandomTFPolicy(env.time_step_spec(), env.action_spec())
    reference = tf_uniform_replay_buffer.TFUniformReplayBuffer(policy.trajectory_spec, batch_size=2, max_length=200)
    with ReverbReplayBuffer(policy.trajectory_spec, sequence_length=2, batch_size=2) as buffer:
        driver = dynamic_step_driver.DynamicStepDriver(
            env, policy, observers=[observers.TFObserver(buffer), reference.add_batch], num_steps=120
        )
        tf.function(driver.run)(env.reset())
        buffer.flush()
        # The windows the reference's frames allow: consecutive frames of one environment, not across FIRST.
        frames = reference.gather_all()
        expected = set()
        for env_index in range(2):
            observation = frames.observation.numpy()[env_index]
            step_type = frames.step_type.numpy()[env_index]
            for t in range(len(step_type) - 1):
                if step_type[t + 1] != time_step.StepType.FIRST:
                    expected.add((observation[t].tobytes(), observation[t + 1].tobytes()))
        assert int(buffer.num_frames()) == len(expected)
        items, _ = buffer.get_next(sample_batch_size=400, num_steps=2)
        drawn = {(w[0].tobytes(), w[1].tobytes()) for w in items.observation}
        assert drawn <= expected and len(drawn) > len(expected) // 2


@pytest.mark.parametrize("in_function", [False, True])
def test_a_prioritized_table_draws_by_the_priorities_given(in_function):
    with ReverbReplayBuffer(SPEC, sequence_length=2, sampler="prioritized", priority_exponent=1.0) as buffer:
        for t in range(4):
            buffer.add_batch(frames([t]))
        buffer.flush()
        # The keys of the three windows, from a sample that surely holds each.
        items, info = buffer.get_next(sample_batch_size=200, num_steps=2)
        key_of = {int(items["x"][i, 0]): int(info.ids[i]) for i in range(200)}
        assert sorted(key_of) == [0, 1, 2]
        update = tf.function(buffer.update_priorities) if in_function else buffer.update_priorities
        update(np.array([key_of[0], key_of[1], key_of[2]]), np.array([0.0, 1.0, 3.0]))
        items, info = buffer.get_next(sample_batch_size=4000, num_steps=2)
        starts = items["x"][:, 0]
        assert set(starts.tolist()) == {1, 2}  # priority 0: never drawn
        np.testing.assert_allclose(info.probabilities[starts == 1], 0.25)
        np.testing.assert_allclose(info.probabilities[starts == 2], 0.75)
        # Reverb cannot be seeded: within 5 standard deviations (fails about once in 2 million runs).
        assert abs(np.mean(starts == 2) - 0.75) < 5 * np.sqrt(0.75 * 0.25 / 4000)
        # A new window gets the largest priority given so far.
        buffer.add_batch(frames([4]))
        buffer.flush()
        items, info = buffer.get_next(sample_batch_size=4000, num_steps=2)
        np.testing.assert_allclose(info.probabilities[items["x"][:, 0] == 3], 3 / 7)


def test_priorities_are_checked_and_a_uniform_table_refuses_them(buffer):
    assert not buffer.prioritized
    with pytest.raises(ValueError, match="table 'tfbuffers' samples uniformly; create the buffer with sampler="):
        buffer.update_priorities(np.array([1]), np.array([1.0]))
    with ReverbReplayBuffer(SPEC, sequence_length=1, sampler="prioritized", priority_exponent=1.0) as prioritized:
        assert prioritized.prioritized
        prioritized.add_batch(frames([7]))
        prioritized.flush()
        _, info = prioritized.get_next(sample_batch_size=1)
        with pytest.raises(ValueError, match=r"priorities: expected finite values >= 0, got nan at index 1"):
            prioritized.update_priorities(np.array([info.ids[0], info.ids[0]]), np.array([2.0, np.nan]))
        with pytest.raises(ValueError, match=r"priorities: expected the shape of ids, \[1\], got \[2\]"):
            prioritized.update_priorities(info.ids, np.array([1.0, 2.0]))
        with pytest.raises(TypeError, match="ids: expected integer frame ids, got dtype float64"):
            prioritized.update_priorities(np.array([1.5]), np.array([1.0]))
        _, info = prioritized.get_next(sample_batch_size=1)
        assert float(info.probabilities[0]) == 1.0  # nothing changed: still the only item


def test_a_sample_to_insert_ratio_rate_limiter_is_configured_as_asked():
    with ReverbReplayBuffer(SPEC, sequence_length=1, min_size_to_sample=10, samples_per_insert=4.0) as buffer:
        limiter = buffer.py_client.server_info()["tfbuffers"].rate_limiter_info
        assert limiter.samples_per_insert == 4.0 and limiter.min_size_to_sample == 10
        assert (limiter.min_diff, limiter.max_diff) == (40.0 - 4.0, 40.0 + 4.0)  # error_buffer: max(10% of 40, 4)


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
def test_a_wait_the_rate_limiter_holds_past_the_timeout_raises_with_the_frames_taken(in_function):
    # One sample per insert once the table holds 2 items, drifting by up to 10: the limiter admits 12 items
    # (12 x 1 - 0 <= 2 + 10), then holds the rest until the learner samples.
    limits = {"min_size_to_sample": 2, "samples_per_insert": 1.0, "error_buffer": 10.0}
    with ReverbReplayBuffer(SPEC, sequence_length=1, timeout=0.5, **limits) as buffer:
        add = tf.function(buffer.add_batch) if in_function else buffer.add_batch
        for t in range(31):  # 31 items made; the wait after the 16th returns (at most 16 may be unconfirmed)
            np.testing.assert_array_equal(add(frames([t])), [t])
        started = time.monotonic()
        # The 32nd: 20 unconfirmed, more than 16; the wait for the server gives up after the timeout.
        expected = TimeoutError if not in_function else tf.errors.OpError
        with pytest.raises(expected, match=r"did not confirm the items within timeout=0.5 s .*taken"):
            add(frames([31]))
        assert 0.5 <= time.monotonic() - started < 30
        np.testing.assert_array_equal(add(frames([32])), [32])  # frame 31 was taken: this one is 32
        with pytest.raises(TimeoutError, match="within timeout=0.5 s .*: the items are kept"):
            buffer.flush()
        with pytest.raises(TimeoutError, match="within timeout=0.5 s .*: nothing of this call was taken or changed"):
            buffer.clear()  # it would wait for them first
        assert int(buffer.num_frames()) == 12
        windows, _ = buffer.get_next(sample_batch_size=25)  # 25 samples admit 25 more items (21 wait)
        assert set(windows["x"].tolist()) <= set(range(33))
        buffer.flush()
        assert int(buffer.num_frames()) == 33  # every frame taken, the timed-out one's too, once
        buffer.clear()
        assert int(buffer.num_frames()) == 0


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"timeout": 0}, ValueError, "timeout: expected a number of seconds > 0 or None, got 0"),
        ({"sampler": "fifo"}, ValueError, r"sampler: expected one of \['uniform', 'prioritized'\], got 'fifo'"),
        ({"priority_exponent": -1.0}, ValueError, "priority_exponent: expected a finite number >= 0, got -1.0"),
        ({"samples_per_insert": 0}, ValueError, "samples_per_insert: expected a finite number > 0 or None, got 0"),
        ({"samples_per_insert": "2"}, TypeError, "samples_per_insert: expected a finite number > 0 or None, got str"),
        (
            {"samples_per_insert": 4.0, "error_buffer": 2.0},
            ValueError,
            r"error_buffer: expected at least max\(1.0, samples_per_insert\) = 4 .*, got 2.0",
        ),
    ],
)
def test_bad_table_options_are_refused_naming_the_field(kwargs, error, message):
    with pytest.raises(error, match=message):
        ReverbReplayBuffer(SPEC, **kwargs)


def test_two_servers_are_sampled_through_one_dataset_with_exact_mixture_probabilities():
    from sampling_stats_test import chi_square_p_value_against

    import tfbuffers

    with (
        ReverbReplayBuffer(SPEC, sequence_length=2) as first,
        ReverbReplayBuffer(SPEC, sequence_length=2) as second,
    ):
        assert first.server_address != second.server_address  # two servers
        for t in range(3):
            first.add_batch(frames([t]))
        for t in range(5):
            second.add_batch(frames([100 + t]))
        first.flush()
        second.flush()
        dataset = tfbuffers.sharded_dataset([first, second], 100, num_steps=2, weights=[1, 3], seed=5)
        cells = [(0, 1), (1, 2), (100, 101), (101, 102), (102, 103), (103, 104)]
        expected = np.array([0.25 / 2] * 2 + [0.75 / 4] * 4)
        counts = np.zeros(len(cells), np.int64)
        for items, info in dataset.take(40):
            np.testing.assert_array_equal(items["v"][..., 0].numpy(), items["x"].numpy())  # whole frames
            drawn = [cells.index(tuple(window)) for window in items["x"].numpy().tolist()]
            np.testing.assert_allclose(info.probabilities.numpy(), expected[drawn].astype(np.float32), rtol=1e-6)
            np.add.at(counts, drawn, 1)
        assert counts.sum() == 4000
        assert chi_square_p_value_against(counts, expected) > 1e-4


def test_priority_updates_given_to_every_shard_change_each_item_once():
    import tfbuffers

    with (
        ReverbReplayBuffer(SPEC, sequence_length=2, sampler="prioritized") as first,
        ReverbReplayBuffer(SPEC, sequence_length=2, sampler="prioritized") as second,
    ):
        for t in range(3):
            first.add_batch(frames([t]))
            second.add_batch(frames([100 + t]))
        first.flush()
        second.flush()
        keys = {}
        for items, info in tfbuffers.sharded_dataset([first, second], 50, num_steps=2).take(4):
            keys.update(zip(items["x"].numpy()[:, 0].tolist(), info.ids.numpy().tolist()))
        assert set(keys) == {0, 1, 100, 101}
        ids = np.array([keys[start] for start in sorted(keys)], np.int64)
        for shard in (first, second):
            shard.update_priorities(ids, np.array([2.0, 3.0, 5.0, 7.0]))
        priorities = {}
        for shard in (first, second):
            for sample in shard.py_client.sample(shard.table_name, 200, emit_timesteps=False):
                priorities[int(sample.data[tf.nest.flatten(SPEC).index(SPEC["x"])][0])] = sample.info.priority
        assert priorities == {0: 2.0, 1: 3.0, 100: 5.0, 101: 7.0}


@pytest.fixture
def two_shards():
    with ReverbReplayBuffer(SPEC, sequence_length=2) as first, ReverbReplayBuffer(SPEC, sequence_length=2) as second:
        yield first, second


@pytest.mark.parametrize(
    ("make_shards", "kwargs", "message"),
    [
        (lambda a, b: [], {}, "buffers: expected one or more ReverbReplayBuffer"),
        (lambda a, b: [a, "b"], {}, "buffers: expected one or more ReverbReplayBuffer"),
        (lambda a, b: [a, b], {"weights": [1.0]}, r"weights: expected 2 finite numbers > 0, got \[1.0\]"),
        (lambda a, b: [a, b], {"weights": [1.0, 0.0]}, r"weights: expected 2 finite numbers > 0, got \[1.0, 0.0\]"),
        (lambda a, b: [a, b], {"weights": [1.0, np.nan]}, "weights: expected 2 finite numbers > 0"),
        (lambda a, b: [a, b], {"sample_batch_size": 0}, "sample_batch_size: expected a positive int, got int 0"),
    ],
)
def test_sharded_dataset_refuses_bad_shards_and_weights(two_shards, make_shards, kwargs, message):
    import tfbuffers

    with pytest.raises(ValueError, match=message):
        tfbuffers.sharded_dataset(make_shards(*two_shards), **{"sample_batch_size": 4, **kwargs})


def test_sharded_dataset_refuses_shards_of_other_specs(two_shards):
    import tfbuffers

    other = {"x": tf.TensorSpec([], tf.int32), "v": tf.TensorSpec([2], tf.float32)}
    message = r"buffers\[1\]: expected the data spec of buffers\[0\], got another one"
    with ReverbReplayBuffer(other, sequence_length=2) as third, pytest.raises(ValueError, match=message):
        tfbuffers.sharded_dataset([two_shards[0], third], 4)
