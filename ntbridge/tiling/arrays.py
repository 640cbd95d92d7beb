"""Array helpers shared by the tiles, their VJPs and the kernels: exact symmetrization, and a
function of some leaves of a pytree."""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp


def symmetrize(a, perm: tuple[int, ...]):
    """``(a + a.transpose(perm)) / 2`` for a JAX array or a torch tensor: exactly symmetric when
    evaluated op by op (not inside a compiled program, where XLA may fold the transpose into the
    producer of ``a`` and round the two halves differently). ``perm`` exchanges x1 and x2. A torch
    tensor is transposed by a blocked copy first (``a + a.T`` reads one side across rows); entry
    ``(i, j)`` and ``(j, i)`` are still the same sum, ``(a[i, j] + a[j, i]) / 2``.

    Example:
        >>> symmetrize(jnp.array([[1., 2.], [4., 3.]]), (1, 0)).tolist()
        [[1.0, 3.0], [3.0, 3.0]]
    """
    if hasattr(a, "permute"):
        return (a.permute(perm).contiguous() + a).div_(2)
    return (a + jnp.transpose(a, perm)) / 2


def restrict(fn, tree, keep: Sequence[int]):
    """``(of_sub, sub)``: ``of_sub(sub, *rest) = fn(tree with its leaves keep replaced by sub,
    *rest)``, and ``sub``, the leaves ``keep`` (``jax.tree.leaves`` order) of ``tree``.

    Example:
        >>> of_w, sub = restrict(lambda p, x: p["w"] * x + p["b"], {"b": 1., "w": 2.}, [1])
        >>> of_w([3.], 1.)
        4.0
    """
    leaves, treedef = jax.tree.flatten(tree)

    def of_sub(sub, *rest):
        full = list(leaves)
        for i, v in zip(keep, sub):
            full[i] = v
        return fn(jax.tree.unflatten(treedef, full), *rest)

    return of_sub, [leaves[i] for i in keep]
