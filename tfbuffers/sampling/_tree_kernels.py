"""Compiled (numba) loops for the numpy sum tree: a draw's descent and the recomputation of ancestors.

And the py prioritized buffer's two hot calls whole (`draw_windows`, `update_stored`): a `get_next` and an
`update_priorities` of 256 are each a few dozen numpy calls of a few microseconds on 256 numbers; compiled,
one call each.

`tfbuffers.sampling._sum_tree` calls these where numba imports, and its vectorised numpy
steps where it does not (or where `TFBUFFERS_NUMBA=0` is set). Both compute the same
thing: the same leaf for the same target (the descent steps into a child only if
it holds a leaf above 0, counted exactly, as `_sum_tree.find` does), and the same
ancestors (each recomputed from its two children, so no rounding accumulates).

A numpy step costs a microsecond or more whatever its size, and a descent or a
recomputation is `log2(capacity)` dependent steps: about 25 calls each, however
they are grouped. A compiled loop costs one call, then a few nanoseconds per
node: the whole descent of 256 draws through 20 levels is some 5,000 node reads.

The loops are compiled when this module is first imported (by the first py
prioritized buffer made in a process: about two seconds), and cached beside it (or
in numba's user-wide cache where the package's directory cannot be written), so
later processes load them in a fraction of that.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import numpy as np

ENVIRONMENT_VARIABLE = "TFBUFFERS_NUMBA"
"""Set to `0` to use the numpy steps even where numba imports."""


def _numba() -> Any:
    """numba, or None where it cannot be imported or is switched off."""
    if os.environ.get(ENVIRONMENT_VARIABLE, "1") == "0":
        return None
    try:
        import numba
    except ImportError:
        return None
    return numba


_NUMBA = _numba()
_jit = _NUMBA.njit(cache=True, nogil=True, boundscheck=False) if _NUMBA is not None else (lambda fn: fn)


@_jit
def find(tree: np.ndarray, levels: int, targets: np.ndarray, out: np.ndarray) -> None:
    # tree: [2P, 2] float64 (sum, count of leaves above 0); out[i]: the leaf holding targets[i]. Level by
    # level across all draws: a level's reads do not wait on each other, so the memory system overlaps
    # them (the lower levels miss every cache on a large tree).
    remaining = targets.copy()
    nodes = np.ones(targets.shape[0], np.int64)
    for _ in range(levels):
        for i in range(targets.shape[0]):
            left = 2 * nodes[i]
            left_sum = tree[left, 0]
            if tree[left + 1, 1] > 0 and (tree[left, 1] <= 0 or remaining[i] >= left_sum):
                remaining[i] = max(remaining[i] - left_sum, 0.0)
                nodes[i] = left + 1
            else:
                nodes[i] = left
    for i in range(targets.shape[0]):
        out[i] = nodes[i] - (1 << levels)


@_jit
def recompute(tree: np.ndarray, levels: int, leaves: np.ndarray) -> None:
    # Every ancestor of `leaves` recomputed from its children: leaf by leaf up to the root, or the whole
    # tree level by level where that reads fewer nodes.
    size = 1 << levels
    if leaves.shape[0] * levels >= size:
        for node in range(size - 1, 0, -1):
            tree[node, 0] = tree[2 * node, 0] + tree[2 * node + 1, 0]
            tree[node, 1] = tree[2 * node, 1] + tree[2 * node + 1, 1]
        return
    for i in range(leaves.shape[0]):
        node = (size + leaves[i]) >> 1
        while node >= 1:
            tree[node, 0] = tree[2 * node, 0] + tree[2 * node + 1, 0]
            tree[node, 1] = tree[2 * node, 1] + tree[2 * node + 1, 1]
            node >>= 1


@_jit
def update(tree: np.ndarray, levels: int, leaves: np.ndarray, values: np.ndarray) -> None:
    # Sets distinct `leaves` to `values` (sum and count), then recomputes their ancestors.
    size = 1 << levels
    for i in range(leaves.shape[0]):
        tree[size + leaves[i], 0] = values[i]
        tree[size + leaves[i], 1] = 1.0 if values[i] > 0 else 0.0
    recompute(tree, levels, leaves)


@_jit
def masked_totals(tree: np.ndarray, levels: int, start: int, length: int, capacity: int) -> tuple[float, float]:
    # (sum, positive count) of leaves [start, start + length) modulo capacity, summed in that order (as
    # `_sum_tree.mask`'s running sums are).
    size = 1 << levels
    total = 0.0
    positive = 0.0
    for k in range(length):
        leaf = size + (start + k) % capacity
        total += tree[leaf, 0]
        positive += tree[leaf, 1]
    return total, positive


@_jit
def draw_windows(
    tree: np.ndarray,
    levels: int,
    targets: np.ndarray,
    mask_start: int,
    mask_length: int,
    first_add: int,
    max_length: int,
    batch_size: int,
    leaves: np.ndarray,
    weights: np.ndarray,
    ids: np.ndarray,
    rows: np.ndarray,
) -> int:
    # One descent per target (`find`), each leaf within the ring's rows; its weight; the ids and rows of the
    # window of `ids.shape[1]` frames it starts (`_ring.ids_of_rows`, `window_ids_and_rows`, for a ring whose
    # oldest stored add is `first_add`). Returns how many leaves lie in the mask: the caller draws those again.
    capacity = max_length * batch_size
    find(tree, levels, targets, leaves)
    size = 1 << levels
    masked = 0
    for i in range(targets.shape[0]):
        leaf = min(leaves[i], capacity - 1)
        leaves[i] = leaf
        if (leaf - mask_start) % capacity < mask_length:
            masked += 1
        weights[i] = tree[size + leaf, 0]
        add = first_add + (leaf // batch_size - first_add % max_length) % max_length
        first = add * batch_size + leaf % batch_size
        for step in range(ids.shape[1]):
            ids[i, step] = first + step * batch_size
            rows[i, step] = ids[i, step] % capacity
    return masked


@_jit
def update_stored(
    tree: np.ndarray,
    levels: int,
    values: np.ndarray,
    ids: np.ndarray,
    priorities: np.ndarray,
    weights: np.ndarray,
    first_add: int,
    max_length: int,
    batch_size: int,
) -> tuple[int, float]:
    # `update_priorities` of checked `ids` (each below the next id): the frames still stored (adds from
    # `first_add` on) get their priority and leaf weight, in order (an id given twice takes its last), then
    # the ancestors of those leaves are recomputed. Returns (how many were skipped, the largest priority they
    # now have; 0.0 if none).
    size = 1 << levels
    capacity = max_length * batch_size
    kept = np.empty(ids.shape[0], np.int64)
    count = 0
    largest = 0.0
    for i in range(ids.shape[0]):
        if ids[i] // batch_size < first_add:
            continue
        row = ids[i] % capacity
        values[row] = priorities[i]
        tree[size + row, 0] = weights[i]
        tree[size + row, 1] = 1.0 if weights[i] > 0 else 0.0
        kept[count] = row
        count += 1
    for j in range(count):  # each row's last priority
        largest = max(largest, values[kept[j]])
    recompute(tree, levels, kept[:count])
    return ids.shape[0] - count, largest


class Kernels(NamedTuple):
    """The compiled loops."""

    find: Any
    recompute: Any
    update: Any
    masked_totals: Any
    draw_windows: Any
    update_stored: Any


def _load() -> Kernels | None:
    """The compiled functions, each compiled (or loaded from the cache) now on a tree of 4 leaves; or None."""
    if _NUMBA is None:
        return None
    tree = np.zeros([8, 2])
    update(tree, 2, np.arange(4, dtype=np.int64), np.ones(4))
    recompute(tree, 2, np.zeros(1, np.int64))
    find(tree, 2, np.zeros(1), np.zeros(1, np.int64))
    masked_totals(tree, 2, 0, 1, 4)
    one = np.zeros(1, np.int64)
    draw_windows(
        tree, 2, np.zeros(1), 0, 0, 0, 4, 1, one, np.zeros(1), np.zeros([1, 2], np.int64), np.zeros([1, 2], np.int64)
    )
    update_stored(tree, 2, np.zeros(4), one, np.ones(1), np.ones(1), 0, 4, 1)
    return Kernels(find, recompute, update, masked_totals, draw_windows, update_stored)


KERNELS = _load()
"""The compiled loops (`Kernels`), or None where numba is not used."""
