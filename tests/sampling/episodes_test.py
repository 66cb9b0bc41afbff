"""Episode-aware windows: `episode_boundaries` on every local buffer kind, checked against a plain-Python reference."""

from __future__ import annotations

import conftest
import numpy as np
import pytest
import tensorflow as tf
from conftest import make_buffer, underlying
from sampling_stats_test import chi_square_p_value_against

FIRST, MID, LAST = 0, 1, 2
SPEC = {"step_type": tf.TensorSpec([], tf.int32), "code": tf.TensorSpec([], tf.int64)}


def episode_types(lengths: list[int], num_adds: int) -> list[int]:
    """Step types of episodes of `lengths` (cycled) over `num_adds` frames: FIRST, MID..., LAST; a 1 is [FIRST]."""
    types: list[int] = []
    while len(types) < num_adds:
        for length in lengths:
            types += [FIRST] if length == 1 else [FIRST] + [MID] * (length - 2) + [LAST]
    return types[:num_adds]


def fill(buffer, types_by_segment: list[list[int]]) -> None:
    for t in range(len(types_by_segment[0])):
        steps = np.array([types[t] for types in types_by_segment], np.int32)
        buffer.add_batch({"step_type": steps, "code": 1000 * np.arange(len(types_by_segment)) + t})


def reference_windows(types_by_segment: list[list[int]], max_length: int, num_steps: int) -> list[tuple[int, ...]]:
    """The codes of every window that can be drawn, by plain loops: stored, in one segment, within one episode."""
    windows = []
    for segment, types in enumerate(types_by_segment):
        stored = list(range(max(len(types) - max_length, 0), len(types)))
        for i in range(len(stored) - num_steps + 1):
            adds = stored[i : i + num_steps]
            crosses = any(types[a] == LAST for a in adds[:-1]) or any(types[a] == FIRST for a in adds[1:])
            if not crosses:
                windows.append(tuple(1000 * segment + a for a in adds))
    return windows


# (episode lengths per segment, number of adds, max_length, num_steps): episodes shorter than num_steps;
# rings that wrapped in the middle of an episode; several segments.
CASES = {
    "short_episodes": ([[1, 2, 3, 5], [2, 2, 6], [4, 1, 1, 3]], 12, 12, 3),
    "wrapped_mid_episode": ([[9, 2], [4, 7]], 17, 6, 3),
    "pairs": ([[2, 3], [1, 4, 2]], 11, 8, 2),
    "long_windows": ([[7, 3, 9], [12, 2]], 30, 20, 5),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_window_is_within_one_episode_with_exact_probabilities(kind, case):
    lengths, num_adds, max_length, num_steps = CASES[case]
    types = [episode_types(segment_lengths, num_adds) for segment_lengths in lengths]
    buffer = make_buffer(kind, len(types), max_length, SPEC, episode_boundaries=True)
    fill(buffer, types)
    expected = reference_windows(types, max_length, num_steps)
    assert expected  # every case has windows to draw, and windows left out
    assert len(expected) < len(types) * (min(num_adds, max_length) - num_steps + 1)

    items, info = buffer.get_next(sample_batch_size=400, num_steps=num_steps)
    drawn = [tuple(window) for window in np.asarray(items["code"]).tolist()]
    assert set(drawn) <= set(expected)
    np.testing.assert_array_equal(
        np.asarray(info.ids), np.asarray(items["code"]) % 1000 * len(types) + np.asarray(items["code"]) // 1000
    )
    np.testing.assert_array_equal(np.asarray(info.probabilities), np.full(400, 1 / len(expected), np.float32))

    # The epoch holds every valid window once; the counts agree.
    inner = underlying(buffer)
    epoch = [tuple(w) for batch, _ in inner.epoch_dataset(7, num_steps) for w in np.asarray(batch["code"]).tolist()]
    assert sorted(epoch) == sorted(expected)
    assert inner.full_batches_per_epoch(7, num_steps) == len(expected) // 7


@pytest.mark.parametrize("sample_batch_size", [None, 2])
@pytest.mark.parametrize("kind_name", list(conftest.BUFFER_KINDS))
def test_the_deterministic_pass_yields_the_plain_pass_windows_within_episodes(kind_name, sample_batch_size):
    lengths, num_adds, max_length, num_steps = CASES["wrapped_mid_episode"]
    types = [episode_types(segment_lengths, num_adds) for segment_lengths in lengths]
    plain = conftest.make(kind_name, SPEC, len(types), max_length, dataset_window_shift=1)
    aware = conftest.make(kind_name, SPEC, len(types), max_length, dataset_window_shift=1, episode_boundaries=True)
    fill(plain, types)
    fill(aware, types)
    valid = set(reference_windows(types, max_length, num_steps))

    def windows(buffer):
        dataset = buffer.as_dataset(sample_batch_size, num_steps, single_deterministic_pass=True)
        elements = [np.atleast_2d(np.asarray(items["code"])).tolist() for items, _ in dataset]
        return [[tuple(w) for w in element if len(w) == num_steps] for element in elements]

    expected = [[w for w in element if w in valid] for element in windows(plain)]
    assert [element for element in windows(aware) if element] == [element for element in expected if element]
    assert {w for element in expected for w in element} == valid


@pytest.mark.parametrize("kind_name", [name for name, kind in conftest.BUFFER_KINDS.items() if not kind.uniform])
def test_prioritized_draws_are_proportional_among_windows_within_episodes(kind_name):
    lengths, num_adds, max_length, num_steps = CASES["long_windows"]
    types = [episode_types(segment_lengths, num_adds) for segment_lengths in lengths]
    tf.random.set_seed(7)
    buffer = conftest.make(
        kind_name, SPEC, len(types), max_length, seed=7, priority_exponent=0.5, episode_boundaries=True
    )
    fill(buffer, types)
    rng = np.random.default_rng(7)
    stored = np.arange(num_adds - max_length, num_adds)
    ids = (stored[:, None] * len(types) + np.arange(len(types))).ravel()
    priorities = rng.choice([0.0, 0.5, 1.0, 4.0, 9.0], size=ids.size)
    buffer.update_priorities(ids, priorities)
    weight_of = {(1000 * (i % len(types)) + i // len(types)): p**0.5 for i, p in zip(ids, priorities)}

    expected = reference_windows(types, max_length, num_steps)
    weights = np.array([weight_of[window[0]] for window in expected])
    probabilities = weights / weights.sum()
    items, info = buffer.get_next(sample_batch_size=20_000, num_steps=num_steps)
    codes = np.asarray(items["code"])
    index = {window: i for i, window in enumerate(expected)}
    drawn = np.array([index[tuple(window)] for window in codes.tolist()])  # KeyError: a window not in the reference
    np.testing.assert_allclose(np.asarray(info.probabilities), probabilities[drawn].astype(np.float32), rtol=1e-6)
    counts = np.bincount(drawn, minlength=len(expected))
    assert chi_square_p_value_against(counts, probabilities) > 1e-3


@pytest.mark.parametrize("kind_name", [name for name, kind in conftest.BUFFER_KINDS.items() if kind.uniform])
def test_uniform_draws_pass_a_chi_square_test_over_the_valid_windows(kind_name):
    lengths, num_adds, max_length, num_steps = CASES["long_windows"]
    types = [episode_types(segment_lengths, num_adds) for segment_lengths in lengths]
    tf.random.set_seed(11)
    buffer = conftest.make(kind_name, SPEC, len(types), max_length, seed=11, episode_boundaries=True)
    fill(buffer, types)
    expected = reference_windows(types, max_length, num_steps)
    index = {window: i for i, window in enumerate(expected)}
    items, _ = buffer.get_next(sample_batch_size=20_000, num_steps=num_steps)
    drawn = np.array([index[tuple(window)] for window in np.asarray(items["code"]).tolist()])
    counts = np.bincount(drawn, minlength=len(expected))
    assert chi_square_p_value_against(counts, np.full(len(expected), 1 / len(expected))) > 1e-3


@pytest.mark.parametrize("seed", range(4))
def test_random_episodes_match_the_reference_on_every_kind(seed):
    rng = np.random.default_rng(seed)
    batch_size, max_length, num_steps = int(rng.integers(1, 4)), int(rng.integers(4, 12)), int(rng.integers(2, 5))
    num_steps = min(num_steps, max_length)
    num_adds = int(rng.integers(max_length, 3 * max_length))
    types = [rng.choice([FIRST, MID, MID, MID, LAST], size=num_adds).tolist() for _ in range(batch_size)]
    expected = sorted(reference_windows(types, max_length, num_steps))
    for name in conftest.BUFFER_KINDS:
        buffer = conftest.make(name, SPEC, batch_size, max_length, episode_boundaries=True)
        fill(buffer, types)
        epoch = [
            tuple(w) for batch, _ in buffer.epoch_dataset(5, num_steps) for w in np.asarray(batch["code"]).tolist()
        ]
        assert sorted(epoch) == expected, name
        if expected:
            items, info = buffer.get_next(sample_batch_size=50, num_steps=num_steps)
            assert {tuple(w) for w in np.asarray(items["code"]).tolist()} <= set(expected), name
            if conftest.BUFFER_KINDS[name].uniform:
                np.testing.assert_array_equal(np.asarray(info.probabilities), np.float32(1 / len(expected)))


def test_single_frames_and_a_custom_step_type_path(kind):
    spec = {"info": {"kind": tf.TensorSpec([], tf.int64)}, "code": tf.TensorSpec([], tf.int64)}
    buffer = make_buffer(kind, 1, 6, spec, episode_boundaries="info/kind")
    for t, step in enumerate([FIRST, LAST, FIRST, MID, LAST]):
        buffer.add_batch({"info": {"kind": np.array([step])}, "code": np.array([t])})
    items, info = buffer.get_next(sample_batch_size=200)  # single frames: all 5 frames, never affected
    assert set(np.asarray(items["code"]).tolist()) == {0, 1, 2, 3, 4}
    np.testing.assert_array_equal(np.asarray(info.probabilities), np.float32(0.2))
    items, info = buffer.get_next(sample_batch_size=200, num_steps=2)
    assert {tuple(w) for w in np.asarray(items["code"]).tolist()} == {(0, 1), (2, 3), (3, 4)}
    assert underlying(buffer).episode_boundaries == "info/kind"


def test_no_window_within_an_episode_is_refused_and_the_buffer_still_works(kind):
    buffer = make_buffer(kind, 2, 4, SPEC, episode_boundaries=True)
    fill(buffer, [[LAST, LAST, LAST], [FIRST, FIRST, FIRST]])
    with pytest.raises(tf.errors.InvalidArgumentError, match="no stored window of 2 frames lies within one episode"):
        buffer.get_next(sample_batch_size=3, num_steps=2)
    items, _ = buffer.get_next(sample_batch_size=3)  # single frames still
    assert np.asarray(items["code"]).shape == (3,)
    buffer.add_batch({"step_type": np.array([MID, MID], np.int32), "code": np.array([3, 1003])})
    items, _ = buffer.get_next(sample_batch_size=50, num_steps=2)
    assert {tuple(w) for w in np.asarray(items["code"]).tolist()} == {(1002, 1003)}
    assert np.asarray(buffer.gather_all()["code"]).tolist() == [[0, 1, 2, 3], [1000, 1001, 1002, 1003]]
    buffer.clear()
    assert int(buffer.num_frames()) == 0


@pytest.mark.parametrize(
    ("option", "error", "message"),
    [
        (1, TypeError, r"episode_boundaries: expected False, True .* got int 1"),
        ("steps", ValueError, r"among \['code', 'step_type'\], got str 'steps'"),
        ("code", None, None),
    ],
)
def test_a_bad_episode_option_names_the_field(option, error, message):
    for name in conftest.BUFFER_KINDS:
        if error is None:
            spec = {"step_type": tf.TensorSpec([2], tf.int32), "code": tf.TensorSpec([], tf.float32)}
            with pytest.raises(
                ValueError, match=r"field code: expected an integer scalar spec \(step types\), got float32"
            ):
                conftest.make(name, spec, 1, 4, episode_boundaries="code")
            with pytest.raises(
                ValueError, match=r"field step_type: expected an integer scalar spec .* got int32 \(2,\)"
            ):
                conftest.make(name, spec, 1, 4, episode_boundaries=True)
        else:
            with pytest.raises(error, match=message):
                conftest.make(name, SPEC, 1, 4, episode_boundaries=option)


def test_the_option_survives_a_file(tmp_path, kind):
    buffer = make_buffer(kind, 1, 5, SPEC, episode_boundaries=True)
    fill(buffer, [[FIRST, LAST, FIRST, MID, MID]])
    path = underlying(buffer).save(tmp_path / "episodes.tfb")
    loaded = type(underlying(buffer)).load(path)
    assert loaded.episode_boundaries is True
    items, _ = loaded.get_next(sample_batch_size=50, num_steps=2)
    assert {tuple(w) for w in np.asarray(items["code"]).tolist()} == {(0, 1), (2, 3), (3, 4)}


# The adds' record of episode ends (tfbuffers.sampling._episodes) and the draws made with it.


def reference_record(buffer, types_by_segment: list[list[int]]) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """The record of episode ends, by plain loops.

    Each row's distance to its episode's last frame (0: farther than NEAR, or the episode has not ended), the
    rows' weights summed by distance, and each segment's newest episode end.
    """
    from tfbuffers.prioritized import leaf_weights
    from tfbuffers.sampling import _episodes

    inner = underlying(buffer)
    batch_size, max_length = inner.batch_size, inner.max_length
    distance = np.zeros(inner.capacity + 1, np.int8)
    near = np.zeros([_episodes.NEAR + 1, 3])
    weights = np.ones(inner.capacity)
    if inner.prioritized:
        weights = leaf_weights(np.asarray(inner.storage.extras["priority"]), inner.priority_exponent)
    last_ends = []
    for segment, types in enumerate(types_by_segment):
        stored = range(max(len(types) - max_length, 0), len(types))
        ends = [e for e in stored[:-1] if types[e] == LAST or types[e + 1] == FIRST]
        last_ends.append(ends[-1] if ends else -1)
        for t in stored:
            following = [e for e in ends if e >= t]
            if following and following[0] - t + 1 <= _episodes.NEAR:
                row = (t % max_length) * batch_size + segment
                distance[row] = following[0] - t + 1
                near[distance[row]] += [weights[row], weights[row] > 0, 1]
    near[0] = 0
    return distance, near, last_ends


def stored_record(buffer) -> list:
    """The record's three extras as the buffer's storage keeps them: distance, near, last_end."""
    extras = underlying(buffer).storage.extras
    return [extras[f"episodes/{name}"] for name in ("distance", "near", "last_end")]


def assert_record(buffer, types_by_segment: list[list[int]]) -> None:
    distance, near, last_ends = reference_record(buffer, types_by_segment)
    record = [np.asarray(x) for x in stored_record(buffer)]
    np.testing.assert_array_equal(record[0][:-1], distance[:-1])  # the last row takes masked-out writes
    np.testing.assert_allclose(record[1][1:], near[1:], rtol=1e-12)  # row 0 takes masked-out sums
    assert record[2].tolist() == last_ends


def test_the_adds_keep_the_record_of_episode_ends_through_wraps_clear_restore_and_updates(kind):
    rng = np.random.default_rng(3)
    batch_size, max_length, num_adds = 3, 20, 57
    types = [rng.choice([FIRST, MID, MID, MID, LAST], size=num_adds).tolist() for _ in range(batch_size)]
    buffer = make_buffer(kind, batch_size, max_length, SPEC, episode_boundaries=True)
    prioritized = buffer.prioritized
    for t in range(num_adds):
        fill(buffer, [segment[t : t + 1] for segment in types])
        if prioritized and t % 5 == 4:  # some rows near an episode's end change weight, one to 0
            ids = rng.choice((t + 1 - min(t + 1, max_length)) * batch_size + np.arange(min(t + 1, max_length) * 3), 6)
            buffer.update_priorities(ids, np.append(rng.uniform(0.1, 3.0, 5), 0.0))
        assert_record(buffer, [segment[: t + 1] for segment in types])
    assert (np.asarray(stored_record(buffer)[0]) > 0).sum() > 10  # rows near ends, some written before the wrap
    state = underlying(buffer).state()
    buffer.clear()
    assert_record(buffer, [[]] * batch_size)
    fill(buffer, [[MID, LAST, FIRST]] * batch_size)
    assert_record(buffer, [[MID, LAST, FIRST]] * batch_size)
    underlying(buffer).restore_state(state)
    assert_record(buffer, types)
    fill(buffer, [[FIRST]] * batch_size)  # adds go on from the rebuilt record
    assert_record(buffer, [segment + [FIRST] for segment in types])


@pytest.mark.parametrize("num_steps", [12, 17, 18])
@pytest.mark.parametrize("kind_name", list(conftest.BUFFER_KINDS))
def test_long_windows_and_few_valid_ones_are_drawn_exactly(kind_name, num_steps):
    # Windows of 17 frames are the longest the record covers, 18 are drawn in one pass; episodes of 12 and
    # windows of 12 leave a twelfth of the windows valid: too few draws are kept, and the pass draws the batch.
    lengths = [12] if num_steps == 12 else [25, 19, 30]
    types = [episode_types(lengths, 90), episode_types(lengths[::-1], 90)]
    buffer = conftest.make(kind_name, SPEC, 2, 64, episode_boundaries=True)
    fill(buffer, types)
    expected = reference_windows(types, 64, num_steps)
    assert expected
    items, info = buffer.get_next(sample_batch_size=300, num_steps=num_steps)
    drawn = {tuple(window) for window in np.asarray(items["code"]).tolist()}
    assert drawn <= set(expected)
    if conftest.BUFFER_KINDS[kind_name].uniform:
        assert len(drawn) > len(expected) // 2
        np.testing.assert_array_equal(np.asarray(info.probabilities), np.float32(1 / len(expected)))
    else:  # every frame has the same priority: uniform over the valid windows too
        np.testing.assert_allclose(np.asarray(info.probabilities), 1 / len(expected), rtol=1e-6)


@pytest.mark.parametrize("share", ["most_weight_within", "most_weight_crossing"])
@pytest.mark.parametrize("kind_name", [name for name, kind in conftest.BUFFER_KINDS.items() if not kind.uniform])
def test_prioritized_episode_draws_are_exact_whether_rejection_keeps_enough_or_not(kind_name, share):
    # Most weight within episodes: the draws from the tree that land on crossing windows are left out. Most
    # on crossing windows: too few draws are kept, and the batch is drawn in one pass over every row.
    types = [episode_types([6, 4, 7], 40), episode_types([5, 9], 40)]
    max_length, num_steps = 32, 3
    tf.random.set_seed(5)
    buffer = conftest.make(kind_name, SPEC, 2, max_length, seed=5, priority_exponent=1.0, episode_boundaries=True)
    fill(buffer, types)
    expected = reference_windows(types, max_length, num_steps)
    starts = {window[0] for window in expected}
    stored = np.arange(40 - max_length, 40)
    codes = (np.arange(2)[None, :] * 1000 + stored[:, None]).ravel()
    ids = (stored[:, None] * 2 + np.arange(2)).ravel()
    crossing_weight = 1.0 if share == "most_weight_within" else 5000.0
    priorities = np.array([(1.0 + code % 3) if code in starts else crossing_weight for code in codes])
    buffer.update_priorities(ids, priorities)
    weight_of = dict(zip(codes.tolist(), priorities))
    weights = np.array([weight_of[window[0]] for window in expected])
    probabilities = weights / weights.sum()
    items, info = buffer.get_next(sample_batch_size=5000, num_steps=num_steps)
    index = {window: i for i, window in enumerate(expected)}
    drawn = np.array([index[tuple(window)] for window in np.asarray(items["code"]).tolist()])
    np.testing.assert_allclose(np.asarray(info.probabilities), probabilities[drawn].astype(np.float32), rtol=1e-6)
    counts = np.bincount(drawn, minlength=len(expected))
    assert chi_square_p_value_against(counts, probabilities) > 1e-3


@pytest.mark.parametrize("kind_name", ["tf", "tf_prioritized", "py"])
def test_samples_overlapping_adds_stay_within_episodes(kind_name):
    # Full rings of 8 (each holds a window of 3 within an episode): every add drops the oldest frame and, often,
    # the cut after it, while samples read.
    import threading
    import time

    types = episode_types([3, 1, 5, 2, 4], 50_000)
    buffer = conftest.make(kind_name, SPEC, 2, 8, episode_boundaries=True)
    add = buffer.add_batch if kind_name == "py" else tf.function(buffer.add_batch)
    for t in range(8):
        add({"step_type": np.full([2], types[t], np.int32), "code": np.array([t, 100_000 + t])})
    stop, errors, adds = threading.Event(), [], [8]

    def write() -> None:
        try:
            while not stop.is_set() and adds[0] < len(types):
                t = adds[0]
                add({"step_type": np.full([2], types[t], np.int32), "code": np.array([t, 100_000 + t])})
                adds[0] += 1
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    writer = threading.Thread(target=write)
    writer.start()
    samples, deadline = 0, time.monotonic() + 2.0
    try:
        while time.monotonic() < deadline or samples < 20:
            items, _ = buffer.get_next(sample_batch_size=16, num_steps=3)
            codes, steps = np.asarray(items["code"]) % 100_000, np.asarray(items["step_type"])
            np.testing.assert_array_equal(np.diff(codes, axis=1), 1)  # whole windows
            np.testing.assert_array_equal(steps, np.asarray(types)[codes])  # not torn
            assert not ((steps[:, :-1] == LAST) | (steps[:, 1:] == FIRST)).any(), codes
            samples += 1
    finally:
        stop.set()
        writer.join()
    assert not errors, errors
    assert samples >= 20 and adds[0] > 100
