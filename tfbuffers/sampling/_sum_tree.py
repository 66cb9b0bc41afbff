"""A batched sum tree: priority updates and proportional draws in O(log n), written once for numpy and TensorFlow.

The tree is one `[2P, 2]` float64 array (P: the leaf count rounded up to a power
of two), a complete binary tree in heap order: node 1 is the root, node `i` has
children `2i` and `2i + 1`, leaf `j` is node `P + j`, node 0 is unused. Column
`SUM` of a node holds the sum of the leaf values below it, column `POSITIVE`
how many of those leaves are above 0 (exact: integers in float64). The TF
buffer keeps the same nodes in rows of 16 (`blocked`: `[2P / 16, 16, 2]`), and
reads them by node number through `Ops.nodes`.

Updates set leaves, then recompute every ancestor from its two children, level
by level (`depth` vectorised steps for a whole batch of leaves). A node so
recomputed depends only on the current leaves, not on the history of updates: no
rounding error accumulates, and each node is within `depth` float64 roundings
(about 1e-15 relative) of the exact sum. The numpy buffer defers the ancestors of
its adds' rows and recomputes them this way before the next draw or update. The
TF buffer's adds, where each op counts, add the change of their contiguous leaves
to every ancestor in one op (`add_block_variable`), at the price of float64
rounding carried in those sums (bounded below; counts stay exact).

A draw descends from the root, one vectorised step per level, towards the leaf
whose cumulative sum interval holds its target. Leaves can be masked for one
draw (a contiguous circular range of leaves, such as a ring's newest rows whose
windows would run past the newest frame): the descent subtracts the masked
leaves below each node from its sum and count. It steps into a child only if
that child has an unmasked positive leaf, counted exactly, so whatever the float
rounding of the sums, a draw always ends on an unmasked leaf above 0.

The numpy buffers run the descent and the recomputation of ancestors in numba's
compiled loops (`tfbuffers.sampling._tree_kernels`: `find_numpy`, `update_numpy`,
`recompute_ancestors_numpy`), one call each for a whole batch; the py prioritized
buffer's `get_next` and `update_priorities` run whole in one compiled call each
(`PrioritizedSampler._sample_compiled`, `update_stored`), the same draws as these steps. Where numba does not
import, they take vectorised numpy steps (`find_steps`, `recompute_steps`). In numpy
each call costs a microsecond or more whatever its size, so `find_steps` takes fewer,
larger steps: one running sum over a whole level near
the top (4096 nodes) and a `searchsorted` into it, then steps of 16 descendants
(four levels) per call. `draw_numpy` draws from the whole tree and draws again the few
draws that land in the mask (rejection: the kept draws follow the unmasked
leaves' proportions exactly), leaving any still masked after that to `find`.
In TensorFlow each op costs a few microseconds whatever its size, a gather about
as much per index as per row, and `find` runs some twenty ops per level:
`find_wide` takes the same few steps as `draw_numpy` for a draw from the whole
tree, four levels per step, each step one row of the blocked tree per draw (one
index, where the `[2P, 2]` layout took 16: half the cost of a prioritized
`get_next` on a 1M-frame buffer), and the TF sampler leaves a mask out by
rejection too (`tfbuffers.sampling`), with `find` for the draws that land in the
mask twice.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from tfbuffers import _xla

SUM, POSITIVE = 0, 1

_COMPILED: list[Any] = []  # the compiled loops, once looked up: [kernels or None]


def compiled() -> Any:
    """`tfbuffers.sampling._tree_kernels.KERNELS`: the compiled loops, or None (no numba); imported on first use."""
    if not _COMPILED:
        import tfbuffers.sampling._tree_kernels as _tree_kernels

        _COMPILED.append(_tree_kernels.KERNELS)
    return _COMPILED[0]


def leaf_count(capacity: int) -> int:
    """P: `capacity` rounded up to a power of two (at least 1)."""
    return 1 << max(capacity - 1, 0).bit_length()


def depth(capacity: int) -> int:
    """The number of levels below the root: log2(P)."""
    return leaf_count(capacity).bit_length() - 1


def empty(capacity: int) -> np.ndarray:
    """A tree of `capacity` leaves, all 0."""
    return np.zeros([2 * leaf_count(capacity), 2], np.float64)


def build(leaves: np.ndarray, capacity: int) -> np.ndarray:
    """The tree over `leaves` (`[capacity]` values >= 0), built bottom-up in one pass per level."""
    size = leaf_count(capacity)
    tree = empty(capacity)
    tree[size : size + capacity, SUM] = leaves
    tree[size : size + capacity, POSITIVE] = leaves > 0
    while size > 1:
        tree[size // 2 : size] = tree[size : 2 * size : 2] + tree[size + 1 : 2 * size : 2]
        size //= 2
    return tree


# The TF tree's nodes per row: a node's descendants four levels down fill one row (`find_wide`).
BLOCK = 16


def block(capacity: int) -> int:
    """The nodes per row of a TF tree of `capacity` leaves: `BLOCK`, or all `2P` of a smaller tree."""
    return min(BLOCK, 2 * leaf_count(capacity))


def blocked(tree: np.ndarray, capacity: int) -> np.ndarray:
    """`tree` (`[2P, 2]`) as the TF buffer keeps it: `[2P / block, block, 2]`, node `n` at `[n // block, n % block]`.

    A node's `BLOCK` descendants four levels down (nodes `[BLOCK n, BLOCK n + BLOCK)`) are row `n`:
    `find_wide` reads them with one index per draw rather than `BLOCK`, and TensorFlow's gather costs
    about as much per index as per row.
    """
    return tree.reshape(-1, block(capacity), 2)


def _tf_nodes(tree: Any, nodes: Any) -> tf.Tensor:
    """`[..., 2]`: the (sum, positive count) of `nodes` (int64, any shape) of a blocked tree (`blocked`)."""
    return tf.gather_nd(_gatherable(tree), _positions(tree, nodes))


def _gatherable(tree: Any) -> Any:
    """`tree` as `tf.gather_nd` takes it: a variable's value in an XLA program, which has no `ResourceGatherNd`.

    (There the program reads its variables in place: the value is no copy.)
    """
    return tree.value() if isinstance(tree, tf.Variable) and _xla.compiling() else tree


def _positions(tree: Any, nodes: Any) -> tf.Tensor:
    """`[..., 2]`: the (row, column) of `nodes` in a blocked tree, for `gather_nd` and `scatter_nd_*`."""
    width = tree.shape[1]
    return tf.stack([nodes // width, nodes % width], -1)


class Ops(NamedTuple):
    """The array functions the tree needs, for one backend."""

    gather: Any  # (array, indices) -> array[indices]
    nodes: Any  # (tree, nodes) -> [..., 2]: the nodes' (sum, count), whatever the tree's layout (`blocked`)
    flat: Any  # (tree) -> [2P, 2]: every node (TensorFlow: read whole)
    where: Any
    minimum: Any
    maximum: Any
    arange: Any  # (n) -> int64 [0, n)
    int64: Any  # (bool or int array) -> int64
    roots: Any  # (targets) -> int64 ones shaped like the targets: node 1 for each
    cumsum0: Any  # (values [K, 2]) -> [K + 1, 2]: a row of zeros, then the running sums
    last_of_each: Any  # (leaves, values) -> each leaf once, with its last value (later updates win)
    scatter_add: Any  # (target, indices, values) -> target[indices] += values, repeats summed (in place, or an op)


def _np_last_of_each(leaves: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    unique, first_in_reversed = np.unique(leaves[::-1], return_index=True)
    return unique, values[::-1][first_in_reversed]


def _tf_last_of_each(leaves: tf.Tensor, values: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    unique, index = tf.unique(leaves)
    last = tf.math.unsorted_segment_max(tf.range(tf.size(leaves)), index, tf.size(unique))
    return unique, tf.gather(values, last)


NUMPY = Ops(
    gather=lambda array, indices: array[indices],
    nodes=lambda tree, nodes: tree[nodes],
    flat=lambda tree: tree,
    where=np.where,
    minimum=np.minimum,
    maximum=np.maximum,
    arange=lambda n: np.arange(n, dtype=np.int64),
    int64=lambda x: np.asarray(x, np.int64),
    roots=lambda targets: np.ones(np.shape(targets), np.int64),
    cumsum0=lambda values: np.concatenate([np.zeros([1, 2]), np.cumsum(values, axis=0)]),
    last_of_each=_np_last_of_each,
    scatter_add=np.add.at,
)

TENSORFLOW = Ops(
    gather=tf.gather,
    nodes=_tf_nodes,
    flat=lambda tree: tf.reshape(tree, [-1, 2]),
    where=tf.where,
    minimum=tf.minimum,
    maximum=tf.maximum,
    arange=lambda n: tf.range(tf.cast(n, tf.int64), dtype=tf.int64),
    int64=lambda x: tf.cast(x, tf.int64),
    roots=lambda targets: tf.ones_like(targets, tf.int64),
    cumsum0=lambda values: tf.concat([tf.zeros([1, 2], tf.float64), tf.cumsum(values, axis=0)], 0),
    last_of_each=_tf_last_of_each,
    scatter_add=lambda target, indices, values: target.scatter_add(tf.IndexedSlices(values, indices)),
)


class Mask(NamedTuple):
    """Leaves `[start, start + length)` modulo `capacity`, left out of one draw, and their running sums."""

    start: Any
    length: Any
    capacity: int
    running: Any  # [length + 1, 2]: cumsum0 of the masked leaves' (value, positive), in circular order

    def below(self, ops: Ops, low: Any, high: Any) -> Any:
        """`[..., 2]`: the masked (sum, positive count) among leaves `[low, high)`."""
        first = ops.minimum(self.length, self.capacity - self.start)  # masked leaves before the wrap
        # The masked range is [start, start + first) then [0, length - first).
        begin = ops.minimum(ops.maximum(low - self.start, 0), first)
        end = ops.minimum(ops.maximum(high - self.start, 0), first)
        wrapped_begin = first + ops.minimum(ops.maximum(low, 0), self.length - first)
        wrapped_end = first + ops.minimum(ops.maximum(high, 0), self.length - first)
        running = self.running
        return (
            ops.gather(running, end)
            - ops.gather(running, begin)
            + ops.gather(running, wrapped_end)
            - ops.gather(running, wrapped_begin)
        )


def mask(ops: Ops, tree: Any, capacity: int, start: Any, length: Any) -> Mask:
    """Masks leaves `[start, start + length)` modulo `capacity` (`0 <= start < capacity`, `length <= capacity`)."""
    leaves = (start + ops.arange(length)) % capacity
    values = ops.nodes(tree, leaf_count(capacity) + leaves)
    return Mask(start, length, capacity, ops.cumsum0(values))


def unmasked_total(ops: Ops, tree: Any, leaf_mask: Mask | None) -> tuple[Any, Any]:
    """(sum, positive count) of the unmasked leaves: the root's less the mask's."""
    root = ops.nodes(tree, 1)
    if leaf_mask is None:
        return root[SUM], root[POSITIVE]
    masked = ops.gather(leaf_mask.running, leaf_mask.length)
    return root[SUM] - masked[SUM], root[POSITIVE] - masked[POSITIVE]


def find(ops: Ops, tree: Any, capacity: int, targets: Any, leaf_mask: Mask | None) -> Any:
    """The leaves whose cumulative-sum intervals (over unmasked leaves) hold `targets`.

    Args:
      ops: The backend.
      tree: The tree array (or a tf.Variable).
      capacity: The leaf count the tree was made for.
      targets: float64, any shape, each in `[0, unmasked sum)`.
      leaf_mask: Leaves to leave out, or None.

    Returns:
      int64 leaf indices shaped like `targets`, each an unmasked leaf above 0,
      provided one exists (`unmasked_total`'s count > 0).
    """
    size = leaf_count(capacity)
    nodes = ops.roots(targets)
    remaining = targets
    pair = ops.arange(2)
    # The masked (sum, count) below the current node: the whole mask's at the root, then carried down, so
    # that each level computes the left child's alone (the right child's is the rest).
    masked = None if leaf_mask is None else ops.gather(leaf_mask.running, leaf_mask.length)
    span = size
    for _ in range(depth(capacity)):
        span //= 2
        children = ops.nodes(tree, 2 * nodes[..., None] + pair)  # [..., 2 children, 2 columns]
        left, right = children[..., 0, :], children[..., 1, :]
        if leaf_mask is not None:
            low = (2 * nodes - (size // span)) * span  # the left child's first leaf
            masked_left = leaf_mask.below(ops, low, low + span)
            masked_right = masked - masked_left
            left, right = left - masked_left, right - masked_right
        go_right = (right[..., POSITIVE] > 0) & ((left[..., POSITIVE] <= 0) | (remaining >= left[..., SUM]))
        remaining = ops.where(go_right, ops.maximum(remaining - left[..., SUM], 0.0), remaining)
        nodes = 2 * nodes + ops.int64(go_right)
        if leaf_mask is not None:
            masked = ops.where(go_right[..., None], masked_right, masked_left)
    return nodes - size


def update_numpy(
    tree: np.ndarray, capacity: int, leaves: np.ndarray, values: np.ndarray, *, distinct: bool = False
) -> None:
    """Sets `leaves` (int64, 1-D; a repeated leaf takes its last value) to `values` (float64 >= 0), in place.

    `distinct=True` skips making repeated leaves take their last value (for leaves known distinct).
    """
    if not distinct:
        leaves, values = NUMPY.last_of_each(leaves, values)
    kernels = compiled()
    if kernels is None:
        set_leaves_numpy(tree, capacity, leaves, values)
        recompute_steps(tree, capacity, leaves)
    else:
        kernels.update(
            tree, depth(capacity), np.ascontiguousarray(leaves, np.int64), np.ascontiguousarray(values, np.float64)
        )


def set_leaves_numpy(tree: np.ndarray, capacity: int, leaves: Any, values: np.ndarray) -> None:
    """Sets the leaves alone (distinct indices, or a slice); their ancestors are stale until recomputed."""
    if isinstance(leaves, slice):
        size = leaf_count(capacity)
        nodes: Any = slice(size + leaves.start, size + leaves.stop)
    else:
        nodes = leaf_count(capacity) + leaves
    tree[nodes, SUM] = values
    tree[nodes, POSITIVE] = values > 0


def recompute_ancestors_numpy(tree: np.ndarray, capacity: int, leaves: np.ndarray) -> None:
    """Recomputes every ancestor of `leaves` from its two children, in place: compiled, or `recompute_steps`."""
    kernels = compiled()
    if kernels is None:
        recompute_steps(tree, capacity, leaves)
    else:
        kernels.recompute(tree, depth(capacity), np.ascontiguousarray(leaves, np.int64))


def recompute_steps(tree: np.ndarray, capacity: int, leaves: np.ndarray) -> None:
    """`recompute_ancestors_numpy` in vectorised numpy steps, level by level.

    Levels with many nodes recompute the listed ones; once a level has few nodes beside the
    list, it and every level above are recomputed whole, from contiguous slices (cheaper per node).
    """
    pairs = tree.reshape(-1, 4)  # row n: node 2n's (sum, count), then node 2n + 1's
    nodes = (leaf_count(capacity) + leaves) // 2
    for level in range(depth(capacity) - 1, -1, -1):
        if 1 << level <= _WHOLE_LEVEL_PER_NODE * nodes.size:
            for upper in range(level, -1, -1):
                first, end = 1 << upper, 2 << upper
                np.add(pairs[first:end, :2], pairs[first:end, 2:], out=tree[first:end])
            return
        if nodes.size > _UNIQUE_ABOVE:  # many leaves (a refresh of many adds): each level's work halves
            nodes = np.unique(nodes)
        # A node listed twice is written twice with the same sum: cheaper than sorting a small batch.
        children = pairs.take(nodes, axis=0)  # `take`: a fraction of fancy indexing's fixed cost
        tree[nodes] = children[:, :2] + children[:, 2:]
        nodes = nodes >> 1


# Above this many nodes, a level's nodes are made distinct before they are recomputed.
_UNIQUE_ABOVE = 4096
# A level with at most this many nodes per listed node is recomputed whole.
_WHOLE_LEVEL_PER_NODE = 4
# `draw_numpy`: the level read whole by one running sum, the levels per later step, and the rejection rounds.
_TOP_LEVEL = 12
_LEVELS_PER_STEP = 4
_REDRAWS = 2


def find_numpy(tree: np.ndarray, capacity: int, targets: np.ndarray) -> np.ndarray:
    """`find` with no mask, in numpy: `targets` (float64, 1-D) each in `[0, root sum)`; compiled, or `find_steps`.

    Both end each draw on a leaf above 0 whatever the rounding of the sums. They take the
    same leaf for a target, but where the sums' rounding puts a target on the edge between
    two leaves (within about 1e-15 of the root's sum).
    """
    kernels = compiled()
    if kernels is None:
        return find_steps(tree, capacity, targets)
    leaves = np.empty(targets.size, np.int64)
    kernels.find(tree, depth(capacity), np.ascontiguousarray(targets, np.float64), leaves)
    return leaves


def find_steps(
    tree: np.ndarray,
    capacity: int,
    targets: np.ndarray,
    *,
    top_level: int = _TOP_LEVEL,
    levels_per_step: int = _LEVELS_PER_STEP,
) -> np.ndarray:
    """`find_numpy` in few vectorised numpy calls.

    The first step takes the running sum of every node `top_level` levels down
    and a `searchsorted` into it; each later step, the running sums of the
    current nodes' descendants `levels_per_step` levels down. A step goes into
    the first node whose running sum exceeds the target (the target first
    lowered below the last running sum, should rounding have put it at or
    above it): that node's own sum is above 0, so every draw ends on a leaf above
    0 whatever the rounding. Targets at or past the root's sum get the last leaf
    above 0.
    """
    size, levels = leaf_count(capacity), depth(capacity)
    top = min(top_level, levels)
    running = np.cumsum(tree[1 << top : 2 << top, SUM])
    remaining = np.minimum(targets, np.nextafter(running[-1], 0.0))
    index = np.searchsorted(running, remaining, side="right")
    remaining = remaining - np.concatenate([[0.0], running]).take(index)
    nodes = (1 << top) + index
    rows = np.arange(targets.size)
    while top < levels:
        step = min(levels_per_step, levels - top)
        width = 1 << step  # the descendants `step` levels down: nodes `[node * width, node * width + width)`
        running = np.cumsum(tree.reshape(-1, 2 * width).take(nodes, axis=0)[:, SUM::2], axis=1)
        remaining = np.minimum(remaining, np.nextafter(running[:, -1], 0.0))
        index = np.count_nonzero(running[:, :-1] <= remaining[:, None], axis=1)
        before = np.concatenate([np.zeros([targets.size, 1]), running], 1).take(rows * (width + 1) + index)
        remaining = remaining - before
        nodes = nodes * width + index
        top += step
    return nodes - size


# `find_wide`: the level read whole first (at least 1024 nodes), then four levels per step (a row of 16).
_TF_TOP_LEVEL = 10
_TINY = float(np.finfo(np.float64).tiny)
# `[BLOCK, BLOCK]` ones on and above the diagonal: a row times it is the row's running sums, in one matmul (a
# cumsum along a short axis costs several times more). Every column sums its terms in the same order, the terms
# it leaves out adding exact zeros, so the running sums never decrease and a node of weight 0 repeats the sum
# before it exactly, as a cumsum's would.
_RUNNING = np.triu(np.ones([BLOCK, BLOCK]))


def find_wide(tree: Any, capacity: int, targets: tf.Tensor, *, top_level: int = _TF_TOP_LEVEL) -> tf.Tensor:
    """`find` with no mask on a blocked tree (`blocked`), in few ops: `targets` (float64, any shape) in `[0, root sum)`.

    As `find_numpy`: a running sum over a whole level near the top (the first at or
    below `top_level` from which steps of four levels reach the leaves), then steps
    of four levels, each reading the current node's 16 descendants (one row of the
    blocked tree, one index per draw), their running sums and a `searchsorted`:
    about 15 ops per step rather than 20 per level. The TF buffer's adds carry
    rounding in the ancestors' sums (`add_block_variable`), so a step weighs a node
    by its sum only where its exact count of leaves above 0 is not 0 (and by at
    least the smallest float there): every draw still ends on a leaf above 0. A
    tree with none (all 0, or read torn by a concurrent clear) still gives leaves
    within the tree.
    """
    size, levels, width = leaf_count(capacity), depth(capacity), tree.shape[1]
    top = min(top_level, levels)
    top += (levels - top) % 4  # steps of four levels from there reach the leaves exactly
    first, last = 1 << top, 2 << top
    rows = tf.gather(tree, tf.range(first // width, max(last // width, 1), dtype=tf.int64))
    weights = _drawable(tf.reshape(rows, [-1, 2])[first % width : first % width + first])  # [W], the same for all
    running = tf.cumsum(weights)
    remaining = tf.minimum(tf.reshape(targets, [1, -1]), _below(running[-1:]))
    index = tf.minimum(tf.searchsorted(running[None], remaining, side="right", out_type=tf.int64)[0], first - 1)
    remaining = tf.maximum(remaining[0] - tf.gather(running - weights, index), 0.0)[:, None]
    nodes = first + index  # [targets]
    for _ in range((levels - top) // 4):  # the tree has rows of BLOCK nodes here (2P >= 32)
        weights = _drawable(tf.gather(tree, nodes))  # [targets, BLOCK]: the nodes' descendants four levels down
        running = tf.matmul(weights, _RUNNING)
        remaining = tf.minimum(remaining, _below(running[:, -1:]))
        index = tf.minimum(tf.searchsorted(running, remaining, side="right", out_type=tf.int64), BLOCK - 1)
        remaining = tf.maximum(remaining - tf.gather(running - weights, index, batch_dims=1), 0.0)
        nodes = nodes * BLOCK + index[:, 0]
    return tf.reshape(nodes - size, tf.shape(targets, out_type=tf.int64))


def _drawable(nodes: tf.Tensor) -> tf.Tensor:
    """`[..., 2]` nodes -> their weights in a draw: the sum (at least `_TINY`) if a leaf below is above 0, else 0."""
    return tf.where(nodes[..., POSITIVE] > 0, tf.maximum(nodes[..., SUM], _TINY), 0.0)


def _below(x: tf.Tensor) -> tf.Tensor:
    """The float64 just below `x` (towards 0)."""
    return tf.math.nextafter(x, tf.zeros_like(x))


def draw_numpy(tree: np.ndarray, capacity: int, uniforms: Any, shape: list[int], leaf_mask: Mask | None) -> np.ndarray:
    """Leaves drawn in proportion to their values, none masked: `uniforms(n)` gives n floats in `[0, 1)`.

    The tree must have an unmasked leaf above 0 (`unmasked_total`'s count > 0).
    """
    count = int(np.prod(shape, dtype=np.int64))
    leaves = find_numpy(tree, capacity, uniforms(count) * tree[1, SUM])
    if leaf_mask is not None:
        redraw_masked(tree, capacity, uniforms, leaves, leaf_mask)
    return leaves.reshape(shape)


def redraw_masked(tree: np.ndarray, capacity: int, uniforms: Any, leaves: np.ndarray, leaf_mask: Mask) -> None:
    """Draws again, in place, the `leaves` (1-D) that lie in `leaf_mask`: `draw_numpy`'s rejection rounds.

    Twice over the whole tree, then any still masked by the descent that leaves the mask out.
    """
    root = tree[1, SUM]
    for round_ in range(_REDRAWS + 1):
        masked = np.flatnonzero((leaves - leaf_mask.start) % capacity < leaf_mask.length)
        if not masked.size:
            return
        if round_ < _REDRAWS:
            leaves[masked] = find_numpy(tree, capacity, uniforms(masked.size) * root)
        else:  # the mask holds most of the weight: descend around it
            total, _ = unmasked_total(NUMPY, tree, leaf_mask)
            leaves[masked] = find(NUMPY, tree, capacity, uniforms(masked.size) * total, leaf_mask)


def update_variable(
    tree: tf.Variable, capacity: int, leaves: tf.Tensor, values: tf.Tensor, *, distinct: bool = False
) -> tf.Operation:
    """As `update_numpy`, on a blocked float64 variable (`blocked`): one scatter for the leaves, one per level above.

    `distinct=True` skips making repeated leaves take their last value (for leaves known distinct).
    """
    if not distinct:
        leaves, values = TENSORFLOW.last_of_each(leaves, values)
    nodes = leaf_count(capacity) + leaves
    update = tree.scatter_nd_update(_positions(tree, nodes), tf.stack([values, tf.cast(values > 0, tf.float64)], -1))
    for _ in range(depth(capacity)):
        nodes = nodes // 2
        with tf.control_dependencies([update]):
            children = _tf_nodes(tree, tf.stack([2 * nodes, 2 * nodes + 1], -1))
        update = tree.scatter_nd_update(_positions(tree, nodes), tf.reduce_sum(children, 1))
    return update


def add_block_variable(tree: tf.Variable, capacity: int, leaves: tf.Tensor, values: tf.Tensor) -> tf.Operation:
    """Sets `leaves` (int64, 1-D, distinct: an add's block of rows) to `values`; adds the change to their ancestors.

    Three reads and writes whatever the depth (a gather, a scatter of the leaves, one scatter-add to every
    ancestor of every leaf, repeats summed), for an add's block of rows. The ancestors' sums then carry the
    float64 rounding of each addition (relative 1e-16 per add, about 1e-11 after a billion adds if the
    roundings do not cancel); their positive counts stay exact. A restore or clear rebuilds them from the
    leaves, and `update_variable` recomputes the ancestors it touches from their children.
    """
    levels = depth(capacity)
    # Each leaf's node and its ancestors, `[levels + 1, leaves]` (row i: i levels up), as (row, column) of the tree.
    path = (leaf_count(capacity) + leaves)[None, :] // tf.constant(2 ** np.arange(levels + 1), tf.int64)[:, None]
    positions = _positions(tree, path)
    at_leaves = positions[0]
    old = tf.gather_nd(_gatherable(tree), at_leaves)
    new = tf.stack([values, tf.cast(values > 0, tf.float64)], -1)
    with tf.control_dependencies([old]):
        written = tree.scatter_nd_update(at_leaves, new)
    if levels == 0:
        return written
    with tf.control_dependencies([written]):  # one update per ancestor of each leaf, repeats summed
        return tree.scatter_nd_add(positions[1:], tf.broadcast_to(new - old, [levels, *leaves.shape, 2]))
