"""Elementwise nonlinearities and their Gaussian-expectation kernel rules.

A rule is ``rule(c, q1, q2) -> (E[f(u) f(v)], E[f'(u) f'(v)])`` for ``(u, v)`` centred Gaussian
with variances ``q1``, ``q2`` and covariance ``c``; :func:`elementwise` applies it to every entry of
the kernel (batch pairs and spatial pairs alike). A self rule is ``self_rule(q) -> E[f(u)^2]`` for
``u`` of variance ``q``: the rule's NNGP at cosine 1 (``rule(q, q, q)[0]``) in closed form, for each
example's own variances (a fraction of the rule's operations, which XLA compiles faster). The NTK
picks up the derivative factor ``f'`` as autodiff sees it (zero where ``f`` is piecewise constant,
as for ``sign``).

Closed forms: ABReLU (ReLU, LeakyReLU, Abs), rectified monomials and Sign by the arc-cosine
kernels (``arccos.py``), GELU (erf form), Erf, Sin/Cos. Any other function goes through
:func:`Numerical` (``piecewise.py``, ``quadrature.py``).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import InputError, UnsupportedLayerError
from .arccos import (SelfRule, ab_relu_rule, ab_relu_self_rule, rectified_monomial_rule,
                     rectified_monomial_self_rule, sign_rule, sign_self_rule)
from .channel_blocks import per_block
from .features import elementwise_features
from .kernel import Kernel, variances
from .layers import Layer
from .orthant import shifted_channels
from .piecewise import Pieces, piecewise_rule, quadrature_rule
from .polar import polar_rule
from .quadrature import Corrected, Rule, corrected_rule, smooth_rule
from .sources import SAMPLING, Sources, channel_map, pointwise, rule_of


def elementwise(fn: Callable[[jax.Array], jax.Array], rule: Rule, name: str,
                self_rule: SelfRule | None = None,
                slopes: tuple[float, float] | None = None) -> Layer:
    """A layer applying ``fn`` to each entry, with kernel rule ``rule`` and self rule ``self_rule``
    (default: ``rule(q, q, q)[0]``), see the module doc.

    The self rule gives each example's covariance with itself where it holds variances only
    (vectors, or same-position covariances); with every pair of positions it has covariances of
    distinct positions too, and ``rule`` gives it. The rule needs Gaussian inputs; an input made of
    Gaussian sources otherwise (after eval-mode BatchNorm with channel-dependent statistics, a
    residual sum with a non-Gaussian identity, MaxPool, another nonlinearity) has its kernel
    computed numerically (:mod:`.sources`), or, for an ABReLU ``fn`` of ``slopes`` (ReLU,
    LeakyReLU, Abs) right after BatchNorm, in closed form (without shifts
    :func:`_centred_channels`, with them :func:`~.orthant.shifted_channels`). Other inputs raise
    :class:`~ntbridge.errors.UnsupportedLayerError`.
    """
    own = self_rule or (lambda q: rule(q, q, q)[0])

    def gaussian_rule(k: Kernel) -> Kernel:
        q = variances(k)
        nngp, dot = rule(k.nngp, *q["nngp"])
        pairs = not k.diagonal_spatial and k.spatial_shape
        covariance = lambda c, side: rule(c, *q[side])[0] if pairs else own(c)
        cov1 = covariance(k.cov1, "cov1")
        return k.replace(
            nngp=nngp, ntk=None if k.ntk is None else k.ntk * dot, cov1=cov1,
            cov2=cov1 if k.x1_is_x2 else covariance(k.cov2, "cov2"), is_gaussian=False,
            sources=Sources(base=k, ops=(fn,), rule=rule_of(k)))

    def kernel_fn(k: Kernel) -> Kernel:
        if k.blocks is not None:  # a concatenation along channels
            return per_block(k, kernel_fn)
        if k.is_gaussian:
            return gaussian_rule(k)
        if k.sources is None:
            raise UnsupportedLayerError(
                f"{name}'s kernel rule needs a Gaussian input (the output of a Linear/Conv "
                f"layer) or one made of Gaussian sources by layers with rules for them, but its "
                f"input is the raw data or the output of a map that mixes positions or examples "
                f"after a nonlinearity; put an affine layer before it, or use "
                f"ntbridge.empirical_ntk / ntbridge.monte_carlo.")
        cmap = channel_map(k) if slopes is not None else None
        if cmap is not None:
            return (_centred_channels(k, fn, gaussian_rule) if cmap.centred
                    else shifted_channels(k, fn, slopes))
        return pointwise(k, fn, name)

    return Layer(lambda key, shape: (tuple(shape), {}), lambda params, x: fn(x), kernel_fn,
                 features=elementwise_features(fn), replicates=SAMPLING.replicates)


def _centred_channels(k: Kernel, fn: Callable, gaussian_rule: Callable[[Kernel], Kernel]):
    """A homogeneous ``f`` after eval-mode BatchNorm without shifts (``ChannelMap.centred``), in
    closed form: with ``y_c = a_c h``, ``E[f(y_c) f(y'_c)] = a_c**2 E[f(h) f(h')]`` and
    ``E[f'(y_c) f'(y'_c)] = E[f'(h) f'(h')]`` (the law of ``(h, h')`` is symmetric), so the NNGP
    and covariances scale by ``mean(a**2)``; the NTK is ``mean(a**2) E[f'f'] Theta``, plus for a
    trained ``gamma`` ``mean(1 / s**2) E[f(h) f(h')]`` (``f'(y) h = f(y) / a``: Euler) and for a
    trained ``beta`` ``E[f'f']``. Fresh buffers give the plain rule times ``1 / (1 + eps)``."""
    base, cmap = k.sources.base, k.sources.ops[0]
    plain = gaussian_rule(base if base.ntk is None else base.replace(
        ntk=jnp.ones_like(base.ntk), sources=base.sources))
    a2 = float(np.mean(np.square(cmap.a)))
    ntk = None
    if base.ntk is not None:
        ntk = a2 * plain.ntk * base.ntk + float(cmap.beta) * plain.ntk
        ntk = ntk + float(np.mean(1 / np.square(cmap.s))) * plain.nngp if cmap.gamma else ntk
    return k.replace(nngp=a2 * plain.nngp, ntk=ntk, cov1=a2 * plain.cov1, cov2=a2 * plain.cov2,
                     is_gaussian=False, sources=Sources(base=base, ops=(cmap, fn)))


def numerical_rule(fn: Callable[[jax.Array], jax.Array], kinks: Sequence[float] = (),
                   pieces: Pieces | None = None, corrected: Corrected | None = None) -> Rule:
    """The kernel rule of ``fn`` (see :func:`Numerical`): by its ``pieces`` where given (closed-form
    inner expectation, ``piecewise.py``), else as the smooth part plus a correction above a
    threshold where ``corrected`` is given, else by quadrature in polar coordinates where its only
    kink is at 0 (``polar_rule``), else by quadrature split at its ``kinks``, else by the smooth
    rule (``quadrature.py``)."""
    if pieces is not None:
        return piecewise_rule(pieces)
    if corrected is not None:
        return corrected_rule(corrected)
    if set(kinks) == {0.0}:
        return polar_rule(fn)
    return quadrature_rule(fn, kinks) if kinks else smooth_rule(fn)


def Numerical(fn: Callable[[jax.Array], jax.Array], name: str, kinks: Sequence[float] = (),
              pieces: Pieces | None = None, corrected: Corrected | None = None) -> Layer:
    """Any elementwise ``fn`` (a JAX function), its kernel computed numerically. Declare where it
    is not analytic: its ``kinks`` (the inputs where it or its derivative is not smooth, or jumps),
    or better its ``pieces`` (:class:`~ntbridge.stax.piecewise.Pieces`: polynomials of degree <= 2
    and exponentials between kinks, whose Gaussian expectations are in closed form), or, for a
    smooth function with a small jump to another above a threshold, ``corrected``
    (:class:`~ntbridge.stax.quadrature.Corrected`); with none, ``fn`` must be analytic near the
    real axis (tanh, sigmoid, ...). The forward pass is ``fn``.

    The NTK's factor ``f'`` is autodiff's derivative of ``fn``, as the empirical NTK sees it: where
    ``fn`` jumps (Hardshrink, Threshold, torch's Softplus at its threshold) it has no delta term, so
    the NTK is the width -> infinity limit of ``ntbridge.empirical_ntk``. (With the delta terms of
    the distributional derivative the NTK would be infinite at equal inputs.)

    Example:
        >>> layer = Numerical(jnp.tanh, "Tanh")
        >>> relu6 = Pieces((0.0, 6.0), (Piece(), Piece((0.0, 1.0)), Piece((6.0,))))
        >>> layer = Numerical(lambda x: jnp.clip(x, 0.0, 6.0), "ReLU6", pieces=relu6)
    """
    return elementwise(fn, numerical_rule(fn, kinks, pieces, corrected), name)


def RectifiedMonomial(k: int) -> Layer:
    """``f(x) = max(x, 0)^k`` for ``k`` in 1..3 (``k = 1`` is ReLU), by the arc-cosine kernels.

    The derivative ``k max(x, 0)^(k-1)`` gives ``E[f'(u) f'(v)] = k^2 (q1 q2)^((k-1)/2) J_(k-1)(t)
    / (2 pi)``. Stax-only: torch has no module for it.

    Example:
        >>> layer = RectifiedMonomial(2)   # relu(x) ** 2
    """
    if k not in (1, 2, 3):
        raise InputError(f"RectifiedMonomial supports k = 1, 2, 3, got {k!r}.")
    return elementwise(lambda x: jnp.maximum(x, 0) ** k, rectified_monomial_rule(k),
                       f"RectifiedMonomial({k})", rectified_monomial_self_rule(k))


def _ab_relu(fn: Callable[[jax.Array], jax.Array], a: float, b: float, name: str) -> Layer:
    """``fn``, which is ``a * min(x, 0) + b * max(x, 0)``, with its rule and self rule."""
    return elementwise(fn, ab_relu_rule(a, b), name, ab_relu_self_rule(a, b), slopes=(a, b))


def ABRelu(a: float, b: float, name: str = "ABRelu") -> Layer:
    """``f(x) = a * min(x, 0) + b * max(x, 0)``: ReLU, LeakyReLU, Abs."""
    return _ab_relu(lambda x: a * jnp.minimum(x, 0) + b * jnp.maximum(x, 0), a, b, name)


def Relu() -> Layer:
    """torch's ``nn.ReLU``."""
    return _ab_relu(jax.nn.relu, 0.0, 1.0, "ReLU")


def LeakyRelu(negative_slope: float = 0.01) -> Layer:
    """torch's ``nn.LeakyReLU(negative_slope)``: ``x`` for ``x >= 0``, ``negative_slope * x`` below."""
    return _ab_relu(lambda x: jnp.where(x >= 0, x, negative_slope * x), negative_slope, 1.0,
                    "LeakyReLU")


def Abs() -> Layer:
    """``torch.abs``."""
    return _ab_relu(jnp.abs, -1.0, 1.0, "Abs")


def gelu_rule(c, q1, q2):
    """Rule of ``x Phi(x)`` (exact GELU). With ``P = (1 + q1)(1 + q2)``, ``D = sqrt(P - c^2)`` and
    ``s = arcsin(c / sqrt(P))`` (Tsuchida et al. 2020; Neural Tangents' Gelu):
    ``E[f f] = c/4 + (c s + (c^2 + q1 q2 D^2) / (P D)) / (2 pi)``,
    ``E[f' f'] = 1/4 + s / (2 pi) + c (1/D^2 + (1 - q1 q2) / P + 1) / (2 pi D)``.
    """
    p = (1 + q1) * (1 + q2)
    d2 = p - c * c                                  # >= 1 + q1 + q2 > 0
    d = jnp.sqrt(d2)
    s = jnp.arctan2(c, d)
    nngp = c / 4 + (c * s + (c * c + q1 * q2 * d2) / (p * d)) / (2 * math.pi)
    dot = 0.25 + s / (2 * math.pi) + c * (1 / d2 + (1 - q1 * q2) / p + 1) / (2 * math.pi * d)
    return nngp, dot


def Gelu(approximate: str = "none") -> Layer:
    """torch's ``nn.GELU(approximate)``: the erf form in closed form; ``"tanh"`` is a different
    function, whose kernel is computed numerically."""
    if approximate == "tanh":
        return Numerical(lambda x: jax.nn.gelu(x, approximate=True), "GELU(tanh)")
    return elementwise(lambda x: jax.nn.gelu(x, approximate=False), gelu_rule, "GELU")


def erf_rule(a: float, b: float, c: float) -> Rule:
    """Rule of ``a erf(b x) + c`` (Williams 1997): with ``d_i = 1 + 2 b^2 q_i``,
    ``E[f f] = a^2 (2/pi) arcsin(2 b^2 cov / sqrt(d1 d2)) + c^2``,
    ``E[f' f'] = a^2 b^2 (4/pi) / sqrt(d1 d2 - 4 b^4 cov^2)``."""

    def rule(cov, q1, q2):
        bb = b * b
        d = (1 + 2 * bb * q1) * (1 + 2 * bb * q2)
        ratio = jnp.clip(2 * bb * cov * jax.lax.rsqrt(d), -1.0, 1.0)
        nngp = a * a * (2 / math.pi) * jnp.arcsin(ratio) + c * c
        dot = a * a * bb * (4 / math.pi) * jax.lax.rsqrt(d - 4 * bb * bb * cov * cov)
        return nngp, dot

    return rule


def erf_self_rule(a: float, b: float, c: float) -> SelfRule:
    """Self rule of :func:`erf_rule`: ``a^2 (2/pi) arcsin(2 b^2 q / (1 + 2 b^2 q)) + c^2``."""
    return lambda q: a * a * (2 / math.pi) * jnp.arcsin(2 * b * b * q / (1 + 2 * b * b * q)) + c * c


def Erf(a: float = 1.0, b: float = 1.0, c: float = 0.0) -> Layer:
    """``a * erf(b * x) + c`` (``torch.special.erf`` with a=b=1, c=0)."""
    return elementwise(lambda x: a * jax.scipy.special.erf(b * x) + c, erf_rule(a, b, c), "Erf",
                       erf_self_rule(a, b, c))


def exp_rule(a: float, b: float) -> Rule:
    """Rule of ``a exp(b x)``, from the moment generating function of ``b (u + v)``:
    ``E[f f] = a^2 exp(b^2 (q1 + q2 + 2 cov) / 2)`` and ``E[f' f'] = b^2 E[f f]``."""

    def rule(cov, q1, q2):
        nngp = a * a * jnp.exp(0.5 * b * b * (q1 + q2 + 2 * cov))
        return nngp, b * b * nngp

    return rule


def Exp(a: float = 1.0, b: float = 1.0) -> Layer:
    """``a * exp(b * x)`` (``torch.exp`` with a = b = 1)."""
    return elementwise(lambda x: a * jnp.exp(b * x), exp_rule(a, b), "Exp",
                       lambda q: a * a * jnp.exp(2 * b * b * q))


def Sign() -> Layer:
    """``torch.sign`` (no nn module): -1, 0 or 1."""
    return elementwise(jnp.sign, sign_rule, "Sign", sign_self_rule)


def sin_rule(a: float, b: float, c: float) -> Rule:
    """Rule of ``a sin(b x + c)``, from ``E[cos(b(u -+ v))] = exp(-b^2 (q1 + q2 -+ 2 cov) / 2)``:
    ``E[f f] = a^2 / 2 (e- - e+ cos 2c)``, ``E[f' f'] = a^2 b^2 / 2 (e- + e+ cos 2c)``."""

    def rule(cov, q1, q2):
        half = -0.5 * b * b * (q1 + q2)
        minus, plus = jnp.exp(half + b * b * cov), jnp.exp(half - b * b * cov) * math.cos(2 * c)
        return a * a / 2 * (minus - plus), a * a * b * b / 2 * (minus + plus)

    return rule


def sin_self_rule(a: float, b: float, c: float) -> SelfRule:
    """Self rule of :func:`sin_rule`: ``E[f^2] = a^2 / 2 (1 - exp(-2 b^2 q) cos 2c)``."""
    return lambda q: a * a / 2 * (1 - jnp.exp(-2 * b * b * q) * math.cos(2 * c))


def _sinusoid(fn: Callable[[jax.Array], jax.Array], a: float, b: float, c: float,
              name: str) -> Layer:
    """``fn``, which is ``a * sin(b * x + c)``, with its rule and self rule."""
    return elementwise(fn, sin_rule(a, b, c), name, sin_self_rule(a, b, c))


def Sin(a: float = 1.0, b: float = 1.0, c: float = 0.0) -> Layer:
    """``a * sin(b * x + c)``; ``Cos`` is ``Sin`` with ``c + pi / 2``."""
    return _sinusoid(lambda x: a * jnp.sin(b * x + c), a, b, c, "Sin")


def Cos(a: float = 1.0, b: float = 1.0, c: float = 0.0) -> Layer:
    """``a * cos(b * x + c)``."""
    return _sinusoid(lambda x: a * jnp.cos(b * x + c), a, b, c + math.pi / 2, "Cos")
