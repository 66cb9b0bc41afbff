"""The sum tree against brute force: cumulative sums over random priorities, zeros and masks included."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tfbuffers.sampling import _sum_tree as st
from tfbuffers.sampling import _tree_kernels


@pytest.fixture(params=["compiled", "steps"])
def numpy_path(request, monkeypatch):
    """The numpy tree's functions through numba's compiled loops, then through the vectorised numpy steps."""
    kernels = _tree_kernels.KERNELS if request.param == "compiled" else None
    if request.param == "compiled":
        assert kernels is not None, "numba is a dependency of tfbuffers: its loops must load"
    monkeypatch.setattr(st, "_COMPILED", [kernels])
    return request.param


def random_leaves(rng, capacity, zeros=0.3):
    leaves = rng.exponential(size=capacity)
    leaves[rng.random(capacity) < zeros] = 0.0
    return leaves


def unmasked(capacity, start, length):
    keep = np.ones(capacity, bool)
    keep[(start + np.arange(length)) % capacity] = False
    return keep


def midpoint_targets(leaves, keep):
    """For every unmasked leaf above 0, the target in the middle of its interval, and that leaf."""
    values = np.where(keep, leaves, 0.0)
    before = np.concatenate([[0.0], np.cumsum(values)[:-1]])
    drawn = np.flatnonzero(values > 0)
    return before[drawn] + values[drawn] / 2, drawn


def find_numpy(tree, capacity, targets, start=None, length=None):
    leaf_mask = None if start is None else st.mask(st.NUMPY, tree, capacity, np.int64(start), np.int64(length))
    return st.find(st.NUMPY, tree, capacity, targets, leaf_mask), st.unmasked_total(st.NUMPY, tree, leaf_mask)


@pytest.mark.parametrize("capacity", [1, 2, 3, 7, 8, 100, 1000])
def test_leaf_count_and_depth(capacity):
    size = st.leaf_count(capacity)
    assert size >= capacity and size & (size - 1) == 0 and size < 2 * max(capacity, 1)
    assert 2 ** st.depth(capacity) == size


@pytest.mark.parametrize("capacity", [1, 5, 64, 1000])
def test_batched_updates_give_the_tree_a_bottom_up_build_gives(capacity, numpy_path):
    rng = np.random.default_rng(capacity)
    tree, leaves = st.empty(capacity), np.zeros(capacity)
    for _ in range(50):
        index = rng.integers(0, capacity, size=rng.integers(1, 40))
        values = random_leaves(rng, len(index))
        st.update_numpy(tree, capacity, index, values)
        for i, v in zip(index, values):  # a repeated leaf takes its last value
            leaves[i] = v
        # Every node is recomputed from its children: bit for bit the tree built from the leaves now.
        np.testing.assert_array_equal(tree, st.build(leaves, capacity))
    assert tree[1, st.POSITIVE] == np.count_nonzero(leaves)
    assert tree[1, st.SUM] == pytest.approx(math.fsum(leaves), rel=1e-14)


@pytest.mark.parametrize("capacity", [1, 6, 64, 777])
def test_find_lands_where_the_cumulative_sum_says(capacity):
    rng = np.random.default_rng(capacity)
    leaves = random_leaves(rng, capacity)
    leaves[rng.integers(capacity)] = 1.0  # at least one above 0
    tree = st.build(leaves, capacity)
    targets, expected = midpoint_targets(leaves, np.ones(capacity, bool))
    found, (total, positive) = find_numpy(tree, capacity, targets)
    np.testing.assert_array_equal(found, expected)
    assert positive == np.count_nonzero(leaves) and total == pytest.approx(leaves.sum(), rel=1e-14)
    # Both ends and beyond: always a leaf above 0, the first one for 0, the last one at or past the total.
    edges, _ = find_numpy(tree, capacity, np.array([0.0, np.nextafter(total, 0), total, total * 2]))
    positive_leaves = np.flatnonzero(leaves)
    assert edges.tolist() == [positive_leaves[0]] + [positive_leaves[-1]] * 3


@pytest.mark.parametrize(
    ("capacity", "start", "length"),
    [(8, 0, 3), (8, 6, 4), (10, 9, 1), (100, 37, 20), (100, 90, 30), (777, 700, 200), (64, 0, 63)],
)
def test_a_masked_range_is_never_drawn_and_the_rest_keep_their_intervals(capacity, start, length):
    rng = np.random.default_rng(start)
    leaves = random_leaves(rng, capacity)
    keep = unmasked(capacity, start, length)
    leaves[rng.choice(np.flatnonzero(keep))] = 1.0
    tree = st.build(leaves, capacity)
    targets, expected = midpoint_targets(leaves, keep)
    found, (total, positive) = find_numpy(tree, capacity, targets, start, length)
    np.testing.assert_array_equal(found, expected)
    assert positive == np.count_nonzero(leaves[keep])
    assert total == pytest.approx(leaves[keep].sum(), rel=1e-12)
    # Any target, boundaries and rounding included, lands on an unmasked leaf above 0.
    anywhere = np.concatenate([rng.random(2000) * total, [0.0, total, np.nextafter(total, np.inf)], targets * 2])
    found, _ = find_numpy(tree, capacity, anywhere, start, length)
    assert keep[found].all() and (leaves[found] > 0).all()


def test_boundaries_never_reach_a_zero_or_masked_leaf_whatever_the_rounding():
    # Sums of wildly different magnitudes round: the exact counts still steer every draw to an allowed leaf.
    rng = np.random.default_rng(0)
    capacity = 512
    leaves = np.where(rng.random(capacity) < 0.5, 0.0, 10.0 ** rng.uniform(-300, 300, capacity))
    tree = st.build(leaves, capacity)
    for start, length in [(0, 0), (100, 50), (500, 40)]:
        keep = unmasked(capacity, start, length)
        total, _ = st.unmasked_total(st.NUMPY, tree, st.mask(st.NUMPY, tree, capacity, start, length))
        targets = np.concatenate([rng.random(5000), np.linspace(0, 1, 1001)]) * total
        found, _ = find_numpy(tree, capacity, targets, start, length)
        assert keep[found].all() and (leaves[found] > 0).all()


def test_draws_follow_the_leaves_proportionally():
    rng = np.random.default_rng(1)
    capacity = 50
    leaves = random_leaves(rng, capacity)
    tree = st.build(leaves, capacity)
    start, length = 45, 10
    keep = unmasked(capacity, start, length)
    leaf_mask = st.mask(st.NUMPY, tree, capacity, start, length)
    total, _ = st.unmasked_total(st.NUMPY, tree, leaf_mask)
    draws = 200_000
    found = st.find(st.NUMPY, tree, capacity, rng.random(draws) * total, leaf_mask)
    expected = np.where(keep, leaves, 0) / leaves[keep].sum() * draws
    counts = np.bincount(found, minlength=capacity)
    assert (counts[expected == 0] == 0).all()
    chi2 = (((counts - expected) ** 2)[expected > 0] / expected[expected > 0]).sum()
    dof = np.count_nonzero(expected) - 1
    assert chi2 < dof + 5 * math.sqrt(2 * dof)  # fixed seed: the statistic is a fixed number


def test_a_long_run_accumulates_no_rounding_error(numpy_path):
    # 100,000 updates of 64 leaves each: the tree equals the tree built from the final leaves, bit for bit.
    rng = np.random.default_rng(2)
    capacity = 4096
    tree, leaves = st.empty(capacity), np.zeros(capacity)
    for _ in range(100_000 // 64):
        index = rng.choice(capacity, 64, replace=False)
        values = 10.0 ** rng.uniform(-8, 8, 64)
        st.update_numpy(tree, capacity, index, values)
        leaves[index] = values
    np.testing.assert_array_equal(tree, st.build(leaves, capacity))
    assert tree[1, st.SUM] == pytest.approx(math.fsum(leaves), rel=1e-13)


@pytest.mark.parametrize("in_function", [False, True])
def test_the_tensorflow_tree_matches_numpys(in_function, numpy_path):
    rng = np.random.default_rng(3)
    capacity = 300
    tree = st.empty(capacity)
    variable = tf.Variable(st.blocked(tree, capacity))

    def update(index, values):
        st.update_variable(variable, capacity, index, values)

    def find(targets, start, length):
        leaf_mask = st.mask(st.TENSORFLOW, variable, capacity, start, length)
        total = st.unmasked_total(st.TENSORFLOW, variable, leaf_mask)
        return st.find(st.TENSORFLOW, variable, capacity, targets, leaf_mask), total

    if in_function:
        update, find = tf.function(update), tf.function(find)
    for _ in range(20):
        index = rng.integers(0, capacity, size=50)
        index[:5] = index[5]  # repeated leaves: the last value wins, as in numpy
        values = random_leaves(rng, 50)
        update(tf.constant(index), tf.constant(values))
        st.update_numpy(tree, capacity, index, values)
        np.testing.assert_array_equal(variable.numpy().reshape(-1, 2), tree)
        start, length = int(rng.integers(capacity)), int(rng.integers(0, capacity // 2))
        targets = (
            rng.random(1000) * st.unmasked_total(st.NUMPY, tree, st.mask(st.NUMPY, tree, capacity, start, length))[0]
        )
        found, total = find(tf.constant(targets), tf.constant(start, tf.int64), tf.constant(length, tf.int64))
        expected, expected_total = find_numpy(tree, capacity, targets, start, length)
        np.testing.assert_array_equal(found.numpy(), expected)
        assert [float(x) for x in total] == [float(x) for x in expected_total]


def test_leaves_set_alone_then_ancestors_recomputed_give_the_built_tree(numpy_path):
    rng = np.random.default_rng(4)
    capacity = 96
    tree, leaves = st.empty(capacity), np.zeros(capacity)
    stale = []
    for _ in range(40):
        first = int(rng.integers(0, capacity // 8)) * 8
        values = random_leaves(rng, 8)
        st.set_leaves_numpy(tree, capacity, slice(first, first + 8), values)
        leaves[first : first + 8] = values
        stale.append(first)
        if rng.random() < 0.3:
            st.recompute_ancestors_numpy(tree, capacity, (np.array(stale)[:, None] + np.arange(8)).ravel())
            stale = []
            np.testing.assert_array_equal(tree, st.build(leaves, capacity))


@pytest.mark.parametrize("in_function", [False, True])
def test_block_adds_keep_exact_leaves_and_counts_and_sums_within_rounding(in_function):
    # The TF buffer's adds: the change of a contiguous block of leaves added to every ancestor in one op.
    rng = np.random.default_rng(5)
    capacity, block = 1000, 8
    variable = tf.Variable(st.blocked(st.empty(capacity), capacity))
    leaves = np.zeros(capacity)

    def add(first, values):
        st.add_block_variable(variable, capacity, first + tf.range(block, dtype=tf.int64), values)

    def update(index, values):
        st.update_variable(variable, capacity, index, values)

    if in_function:
        add, update = tf.function(add), tf.function(update)
    for step in range(300):
        first = int(rng.integers(0, capacity // block)) * block
        values = random_leaves(rng, block)
        add(tf.constant(first, tf.int64), tf.constant(values))
        leaves[first : first + block] = values
        if step % 10 == 0:  # a learner's update now and then: exact recomputation of its paths
            index = rng.integers(0, capacity, 20)
            values = random_leaves(rng, 20)
            update(tf.constant(index), tf.constant(values))
            for i, v in zip(index, values):
                leaves[i] = v
    built, tree = st.build(leaves, capacity), variable.numpy().reshape(-1, 2)
    size = st.leaf_count(capacity)
    np.testing.assert_array_equal(tree[size:], built[size:])  # the leaves exactly
    np.testing.assert_array_equal(tree[:, st.POSITIVE], built[:, st.POSITIVE])  # every count exactly
    np.testing.assert_allclose(tree[1:, st.SUM], built[1:, st.SUM], rtol=1e-12, atol=1e-12)


# The numpy buffer's draws: `find_numpy` (a whole level, then several levels per step) and `draw_numpy`.
STEPPINGS = [(0, 1), (1, 3), (2, 4), (3, 2), (12, 4)]


def few_step_finder(kind, tree, capacity, top_level, levels_per_step):
    """`find_numpy` on `tree`, or `find_wide` on a variable holding it blocked (compiled): targets in, leaves out.

    `find_wide` steps four levels at a time (a row of the blocked tree), from the level at or below
    `top_level` that reaches the leaves so: `levels_per_step` is numpy's alone.
    """
    if kind == "numpy":
        return lambda targets: st.find_steps(
            tree, capacity, targets, top_level=top_level, levels_per_step=levels_per_step
        )
    if kind == "compiled":  # one compiled descent, level by level, whatever the stepping
        assert st.compiled() is not None
        return lambda targets: st.find_numpy(tree, capacity, targets)
    variable = tf.Variable(st.blocked(tree, capacity))
    found = tf.function(lambda targets: st.find_wide(variable, capacity, targets, top_level=top_level))
    return lambda targets: found(tf.constant(targets, tf.float64)).numpy()


# The numpy buffer's descents (compiled: one, level by level, whatever the stepping; numpy's steps), the TF buffer's.
@pytest.mark.parametrize(
    ("kind", "top_level", "levels_per_step"),
    [("compiled", None, None)] + [(kind, *stepping) for kind in ("numpy", "tensorflow") for stepping in STEPPINGS],
)
@pytest.mark.parametrize("capacity", [1, 2, 6, 64, 777, 5000])
def test_the_few_step_descents_land_where_the_cumulative_sum_says(kind, capacity, top_level, levels_per_step):
    rng = np.random.default_rng(capacity + (top_level or 0))
    leaves = random_leaves(rng, capacity)
    leaves[rng.integers(capacity)] = 1.0
    tree = st.build(leaves, capacity)
    find = few_step_finder(kind, tree, capacity, top_level, levels_per_step)
    targets, expected = midpoint_targets(leaves, np.ones(capacity, bool))
    np.testing.assert_array_equal(find(targets), expected)
    total = tree[1, st.SUM]
    positive_leaves = np.flatnonzero(leaves)
    edges = np.array([0.0, np.nextafter(total, 0), total, total * 2])
    assert find(edges).tolist() == [positive_leaves[0]] + [positive_leaves[-1]] * 3
    if kind == "tensorflow":  # targets of any shape
        assert find(edges.reshape(2, 2)).tolist() == [
            [positive_leaves[0], positive_leaves[-1]],
            [positive_leaves[-1]] * 2,
        ]


@pytest.mark.parametrize(("top_level", "levels_per_step"), [*STEPPINGS, ("compiled", None)])
def test_the_few_call_descent_never_reaches_a_zero_leaf_whatever_the_rounding(top_level, levels_per_step):
    rng = np.random.default_rng(6)
    capacity = 20_000
    leaves = np.where(rng.random(capacity) < 0.5, 0.0, 10.0 ** rng.uniform(-300, 300, capacity))
    tree = st.build(leaves, capacity)
    targets = np.concatenate([rng.random(5000), np.linspace(0, 1, 1001)]) * tree[1, st.SUM]
    if top_level == "compiled":
        assert _tree_kernels.KERNELS is not None
        found = st.find_numpy(tree, capacity, targets)
    else:
        found = st.find_steps(tree, capacity, targets, top_level=top_level, levels_per_step=levels_per_step)
    assert (leaves[found] > 0).all()
    # The largest leaves hold all the weight there: each target lands on the leaf whose interval holds it.
    np.testing.assert_array_equal(found, np.searchsorted(np.cumsum(leaves), targets, side="right"))


@pytest.mark.parametrize("top_level", [0, 1, 2, 3, 12])
def test_the_few_op_tensorflow_descent_never_reaches_a_zero_leaf_whatever_the_sums_carry(top_level):
    # Sums spanning 600 orders of magnitude, and ancestors carrying what the TF buffer's adds leave in them:
    # a positive sum over leaves all 0, a sum of 0 or below over a leaf above 0. Counts decide, not sums.
    rng = np.random.default_rng(7)
    capacity = 20_000
    leaves = np.where(rng.random(capacity) < 0.5, 0.0, 10.0 ** rng.uniform(-300, 300, capacity))
    leaves[:64] = 0.0
    leaves[64:128] = 0.0
    leaves[100] = 1e-300
    tree = st.build(leaves, capacity)
    size = st.leaf_count(capacity)
    tree[(size + 0) >> 6, st.SUM] = 1e-3  # the 64 leaves [0, 64) are all 0
    tree[(size + 64) >> 6, st.SUM] = -1e-3  # one leaf above 0 among [64, 128)
    targets = np.concatenate([rng.random(5000), np.linspace(0, 1, 1001)]) * tree[1, st.SUM]
    found = st.find_wide(tf.Variable(st.blocked(tree, capacity)), capacity, tf.constant(targets), top_level=top_level)
    assert (leaves[found.numpy()] > 0).all()
    # The largest leaves hold all the weight there: each target lands on the leaf whose interval holds it, the
    # root's sum itself on the last leaf that adds to the running sum.
    running = np.cumsum(leaves)
    expected = np.searchsorted(running, np.minimum(targets, np.nextafter(running[-1], 0)), side="right")
    np.testing.assert_array_equal(found, expected)


@pytest.mark.parametrize("capacity", [6, 5000])
def test_the_few_op_tensorflow_descent_stays_within_a_tree_with_no_leaf_above_0(capacity):
    # All priorities 0, or a read torn by a concurrent clear: the sampler then refuses the draw or reads again,
    # so the descent must only end within the leaves, not fail on an index past the tree.
    variable = tf.Variable(st.blocked(st.empty(capacity), capacity))
    found = st.find_wide(variable, capacity, tf.constant([0.0, 0.5, 1.0], tf.float64))
    assert ((found.numpy() >= 0) & (found.numpy() < st.leaf_count(capacity))).all()


@pytest.mark.parametrize(
    ("masked_weight", "redraws"),
    [(1.0, 2), (1e6, 2), (1e6, 0)],  # the mask holding little, or nearly all, of the weight; no redraws at all
)
def test_draws_with_a_mask_follow_the_unmasked_leaves_proportionally(monkeypatch, numpy_path, masked_weight, redraws):
    # Draws landing in the mask are drawn again, then (rounds spent) found by the masked descent:
    # either way only unmasked leaves, in their proportions.
    monkeypatch.setattr(st, "_REDRAWS", redraws)
    rng = np.random.default_rng(7)
    capacity, start, length = 6000, 5990, 30
    leaves = random_leaves(rng, capacity)
    keep = unmasked(capacity, start, length)
    leaves[~keep] = masked_weight
    tree = st.build(leaves, capacity)
    leaf_mask = st.mask(st.NUMPY, tree, capacity, np.int64(start), np.int64(length))
    draws = 300_000
    found = st.draw_numpy(tree, capacity, rng.random, [draws // 100, 100], leaf_mask)
    assert found.shape == (draws // 100, 100)
    counts = np.bincount(found.ravel(), minlength=capacity)
    assert (counts[~keep] == 0).all() and (counts[leaves == 0] == 0).all()
    # Leaves grouped in 60 bins of 100: a chi-square over the bins against the unmasked proportions.
    expected = np.where(keep, leaves, 0).reshape(60, 100).sum(1) / leaves[keep].sum() * draws
    observed = counts.reshape(60, 100).sum(1)
    present = expected > 0
    chi2 = (((observed - expected) ** 2)[present] / expected[present]).sum()
    dof = np.count_nonzero(present) - 1
    assert chi2 < dof + 5 * math.sqrt(2 * dof)  # fixed seed: the statistic is a fixed number


def test_many_leaves_recomputed_at_once_give_the_built_tree(numpy_path):
    # A refresh of many adds: above 4096 listed nodes each level's nodes are made distinct first.
    rng = np.random.default_rng(8)
    capacity = 1 << 15
    tree, leaves = st.empty(capacity), np.zeros(capacity)
    index = rng.choice(capacity, 10_000, replace=False)
    values = random_leaves(rng, index.size)
    st.set_leaves_numpy(tree, capacity, index, values)
    leaves[index] = values
    st.recompute_ancestors_numpy(tree, capacity, np.concatenate([index, index[:100]]))
    np.testing.assert_array_equal(tree, st.build(leaves, capacity))


def test_numba_is_used_unless_switched_off():
    # numba is a dependency: its loops load. TFBUFFERS_NUMBA=0 gives the numpy steps (what users get where
    # numba does not import), and the buffers draw the same way through either.
    probe = "from tfbuffers.sampling import _sum_tree; print(_sum_tree.compiled() is not None)"
    outputs = [
        subprocess.run(
            [sys.executable, "-c", probe],
            env={**os.environ, _tree_kernels.ENVIRONMENT_VARIABLE: value},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()[-1]
        for value in ("1", "0")
    ]
    assert outputs == ["True", "False"]


@pytest.mark.parametrize(("capacity", "width"), [(1, 2), (3, 8), (8, 16), (300, 16)])
def test_the_tf_buffers_layout_puts_a_nodes_sixteen_descendants_four_levels_down_in_one_row(capacity, width):
    tree = st.build(np.arange(1.0, capacity + 1), capacity)
    layout = st.blocked(tree, capacity)
    assert layout.shape == (2 * st.leaf_count(capacity) // width, width, 2)
    for node in range(1, 2 * st.leaf_count(capacity)):
        assert layout[node // width, node % width].tolist() == tree[node].tolist()
    if width == st.BLOCK:
        for node in range(1, st.leaf_count(capacity) // 8):  # nodes with descendants four levels down
            np.testing.assert_array_equal(layout[node], tree[16 * node : 16 * node + 16])
    variable = tf.Variable(layout)
    nodes = np.array([[1, 2 * st.leaf_count(capacity) - 1], [st.leaf_count(capacity), 1]])
    np.testing.assert_array_equal(st.TENSORFLOW.nodes(variable, tf.constant(nodes)).numpy(), tree[nodes])
    np.testing.assert_array_equal(st.TENSORFLOW.flat(variable).numpy(), tree)
