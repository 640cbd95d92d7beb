"""The ``"jacobian"`` strategy: per-example Jacobians, contracted one parameter array at a time."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..tiling.arrays import restrict
from .axes import contract
from .groups import group_of, leaf_paths, sum_groups


def _jacobian(apply_fn, params, x, interact: bool):
    """Jacobian of each example's output w.r.t. params: leaves ``(N, *out, *param_shape)``.

    With interacting examples, that of the whole batch's output (same layout).
    """
    if interact:
        return jax.jacrev(apply_fn)(params, x)
    single = lambda p, xi: apply_fn(p, xi[None])[0]
    return jax.vmap(jax.jacrev(single), in_axes=(None, 0))(params, x)


def jacobian_parts(apply_fn, params, x1, x2, axes, keep, group, interact=False):
    """Jacobian contraction of the leaves ``keep``, as ``{group: [contributions]}``."""
    fn, sub = restrict(apply_fn, params, keep)
    n1 = x1.shape[0]  # x1 and x2 as one batch: one Jacobian to compile, split at n1
    j = _jacobian(fn, sub, x1 if x2 is None else jnp.concatenate([x1, x2]), interact)
    j1, j2 = [a[:n1] for a in j], (j if x2 is None else [a[n1:] for a in j])
    parts: dict[str, list] = {}
    paths = leaf_paths(params)
    for i, a, b in zip(keep, j1, j2):
        parts.setdefault(group(paths[i]), []).append(contract(a, b, axes))
    return parts


def jacobian_strategy(model, params, x1, x2, axes, by_layer, interact=False):
    keep = range(len(jax.tree.leaves(params)))
    parts = jacobian_parts(model.apply_fn, params, x1, x2, axes, keep, group_of(model), interact)
    return sum_groups(parts, by_layer)
