"""The sampler seam: a sampler written here draws for the TF and py buffers through `sampler=`."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from conftest import SPEC, NewestAdds, batch, fill, make, to_numpy

import tfbuffers
from tfbuffers import sampling


@pytest.fixture(params=["tf", "py"])
def name(request):
    tf.random.set_seed(7)
    return request.param


@pytest.mark.parametrize("in_function", [False, True])
def test_a_sampler_written_here_draws_for_both_buffers_eagerly_and_in_graphs(name, in_function):
    buffer = make(name, batch_size=3, max_length=5, sampler=NewestAdds)
    assert type(buffer.sampler) is NewestAdds
    assert (buffer.sampler.buffer_name, buffer.sampler.batch_size, buffer.sampler.max_length) == (
        type(buffer).__name__,
        3,
        5,
    )
    fill(buffer, 7)  # adds 0..6; windows of 2 that start at adds 4 and 5 (add 6 starts none)
    get_next = tf.function(buffer.get_next) if in_function else buffer.get_next
    items, info = get_next(sample_batch_size=300, num_steps=2)
    ids = to_numpy(info.ids)
    assert ids.shape == (300, 2)
    assert set((ids[:, 0] // 3).tolist()) == {4, 5}
    assert set((ids[:, 0] % 3).tolist()) == {0, 1, 2}
    np.testing.assert_array_equal(ids[:, 1], ids[:, 0] + 3)
    codes = to_numpy(items["step"])
    np.testing.assert_array_equal(codes, 1000 * (ids % 3) + ids // 3)  # the frames of those ids
    np.testing.assert_array_equal(to_numpy(info.probabilities), np.full([300], np.float32(1 / 6)))
    single, info = get_next(sample_batch_size=200)
    assert set(to_numpy(single["step"]).tolist()) == {5, 6, 1005, 1006, 2005, 2006}
    np.testing.assert_array_equal(to_numpy(info.probabilities), np.full([200], np.float32(1 / 6)))


def test_a_sampler_written_here_draws_for_datasets(name):
    buffer = make(name, batch_size=3, max_length=5, sampler=NewestAdds)
    fill(buffer, 9)
    items, info = next(iter(buffer.as_dataset(sample_batch_size=100, num_steps=3)))
    assert set((to_numpy(info.ids)[:, 0] // 3).tolist()) == {5, 6}
    np.testing.assert_array_equal(to_numpy(items["step"])[:, 2] % 1000, to_numpy(info.ids)[:, 0] // 3 + 2)


class EvenSegmentsPass(sampling.UniformSampler):
    """Draws as the uniform sampler; its deterministic pass and epochs keep the windows of even segments only."""

    def narrows_windows(self, num_steps):
        return True

    def keeps_windows(self, gather, ids):
        return tf.reduce_all(ids % self.batch_size % 2 == 0, axis=-1)


def test_a_sampler_written_here_narrows_the_deterministic_pass_and_the_epochs(name):
    # The datasets that draw nothing yield the windows the sampler keeps, in its pass's order.
    buffer = make(name, batch_size=3, max_length=4, sampler=EvenSegmentsPass)
    fill(buffer, 4)  # segment b holds 1000 * b + (0..3)

    def steps(dataset):
        return [to_numpy(items["step"]).tolist() for items, _ in dataset]

    passed = buffer.as_dataset(num_steps=2, single_deterministic_pass=True)
    assert steps(passed) == [[0, 1], [2, 3], [2000, 2001], [2002, 2003]]
    passed = buffer.as_dataset(sample_batch_size=2, num_steps=2, single_deterministic_pass=True)
    assert steps(passed) == [[[0, 1]], [[2, 3]], [[2000, 2001]], [[2002, 2003]]]  # segment 1 left out of each group
    assert steps(buffer.as_dataset(single_deterministic_pass=True)) == [0, 1, 2, 3, 2000, 2001, 2002, 2003]
    epoch = steps(buffer.epoch_dataset(sample_batch_size=1, num_steps=2, seed=3))
    expected = [[[1000 * b + t, 1000 * b + t + 1]] for b in (0, 2) for t in range(3)]
    assert sorted(epoch) == expected and buffer.full_batches_per_epoch(2, num_steps=2) == 3
    items, _ = buffer.get_next(sample_batch_size=300, num_steps=2)  # draws are the uniform sampler's
    assert {row // 1000 for row in to_numpy(items["step"])[:, 0].tolist()} == {0, 1, 2}


def test_a_prioritized_sampler_never_bound_says_so_and_works_once_bound():
    sampler = sampling.PrioritizedSampler("b", 2, 3)
    with pytest.raises(ValueError, match=r"sampler: expected a PrioritizedSampler bound to a buffer's storage"):
        _ = sampler.max_priority
    storage = tfbuffers.storage.NumpyTable([], 6)  # what a buffer of 2 segments of 3 frames binds it to
    sampler.bind(storage, sampling.numpy_backend(np.random.default_rng(0)), None)
    assert sampler.max_priority == 1.0 and storage.extras["priority"].tolist() == [0.0] * 6


def test_a_loaded_buffer_takes_its_sampler_again(name, tmp_path):
    buffer = make(name, batch_size=3, max_length=5, sampler=NewestAdds)
    fill(buffer, 7)
    assert "sampler" not in buffer.constructor_options()
    loaded = type(buffer).load(buffer.save(tmp_path / "b.safetensors"), sampler=NewestAdds)
    _, info = loaded.get_next(sample_batch_size=100)
    assert set((to_numpy(info.ids) // 3).tolist()) == {5, 6}


def test_episode_boundaries_refuse_a_sampler_that_does_not_keep_them(name):
    with pytest.raises(ValueError, match="sampler: NewestAdds does not keep episode boundaries"):
        make(name, batch_size=3, max_length=5, sampler=NewestAdds, episode_boundaries="step")


@pytest.mark.parametrize(
    ("sampler", "error", "message"),
    [
        (
            "newest",
            ValueError,
            r"sampler: expected one of \['uniform', 'prioritized'\] or a callable \(buffer_name, batch_size, "
            r"max_length\) -> tfbuffers.sampling.Sampler, got 'newest'$",
        ),
        (3, TypeError, r"sampler: expected a callable \(buffer_name, batch_size, max_length\) -> .*, got int 3$"),
        (lambda *args: None, TypeError, "sampler: expected a callable .*, got a factory that made NoneType"),
    ],
)
def test_a_wrong_sampler_is_refused_naming_it(name, sampler, error, message):
    with pytest.raises(error, match=message):
        make(name, batch_size=3, max_length=5, sampler=sampler)


@pytest.mark.parametrize("in_function", [False, True])
def test_the_buffers_take_the_samplers_by_name_as_the_remote_buffers_do(name, in_function):
    buffer = make(name, batch_size=3, max_length=5, sampler="uniform")
    assert type(buffer.sampler) is sampling.UniformSampler
    fill(buffer, 2)
    get_next = tf.function(buffer.get_next) if in_function else buffer.get_next
    items, info = get_next(sample_batch_size=300)
    assert set(to_numpy(items["step"]).tolist()) == {0, 1, 1000, 1001, 2000, 2001}
    np.testing.assert_array_equal(to_numpy(info.probabilities), np.full([300], np.float32(1 / 6)))
    with pytest.raises(ValueError) as raised:  # a uniform buffer keeps no priorities: the presets do
        make(name, batch_size=3, max_length=5, sampler="prioritized")
    assert str(raised.value) == (
        "sampler: expected a sampler that draws without priorities (a uniform buffer keeps none), got 'prioritized', "
        "which is prioritized: use TFPrioritizedReplayBuffer or PyPrioritizedReplayBuffer"
    )


def test_a_uniform_buffer_refuses_a_prioritized_sampler(name):
    def prioritized(buffer_name, batch_size, max_length):
        return sampling.PrioritizedSampler(buffer_name, batch_size, max_length)

    with pytest.raises(
        ValueError,
        match="sampler: expected a sampler that draws without priorities .*, got "
        "PrioritizedSampler, which is prioritized: use TFPrioritizedReplayBuffer or ",
    ):
        make(name, batch_size=3, max_length=5, sampler=prioritized)


def test_the_default_sampler_is_uniform_and_a_sampler_is_no_option_of_the_prioritized_buffers():
    buffer = tfbuffers.PyUniformReplayBuffer(SPEC, batch_size=3, max_length=5, sampler=sampling.UniformSampler)
    buffer.add_batch(batch(3, 0))
    _, info = buffer.get_next(sample_batch_size=4)
    np.testing.assert_array_equal(info.probabilities, np.full([4], np.float32(1 / 3)))
    with pytest.raises(TypeError, match="sampler"):
        tfbuffers.PyPrioritizedReplayBuffer(SPEC, batch_size=3, max_length=5, sampler=NewestAdds)


def test_a_prioritized_buffer_refuses_a_uniform_sampler_and_a_uniform_sampler_keeps_no_priorities():
    # Two refusals no buffer reaches today (the presets pass a PrioritizedSampler; only they update priorities),
    # kept for a caller that composes a buffer of its own.
    expected = "sampler: expected a prioritized sampler for TFPrioritizedReplayBuffer, got UniformSampler"
    with pytest.raises(ValueError) as raised:
        sampling.make(sampling.UniformSampler, "TFPrioritizedReplayBuffer", 2, 4, prioritized=True)
    assert str(raised.value) == expected
    uniform = sampling.make(None, "PyUniformReplayBuffer", 2, 4)
    with pytest.raises(ValueError) as raised:
        uniform.on_update_priorities(np.array([0]), np.array([1.0]))
    assert str(raised.value) == "sampler: UniformSampler draws without priorities: it keeps none to update"


def test_a_reopened_directory_samples_with_the_sampler_it_is_given(tmp_path):
    buffer = tfbuffers.PyUniformReplayBuffer(SPEC, batch_size=3, max_length=5, sampler=NewestAdds, directory=tmp_path)
    fill(buffer, 6)
    buffer.close()
    for sampler, adds in ((NewestAdds, {4, 5}), (None, {1, 2, 3, 4, 5})):  # a directory records no code
        reopened = tfbuffers.PyUniformReplayBuffer.open(tmp_path, sampler=sampler, seed=0)
        items, _ = reopened.get_next(sample_batch_size=300)
        assert set((to_numpy(items["step"]) % 1000).tolist()) == adds
        reopened.close()


def test_a_sampler_is_recorded_by_name_or_import_path_and_one_that_would_not_come_back_is_refused():
    from tfbuffers.remote.options import recorded_sampler, sampler_record

    assert sampler_record("prioritized", "a manifest") == "prioritized" == recorded_sampler("prioritized")
    assert sampler_record(NewestAdds, "a manifest") == "conftest:NewestAdds"
    assert recorded_sampler("conftest:NewestAdds") is NewestAdds
    assert recorded_sampler("tfbuffers.sampling:UniformSampler") is sampling.UniformSampler
    scripted = type("Scripted", (NewestAdds,), {"__module__": "__main__"})  # a class of the running script
    for refused in (lambda *args: NewestAdds(*args), scripted):
        with pytest.raises(ValueError) as raised:
            sampler_record(refused, "directory=")
        assert str(raised.value) == (
            "sampler: expected a name of ['uniform', 'prioritized'] or a callable importable by its name (a "
            "module-level class or function of a module other than __main__), since directory= records the "
            f"sampler in a file; got {refused!r}"
        )
    with pytest.raises(ValueError, match=r"sampler: the recorded sampler 'nowhere_at_all:X' does not import here"):
        recorded_sampler("nowhere_at_all:X")
    with pytest.raises(ValueError, match=r"sampler: expected a name of .* or an import path module:qualname, got 'x'"):
        recorded_sampler("x")
