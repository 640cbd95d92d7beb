"""The finite-width NNGP of one network: its outputs' products, contracted per the axes rules."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from .. import programs
from .axes import Axes, contract


def outputs_product(apply_fn: Callable, interact: bool) -> Callable:
    """``nngp(params, x1, x2, axes)``: the outputs' products, traceable."""
    def nngp(params, x1, x2, axes):
        if interact and x2 is not None:
            f = apply_fn(params, jnp.concatenate([x1, x2]))
            f1, f2 = f[:x1.shape[0]], f[x1.shape[0]:]
        else:
            f1 = apply_fn(params, x1)
            f2 = f1 if x2 is None else apply_fn(params, x2)
        return contract(f1, f2, axes)
    return nngp


def empirical_nngp_fn(apply_fn: Callable[[Any, jax.Array], jax.Array], *,
                      examples_interact: bool = False) -> Callable:
    """``fn(params, x1, x2=None, *, trace_axes=(-1,), diagonal_axes=())`` -> ``f(x1) f(x2)``.

    The outputs' products contracted per the axes rules (the finite-width NNGP of one network);
    with ``examples_interact``, the outputs of the joint batch (see the module doc). With
    ``x2=None`` the result is exactly symmetric.
    """
    nngp = outputs_product(apply_fn, examples_interact)

    def fn(params, x1, x2=None, *, trace_axes=(-1,), diagonal_axes=()):
        out_ndim = len(jax.eval_shape(apply_fn, params, x1[:1]).shape)
        axes = Axes.of(out_ndim, trace_axes, diagonal_axes)
        key = programs.ProgramKey.of("empirical_nngp_fn", (apply_fn, examples_interact, axes),
                                     (params, x1, x2))
        run = programs.cached(key, lambda: jax.jit(nngp, static_argnums=3))
        return axes.symmetrized(run(params, x1, x2, axes), x2)

    return fn
