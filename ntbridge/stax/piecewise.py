"""Kernel rules of activations with kinks: one outer Gauss-Legendre rule, the inner expectation in
closed form for piecewise polynomial-exponential activations, else by quadrature.

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

Without declared pieces, :func:`quadrature_rule` takes ``H`` by Gauss-Legendre in ``Z`` split at
the kink ``Z = (k - m) / s`` and at fixed points (``INNER``), and more outer nodes per piece. A
function whose only kink is at 0 (Softsign) goes to :func:`~.polar.polar_rule` instead.

Cost per kernel entry: ``P n`` evaluations of ``g`` and ``H`` (one ``erfc`` and one ``exp`` per kink,
plus an ``erfcx`` per end of an exponential piece), in ``P n`` sequential steps (one per outer
node) over all entries; :func:`quadrature_rule` evaluates ``h`` and ``h'`` at ``n'`` inner nodes
per outer node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import InputError
from .kernel import safe_reciprocal
from .quadrature import Function, Rule, gauss_legendre_piece, spread, value_and_slope

# dtype -> (truncation L, fixed splits, nodes per piece, splits around a smoothed kink in units of s)
ACCURACY = {
    jnp.dtype(jnp.float32): (6.0, (-4.0, -2.0, 0.0, 2.0, 4.0), 8, (-5.0, -2.0, 2.0, 5.0)),
    jnp.dtype(jnp.float64): (8.5, (-6.0, -4.0, -2.0, 0.0, 2.0, 4.0, 6.0), 12, (-7.0, -4.0, -2.0, 2.0, 4.0, 7.0)),
}
# dtype -> (truncation L, fixed splits, nodes per piece) of the inner expectation by quadrature, and
# the outer nodes per piece of its rule (its f is not a polynomial or exponential between kinks)
INNER = {
    jnp.dtype(jnp.float32): (6.0, (-2.0, 2.0), 12, 12),
    jnp.dtype(jnp.float64): (8.5, (-4.0, -2.0, 0.0, 2.0, 4.0), 16, 20),
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


Means = Callable[[jax.Array, jax.Array], list[jax.Array]]


def piecewise_rule(f: Pieces) -> Rule:
    """The kernel rule ``rule(c, q1, q2) -> (E[f(u) f(v)], E[f'(u) f'(v)])`` of ``f`` (see module
    doc). Shapes: ``c``, ``q1``, ``q2`` broadcast together; both results have the broadcast shape
    and the inputs' dtype (float32 or float64).

    Example:
        >>> relu6 = Pieces((0.0, 6.0), (Piece(), Piece((0.0, 1.0)), Piece((6.0,))))
        >>> nngp, dot = piecewise_rule(relu6)(jnp.array(0.5), jnp.array(1.0), jnp.array(1.0))
    """
    functions = (f, f.derivative())
    return outer_rule(f.kinks, functions, lambda m, s: conditional_means(functions, m, s))


def quadrature_means(fn: Function, kinks: Sequence[float]) -> Means:
    """``(m, s) -> [E[f(m + s Z)], E[f'(m + s Z)]]`` by Gauss-Legendre in ``Z`` on ``[-L, L]`` split
    at ``Z = (k - m) / s`` for each kink ``k`` of ``fn`` (analytic between its kinks) and at
    ``INNER`` fixed points; ``f'`` is autodiff's (``jax.jvp``)."""

    def means(m, s):
        half_width, fixed, degree, _ = INNER[jnp.dtype(m.dtype)]
        t, w = (jnp.asarray(a, m.dtype) for a in np.polynomial.legendre.leggauss(degree))
        splits = [jnp.broadcast_to(jnp.asarray(z, m.dtype), m.shape) for z in fixed]
        splits += [jnp.clip((k - m) / s, -half_width, half_width) for k in kinks]
        edge = jnp.full((1,) + m.shape, half_width, m.dtype)
        ends = jnp.concatenate([-edge, jnp.sort(jnp.stack(splits), axis=0), edge])
        z, weight = gauss_legendre_piece(ends[:-1], ends[1:], t, w)   # (pieces, ..., degree)
        value, slope = value_and_slope(fn, m[..., None] + s[..., None] * z)
        return [jnp.sum(weight * a, axis=(0, -1)) for a in (value, slope)]

    return means


def quadrature_rule(fn: Function, kinks: Sequence[float]) -> Rule:
    """The kernel rule ``rule(c, q1, q2) -> (E[f(u) f(v)], E[f'(u) f'(v)])`` of ``fn``, elementwise
    in JAX and analytic between its ``kinks``: as :func:`piecewise_rule`, with the inner expectation
    by :func:`quadrature_means`.

    Example:
        >>> rule = quadrature_rule(lambda x: jnp.abs(jnp.tanh(x - 1.0)), (1.0,))
        >>> nngp, dot = rule(jnp.array(0.5), jnp.array(1.0), jnp.array(1.0))
    """
    kinks = tuple(sorted({float(k) for k in kinks}))
    functions = (fn, lambda x: value_and_slope(fn, x)[1])
    degrees = {dtype: table[3] for dtype, table in INNER.items()}
    return outer_rule(kinks, functions, quadrature_means(fn, kinks), degrees)


def outer_rule(kinks: Sequence[float], functions: tuple[Function, Function], means: Means,
               degrees: dict[jnp.dtype, int] | None = None) -> Rule:
    """The kernel rule of ``(g, g') = functions`` with kinks ``kinks``, given ``means(m, s)``, the
    inner expectations ``[E[g(m + s Z)], E[g'(m + s Z)]]``: the outer expectation over ``z1`` by
    Gauss-Legendre split as the module doc says, with ``degrees[dtype]`` nodes per piece (default:
    ``ACCURACY``'s)."""

    def rule(c, q1, q2):
        c, q1, q2 = jnp.broadcast_arrays(c, q1, q2)
        half_width, fixed, degree, taus = ACCURACY[jnp.dtype(c.dtype)]
        degree = (degrees or {}).get(jnp.dtype(c.dtype), degree)
        t, w = (jnp.asarray(a, c.dtype) for a in np.polynomial.legendre.leggauss(degree))
        root1, r, s = spread(c, q1, q2)
        smoothed = s > jnp.finfo(c.dtype).eps * jnp.sqrt(q2)   # else H = h
        s_safe = jnp.where(smoothed, s, 1)
        splits = [jnp.full_like(c, z) for z in fixed] + [k * safe_reciprocal(root1) for k in kinks]
        splits += [(k + tau * s) * safe_reciprocal(r) for k in kinks for tau in (0.0, *taus)]
        ends = jnp.clip(jnp.sort(jnp.stack(splits), axis=0), -half_width, half_width)
        edge = jnp.full((1,) + c.shape, half_width, c.dtype)
        ends = jnp.concatenate([-edge, ends, edge])

        z1, w1 = (jnp.moveaxis(a, -1, 1).reshape((-1,) + c.shape)
                  for a in gauss_legendre_piece(ends[:-1], ends[1:], t, w))

        def step(acc, node):
            z, weight = node
            m = r * z
            u = root1 * z
            return tuple(a + weight * g(u) * jnp.where(smoothed, mean, g(m))
                         for a, g, mean in zip(acc, functions, means(m, s_safe))), None

        zero = jnp.zeros_like(c)
        (nngp, dot), _ = jax.lax.scan(step, (zero, zero), (z1, w1))
        return nngp, dot

    return rule
