"""A tile's kernel computed in blocks of examples whose arrays stay in a CPU core's cache.

The analytic kernels of images are memory-bound: every layer passes several times over arrays of
``b1 x b2`` example pairs times the positions (or pairs of positions) each pair holds: the
convolution's shifted sums, the nonlinearity's rule, the NTK's update. Once a tile's arrays outgrow
the cache, each pass goes to main memory. :func:`in_blocks` computes the tile in ``s1 x s2``
blocks of examples (as equal as they can be, :func:`balanced`) whose arrays fit in
:data:`BLOCK_BYTES`, one after another inside the tile's program (a ``lax`` loop), so the passes
stay in cache; each block is written into the tile as soon as it is computed. Data each block
needs of its examples alone (e.g. their covariances with themselves, ``2 / s`` of the pairs' work)
can be computed once per tile and handed to the blocks. With x2 = x1 only the blocks on and above
the diagonal are computed; the others are their transposes, and the diagonal blocks are
symmetrized, so the tile is exactly symmetric.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import jaxpr_as_fun

from .arrays import symmetrize

BLOCK_BYTES = 2 ** 21  # one block's arrays: a core's L2 cache or two (benchmarks/README.md)
LIVE_ARRAYS = 4  # kernel arrays alive at once in a layer's rule (NNGP, NTK, their inputs)
# Per-example data is shared by blocks of at most this many examples: a block of s computes it for
# 2s examples next to s^2 pairs, about 2 / (s + 2) of its work, less than the shared pass costs
# beyond this size.
SHARED_UP_TO = 64

TileFn = Callable[[Any, jax.Array, "jax.Array | None"], Any]
PerExample = Callable[[Any, jax.Array], Any]  # (args, examples (n, ...)) -> (n, ...) leaves


def block_size(pair_bytes: int) -> int:
    """Examples per block side, for ``pair_bytes`` bytes per example pair in one kernel array.

    Example:
        >>> block_size(4 * 256)   # float32, 16 x 16 images, same-position covariances
        22
    """
    return max(1, math.isqrt(BLOCK_BYTES // (pair_bytes * LIVE_ARRAYS)))


def balanced(n: int, size: int) -> int:
    """The side of the fewest blocks of at most ``size`` examples that cover ``n``, as equal as
    they can be: the last block is padded by less than one row per block (512 examples in
    blocks of at most 362: two of 256, not two of 362 with 212 rows of padding).

    Example:
        >>> balanced(512, 362), balanced(1000, 256), balanced(100, 256)
        (256, 250, 100)
    """
    count = -(-n // size)
    return -(-n // count)


def _blocks(a: jax.Array, size: int) -> jax.Array:
    """``(n, ...) -> (ceil(n / size), size, ...)``, the last block padded with the last row."""
    count = -(-a.shape[0] // size)
    a = jnp.concatenate([a, jnp.repeat(a[-1:], count * size - a.shape[0], axis=0)])
    return a.reshape(count, size, *a.shape[1:])


def _start(k: jax.Array, n: int, size: int) -> jax.Array:
    """The first row of block ``k`` of the blocks of ``size`` examples covering ``n`` in order:
    the last one ends at ``n`` (it overlaps the one before when ``size`` does not divide ``n``)."""
    return jnp.minimum(k * size, n - size)


def _steps(count1: int, count2: int | None) -> int:
    """The blocks one loop computes (see :func:`_following`): every pair of ``count1`` row and
    ``count2`` column blocks, or with ``count2`` None (x2 = x1) those on and above the diagonal."""
    return count1 * (count1 + 1) // 2 if count2 is None else count1 * count2


def _following(i: jax.Array, j: jax.Array, count1: int,
               count2: int | None) -> tuple[jax.Array, jax.Array]:
    """The block (row and column index) after block ``(i, j)`` in the loop's order, computed in the
    loop rather than read from tables (tables of every block would make the program grow with the
    square of the examples): every pair row by row, or with ``count2`` None (x2 = x1) the blocks
    above the diagonal row by row, starting at ``(0, 1)``, then the diagonal ones. After the last
    block, an index past the end (:func:`_start` clamps it to the last block)."""
    if count2 is not None:
        row_end = j + 1 == count2
        return jnp.where(row_end, i + 1, i), jnp.where(row_end, 0, j + 1)
    row_end, above = j + 1 == count1, i < j
    last_above = row_end & (i + 2 == count1)  # then the diagonal, from (0, 0)
    i_above = jnp.where(last_above, 0, jnp.where(row_end, i + 1, i))
    j_above = jnp.where(last_above, 0, jnp.where(row_end, i + 2, j + 1))
    return jnp.where(above, i_above, i + 1), jnp.where(above, j_above, j + 1)


def splits(a1: jax.Array, a2: jax.Array | None, pair_bytes: Callable[[jax.Array], int]) -> bool:
    """Whether :func:`in_blocks` computes the tile ``a1`` (x ``a2``; shapes and dtypes suffice)
    in more than one block."""
    return max(a1.shape[0], (a1 if a2 is None else a2).shape[0]) > block_size(pair_bytes(a1))


def _per_example_rows(per_example: PerExample, args, a: jax.Array, size: int):
    """``per_example(args, a)`` computed in blocks of ``size`` examples (the memory of one block):
    ``(n, ...)`` leaves."""
    out = jax.lax.map(lambda block: per_example(args, block), _blocks(a, size))
    return jax.tree.map(lambda leaf: leaf.reshape(-1, *leaf.shape[2:])[:a.shape[0]], out)


def _take(tree, start: jax.Array, size: int):
    """The ``size`` examples of each leaf of ``tree`` from ``start`` on."""
    return jax.tree.map(lambda leaf: jax.lax.dynamic_slice_in_dim(leaf, start, size), tree)


def _write(tile, leaves, i: jax.Array, j: jax.Array):
    """``tile`` with the block ``leaves`` written in place at rows ``i`` and columns ``j``."""
    rest = lambda leaf: (jnp.zeros_like(i),) * (leaf.ndim - 2)  # indices of one type
    return jax.tree.map(lambda t, leaf: jax.lax.dynamic_update_slice(
        t, leaf, (i, j, *rest(leaf))), tile, leaves)


def in_blocks(fn: Callable, pair_bytes: Callable[[jax.Array], int],
              perm: Callable[[int], tuple[int, ...]],
              per_example: PerExample | None = None) -> TileFn:
    """``fn(args, a1, a2)`` (a tile's kernel, ``(b1, b2, ...)`` leaves) computed in blocks of at
    most :func:`block_size` examples (:func:`balanced` per side), ``pair_bytes(a1)`` bytes per
    pair; ``perm(ndim)`` exchanges x1 and x2 in a leaf. Tiles no larger than a block are computed
    as they are; others (see :func:`splits`) in one loop that carries the tile and writes each
    block into it in place (no stacked copy of the blocks to assemble afterwards). A block is
    materialised before it is written: XLA would otherwise run its computation inside the
    in-place write, on one thread, and again, rounded differently, in its mirror and its
    symmetrization. The last block of a side ends at its last example, overlapping the one
    before it rather than padded.

    With ``a2=None`` the tile comes out exactly symmetric: the loop writes each block above the
    diagonal with its transpose, then the diagonal blocks symmetrized. Every write of an entry
    writes its mirror in the same step from the same block, except where a block above the
    diagonal overlaps its own transpose; those entries lie in a diagonal block, written after.

    With ``per_example``, data of each example alone, ``per_example(args, a)`` for examples ``a``
    (a pytree of ``(n, ...)`` arrays), is computed once per tile side (once with ``a2=None``),
    and each block is ``fn(args, a1, a2, (e1, e2))`` with its examples' rows ``e1`` and ``e2``,
    read into the loop's carry by the step before (read in the step that uses them, XLA would
    fuse the slicing into each elementwise pass over the pairs); blocks of more than
    :data:`SHARED_UP_TO` examples are ``fn(args, a1, a2)``.

    Example:
        >>> fn = lambda args, a1, a2: a1 @ (a1 if a2 is None else a2).T
        >>> blocked = in_blocks(fn, lambda a1: 2 ** 20, lambda ndim: (1, 0))
        >>> tile = blocked(None, jnp.ones((5, 3)), None)
        >>> tile.shape
        (5, 5)
    """

    def blocked(args, a1, a2):
        if not splits(a1, a2, pair_bytes):
            return fn(args, a1, a2)
        size = block_size(pair_bytes(a1))
        b = a1 if a2 is None else a2
        n1, n2 = a1.shape[0], b.shape[0]
        s1, s2 = balanced(n1, size), balanced(n2, size)
        count1, count2 = -(-n1 // s1), None if a2 is None else -(-n2 // s2)
        starts = lambda i, j: (_start(i, n1, s1), _start(j, n2, s2))
        shared = per_example is not None and max(s1, s2) <= SHARED_UP_TO
        e1 = _per_example_rows(per_example, args, a1, s1) if shared else None
        e2 = e1 if a2 is None or not shared else _per_example_rows(per_example, args, b, s2)
        known = lambda i, j: (_take(e1, i, s1), _take(e2, j, s2)) if shared else None

        def block(i, j, known_ij):
            x1, x2 = _take(a1, i, s1), _take(b, j, s2)
            return fn(args, x1, x2, known_ij) if shared else fn(args, x1, x2)

        # the block traced once, for the tile's shapes and the loop's body alike (tracing a deep
        # network's rules is most of a first call's tracing time; replaying the trace is quick)
        first = np.int32(0), np.int32(0 if a2 is not None else 1)  # the loop's first block
        traced, shapes = jax.make_jaxpr(block, return_shape=True)(
            *starts(*first), known(*starts(*first)))
        replay, out_tree = jaxpr_as_fun(traced), jax.tree.structure(shapes)
        traced_block = lambda i, j, known_ij: jax.tree.unflatten(
            out_tree, replay(i, j, *jax.tree.leaves(known_ij)))

        def step(carry, _):  # carry: the tile so far, block (i, j) and the data of its examples
            tile, i, j, known_ij = carry
            r, c = starts(i, j)
            out = jax.lax.optimization_barrier(traced_block(r, c, known_ij))
            if a2 is None:
                swap = lambda leaf: jnp.transpose(leaf, perm(leaf.ndim))
                out = jax.lax.cond(i == j, lambda o: jax.tree.map(
                    lambda leaf: symmetrize(leaf, perm(leaf.ndim)), o), lambda o: o, out)
                tile = _write(tile, jax.tree.map(swap, out), c, r)
            i_next, j_next = _following(i, j, count1, count2)
            return (_write(tile, out, r, c), i_next, j_next, known(*starts(i_next, j_next))), None

        empty = jax.tree.map(
            lambda leaf: jnp.zeros((n1, n2, *leaf.shape[2:]), leaf.dtype), shapes)
        (tile, *_), _ = jax.lax.scan(step, (empty, *first, known(*starts(*first))), None,
                                     length=_steps(count1, count2))
        return tile

    return blocked
