"""Gaussian orthant probabilities and truncated moments, and with them the closed-form kernel of
ReLU, LeakyReLU and Abs after eval-mode BatchNorm with shifts (``conv -> BN -> ReLU`` with trained
statistics).

For ``(Z1, Z2)`` standard normal with correlation ``rho``, :func:`orthant` is ``P(Z1 > h, Z2 > k)``:
``Phi(-h) Phi(-k)`` plus the integral of the bivariate density over correlations from 0 to
``rho`` (Plackett's identity), by Gauss-Legendre in ``theta = arcsin(r)`` where ``|rho| < 0.925``
(the method of Drezner and Wesolowsky); nearer +-1 as ``Phi(-max(h, k))`` minus the integral from
``rho`` to 1, in ``t = sqrt(1 - r**2)``, where the density's factor ``exp(-(h - k)**2 / (2 t**2))``
turns sharp: its products with the first three Taylor terms of the rest are integrated in closed
form, and Gauss-Legendre takes the remainder (Genz's refinement). Within 1e-14 of 30-digit
integration in float64 (tests/test_orthant.py). :func:`quadrant_moments` adds ``E[Z1; Q]``,
``E[Z2; Q]`` and ``E[Z1 Z2; Q]`` on the quadrant ``Q`` (Rosenbaum's formulas).

The kernel (:func:`shifted_channels`): each channel ``c`` of BatchNorm's output is
``y = A_c u + D_c`` of a centred Gaussian ``u``; an ABReLU ``f(y) = s y + (t - s) max(y, 0)`` has
``f(y) = y f'(y)``, so every term is a moment of two Gaussians weighted by the indicators of the
half planes where ``f'`` is ``t``, in closed form. Channels with equal constants are grouped; the
mean over groups runs as a scan (memory: a few arrays of the kernel's size).
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from .kernel import Kernel, safe_reciprocal, safe_sqrt, variances
from .quadrature import correlation
from .sources import ChannelMap, Sources

NODES = {jnp.dtype(jnp.float32): 10, jnp.dtype(jnp.float64): 20}  # Gauss-Legendre nodes
_CLIP = 40.0  # standardized thresholds beyond this count as infinite


def _tail(x: jax.Array) -> jax.Array:
    """``Phi(-x)``, accurate in both tails."""
    return jax.scipy.special.erfc(x / math.sqrt(2)) / 2


def _density(x: jax.Array) -> jax.Array:
    return jnp.exp(-x * x / 2) / math.sqrt(2 * math.pi)


def _integral(hi: jax.Array, fn: Callable[[jax.Array], jax.Array]) -> jax.Array:
    """``int_0^hi fn`` by Gauss-Legendre (``fn`` maps nodes ``(..., n)`` to values)."""
    t, w = (jnp.asarray(a, hi.dtype) for a in np.polynomial.legendre.leggauss(NODES[hi.dtype]))
    half = hi[..., None] / 2
    return jnp.sum(half * w * fn(half * (1 + t)), -1)


def orthant(h: jax.Array, k: jax.Array, rho: jax.Array) -> jax.Array:
    """``P(Z1 > h, Z2 > k)`` for standard normals of correlation ``rho`` in [-1, 1] (see module
    doc); all three broadcast together.

    Example:
        >>> orthant(jnp.array(0.0), jnp.array(0.0), jnp.array(0.5))   # 1/4 + arcsin(1/2) / (2 pi)
        Array(0.33333334, dtype=float32)
    """
    low = jnp.abs(rho) < 0.925
    theta = jnp.arcsin(jnp.where(low, rho, 0))
    hk, hs = (h * k)[..., None], ((h * h + k * k) / 2)[..., None]
    body = lambda x: jnp.exp((hk * jnp.sin(x) - hs) / jnp.square(jnp.cos(x)))
    near = _tail(h) * _tail(k) + _integral(theta, body) / (2 * math.pi)
    negative = rho < 0  # P(Z1 > h, Z2 > k; rho) = Phi(-h) - P(Z1 > h, -Z2 > -k; -rho)
    k = jnp.where(negative, -k, k)
    upper = _tail(jnp.maximum(h, k)) - _near_one(h, k, jnp.where(low, 1, jnp.abs(rho)))
    far = jnp.where(negative, _tail(h) - upper, upper)
    return jnp.clip(jnp.where(low, near, far), 0, 1)


def _near_one(h: jax.Array, k: jax.Array, rho: jax.Array) -> jax.Array:
    """The bivariate density's integral over correlations from ``rho`` (>= 0.925) to 1. With
    ``t = sqrt(1 - r**2)`` it is ``int_0^a exp(-b**2 / (2 t**2)) g(t) dt / (2 pi)``, ``a =
    sqrt(1 - rho**2)``, ``b = |h - k|``, ``g = exp(-h k / (1 + r)) / r``; ``g``'s Taylor terms
    ``exp(-h k / 2) (1 + c1 t**2 + c2 t**4)`` times the sharp factor integrate in closed form
    (by parts: ``J_j``, over their common factor ``exp(-b**2 / (2 a**2) - h k / 2)``, which never
    overflows as ``(h - k)**2 >= -4 h k``), Gauss-Legendre takes the rest."""
    a, b, hk = safe_sqrt((1 - rho) * (1 + rho)), jnp.abs(h - k), h * k
    c1, c2 = (4 - hk) / 8, 3 / 8 - hk / 8 + hk * hk / 128
    some = a > 0
    a_safe = jnp.where(some, a, 1)
    ratio = b / a_safe
    j0 = a - b * math.sqrt(math.pi / 2) * jax.scipy.special.erfcx(ratio / math.sqrt(2))
    j2 = (a ** 3 - b * b * j0) / 3
    j4 = (a ** 5 - b * b * j2) / 5
    closed = jnp.where(some, jnp.exp(-ratio * ratio / 2 - hk / 2) * (j0 + c1 * j2 + c2 * j4), 0)

    def rest(t):
        x, (bb, hkk, c1x, c2x) = t * t, (v[..., None] for v in (b, hk, c1, c2))
        r = jnp.sqrt(1 - x)
        sharp = -bb * bb / (2 * jnp.maximum(x, jnp.finfo(x.dtype).tiny))
        taylor = jnp.exp(sharp - hkk / 2) * (1 + x * (c1x + x * c2x))
        return jnp.exp(sharp - hkk / (1 + r)) / r - taylor

    return (closed + _integral(a, rest)) / (2 * math.pi)


def quadrant_moments(h: jax.Array, k: jax.Array, rho: jax.Array) -> tuple[jax.Array, ...]:
    """``(P, E[Z1; Q], E[Z2; Q], E[Z1 Z2; Q])`` on the quadrant ``Q = {Z1 > h, Z2 > k}`` of
    standard normals of correlation ``rho``; ``P`` is :func:`orthant`. ``1 - rho**2`` is floored at
    the dtype's epsilon (below it ``rho`` is rounding), where a ratio ``0 / 0`` means equal
    thresholds: the limit 0.

    Example:
        >>> p, e1, e2, e12 = quadrant_moments(jnp.array(0.0), jnp.array(0.0), jnp.array(1.0))
    """
    free = (1 - rho) * (1 + rho)
    floored = jnp.maximum(free, jnp.finfo(rho.dtype).eps)
    root = jnp.sqrt(floored)
    t12, t21 = _tail((k - rho * h) / root), _tail((h - rho * k) / root)
    p = orthant(h, k, rho)
    e1 = _density(h) * t12 + rho * _density(k) * t21
    e2 = _density(k) * t21 + rho * _density(h) * t12
    # (h**2 - 2 rho h k + k**2) / (2 (1 - rho**2)), without 0 / 0 at rho = +-1
    near = jnp.where(rho >= 0, jnp.square(h - k), jnp.square(h + k))
    spread = near / (2 * floored) + jnp.where(rho >= 0, 1, -1) * h * k / (1 + jnp.abs(rho))
    e12 = rho * (p + h * _density(h) * t12 + k * _density(k) * t21)
    return p, e1, e2, e12 + safe_sqrt(free) / (2 * math.pi) * jnp.exp(-spread)


def _groups(cmap: ChannelMap) -> np.ndarray:
    """``(G, 5)``: each group of channels with equal constants, as its share of the channels,
    ``A``, ``D``, ``mu / s`` and ``1 / s`` (``A``'s sign, ``mu`` and ``s`` only matter to a trained
    gamma's term)."""
    a, d, mu, s = (np.asarray(v, np.float64) for v in (cmap.a, cmap.d, cmap.mu, cmap.s))
    rows = (np.stack([a, d, mu / s, 1 / s], 1) if cmap.gamma
            else np.stack([np.abs(a), d, 0 * a, 0 * a], 1))
    unique, counts = np.unique(rows, axis=0, return_counts=True)
    return np.concatenate([(counts / len(a))[:, None], unique], 1)


def _channel_terms(root1, root2, rho, group, slopes: tuple[float, float], cmap: ChannelMap):
    """One group's ``(E[f(y) f(y')], A**2 E[f'f'], own NTK terms)`` for an ABReLU ``f`` of slopes
    ``slopes`` (below, above 0) and ``y = A u + D``, at entries of standard deviations ``root1``,
    ``root2`` and correlation ``rho`` (:func:`~.quadrature.correlation`; see module doc)."""
    _, big_a, big_d, mu_s, inv_s = group
    scale1, scale2 = jnp.abs(big_a) * root1, jnp.abs(big_a) * root2
    # thresholds of y > 0 in standard units; a constant y (a zero scale or variance): +-infinity
    h1, h2 = (jnp.clip(jnp.where(s > 0, -big_d * safe_reciprocal(s), -jnp.sign(big_d) * _CLIP),
                       -_CLIP, _CLIP) for s in (scale1, scale2))
    below, jump = slopes[0], slopes[1] - slopes[0]
    t1, t2, d1, d2 = _tail(h1), _tail(h2), _density(h1), _density(h2)
    regions = ((below * below, (1.0, 0.0, 0.0, rho)),              # f'f' = below**2 everywhere
               (below * jump, (t1, d1, rho * d1, rho * (t1 + h1 * d1))),   # + jump on Z1 > h1
               (below * jump, (t2, rho * d2, d2, rho * (t2 + h2 * d2))),   # + jump on Z2 > h2
               (jump * jump, quadrant_moments(h1, h2, rho)))                # + on both
    m0, m1, m2, m12 = (sum(w * moments[j] for w, moments in regions if w) for j in range(4))
    second = lambda e, s1, s2: e * e * m0 + e * (s1 * m1 + s2 * m2) + s1 * s2 * m12
    sign = jnp.where(big_a < 0, -inv_s, inv_s)   # Z = sign(A) u / sqrt(q)
    own = second(-mu_s, sign * root1, sign * root2) if cmap.gamma else 0.0
    return second(big_d, scale1, scale2), big_a * big_a * m0, own + float(cmap.beta) * m0


def shifted_channels(k: Kernel, fn: Callable, slopes: tuple[float, float]) -> Kernel:
    """The kernel after ``fn``, an ABReLU of ``slopes``, of ``k``'s outputs, which are
    eval-mode BatchNorm's map (``k.sources.ops[0]``, any shifts) of the Gaussian
    ``k.sources.base``: the mean over the channels' groups of the closed-form terms; the NTK is
    ``mean(A**2 E[f'f']) Theta`` plus the trained gamma's and beta's terms (see
    :class:`~ntbridge.stax.sources.ChannelMap`)."""
    base, cmap = k.sources.base, k.sources.ops[0]
    groups = jnp.asarray(_groups(cmap), base.nngp.dtype)
    q = variances(base)
    sides = ("nngp", "cov1") if k.x1_is_x2 else ("nngp", "cov1", "cov2")
    # every entry of the three arrays in one scan (one program body per layer, not three)
    flat = [jnp.broadcast_arrays(getattr(base, side), *q[side]) for side in sides]
    # the groups' common part, once
    entries = correlation(*(jnp.concatenate([f[j].ravel() for f in flat]) for j in range(3)))

    def step(acc, group):
        terms = _channel_terms(*entries, group, slopes, cmap)
        return tuple(a + group[0] * t for a, t in zip(acc, terms)), None

    zero = jnp.zeros_like(entries[2])
    nngp, carried, own = jax.lax.scan(step, (zero, zero, zero), groups)[0]
    ends = np.cumsum([f[0].size for f in flat])[:-1]
    values = [v.reshape(f[0].shape) for v, f in zip(jnp.split(nngp, ends), flat)]
    shape = flat[0][0].shape
    carried, own = carried[:ends[0]].reshape(shape), own[:ends[0]].reshape(shape)
    return k.replace(nngp=values[0], ntk=None if base.ntk is None else carried * base.ntk + own,
                     cov1=values[1], cov2=values[1] if k.x1_is_x2 else values[2],
                     is_gaussian=False, sources=Sources(base=base, ops=(cmap, fn)))
