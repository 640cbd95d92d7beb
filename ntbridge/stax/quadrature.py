"""Kernel rules of arbitrary elementwise functions by two-dimensional Gaussian quadrature.

For ``(u, v)`` centred Gaussian with variances ``q1``, ``q2`` and covariance ``c``, write
``u = sqrt(q1) z1`` and ``v = r z1 + s z2`` with ``r = c / sqrt(q1)``, ``s = sqrt(q2 - r^2)`` and
``z1, z2`` independent standard normals; then ``E[g(u) h(v)]`` is a double sum over nodes ``z_i``,
``z_j``. The nodes are equally spaced on [-6.5, 6.5] with weights proportional to the normal
density: for functions analytic in a strip around the real axis (tanh, sigmoid, SiLU, softplus,
GELU, ...) this trapezoidal rule converges geometrically, much faster than Gauss-Hermite when the
function varies quickly on the scale of the input's standard deviation (e.g. tanh of an input of
variance 4). At the default degree 64 the result is within 1e-5 (1e-4 for the derivative term,
whose integrand is sharper) of the exact expectation, relative to ``sqrt(E f(u)^2 E f(v)^2)``, for
input variances up to about 10; kinks (ELU, ReLU6, Hardtanh) converge only algebraically (about
1e-4 at degree 64).

The derivative ``f'`` is autodiff's (``jax.jvp``), as the empirical NTK sees it. Cost: ``degree^2``
evaluations of ``f`` and ``f'`` per kernel entry, in ``degree^2 / 8`` sequential steps, each over all
entries at once (memory: 8 times the kernel).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from .kernel import safe_sqrt

DEFAULT_DEGREE = 64
_HALF_WIDTH = 6.5  # in standard deviations; the normal density beyond is below 1e-9
_BLOCK = 8         # inner nodes evaluated at once


def nodes(degree: int) -> tuple[np.ndarray, np.ndarray]:
    """Quadrature nodes and weights (summing to 1) for the expectation over a standard normal."""
    z = np.linspace(-_HALF_WIDTH, _HALF_WIDTH, degree)
    w = np.exp(-z * z / 2)
    return z, w / w.sum()


def gaussian_rule(fn: Callable[[jax.Array], jax.Array], degree: int = DEFAULT_DEGREE):
    """The kernel rule ``rule(c, q1, q2) -> (E[f(u) f(v)], E[f'(u) f'(v)])`` of ``fn`` by quadrature.

    ``fn`` must be elementwise and written in JAX. ``degree`` (a multiple of 8) is the number of
    nodes per dimension.

    Example:
        >>> rule = gaussian_rule(jnp.tanh)
        >>> rule(jnp.array(0.5), jnp.array(1.0), jnp.array(1.0))
    """
    if degree % _BLOCK or degree <= 0:
        raise ValueError(f"degree must be a positive multiple of {_BLOCK}, got {degree}")
    z, w = nodes(degree)
    # one step per (outer node i, block of inner nodes): the outer node repeated per block
    outer_z, outer_w = np.repeat(z, degree // _BLOCK), np.repeat(w, degree // _BLOCK)
    inner_z, inner_w = np.tile(z.reshape(-1, _BLOCK), (degree, 1)), np.tile(w.reshape(-1, _BLOCK), (degree, 1))

    def value_and_slope(x):
        return jax.jvp(fn, (x,), (jnp.ones_like(x),))

    def rule(c, q1, q2):
        c, q1, q2 = jnp.broadcast_arrays(c, q1, q2)
        dtype = c.dtype
        safe = jnp.where(q1 > 0, q1, 1)
        r = jnp.where(q1 > 0, c * jax.lax.rsqrt(safe), 0)
        s = safe_sqrt(q2 - r * r)  # 0 on the diagonal, where q2 - r^2 is minimal
        root1 = safe_sqrt(q1)

        def step(acc, node):
            zi, wi, zj, wj = (jnp.asarray(a, dtype) for a in node)
            fu, du = value_and_slope(root1 * zi)
            fv, dv = value_and_slope(r[..., None] * zi + s[..., None] * zj)
            return (acc[0] + wi * fu * (fv @ wj), acc[1] + wi * du * (dv @ wj)), None

        zero = jnp.zeros_like(c)
        (nngp, dot), _ = jax.lax.scan(step, (zero, zero), (outer_z, outer_w, inner_z, inner_w))
        return nngp, dot

    return rule
