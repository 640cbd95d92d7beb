"""A tile's kernel computed in blocks of examples whose arrays stay in a CPU core's cache.

The analytic kernels of images are memory-bound: every layer passes several times over arrays of
``b1 x b2`` example pairs times the positions (or pairs of positions) each pair holds: the
convolution's shifted sums, the nonlinearity's rule, the NTK's update. Once a tile's arrays outgrow
the cache, each pass goes to main memory. :func:`in_blocks` computes the tile in ``s1 x s2``
blocks of examples (as equal as they can be, :func:`balanced`) whose arrays fit in
:data:`BLOCK_BYTES`, one after another inside the tile's program (a ``lax`` loop), so the passes
stay in cache. Data each block needs of its examples alone (e.g. their covariances with
themselves, ``2 / s`` of the pairs' work) can be computed once per tile and handed to the blocks.
With x2 = x1 only the blocks on and above the diagonal are computed; the others are their
transposes, and the diagonal blocks are symmetrized, so the tile is exactly symmetric.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

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


def _assemble(grid: jax.Array, n1: int, n2: int) -> jax.Array:
    """``(nb1, nb2, s1, s2, ...) -> (n1, n2, ...)``: the blocks side by side, padding cut."""
    nb1, nb2, s1, s2, *rest = grid.shape
    tile = jnp.swapaxes(grid, 1, 2).reshape(nb1 * s1, nb2 * s2, *rest)
    return tile[:n1, :n2]


def splits(a1: jax.Array, a2: jax.Array | None, pair_bytes: Callable[[jax.Array], int]) -> bool:
    """Whether :func:`in_blocks` computes the tile ``a1`` (x ``a2``; shapes and dtypes suffice)
    in more than one block."""
    return max(a1.shape[0], (a1 if a2 is None else a2).shape[0]) > block_size(pair_bytes(a1))


def _map_blocks(fn: Callable, args, b1: jax.Array, b2: jax.Array, rows: np.ndarray,
                cols: np.ndarray, per_example: PerExample | None):
    """``fn`` of the blocks ``b1[rows[k]]`` and ``b2[cols[k]]`` (of ``(nb, s, ...)`` inputs) for
    each ``k``, one after another: ``(len(rows), s1, s2, ...)`` leaves.

    With ``per_example`` and blocks of at most :data:`SHARED_UP_TO` examples, its data is computed
    here once per side (once if ``b2`` is ``b1``), block by block, and each step reads the next
    block's rows into the loop's carry: read in the step that uses them, XLA would fuse the
    slicing into each elementwise pass over the pairs that reads them.
    """
    if per_example is None or max(b1.shape[1], b2.shape[1]) > SHARED_UP_TO:
        return jax.lax.map(lambda ij: fn(args, b1[ij[0]], b2[ij[1]]), (rows, cols))
    each = lambda b: jax.lax.map(lambda block: per_example(args, block), b)
    e1 = each(b1)
    e2 = e1 if b2 is b1 else each(b2)
    pick = lambda e, i: jax.tree.map(lambda leaf: leaf[i], e)
    known = lambda i, j: (pick(e1, i), pick(e2, j))

    def step(carry, ij):  # carry: the data of block ij, read by the step before
        i, j, i_next, j_next = ij
        return known(i_next, j_next), fn(args, b1[i], b2[j], carry)

    ahead = lambda r: np.roll(r, -1)
    _, out = jax.lax.scan(step, known(rows[0], cols[0]), (rows, cols, ahead(rows), ahead(cols)))
    return out


def in_blocks(fn: Callable, pair_bytes: Callable[[jax.Array], int],
              perm: Callable[[int], tuple[int, ...]],
              per_example: PerExample | None = None) -> TileFn:
    """``fn(args, a1, a2)`` (a tile's kernel, ``(b1, b2, ...)`` leaves) computed in blocks of at
    most :func:`block_size` examples (:func:`balanced` per side), ``pair_bytes(a1)`` bytes per
    pair; ``perm(ndim)`` exchanges x1 and x2 in a leaf. Tiles no larger than a block are computed
    as they are; others (see :func:`splits`) with ``a2=None`` come out exactly symmetric: the
    blocks below the diagonal are the transposes of those above, and the diagonal blocks are
    symmetrized after the loop, from its stored output (XLA cannot fuse the two sides'
    computations into one expression).

    With ``per_example``, data of each example alone, ``per_example(args, a)`` for examples ``a``
    (a pytree of ``(n, ...)`` arrays), is computed once per tile side (once with ``a2=None``),
    and each block is ``fn(args, a1, a2, (e1, e2))`` with its examples' rows ``e1`` and ``e2``;
    blocks of more than :data:`SHARED_UP_TO` examples are ``fn(args, a1, a2)``.

    Example:
        >>> fn = lambda args, a1, a2: a1 @ (a1 if a2 is None else a2).T
        >>> blocked = in_blocks(fn, lambda a1: 2 ** 20, lambda ndim: (1, 0))
        >>> tile = blocked(None, jnp.ones((5, 3)), None)
        >>> tile.shape
        (5, 5)
    """

    def blocked(args, a1, a2):
        size = block_size(pair_bytes(a1))
        n1, n2 = a1.shape[0], (a1 if a2 is None else a2).shape[0]
        if not splits(a1, a2, pair_bytes):
            return fn(args, a1, a2)
        b1 = _blocks(a1, balanced(n1, size))
        b2 = b1 if a2 is None else _blocks(a2, balanced(n2, size))
        nb1, nb2 = b1.shape[0], b2.shape[0]
        rows, cols = np.triu_indices(nb1) if a2 is None else np.divmod(np.arange(nb1 * nb2), nb2)
        out = _map_blocks(fn, args, b1, b2, rows, cols, per_example)

        def grid(leaf):  # (pairs, s1, s2, ...) -> (n1, n2, ...)
            if a2 is not None:
                return _assemble(leaf.reshape(nb1, nb2, *leaf.shape[1:]), n1, n2)
            index = np.zeros((nb1, nb1), int)  # block (i, j) is pair index[i, j], transposed below
            index[rows, cols] = index[cols, rows] = np.arange(len(rows))
            swap = (0, *(p + 1 for p in perm(leaf.ndim - 1)))
            per_block = lambda mask: mask.reshape(nb1, nb1, *[1] * (leaf.ndim - 1))
            below = per_block(np.tril(np.ones((nb1, nb1), bool), -1))
            diagonal = per_block(np.eye(nb1, dtype=bool))
            swapped = jnp.transpose(leaf, swap)
            upper = jnp.where(diagonal, symmetrize(leaf, swap)[index], leaf[index])
            return _assemble(jnp.where(below, swapped[index], upper), n1, n2)

        return jax.tree.map(grid, out)

    return blocked
