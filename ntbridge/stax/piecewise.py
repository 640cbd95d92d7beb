"""Kernel rules of piecewise polynomial-exponential activations, with the inner expectation in
closed form.

An activation is declared by its :class:`Pieces`: between sorted kinks, each piece is
``p0 + p1 x + p2 x^2 + a exp(b x)`` (Hardtanh, ReLU6, Softshrink, Hardshrink, Threshold,
Hardsigmoid, Hardswish: polynomials; ELU, CELU, SELU: exponentials below 0). Its derivative is
of the same form, piece by piece (without delta terms at jumps: autodiff's, see ``Numerical``).

For ``(u, v)`` centred Gaussian with variances ``q1``, ``q2`` and covariance ``c``, write
``u = sqrt(q1) z1`` and ``v = r z1 + s Z`` with ``r = c / sqrt(q1)``, ``s = sqrt(q2 - r^2)``; then
``E[g(u) h(v)] = E_z1[g(sqrt(q1) z1) H(r z1)]`` with ``H(m) = E[h(m + s Z)]``, which is exact: over
a piece, the truncated normal moments ``E[Z^j; t0 < Z < t1]`` (j <= 2) and
``E[exp(b s Z); t0 < Z < t1] = exp(b^2 s^2 / 2) (Phi(t1 - b s) - Phi(t0 - b s))``, with
``t = (kink - m) / s``. Only the outer expectation over ``z1`` is numerical: Gauss-Legendre on
``[-L, L]`` split at fixed points (where the normal density bends), at ``z1 = k / sqrt(q1)`` (the
kinks of ``g``) and at ``z1 = (k + tau s) / r`` for a few ``tau`` (``H`` is the kink of ``h``
smoothed over a width ``s``: sharp near correlations +-1). On each piece the integrand is analytic,
so the rule converges exponentially. At ``s`` below the rounding of ``sqrt(q2)``, ``H = h``.

Cost per kernel entry: ``P n`` evaluations of ``g`` and ``H`` (one ``erfc`` and one ``exp`` per kink,
plus an ``erfcx`` per end of an exponential piece), in ``P`` sequential steps over all entries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import InputError
from .quadrature import Rule, gauss_legendre_piece, safe_inverse, spread

# dtype -> (truncation L, fixed splits, nodes per piece, splits around a smoothed kink in units of s)
ACCURACY = {
    jnp.dtype(jnp.float32): (6.0, (-4.0, -2.0, 0.0, 2.0, 4.0), 8, (-5.0, -2.0, 2.0, 5.0)),
    jnp.dtype(jnp.float64): (8.5, (-6.0, -4.0, -2.0, 0.0, 2.0, 4.0, 6.0), 12, (-7.0, -4.0, -2.0, 2.0, 4.0, 7.0)),
}
_CLIP = 40.0  # standardized distances to a kink beyond this count as infinite (Phi is then 0 or 1)


@dataclass(frozen=True)
class Piece:
    """``f(x) = poly[0] + poly[1] x + poly[2] x^2 + a exp(b x)`` on one interval.

    Example:
        >>> Piece((0.0, 1.0))              # x
        >>> Piece((-1.0,), a=1.0, b=1.0)   # exp(x) - 1
    """
    poly: tuple[float, ...] = ()
    a: float = 0.0
    b: float = 0.0

    def __post_init__(self):
        if len(self.poly) > 3:
            raise InputError(f"a Piece's polynomial has degree at most 2, got {self.poly!r}.")

    def coefficients(self) -> tuple[float, float, float]:
        return tuple(self.poly) + (0.0,) * (3 - len(self.poly))

    def derivative(self) -> Piece:
        _, p1, p2 = self.coefficients()
        return Piece((p1, 2 * p2), self.a * self.b, self.b)

    def __call__(self, x: jax.Array) -> jax.Array:
        p0, p1, p2 = self.coefficients()
        out = p0 + x * (p1 + x * p2)
        return out + self.a * jnp.exp(self.b * x) if self.a else out


@dataclass(frozen=True)
class Pieces:
    """An elementwise function: ``pieces[i]`` between ``kinks[i - 1]`` and ``kinks[i]`` (sorted
    kinks, one more piece than kinks; the value at a kink itself is the forward pass's business).

    Example:
        >>> relu6 = Pieces((0.0, 6.0), (Piece(), Piece((0.0, 1.0)), Piece((6.0,))))
    """
    kinks: tuple[float, ...]
    pieces: tuple[Piece, ...]

    def __post_init__(self):
        if len(self.pieces) != len(self.kinks) + 1 or list(self.kinks) != sorted(self.kinks):
            raise InputError(f"Pieces needs sorted kinks and one more piece than kinks, got "
                             f"kinks {self.kinks!r} and {len(self.pieces)} pieces.")

    def derivative(self) -> Pieces:
        return Pieces(self.kinks, tuple(p.derivative() for p in self.pieces))

    def __call__(self, x: jax.Array) -> jax.Array:
        """The function at ``x`` (any shape); each piece is evaluated inside its own interval only,
        so that no unselected branch overflows (nor its gradient)."""
        ends = (-math.inf, *self.kinks, math.inf)
        out = jnp.zeros_like(x)
        for lo, hi, piece in zip(ends[:-1], ends[1:], self.pieces):
            out = jnp.where((x > lo) & (x <= hi), piece(jnp.clip(x, lo, hi)), out)
        return out


def _tails(t: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(Phi(t), Phi(-t))``, each accurate in its small tail."""
    small = jax.scipy.special.erfc(jnp.abs(t) / math.sqrt(2)) / 2
    return jnp.where(t < 0, small, 1 - small), jnp.where(t < 0, 1 - small, small)


def _mass(lo: tuple[jax.Array, jax.Array], hi: tuple[jax.Array, jax.Array], t_lo: jax.Array) -> jax.Array:
    """``Phi(t_hi) - Phi(t_lo)`` from the ``_tails`` of both ends, without cancellation in the upper tail."""
    return jnp.where(t_lo > 0, lo[1] - hi[1], hi[0] - lo[0])


def _exp_mass(b: float, m: jax.Array, s: jax.Array, t: jax.Array) -> jax.Array:
    """``exp(b m + b^2 s^2 / 2) Phi(t - b s)`` = ``E[exp(b (m + s Z)); Z < t]``, without overflow:
    below the mean (``y = t - b s < 0``) as ``exp(b (m + s t)) phi(t) Phi(y) / phi(y)``."""
    y = t - b * s
    below = jnp.minimum(y, 0.0)
    mills = jnp.exp(b * (m + s * t) - t * t / 2) / 2 * jax.scipy.special.erfcx(-below / math.sqrt(2))
    above = jnp.where(y >= 0, b * m + b * b * s * s / 2, 0.0)
    return jnp.where(y < 0, mills, jnp.exp(above) * _tails(y)[0])


def conditional_means(functions: Sequence[Pieces], m: jax.Array, s: jax.Array) -> list[jax.Array]:
    """``E[h(m + s Z)]`` for each ``h`` of ``functions`` (all with the same kinks), ``Z`` standard
    normal, ``s > 0``; ``m``, ``s`` broadcast together.

    Example:
        >>> relu6 = Pieces((0.0, 6.0), (Piece(), Piece((0.0, 1.0)), Piece((6.0,))))
        >>> conditional_means([relu6], jnp.array(1.0), jnp.array(0.5))
    """
    kinks = functions[0].kinks
    t = [jnp.full_like(m, -_CLIP)] + [jnp.clip((k - m) / s, -_CLIP, _CLIP) for k in kinks]
    t.append(jnp.full_like(m, _CLIP))
    tails = [_tails(ti) for ti in t]
    density = [jnp.exp(-ti * ti / 2) / math.sqrt(2 * math.pi) for ti in t]
    outs = [jnp.zeros_like(m) for _ in functions]
    for i in range(len(kinks) + 1):
        m0 = _mass(tails[i], tails[i + 1], t[i])
        m1 = density[i] - density[i + 1]
        m2 = m0 + t[i] * density[i] - t[i + 1] * density[i + 1]
        for j, h in enumerate(functions):
            piece = h.pieces[i]
            p0, p1, p2 = piece.coefficients()
            outs[j] += (p0 + m * (p1 + p2 * m)) * m0 + (p1 + 2 * p2 * m) * s * m1 + p2 * s * s * m2
            if piece.a:
                ends = (_exp_mass(piece.b, m, s, t[k]) for k in (i, i + 1))
                outs[j] += piece.a * (-next(ends) + next(ends))
    return outs


def piecewise_rule(f: Pieces) -> Rule:
    """The kernel rule ``rule(c, q1, q2) -> (E[f(u) f(v)], E[f'(u) f'(v)])`` of ``f`` (see module
    doc). Shapes: ``c``, ``q1``, ``q2`` broadcast together; both results have the broadcast shape
    and the inputs' dtype (float32 or float64).

    Example:
        >>> relu6 = Pieces((0.0, 6.0), (Piece(), Piece((0.0, 1.0)), Piece((6.0,))))
        >>> nngp, dot = piecewise_rule(relu6)(jnp.array(0.5), jnp.array(1.0), jnp.array(1.0))
    """
    functions = (f, f.derivative())

    def rule(c, q1, q2):
        c, q1, q2 = jnp.broadcast_arrays(c, q1, q2)
        half_width, fixed, degree, taus = ACCURACY[jnp.dtype(c.dtype)]
        t, w = (jnp.asarray(a, c.dtype) for a in np.polynomial.legendre.leggauss(degree))
        root1, r, s = spread(c, q1, q2)
        smoothed = s > jnp.finfo(c.dtype).eps * jnp.sqrt(q2)   # else H = h
        s_safe = jnp.where(smoothed, s, 1)[..., None]
        splits = [jnp.full_like(c, z) for z in fixed] + [k * safe_inverse(root1) for k in f.kinks]
        splits += [(k + tau * s) * safe_inverse(r) for k in f.kinks for tau in (0.0, *taus)]
        ends = jnp.clip(jnp.sort(jnp.stack(splits), axis=0), -half_width, half_width)
        edge = jnp.full((1,) + c.shape, half_width, c.dtype)
        ends = jnp.concatenate([-edge, ends, edge])

        def step(acc, piece):
            z, weight = gauss_legendre_piece(*piece, t, w)
            m = r[..., None] * z
            means = conditional_means(functions, m, s_safe)
            u = root1[..., None] * z
            return tuple(a + jnp.sum(weight * g(u) * jnp.where(smoothed[..., None], mean, g(m)), axis=-1)
                         for a, g, mean in zip(acc, functions, means)), None

        zero = jnp.zeros_like(c)
        (nngp, dot), _ = jax.lax.scan(step, (zero, zero), (ends[:-1], ends[1:]))
        return nngp, dot

    return rule
