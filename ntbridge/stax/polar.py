"""The kernel rule of an activation whose only kink is at 0 (Softsign), in polar coordinates.

In polar coordinates both kink lines ``u = 0`` and ``v = 0`` are rays, so the plane splits into four
sectors on which the integrand is analytic, with no inner expectation to split per outer node
(compare :mod:`.piecewise`). Cost: in :func:`polar_rule`'s doc.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from .kernel import safe_sqrt
from .quadrature import Function, Rule, correlation, value_and_slope

# dtype -> ((radial nodes, range of t), (angular nodes per sector, tanh-sinh half range))
POLAR = {jnp.dtype(jnp.float32): ((16, -8.0, 5.5), (20, 2.25)),
         jnp.dtype(jnp.float64): ((32, -13.0, 8.0), (36, 3.0))}


@functools.lru_cache
def radial_rule(degree: int, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and weights (shapes ``(degree,)``) of ``E g(R) = int_0^inf g(R) R exp(-R^2 / 2) dR``,
    the radius of a standard normal in the plane: the trapezoidal rule on ``t`` in ``[lo, hi]``
    after ``R = log(1 + e^t)`` (the mass below ``R = e^lo`` is about ``e^(2 lo) / 2``). Near 0
    the map is logarithmic, so a singularity of ``g`` at ``R = -d`` stays about ``pi`` away from
    the real ``t`` axis however small ``d`` (Softsign's ``f(a R)`` at a large scale ``a``): the
    rule converges geometrically whatever the scale, where Gauss rules in ``R`` slow down."""
    t, h = np.linspace(lo, hi, degree, retstep=True)
    radius = np.logaddexp(0.0, t)
    return radius, h * radius * np.exp(-radius * radius / 2) / (1 + np.exp(-t))


@functools.lru_cache
def tanh_sinh(degree: int, half_range: float) -> tuple[np.ndarray, np.ndarray]:
    """Tanh-sinh nodes and weights (shapes ``(degree,)``) on ``[-1, 1]``: the trapezoidal rule on
    ``[-half_range, half_range]`` after ``x = tanh(pi / 2 sinh t)``, which clusters nodes at both
    ends (robust to singularities just beyond them)."""
    t, h = np.linspace(-half_range, half_range, degree, retstep=True)
    inner = math.pi / 2 * np.sinh(t)
    return np.tanh(inner), h * math.pi / 2 * np.cosh(t) / np.cosh(inner) ** 2


# Taylor coefficients of sin(x) / x in x^2, highest (x^20) first
_SINE = tuple((-1) ** k / math.factorial(2 * k + 1) for k in reversed(range(11)))


def _sine(x: jax.Array) -> jax.Array:
    """``sin(x)`` for ``|x| <= pi``: ``sin(sign(x) pi - x)`` folds it into ``[-pi/2, pi/2]``, where
    the Taylor polynomial to ``x^21`` is within 2e-18 (XLA's sin on CPU costs some 20 exps)."""
    x = jnp.where(jnp.abs(x) > math.pi / 2, jnp.sign(x) * math.pi - x, x)
    x2, out = x * x, jnp.full_like(x, _SINE[0])
    for coefficient in _SINE[1:]:
        out = out * x2 + coefficient
    return x * out


def polar_rule(fn: Function) -> Rule:
    """The kernel rule ``rule(c, q1, q2) -> (E[f(u) f(v)], E[f'(u) f'(v)])`` of ``fn``, elementwise
    in JAX and analytic on each side of its only kink, at 0 (Softsign), in polar coordinates.

    With ``(u, v) = R (sqrt(q1) cos th, sqrt(q2) cos(th - phi))``, ``cos phi`` the correlation,
    ``R`` the radius and ``th`` the uniform angle of a standard normal in the plane, both kink lines
    are rays, at ``th = -pi/2, phi - pi/2, pi/2, phi + pi/2``: on each of the four sectors between
    them the integrand is analytic. On a sector, at an angle ``psi`` from its ray ``u = 0``,
    ``(u, v) = +-R (sqrt(q1) sin psi, sqrt(q2) sin(psi -+ phi))`` (the last two sectors are the
    first two turned by ``pi``). ``psi`` by :func:`tanh_sinh` per sector (the singularities of
    ``f`` continued across its kink, e.g. Softsign's pole at -1, lie just beyond the sector ends
    for large ``R``), ``R`` by :func:`radial_rule`; node counts per dtype in ``POLAR`` (Softsign:
    within 2e-9 in float64 and 3e-6 in float32 of adaptive integration at variances 0.3 to 400).

    Shapes: ``c``, ``q1``, ``q2`` broadcast together; both results have the broadcast shape and the
    inputs' dtype. Cost per entry: ``8 P Q`` evaluations of ``f`` and ``f'`` (at ``u`` and ``v``)
    for ``P`` radial and ``4 Q`` angular nodes, in ``4 Q`` sequential steps.

    Example:
        >>> rule = polar_rule(lambda x: x / (1.0 + jnp.abs(x)))   # Softsign
        >>> nngp, dot = rule(jnp.array(0.5), jnp.array(1.0), jnp.array(1.0))
    """

    def rule(c, q1, q2):
        c, q1, q2 = jnp.broadcast_arrays(c, q1, q2)
        radial, angular = POLAR[jnp.dtype(c.dtype)]
        radius, radius_weight = (jnp.asarray(a, c.dtype) for a in radial_rule(*radial))
        root1, root2, cos = correlation(c, q1, q2)
        phi = jnp.arctan2(safe_sqrt(1 - cos * cos), cos)
        # one step per (sector, angular node); sectors 3, 4 are sectors 1, 2 turned by pi
        x, w = tanh_sinh(*angular)
        steps = [np.tile(np.repeat(a, 2), 2) for a in (x, w)]
        steps += [np.tile([0.0, 1.0], 2 * len(x)), np.repeat([1.0, -1.0], 2 * len(x))]

        def step(acc, node):
            x, w, second, sign = node
            width = jnp.where(second > 0, math.pi - phi, phi)
            psi = width * (1 + x) / 2    # angle from the ray u = 0
            u = (sign * root1 * _sine(psi))[..., None] * radius
            v = (sign * root2 * _sine(psi + jnp.where(second > 0, phi, -phi)))[..., None] * radius
            (fu, du), (fv, dv) = value_and_slope(fn, u), value_and_slope(fn, v)
            weight = width * w / (4 * math.pi)
            return tuple(a + weight * (b @ radius_weight)
                         for a, b in zip(acc, (fu * fv, du * dv))), None

        zero = jnp.zeros_like(c)
        steps = tuple(jnp.asarray(a, c.dtype) for a in steps)
        (nngp, dot), _ = jax.lax.scan(step, (zero, zero), steps)
        return nngp, dot

    return rule
