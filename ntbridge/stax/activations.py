"""Elementwise nonlinearities and their Gaussian-expectation kernel rules.

A rule is ``rule(c, q1, q2) -> (E[f(u) f(v)], E[f'(u) f'(v)])`` for ``(u, v)`` centred Gaussian
with variances ``q1``, ``q2`` and covariance ``c``; :func:`elementwise` applies it to every entry of
the kernel (batch pairs and spatial pairs alike). The NTK picks up the derivative factor.
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp

from ..errors import UnsupportedLayerError
from .kernel import Kernel, variances
from .layers import Layer

Rule = Callable[[jax.Array, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]


def elementwise(fn: Callable[[jax.Array], jax.Array], rule: Rule, name: str) -> Layer:
    """A layer applying ``fn`` to each entry, with kernel rule ``rule`` (see module doc).

    The rule needs Gaussian inputs: after a nonlinearity (e.g. ReLU after ReLU) it raises
    :class:`~ntbridge.errors.UnsupportedLayerError`.
    """

    def kernel_fn(k: Kernel) -> Kernel:
        if not k.is_gaussian:
            raise UnsupportedLayerError(
                f"{name}'s kernel rule needs a Gaussian input (the output of a Linear/Conv "
                f"layer), but its input is the output of a nonlinearity or the raw data; put an "
                f"affine layer before it, or use ntbridge.empirical_ntk / ntbridge.monte_carlo.")
        q = variances(k)
        nngp, dot = rule(k.nngp, *q["nngp"])
        return k.replace(
            nngp=nngp, ntk=None if k.ntk is None else k.ntk * dot,
            cov1=rule(k.cov1, *q["cov1"])[0], cov2=rule(k.cov2, *q["cov2"])[0],
            is_gaussian=False)

    return Layer(lambda key, shape: (tuple(shape), {}), lambda params, x: fn(x), kernel_fn)


def _angle(c: jax.Array, q1: jax.Array, q2: jax.Array):
    """``(sqrt(q1 q2), cos, sin, theta)`` of the angle between the two Gaussians, kept finite.

    The cosine is clipped to [-1, 1] (rounding can push it past 1 at x1 == x2), and zero-variance
    inputs are treated as the limit of vanishing inputs (cosine 0), never NaN.
    """
    norm = jnp.sqrt(q1 * q2)
    cos = jnp.clip(c / jnp.where(norm > 0, norm, 1), -1.0, 1.0)
    sin = jnp.sqrt(jnp.maximum(1.0 - cos * cos, 0.0))
    return norm, cos, sin, jnp.arccos(cos)


def ab_relu_rule(a: float, b: float) -> Rule:
    """Rule of ``f(x) = a * min(x, 0) + b * max(x, 0)`` (ReLU: a=0, b=1; |x|: a=-1, b=1).

    Arc-cosine kernel (Cho & Saul): ``E[relu(u) relu(v)] = sqrt(q1 q2) (sin t + (pi - t) cos t)
    / (2 pi)``, ``E[relu'(u) relu'(v)] = (pi - t) / (2 pi)``; the mixed terms follow from
    ``relu(-u)`` having the angle ``pi - t``.
    """

    def rule(c, q1, q2):
        norm, cos, sin, t = _angle(c, q1, q2)
        same = sin + (math.pi - t) * cos           # (2 pi) E[relu(u) relu(v)] / norm
        mixed = sin - t * cos                      # (2 pi) E[relu(u) relu(-v)] / norm
        nngp = norm * ((a * a + b * b) * same - 2 * a * b * mixed) / (2 * math.pi)
        dot = ((a * a + b * b) * (math.pi - t) + 2 * a * b * t) / (2 * math.pi)
        return nngp, dot

    return rule


def ABRelu(a: float, b: float, name: str = "ABRelu") -> Layer:
    """``f(x) = a * min(x, 0) + b * max(x, 0)``: ReLU, LeakyReLU, Abs."""
    return elementwise(lambda x: a * jnp.minimum(x, 0) + b * jnp.maximum(x, 0),
                       ab_relu_rule(a, b), name)


def Relu() -> Layer:
    """torch's ``nn.ReLU``."""
    return elementwise(jax.nn.relu, ab_relu_rule(0.0, 1.0), "ReLU")
