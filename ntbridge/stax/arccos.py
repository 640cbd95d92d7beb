"""Arc-cosine kernels (Cho & Saul): Gaussian expectations of ReLU-like functions (ReLU, LeakyReLU,
Abs, rectified monomials, sign) through the angle ``t`` between two inputs, and the fast, accurate
evaluation of that angle they share.

A rule is ``rule(c, q1, q2) -> (E[f(u) f(v)], E[f'(u) f'(v)])`` and a self rule
``self_rule(q) -> E[f(u)^2]`` (see :mod:`ntbridge.stax.activations`).

Example:
    >>> nngp, dot = ab_relu_rule(0.0, 1.0)(jnp.array(0.5), jnp.array(1.0), jnp.array(1.0))
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from .kernel import safe_reciprocal, safe_sqrt
from .quadrature import Rule

SelfRule = Callable[[jax.Array], jax.Array]


def _fit(fn: Callable[[np.ndarray], np.ndarray]) -> tuple[float, ...]:
    """Power coefficients in ``t = 2a - 1`` (highest first) of a degree-8 Chebyshev interpolant of
    ``fn`` on ``a`` in [0, 1]."""
    cheb = np.polynomial.chebyshev.chebinterpolate(lambda t: fn((t + 1) / 2), 8)
    return tuple(float(v) for v in np.polynomial.chebyshev.cheb2poly(cheb)[::-1])


# arccos(a) / sqrt(1 - a), arccos(a)^2 / (1 - a) and sqrt(1 + a) are analytic on [0, 1] (singular
# at a = -1 only). float32: interpolants of the first and the last, within 3e-9 and 5e-9 relative,
# below float32 rounding. float64: the degree-19 Chebyshev interpolant of the second (its error is
# 1e-16 relative), computed in 50-digit arithmetic and expanded in powers of t = 2a - 1, highest
# first (tests/test_activations.py recomputes it: interpolating in float64 loses a dozen ulps).
_ACOS_OVER_ROOT = _fit(lambda a: np.arccos(a) / np.sqrt(1 - a))
_SQRT_ONE_PLUS = _fit(lambda a: np.sqrt(1 + a))
_ACOS_SQUARED_64 = (
    -2.5037157603353945e-11, 8.093598934627533e-11, -1.3748845681415564e-10, 4.5158246421477443e-10,
    -1.7576916253248074e-09, 5.819007053225595e-09, -1.908561533859214e-08, 6.4175594039631e-08,
    -2.180434647740536e-07, 7.482355065048167e-07, -2.6016194093537407e-06, 9.192524728716312e-06,
    -3.313495464668311e-05, 0.00012251475814017466, -0.0004684613967577248, 0.0018761901930736346,
    -0.00804238326807016, 0.038446411433299334, -0.22515372984798854, 2.193245422464302)


def _horner(coefficients: tuple[float, ...], t: jax.Array) -> jax.Array:
    out = jnp.full_like(t, coefficients[0])
    for coefficient in coefficients[1:]:
        out = out * t + coefficient
    return out


@jax.custom_jvp
def _angles(cos: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(sin t, pi - t)`` for ``t = arccos(cos)``, ``cos`` in [-1, 1].

    By the polynomials above in ``a = |cos|``, not libm's arccos (which costs far more than the
    whole rest of a ReLU layer). XLA repeats cheap operations in each consumer of a result (a
    layer's angles feed the next layer and the NTK) but evaluates a square root once: float32
    shares one square root between its two degree-8 polynomials; float64 ends its degree-19 one in
    a square root, ``arccos(a) = sqrt((1 - a) p(t))`` (within 1 ulp), and takes ``sin t = sqrt((1 -
    a) (1 + a))``. ``pi - t`` is computed directly, so it stays relatively accurate as t -> pi.
    Derivatives: see :func:`_angles_jvp`.
    """
    a = jnp.abs(cos)
    t = 2.0 * a - 1.0
    if cos.dtype == jnp.float32:
        root = jnp.sqrt(1.0 - a)
        acos_a, sin = root * _horner(_ACOS_OVER_ROOT, t), root * _horner(_SQRT_ONE_PLUS, t)
    else:
        acos_a = jnp.sqrt((1.0 - a) * _horner(_ACOS_SQUARED_64, t))
        sin = jnp.sqrt((1.0 - a) * (1.0 + a))
    return sin, jnp.where(cos >= 0, math.pi - acos_a, acos_a)  # acos_a = arccos(a) in [0, pi/2]


@_angles.defjvp
def _angles_jvp(primals, tangents):
    """``d(sin t) = -cos / sin dcos`` and ``d(pi - t) = dcos / sin``, exactly (not through the
    interpolants), and 0 at ``cos = +-1``: there ``t`` has an infinite derivative, but the cosine is
    extremal (an example with itself: :func:`_cosine` snaps it to +-1 with derivative 0), so the
    gradient is the limit along perturbations that keep the angle (e.g. scaling an input), and the
    mean of the one-sided limits across the kink of ``t`` in the others."""
    (cos,), (dcos,) = primals, tangents
    sin, rest = _angles(cos)
    slope = safe_reciprocal(sin) * dcos
    return (sin, rest), (-cos * slope, slope)


SNAP = 8  # ulps: cosines this close to +-1 are +-1 (see _cosine)


def _cosine(c: jax.Array, q1: jax.Array, q2: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(sqrt(q1 q2), c / sqrt(q1 q2))``, with square roots taken per example, not per entry.

    Within ``SNAP`` ulps of +-1 the cosine is ``+-1``: an example with itself must have cosine
    exactly 1, but ``c`` and ``q1``, ``q2`` are rounded separately (different XLA fusions), and the
    angle is ill-conditioned there (``t ~ sqrt(2 (1 - cos))``: one ulp of float32 would cost 1e-4
    of the ReLU NTK). Distinct examples that close are not resolved by the rounding of ``c``
    anyway. A zero-variance side is the limit of vanishing inputs (cosine 0), never NaN (nor its
    gradient).
    """
    s1, s2 = safe_sqrt(q1), safe_sqrt(q2)
    r1, r2 = safe_reciprocal(s1), safe_reciprocal(s2)
    cos = c * r1 * r2
    near_one = jnp.abs(cos) >= 1 - SNAP * jnp.finfo(cos.dtype).eps
    cos = jnp.where(near_one, jnp.sign(cos), cos)
    return s1 * s2, cos


def ab_relu_rule(a: float, b: float) -> Rule:
    """Rule of ``f(x) = a * min(x, 0) + b * max(x, 0)`` (ReLU: a=0, b=1; |x|: a=-1, b=1).

    Arc-cosine kernel (Cho & Saul): ``E[relu(u) relu(v)] = sqrt(q1 q2) (sin t + (pi - t) cos t)
    / (2 pi)``, ``E[relu'(u) relu'(v)] = (pi - t) / (2 pi)``; the mixed terms follow from
    ``relu(-u)`` having the angle ``pi - t``.
    """

    def rule(c, q1, q2):
        norm, cos = _cosine(c, q1, q2)
        sin, rest = _angles(cos)                   # rest = pi - t
        t = math.pi - rest
        same = sin + rest * cos                    # (2 pi) E[relu(u) relu(v)] / norm
        mixed = sin - t * cos                      # (2 pi) E[relu(u) relu(-v)] / norm
        nngp = norm * ((a * a + b * b) * same - 2 * a * b * mixed) / (2 * math.pi)
        dot = ((a * a + b * b) * rest + 2 * a * b * t) / (2 * math.pi)
        return nngp, dot

    return rule


def ab_relu_self_rule(a: float, b: float) -> SelfRule:
    """Self rule of :func:`ab_relu_rule`: ``E[f(u)^2] = (a^2 + b^2) q / 2``."""
    return lambda q: (a * a + b * b) / 2 * q


def _arc_cosine(n: int, cos, sin, rest):
    """Cho & Saul's ``J_n(t)`` (``rest = pi - t``): ``E[relu(u)^n relu(v)^n] = (q1 q2)^(n/2)
    J_n(t) / (2 pi)``."""
    return (rest, sin + rest * cos, 3 * sin * cos + rest * (1 + 2 * cos * cos),
            4 * sin ** 3 + 15 * sin * cos * cos + rest * (9 * sin * sin * cos + 15 * cos ** 3))[n]


def rectified_monomial_rule(k: int) -> Rule:
    """Rule of ``max(x, 0)^k`` (see :func:`ntbridge.stax.RectifiedMonomial`)."""

    def rule(c, q1, q2):
        norm, cos = _cosine(c, q1, q2)
        sin, rest = _angles(cos)
        nngp = norm ** k * _arc_cosine(k, cos, sin, rest) / (2 * math.pi)
        dot = k * k * norm ** (k - 1) * _arc_cosine(k - 1, cos, sin, rest) / (2 * math.pi)
        return nngp, dot

    return rule


def rectified_monomial_self_rule(k: int) -> SelfRule:
    """Self rule of :func:`rectified_monomial_rule`: ``J_k`` at angle 0 (cosine 1, sine 0)."""
    return lambda q: _arc_cosine(k, 1.0, 0.0, math.pi) / (2 * math.pi) * q ** k


def sign_rule(c, q1, q2):
    """Rule of ``sign``: ``E[sign u sign v] = 1 - 2 t / pi``; the derivative is 0 wherever it exists
    (autodiff's, hence the empirical NTK's), so the NTK loses its earlier contributions."""
    _, cos = _cosine(c, q1, q2)
    rest = _angles(cos)[1]
    nngp = jnp.where((q1 > 0) & (q2 > 0), 2 * rest / math.pi - 1, 0.0)
    return nngp, jnp.zeros_like(nngp)


def sign_self_rule(q):
    """Self rule of :func:`sign_rule`: ``E[sign(u)^2] = 1`` (0 for ``q = 0``)."""
    return jnp.where(q > 0, 1.0, 0.0).astype(q.dtype)
