"""Finite-width kernels of a network's current parameters (JAX level).

``f = apply_fn(params, x)`` maps ``(N, *input)`` to ``(N, *out)``. Axis semantics follow Neural
Tangents: ``trace_axes`` (output axes, counted on ``f``'s shape, so ``-1`` is the last) are
averaged over, ``diagonal_axes`` keep only their diagonal, and every other output axis appears
once for x1 and once for x2. The result has shape ``(N1, N2, *kept1, *kept2)`` where ``kept1`` are
the non-traced axes of ``f(x1)`` (diagonal axes included, once) and ``kept2`` the non-traced,
non-diagonal axes of ``f(x2)``:

* ``trace_axes=(-1,)`` (default), ``f`` of shape ``(N, O)``: ``(N1, N2)``, comparable to the
  analytic per-unit kernel.
* ``trace_axes=()``: ``(N1, N2, O, O)``; ``diagonal_axes=(-1,)``: ``(N1, N2, O)``.

Example:
    >>> k = empirical_ntk_fn(graph.apply_fn)(graph.params, x1, x2)   # (N1, N2)
"""

from __future__ import annotations

import math
import string
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from .errors import InputError

IMPLEMENTATIONS = ("auto", "jacobian")
_HIGHEST = jax.lax.Precision.HIGHEST


def normalize_axes(trace_axes: Sequence[int], diagonal_axes: Sequence[int],
                   ndim: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Output axes as non-negative indices into ``f``'s shape of rank ``ndim``, checked."""
    result = []
    for arg, axes in (("trace_axes", trace_axes), ("diagonal_axes", diagonal_axes)):
        try:
            axes = tuple(int(a) for a in axes)
        except (TypeError, ValueError):
            raise InputError(f"{arg} must be a tuple of ints, got {axes!r}.") from None
        fixed = tuple(a % ndim if -ndim <= a < ndim else None for a in axes)
        if None in fixed or 0 in fixed:
            raise InputError(f"{arg}={axes} names an axis the output (rank {ndim}, axis 0 being "
                             f"the batch) does not have; use output axes 1..{ndim - 1} or negative "
                             f"indices.")
        if len(set(fixed)) != len(fixed):
            raise InputError(f"{arg}={axes} names an axis twice.")
        result.append(fixed)
    if set(result[0]) & set(result[1]):
        raise InputError(f"trace_axes={tuple(trace_axes)} and diagonal_axes="
                         f"{tuple(diagonal_axes)} overlap; an axis is traced or diagonal, not both.")
    return result[0], result[1]


def contract(a: jax.Array, b: jax.Array, out_ndim: int, trace_axes: tuple[int, ...],
             diagonal_axes: tuple[int, ...]) -> jax.Array:
    """Contract ``a (N1, *out, *rest)`` with ``b (N2, *out, *rest)`` over ``rest`` and the axes rules.

    ``out_ndim`` is the rank of ``f`` (batch included); ``rest`` (e.g. a parameter's shape) is
    summed over; traced output axes are averaged.
    """
    letters = iter(string.ascii_letters)
    rest = "".join(next(letters) for _ in range(a.ndim - out_ndim))
    sa, sb, kept2 = [next(letters)], [next(letters)], ""
    kept1 = ""
    for axis in range(1, out_ndim):
        la = next(letters)
        lb = la if axis in trace_axes or axis in diagonal_axes else next(letters)
        sa.append(la)
        sb.append(lb)
        if axis not in trace_axes:
            kept1 += la
            kept2 += "" if axis in diagonal_axes else lb
    expr = f"{''.join(sa)}{rest},{''.join(sb)}{rest}->{sa[0]}{sb[0]}{kept1}{kept2}"
    scale = math.prod(a.shape[axis] for axis in trace_axes)
    return jnp.einsum(expr, a, b, precision=_HIGHEST) / scale


def swap_x1_x2(k: jax.Array, out_ndim: int, trace_axes, diagonal_axes) -> jax.Array:
    """The kernel with the roles of x1 and x2 exchanged (for exact symmetrisation)."""
    kept = [a for a in range(1, out_ndim) if a not in trace_axes]
    paired = [i for i, a in enumerate(kept) if a not in diagonal_axes]
    perm = [1, 0] + list(range(2, 2 + len(kept))) + list(range(2 + len(kept), k.ndim))
    for j, i in enumerate(paired):
        perm[2 + i], perm[2 + len(kept) + j] = perm[2 + len(kept) + j], perm[2 + i]
    return jnp.transpose(k, perm)


def _per_example_jacobian(apply_fn, params, x):
    """Jacobian of each example's output w.r.t. params: leaves ``(N, *out, *param_shape)``."""
    single = lambda p, xi: apply_fn(p, xi[None])[0]
    return jax.vmap(jax.jacrev(single), in_axes=(None, 0))(params, x)


def _symmetric(kernel_fn):
    """``x2=None`` means x2 = x1, and the result is made exactly symmetric."""

    def fn(params, x1, x2=None, *, trace_axes=(-1,), diagonal_axes=()):
        # kernel_fn(params, x1, x2 or None, out_ndim, trace_axes, diagonal_axes)
        out_ndim = len(jax.eval_shape(kernel_fn.apply_fn, params, x1[:1]).shape)
        axes = normalize_axes(trace_axes, diagonal_axes, out_ndim)
        k = kernel_fn(params, x1, x2, out_ndim, *axes)
        if x2 is None:
            k = (k + swap_x1_x2(k, out_ndim, *axes)) / 2
        return k

    return fn


def empirical_ntk_fn(apply_fn: Callable[[Any, jax.Array], jax.Array],
                     implementation: str = "jacobian") -> Callable:
    """``fn(params, x1, x2=None, *, trace_axes=(-1,), diagonal_axes=())`` -> the empirical NTK.

    ``sum_p df(x1)/dp df(x2)/dp`` over all parameters ``p`` (a pytree), contracted per the axes
    rules of the module doc. ``implementation="jacobian"`` contracts per-example Jacobians, one
    parameter array at a time.
    """
    if implementation not in IMPLEMENTATIONS:
        raise InputError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}.")

    def ntk(params, x1, x2, out_ndim, trace_axes, diagonal_axes):
        j1 = _per_example_jacobian(apply_fn, params, x1)
        j2 = j1 if x2 is None else _per_example_jacobian(apply_fn, params, x2)
        parts = jax.tree.leaves(jax.tree.map(
            lambda a, b: contract(a, b, out_ndim, trace_axes, diagonal_axes), j1, j2))
        return sum(parts[1:], parts[0])

    ntk.apply_fn = apply_fn
    return _symmetric(ntk)


def empirical_nngp_fn(apply_fn: Callable[[Any, jax.Array], jax.Array]) -> Callable:
    """``fn(params, x1, x2=None, *, trace_axes=(-1,), diagonal_axes=())`` -> ``f(x1) f(x2)``.

    The outputs' products contracted per the axes rules (the finite-width NNGP of one network).
    """

    def nngp(params, x1, x2, out_ndim, trace_axes, diagonal_axes):
        f1 = apply_fn(params, x1)
        f2 = f1 if x2 is None else apply_fn(params, x2)
        return contract(f1, f2, out_ndim, trace_axes, diagonal_axes)

    nngp.apply_fn = apply_fn
    return _symmetric(nngp)
