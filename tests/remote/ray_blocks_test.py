"""A Ray writer's adds sent in one call (`RayHost.add_many`) go in as one block: exactly the adds one by one.

The actor, `RayHost`, runs in this process (no Ray needed), called as `RayWriter` calls it; the writer's own
`extend` and the observers' blocks on a real cluster are in ray_replay_buffer_test.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tfbuffers.remote.ray.actor import RayHost
from tfbuffers.remote.ray.config import actor_config

SPEC = {
    "x": tf.TensorSpec([], tf.int64),
    "obs": tf.TensorSpec([2], tf.float32),
    "step_type": tf.TensorSpec([], tf.int32),
}


def host(batch_size=3, sampler="uniform", layout="segments", **options):
    capacity, max_length = (24, None) if layout == "elastic" else (None, 8)
    config = actor_config(
        SPEC, capacity, batch_size=batch_size, max_length=max_length, sampler=sampler, priority_exponent=1.0,
        episode_boundaries=True, frame_stacks=None, directory=None,
        min_size_to_sample=options.pop("min_size_to_sample", None),
        samples_per_insert=options.pop("samples_per_insert", None), error_buffer=options.pop("error_buffer", None),
        seed=0, name="blocks", layout=layout, **options,
    )  # fmt: skip
    return RayHost(config)


def batches(segments, first, count):
    """`count` adds to `segments` (their leaves, in the spec's order), from add number `first`: x = 100 * env + add."""
    envs = np.asarray(segments, np.int64)
    made = []
    for t in range(first, first + count):
        x = 100 * envs + t
        step_type = np.full(len(envs), 2 if t % 4 == 3 else (0 if t % 4 == 0 else 1), np.int32)
        made.append(
            tf.nest.flatten({"x": x, "obs": np.stack([x, -x], axis=1).astype(np.float32), "step_type": step_type})
        )
    return made


def one_block_only(actor):
    """Makes the actor's adds one by one fail: its `add_many` calls must go in as blocks."""

    def add(*args, **kwargs):
        raise AssertionError("add_many took its batches one by one")

    actor.add = add
    return actor


def kept(actor):
    """What the actor keeps: each segment's frames, the rate limiter's counts, and windows' probabilities."""
    segments = [[leaf.tolist() for leaf in actor.gather_segment(s)] for s in range(len(actor.frames_per_segment()))]
    return segments, actor.limiter_counts()


@pytest.mark.parametrize("layout", ["segments", "elastic"])
@pytest.mark.parametrize("sampler", ["uniform", "prioritized"])
def test_adds_sent_in_one_call_keep_what_they_keep_one_by_one(sampler, layout):
    block, single = host(sampler=sampler, layout=layout), host(sampler=sampler, layout=layout)
    for actor in (block, single):
        assert actor.claim(2, "w") == ([0, 1], [0, 0])
    one_block_only(block)
    # Past the ring's end (8 frames a segment): the block's rows wrap, and one episode spans two calls.
    for first, count in ((0, 6), (6, 7)):
        sent = batches([0, 1], first, count)
        ids = block.add_many([0, 1], sent, None, "w", np.array([first, first]))
        one_by_one = [
            single.add([0, 1], leaves, None, "w", np.array([first + t, first + t])) for t, leaves in enumerate(sent)
        ]
        np.testing.assert_array_equal(ids, np.stack(one_by_one))
        np.testing.assert_array_equal(ids, (np.arange(first, first + count)[:, None]) * 3 + np.array([0, 1]))
    assert kept(block) == kept(single)
    # The elastic layout's 24 rows (chunks of 1) are shared: 2 segments of 13 adds keep 12 each.
    assert block.frames_per_segment() == ([8, 8, 0] if layout == "segments" else [12, 12, 0])
    if sampler == "prioritized":  # the newest frames weigh the largest priority, in both
        block.update_priorities(np.array([3, 4]), np.array([5.0, 2.0]))
        single.update_priorities(np.array([3, 4]), np.array([5.0, 2.0]))
        block.add_many([0, 1], batches([0, 1], 13, 2), None, "w", np.array([13, 13]))
        for t, leaves in enumerate(batches([0, 1], 13, 2)):
            single.add([0, 1], leaves, None, "w", np.array([13 + t, 13 + t]))
    draws = [actor.sample(500, 3, 1, None) for actor in (block, single)]
    for drawn, other in zip(tf.nest.flatten(draws[0]), tf.nest.flatten(draws[1])):  # one seed, alike weights
        np.testing.assert_array_equal(drawn, other)


def test_a_call_a_writer_sent_twice_stores_each_frame_once():
    actor = one_block_only(host())
    actor.claim(2, "w")
    sent = batches([0, 1], 0, 5)
    first = actor.add_many([0, 1], sent[:3], None, "w", np.array([0, 0]))
    # The same adds again (a dropped writer's adoption beside its call in flight): the first three are twins.
    again = actor.add_many([0, 1], sent, None, "w", np.array([0, 0]))
    np.testing.assert_array_equal(again[:3], first)
    np.testing.assert_array_equal(again, np.arange(5)[:, None] * 3 + np.array([0, 1]))
    assert actor.frames_per_segment() == [5, 5, 0]
    assert actor.gather_segment(0)[-1].tolist() == [0, 1, 2, 3, 4]  # "x", the last leaf (obs, step_type, x)
    twins = actor.add_many([0, 1], sent, None, "w", np.array([0, 0]))  # all of them twins: nothing stored
    np.testing.assert_array_equal(twins, again)
    assert actor.frames_per_segment() == [5, 5, 0] and actor.limiter_counts()["inserts"] == 10
    # A resend after a restart: the frames the segment holds already are not stored twice.
    resent = actor.add_many([0, 1], batches([0, 1], 3, 4), None, "w", np.array([3, 3]), True)
    np.testing.assert_array_equal(resent, np.arange(3, 7)[:, None] * 3 + np.array([0, 1]))
    assert actor.gather_segment(1)[-1].tolist() == [100, 101, 102, 103, 104, 105, 106]


def test_a_refused_batch_in_a_call_stores_those_before_it_and_says_how_many():
    actor = host()
    actor.claim(1, "w")
    sent = batches([0], 0, 4)
    sent[2][0] = sent[2][0].astype(np.float64)  # "obs" (the first leaf) of the third add: float64
    with pytest.raises(ValueError) as raised:
        actor.add_many([0], sent, None, "w", np.array([0]))
    message = str(raised.value)
    assert message.startswith("obs: expected dtype float32") and message.endswith(
        "(2 of the 4 adds this writer sent in one call were stored, the rest not)"
    )
    assert actor.frames_per_segment() == [2, 0, 0]
    assert actor.add_many([0], batches([0], 2, 3), None, "w", np.array([2])).ravel().tolist() == [6, 9, 12]
    assert actor.gather_segment(0)[-1].tolist() == [0, 1, 2, 3, 4]


def test_a_call_the_rate_limiter_would_hold_in_part_goes_one_by_one_and_says_how_many_it_stored():
    # min_size 2, one sample per insert, error buffer 4: the limiter lets the first 6 frames in, not 8.
    actor = one_block_only(host(batch_size=1, min_size_to_sample=2, samples_per_insert=1.0, error_buffer=4.0))
    actor.claim(1, "w")
    actor.add_many([0], batches([0], 0, 4), 0.2, "w", np.array([0]))  # all four let in: one block
    del actor.add
    with pytest.raises(TimeoutError) as raised:
        actor.add_many([0], batches([0], 4, 4), 0.2, "w", np.array([4]))
    assert str(raised.value).endswith("(2 of the 4 adds this writer sent in one call were stored, the rest not)")
    assert actor.frames_per_segment() == [6] and actor.limiter_counts()["inserts"] == 6
    assert actor.gather_segment(0)[-1].tolist() == [0, 1, 2, 3, 4, 5]


def test_a_call_from_a_writer_whose_claim_was_taken_stores_nothing():
    actor = host(batch_size=1, writer_lease=0.01)
    actor.claim(1, "old")
    actor.release("old")
    actor.claim(1, "new")
    with pytest.raises(ValueError) as raised:
        actor.add_many([0], batches([0], 0, 3), None, "old", np.array([0]))
    assert "(0 of the 3 adds this writer sent in one call were stored, the rest not)" in str(raised.value)
    assert actor.frames_per_segment() == [0]


def test_a_checkpoint_due_within_a_call_is_taken_at_the_add_it_falls_due_at(tmp_path):
    actor = host(batch_size=1, checkpoint_dir=tmp_path / "checkpoints", checkpoint_frames=10)
    actor.claim(1, "w")
    one_block_only(actor).add_many([0], batches([0], 0, 4), None, "w", np.array([0]))  # 4 of 10: one block
    del actor.add
    actor.add_many([0], batches([0], 4, 8), None, "w", np.array([4]))  # the 10th frame is its 6th add
    report = actor.checkpoint_report()
    assert (report["checkpoints"], report["frames_since"], report["error"]) == (1, 2, None)
    actor.close()
