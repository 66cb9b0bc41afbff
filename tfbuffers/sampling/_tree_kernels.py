"""Compiled (numba) loops for the numpy sum tree: a draw's descent and the recomputation of ancestors.

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
from typing import Any

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


def _load() -> Any:
    """The compiled functions, each compiled (or loaded from the cache) now on a tree of 4 leaves; or None."""
    if _NUMBA is None:
        return None
    tree = np.zeros([8, 2])
    update(tree, 2, np.arange(4, dtype=np.int64), np.ones(4))
    recompute(tree, 2, np.zeros(1, np.int64))
    find(tree, 2, np.zeros(1), np.zeros(1, np.int64))
    return find, recompute, update


KERNELS = _load()
"""`(find, recompute, update)`, compiled, or None where numba is not used."""
