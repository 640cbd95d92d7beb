"""Normalization layers: LayerNorm (with a kernel rule) and BatchNorm (exact forward only)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..errors import ShapeError, UnsupportedLayerError
from .kernel import Kernel, _diagonal_variances
from .layers import Layer


def LayerNorm(normalized_shape: tuple[int, ...], eps: float, weight: float | None = None,
              bias: float | None = None) -> Layer:
    """torch's ``nn.LayerNorm(normalized_shape, eps)`` over every non-batch axis, ``(N, C, *S)``.

    ``weight``/``bias`` are the affine parameters' values, each constant over its entries (None:
    no such parameter). Forward: ``(x - mean) / sqrt(var + eps) * weight + bias`` per example.
    Kernel (Neural Tangents' LayerNorm, with torch's eps): in the infinite-width limit each
    example's mean over its entries is 0 and its variance is ``v`` = the mean over positions of its
    covariance diagonal, so ``K -> K / sqrt((v1 + eps)(v2 + eps))``, the NTK likewise (the
    projection off the example's own direction is one direction out of infinitely many). The
    trained affine parameters add ``weight**2`` to the carried NTK's factor, their own
    ``K_normalized + 1`` (weight, bias) to the NTK and ``bias**2`` to the NNGP.

    Example:
        >>> layer = LayerNorm((64,), 1e-5, weight=1.0, bias=0.0)
    """

    def init_fn(key, input_shape):
        if tuple(input_shape[1:]) != tuple(normalized_shape):
            raise ShapeError(f"normalizes over {tuple(normalized_shape)}, which must be the whole "
                             f"per-example shape, got inputs {tuple(input_shape)}")
        fresh = {"weight": (weight, jnp.ones), "bias": (bias, jnp.zeros)}  # torch's own init
        return tuple(input_shape), {name: init(tuple(normalized_shape))
                                    for name, (value, init) in fresh.items() if value is not None}

    def apply_fn(params, x):
        axes = tuple(range(1, x.ndim))
        mean = x.mean(axes, keepdims=True)
        var = jnp.square(x - mean).mean(axes, keepdims=True)
        y = (x - mean) * jax.lax.rsqrt(var + eps)
        if "weight" in params:
            y = y * params["weight"]
        return y + params["bias"] if "bias" in params else y

    def kernel_fn(k: Kernel) -> Kernel:
        if not k.is_gaussian:
            raise UnsupportedLayerError(
                "LayerNorm's kernel rule needs a zero-mean Gaussian input (the output of a "
                "Linear/Conv layer or of another LayerNorm); its input here has a nonzero mean per "
                "example. Put an affine layer before it, or use ntbridge.empirical_ntk.")
        v1, v2 = (_diagonal_variances(c, k.diagonal_spatial) for c in (k.cov1, k.cov2))
        v1, v2 = (v.reshape(v.shape[0], -1).mean(1) + eps for v in (v1, v2))
        pad = (1,) * (k.nngp.ndim - 2)
        scale = lambda a, va, vb: a * jax.lax.rsqrt(va) * jax.lax.rsqrt(vb)
        nngp = scale(k.nngp, v1.reshape(-1, 1, *pad), v2.reshape(1, -1, *pad))
        cov = lambda c, v: scale(c, v.reshape(-1, *pad), v.reshape(-1, *pad))
        w2 = 1.0 if weight is None else weight ** 2
        b2 = 0.0 if bias is None else bias ** 2
        own = (0.0 if weight is None else nngp) + (0.0 if bias is None else 1.0)
        ntk = None if k.ntk is None else (
            w2 * scale(k.ntk, v1.reshape(-1, 1, *pad), v2.reshape(1, -1, *pad)) + own)
        return k.replace(nngp=w2 * nngp + b2, ntk=ntk, cov1=w2 * cov(k.cov1, v1) + b2,
                         cov2=w2 * cov(k.cov2, v2) + b2, is_gaussian=b2 == 0)  # else not centred

    return Layer(init_fn, apply_fn, kernel_fn)


def BatchNorm(eps: float, batch_statistics: bool) -> Layer:
    """torch's ``nn.BatchNormNd`` on ``(N, C, *S)``, normalising each channel; no kernel rule.

    ``batch_statistics``: normalise with the batch's own mean and (biased) variance, as torch does
    in training mode or without running stats (examples then interact); otherwise with the
    ``running_mean``/``running_var`` params (eval mode). Params: those two (when used) and the
    optional affine ``weight``/``bias``, each ``(C,)``.
    """

    def apply_fn(params, x):
        shape = (1, -1) + (1,) * (x.ndim - 2)
        if batch_statistics:
            axes = (0,) + tuple(range(2, x.ndim))
            mean = x.mean(axes, keepdims=True)
            var = jnp.square(x - mean).mean(axes, keepdims=True)
        else:
            mean, var = params["running_mean"].reshape(shape), params["running_var"].reshape(shape)
        y = (x - mean) * jax.lax.rsqrt(var + eps)
        if "weight" in params:
            y = y * params["weight"].reshape(shape)
        return y + params["bias"].reshape(shape) if "bias" in params else y

    def kernel_fn(k: Kernel) -> Kernel:
        raise UnsupportedLayerError(
            "BatchNorm has no infinite-width kernel rule here (in training mode it couples the "
            "examples of a batch); use ntbridge.empirical_ntk or ntbridge.monte_carlo, or replace "
            "it by nn.LayerNorm.")

    return Layer(lambda key, shape: (tuple(shape), {}), apply_fn, kernel_fn)
