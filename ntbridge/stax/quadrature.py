"""Kernel rules of elementwise functions by Gaussian quadrature.

For ``(u, v)`` centred Gaussian with variances ``q1``, ``q2`` and covariance ``c``, write
``u = sqrt(q1) z1`` and ``v = r z1 + s z2`` with ``r = c / sqrt(q1)``, ``s = sqrt(q2 - r^2)`` and
``z1, z2`` independent standard normals, truncated to ``[-L, L]``. Two rules:

- :func:`smooth_rule`, for functions analytic near the real axis (tanh, sigmoid, SiLU, softplus,
  GELU, ...): equally spaced nodes with weights proportional to the normal density. This
  trapezoidal rule converges geometrically, much faster than Gauss-Hermite when the function varies
  quickly on the scale of the input's standard deviation (tanh of an input of variance 10: poles
  at ``z = +-i pi / (2 sqrt(10))``). Nodes and ``L`` follow the dtype (``SMOOTH``).
- :func:`gaussian_rule`, for functions with *kinks* (points where the function or its derivative
  is not smooth, or jumps) and no declared pieces (see ``piecewise.py`` for those): piecewise
  Gauss-Legendre, split exactly where the integrand is not smooth: the inner variable at
  ``z2 = (b - r z1) / s``, where ``v`` crosses a break ``b`` (a kink, 0, or a given point where the
  function changes fast), for each outer node; the outer variable at ``z1 = b / sqrt(q1)`` and at
  ``z1 = (b -+ L s) / r``, where an inner split of a kink enters and leaves ``[-L, L]`` (between
  these the inner integral varies on the scale ``s / r``: the smoothed kink of ``f(r z1)``). Nodes
  per piece and ``L`` follow the dtype (``ACCURACY``: evaluations per entry, shared among pieces).

For every torch activation they serve, at variances 0.3 to 10 and correlations -1, 0, 0.5, 0.6,
0.999 and 1, float64 is within 1e-8 and float32 within 2e-5 of adaptive integration, relative to
``sqrt(E f(u)^2 E f(v)^2)`` (tests/test_exact_activations.py). The derivative ``f'`` is autodiff's
(``jax.jvp``), as the empirical NTK sees it: at a jump of ``f`` it has no delta term (see
``Numerical``).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .kernel import safe_sqrt

Rule = Callable[[jax.Array, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]
Function = Callable[[jax.Array], jax.Array]

# dtype -> (nodes per dimension, truncation L in standard deviations) of the smooth rule
SMOOTH = {jnp.dtype(jnp.float32): (72, 5.5), jnp.dtype(jnp.float64): (160, 8.5)}
_BLOCK = 8  # inner nodes of the smooth rule evaluated at once
# dtype -> (evaluations of f per kernel entry, truncation L in standard deviations)
ACCURACY = {jnp.dtype(jnp.float32): (12288, 6.0), jnp.dtype(jnp.float64): (36864, 8.0)}
_MULTIPLE = 4  # nodes per piece: a multiple of 4, so that each piece vectorizes


def nodes_per_piece(evaluations: int, outer_pieces: int, inner_pieces: int) -> int:
    """The most nodes per piece (a multiple of 4, at least 8) within ``evaluations`` per entry."""
    n = math.isqrt(evaluations // (outer_pieces * inner_pieces)) // _MULTIPLE * _MULTIPLE
    return max(n, 2 * _MULTIPLE)


def _density(z: jax.Array) -> jax.Array:
    return jnp.exp(-z * z / 2) / math.sqrt(2 * math.pi)


def gauss_legendre_piece(lo: jax.Array, hi: jax.Array, t: jax.Array,
                         w: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Gauss-Legendre nodes and weights (times the normal density) on ``[lo, hi]``: shapes
    ``(...)`` -> ``(..., n)`` for ``n`` reference nodes ``t``, weights ``w`` on [-1, 1]."""
    half = ((hi - lo) / 2)[..., None]
    z = lo[..., None] + half * (1 + t)
    return z, half * w * _density(z)


def safe_inverse(x: jax.Array) -> jax.Array:
    """``1 / x``, and 0 where ``x`` is 0 (a zero scale: every split of that variable is at 0)."""
    nonzero = x != 0
    return jnp.where(nonzero, 1 / jnp.where(nonzero, x, 1), 0)


def _value_and_slope(fn: Function, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    return jax.jvp(fn, (x,), (jnp.ones_like(x),))


def spread(c: jax.Array, q1: jax.Array, q2: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(sqrt(q1), r, s)`` of the module doc, finite (0) where a variance is 0."""
    root1 = safe_sqrt(q1)
    r = c * safe_inverse(root1)
    return root1, r, safe_sqrt(q2 - r * r)


def smooth_rule(fn: Function) -> Rule:
    """The kernel rule ``rule(c, q1, q2) -> (E[f(u) f(v)], E[f'(u) f'(v)])`` of a smooth ``fn``
    (elementwise, in JAX) by the trapezoidal rule (see module doc). Shapes: ``c``, ``q1``, ``q2``
    broadcast together; both results have the broadcast shape and the inputs' dtype. Cost per
    entry: ``n^2`` evaluations of ``f`` and ``f'`` in ``n^2 / 8`` sequential steps.

    Example:
        >>> nngp, dot = smooth_rule(jnp.tanh)(jnp.array(0.5), jnp.array(1.0), jnp.array(1.0))
    """

    def rule(c, q1, q2):
        c, q1, q2 = jnp.broadcast_arrays(c, q1, q2)
        degree, half_width = SMOOTH[jnp.dtype(c.dtype)]
        z = np.linspace(-half_width, half_width, degree)
        w = np.exp(-z * z / 2) / np.exp(-z * z / 2).sum()
        # one step per (outer node, block of inner nodes): the outer node repeated per block
        steps = (np.repeat(z, degree // _BLOCK), np.repeat(w, degree // _BLOCK),
                 np.tile(z.reshape(-1, _BLOCK), (degree, 1)), np.tile(w.reshape(-1, _BLOCK), (degree, 1)))
        root1, r, s = spread(c, q1, q2)

        def step(acc, node):
            zi, wi, zj, wj = node
            fu, du = _value_and_slope(fn, root1 * zi)
            fv, dv = _value_and_slope(fn, r[..., None] * zi + s[..., None] * zj)
            return (acc[0] + wi * fu * (fv @ wj), acc[1] + wi * du * (dv @ wj)), None

        zero = jnp.zeros_like(c)
        (nngp, dot), _ = jax.lax.scan(step, (zero, zero), tuple(jnp.asarray(a, c.dtype) for a in steps))
        return nngp, dot

    return rule


def _with_zero(splits: jax.Array) -> jax.Array:
    """Sorted ``splits`` (P, ...) with 0 merged in (P + 1, ...), elementwise: the i-th is 0 clamped
    to ``[splits[i - 1], splits[i]]``."""
    ends = jnp.full((1,) + splits.shape[1:], jnp.inf, splits.dtype)
    return jnp.clip(0, jnp.concatenate([-ends, splits]), jnp.concatenate([splits, ends]))


def gaussian_rule(fn: Function, kinks: Sequence[float] = (), breaks: Sequence[float] = ()) -> Rule:
    """The kernel rule ``rule(c, q1, q2) -> (E[f(u) f(v)], E[f'(u) f'(v)])`` of ``fn``.

    ``fn`` must be elementwise, written in JAX, and analytic between its ``kinks`` (the inputs
    where it or its derivative is not smooth, or jumps); ``breaks`` are further inputs to split at,
    where ``fn`` changes fast (e.g. 0, +-1, +-2 for tanh). Shapes: ``c``, ``q1``, ``q2`` broadcast
    together; both results have the broadcast shape and the inputs' dtype (float32 or float64; the
    node tables are made per call, in that dtype).

    Example:
        >>> rule = gaussian_rule(lambda x: jnp.clip(x, 0.0, 6.0), kinks=(0.0, 6.0))   # ReLU6
        >>> nngp, dot = rule(jnp.array(0.5), jnp.array(1.0), jnp.array(1.0))
    """
    kinks = tuple(sorted({float(k) for k in kinks}))
    breaks = tuple(sorted({0.0, *kinks, *map(float, breaks)}))
    outer_pieces, inner_pieces = len(breaks) + 2 * len(kinks) + 1, len(breaks) + 2

    def rule(c, q1, q2):
        c, q1, q2 = jnp.broadcast_arrays(c, q1, q2)
        evaluations, half_width = ACCURACY[jnp.dtype(c.dtype)]
        degree = nodes_per_piece(evaluations, outer_pieces, inner_pieces)
        t, w = (jnp.asarray(a, c.dtype) for a in np.polynomial.legendre.leggauss(degree))
        root1, r, s = spread(c, q1, q2)
        inv_s, inv_r = safe_inverse(s), safe_inverse(r)
        clip = lambda z: jnp.clip(z, -half_width, half_width)
        ends = jnp.full(c.shape, half_width, c.dtype)
        splits = [b * safe_inverse(root1) for b in breaks]
        splits += [(k + sign * half_width * s) * inv_r for k in kinks for sign in (-1, 1)]
        outer = [-ends, *jnp.sort(clip(jnp.stack(splits)), axis=0), ends]
        z1, w1 = (jnp.moveaxis(jnp.concatenate(a, axis=-1), -1, 0) for a in zip(*(
            gauss_legendre_piece(lo, hi, t, w) for lo, hi in zip(outer[:-1], outer[1:]))))

        def step(acc, node):
            zi, wi = node
            inner = [-ends, *_with_zero(clip(jnp.stack([(b - r * zi) * inv_s for b in breaks]))), ends]
            fu, du = _value_and_slope(fn, root1 * zi)
            for lo, hi in zip(inner[:-1], inner[1:]):
                z2, w2 = gauss_legendre_piece(lo, hi, t, w)
                fv, dv = _value_and_slope(fn, r[..., None] * zi[..., None] + s[..., None] * z2)
                acc = (acc[0] + wi * fu * jnp.sum(w2 * fv, axis=-1),
                       acc[1] + wi * du * jnp.sum(w2 * dv, axis=-1))
            return acc, None

        zero = jnp.zeros_like(c)
        (nngp, dot), _ = jax.lax.scan(step, (zero, zero), (z1, w1))
        return nngp, dot

    return rule
