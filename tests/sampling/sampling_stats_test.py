"""Uniformity of sampled windows, by a chi-square test with fixed seeds."""

from __future__ import annotations

import conftest
import numpy as np
import pytest
import tensorflow as tf
from conftest import SPEC, fill

BATCH_SIZE, MAX_LENGTH, NUM_ADDS, NUM_STEPS, DRAWS = 4, 10, 13, 3, 32_000
# Adds 3..12 are stored; windows of 3 start at adds 3..10 of each segment.
STARTS = np.arange(3, 11)


def chi_square_p_value(counts: np.ndarray) -> float:
    """P-value of counts under a uniform distribution (upper regularised gamma)."""
    expected = counts.sum() / counts.size
    statistic = float(((counts - expected) ** 2 / expected).sum())
    return float(tf.math.igammac((counts.size - 1) / 2.0, statistic / 2.0))


def window_counts(codes: np.ndarray) -> np.ndarray:
    segment, start = codes[:, 0] // 1000, codes[:, 0] % 1000
    counts = np.zeros([BATCH_SIZE, STARTS.size], np.int64)
    np.add.at(counts, (segment, start - STARTS[0]), 1)
    return counts


@pytest.mark.parametrize("kind", [name for name, kind in conftest.BUFFER_KINDS.items() if kind.uniform])
def test_window_starts_are_uniform(kind):
    tf.random.set_seed(20261122)
    buffer = conftest.make(kind, SPEC, BATCH_SIZE, MAX_LENGTH, seed=20261122)
    fill(buffer, NUM_ADDS)
    items, _ = buffer.get_next(sample_batch_size=DRAWS, num_steps=NUM_STEPS)
    counts = window_counts(np.asarray(items["step"]))
    assert counts.sum() == DRAWS  # every sample is one of the 32 valid windows
    assert chi_square_p_value(counts) > 1e-3


def test_the_chi_square_test_detects_a_biased_sampler():
    rng = np.random.default_rng(0)
    cells = BATCH_SIZE * STARTS.size
    weights = np.ones(cells)
    weights[0] = 1.3  # one window drawn 30% too often
    draws = rng.choice(cells, size=DRAWS, p=weights / weights.sum())
    counts = np.bincount(draws, minlength=cells)
    assert chi_square_p_value(counts) < 1e-6
    assert chi_square_p_value(np.bincount(rng.integers(0, cells, DRAWS), minlength=cells)) > 1e-3


def chi_square_p_value_against(counts: np.ndarray, probabilities: np.ndarray) -> float:
    """P-value of counts under the given cell probabilities (cells of probability 0 must be empty)."""
    assert (counts[probabilities == 0] == 0).all(), "a cell of probability 0 was drawn"
    expected = counts.sum() * probabilities[probabilities > 0]
    statistic = float(((counts[probabilities > 0] - expected) ** 2 / expected).sum())
    return float(tf.math.igammac((expected.size - 1) / 2.0, statistic / 2.0))


PRIORITIZED = [name for name, kind in conftest.BUFFER_KINDS.items() if not kind.uniform]


@pytest.mark.parametrize("kind", PRIORITIZED)
@pytest.mark.parametrize("exponent", [0.0, 0.6, 1.0])
def test_window_starts_follow_priorities_before_and_after_updates(kind, exponent):
    tf.random.set_seed(20261123)
    rng = np.random.default_rng(20261123)
    buffer = conftest.make(kind, SPEC, BATCH_SIZE, MAX_LENGTH, seed=20261123, priority_exponent=exponent)
    fill(buffer, NUM_ADDS)
    # Stored adds 3..12; every frame's priority, by [segment, add - 3].
    priorities = np.ones([BATCH_SIZE, MAX_LENGTH])  # new frames: 1.0
    for _ in range(2):
        weights = np.where(priorities > 0, priorities**exponent, 0.0)[:, : STARTS.size]
        items, _ = buffer.get_next(sample_batch_size=DRAWS, num_steps=NUM_STEPS)
        counts = window_counts(np.asarray(items["step"]))
        assert chi_square_p_value_against(counts.ravel(), (weights / weights.sum()).ravel()) > 1e-3
        # Then new priorities for every stored frame, zeros and a wide range included.
        priorities = rng.choice([0.0, 0.1, 1.0, 3.0, 10.0], size=priorities.shape)
        adds = np.arange(3, 13)[None, :]
        ids = adds * BATCH_SIZE + np.arange(BATCH_SIZE)[:, None]
        assert int(buffer.update_priorities(ids.ravel(), priorities.ravel())) == 0


def test_the_priority_check_detects_a_sampler_off_by_one_window():
    rng = np.random.default_rng(1)
    weights = np.arange(1, BATCH_SIZE * STARTS.size + 1, dtype=np.float64) ** 0.6
    probabilities = weights / weights.sum()
    biased = probabilities.copy()
    biased[[0, -1]] = biased[[-1, 0]]  # the smallest and the largest priorities swapped
    draws = rng.choice(weights.size, size=DRAWS, p=biased)
    assert chi_square_p_value_against(np.bincount(draws, minlength=weights.size), probabilities) < 1e-6
    draws = rng.choice(weights.size, size=DRAWS, p=probabilities)
    assert chi_square_p_value_against(np.bincount(draws, minlength=weights.size), probabilities) > 1e-3
