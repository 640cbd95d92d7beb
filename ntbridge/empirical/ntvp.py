"""The ``"ntvp"`` strategy: NTK-vector products, the JVP over x1 of each VJP of one x2 output unit;
Jacobians are never formed whole (the VJPs are taken in chunks of bounded memory)."""

from __future__ import annotations

import math
import string

import jax
import jax.numpy as jnp

from ..tiling.arrays import restrict
from .groups import group_of, leaf_paths, sum_groups


def _ntvp_columns(apply_fn, params, x1, x2, chunk):
    """``Theta[n2, o2, n1, *o1]``: the JVP over x1 of the VJP of each x2 output unit."""
    f = jax.eval_shape(apply_fn, params, x2[:1])
    out = f.shape[1:]
    units = math.prod(out)
    xs = jnp.repeat(x2, units, axis=0)[:, None]
    # in the outputs' dtype (x2 may be token ids)
    cts = jnp.tile(jnp.eye(units, dtype=f.dtype), (x2.shape[0], 1)).reshape(-1, 1, *out)

    def column(args):
        x, ct = args
        _, vjp = jax.vjp(lambda p: apply_fn(p, x), params)
        return jax.jvp(lambda p: apply_fn(p, x1), (params,), vjp(ct))[1]

    cols = jax.lax.map(column, (xs, cts), batch_size=chunk or xs.shape[0])
    return cols.reshape(x2.shape[0], *out, *cols.shape[1:])


def ntvp_strategy(model, params, x1, x2, axes, by_layer, chunk=None):
    """``chunk``: VJPs taken at once (None: all; the kernel is the same, memory is not)."""
    group = group_of(model)
    groups: dict[str, list[int]] = {}
    for i, path in enumerate(leaf_paths(params)):
        groups.setdefault(group(path), []).append(i)
    letters = iter(string.ascii_letters)
    sa, sb, out = axes.subscripts(letters)
    parts = {}
    for name, keep in groups.items():
        fn, sub = restrict(model.apply_fn, params, keep)
        full = _ntvp_columns(fn, sub, x1, x1 if x2 is None else x2, chunk)
        parts[name] = [jnp.einsum(f"{sb}{sa}->{out}", full) / axes.scale(full.shape[:axes.out_ndim])]
    return sum_groups(parts, by_layer)
