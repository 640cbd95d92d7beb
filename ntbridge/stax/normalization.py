"""Normalization layers: LayerNorm and RMSNorm (BatchNorm is :mod:`.batchnorm`'s)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..errors import ShapeError, UnsupportedLayerError
from .kernel import Kernel, _diagonal_variances, variances
from .layers import Layer


def LayerNorm(normalized_shape: tuple[int, ...], eps: float, weight: float | None = None,
              bias: float | None = None) -> Layer:
    """torch's ``nn.LayerNorm(normalized_shape, eps)`` over every non-batch axis, ``(N, C, *S)``,
    or over each position's features of sequences ``(N, T, d)`` or channels-last images ``(N, *S,
    d)`` (``normalized_shape = (d,)``: the same rule per position, with its own variance ``v_s``).

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
    return _normalization("LayerNorm", tuple(normalized_shape), eps, weight, bias, centred=True)


def RMSNorm(normalized_shape: tuple[int, ...], eps: float, weight: float | None = None) -> Layer:
    """torch's ``nn.RMSNorm(normalized_shape, eps)`` (and Llama's): ``x / sqrt(mean(x**2) + eps)
    * weight``, over the same axes as :func:`LayerNorm`'s (per token for ``(N, T, d)``).

    ``weight``: the scale's value, constant over its entries (None: no scale); a size -1 in
    ``normalized_shape`` takes the input's, whatever it is (a hand-written norm of the last axis).
    Kernel: in the
    infinite-width limit the mean square over the normalized entries is the mean of the covariance
    diagonal ``v`` (a law of large numbers over i.i.d. units, for any input distribution, so no
    centring is needed), hence ``K -> K / sqrt((v1 + eps)(v2 + eps))``, the NTK likewise; a trained
    ``weight`` multiplies both by ``weight**2`` and adds the normalized NNGP to the NTK (its
    gradient is the normalized input).

    Example:
        >>> layer = RMSNorm((64,), 1e-6, weight=1.0)
    """
    return _normalization("RMSNorm", tuple(normalized_shape), eps, weight, None, centred=False)


def _normalization(name: str, shape: tuple[int, ...], eps: float, weight: float | None,
                   bias: float | None, centred: bool) -> Layer:
    """LayerNorm (``centred``: the mean subtracted) or RMSNorm over the last ``len(shape)`` axes."""
    n_axes = len(shape)

    def init_fn(key, input_shape):
        normalized = tuple(input_shape[-n_axes:])
        if (len(input_shape) - n_axes < 1
                or any(s not in (-1, n) for s, n in zip(shape, normalized))):
            raise ShapeError(f"normalizes over {shape}, which must be the whole per-example shape "
                             f"or each position's features (N, T, d) or (N, *S, d), got inputs "
                             f"{tuple(input_shape)}")
        fresh = {"weight": (weight, jnp.ones), "bias": (bias, jnp.zeros)}  # torch's own init
        return tuple(input_shape), {key: init(shape) for key, (value, init) in fresh.items()
                                    if value is not None}

    def apply_fn(params, x):
        axes = tuple(range(x.ndim - n_axes, x.ndim))
        x = x - x.mean(axes, keepdims=True) if centred else x
        y = x * jax.lax.rsqrt(jnp.square(x).mean(axes, keepdims=True) + eps)
        if "weight" in params:
            y = y * params["weight"]
        return y + params["bias"] if "bias" in params else y

    def kernel_fn(k: Kernel) -> Kernel:
        _check_input(name, shape, k, centred)
        return _normalized(k, n_axes, eps, weight, bias)

    return Layer(init_fn, apply_fn, kernel_fn)


def _check_input(name: str, shape: tuple[int, ...], k: Kernel, centred: bool) -> None:
    """ShapeError for a per-token norm of channels-first inputs; UnsupportedLayerError for a
    LayerNorm (``centred``) of an input that is not a zero-mean Gaussian."""
    if len(k.shape1) - len(shape) >= 2 and not k.tokens:
        raise ShapeError(
            f"{name}{shape} of inputs {k.shape1} normalizes the last axis: a kernel rule for "
            f"sequences (N, T, d), features last, but its input here is channels first, its last "
            f"axis positions. Normalize the whole per-example shape, or use "
            f"ntbridge.empirical_ntk.")
    if centred and not k.is_gaussian:
        raise UnsupportedLayerError(
            "LayerNorm's kernel rule needs a zero-mean Gaussian input (the output of a "
            "Linear/Conv layer or of another LayerNorm); its input here has a nonzero mean per "
            "example. Put an affine layer before it, or use ntbridge.empirical_ntk.")


def _normalized(k: Kernel, n_axes: int, eps: float, weight: float | None,
                bias: float | None) -> Kernel:
    """``k`` divided by ``sqrt((v1 + eps)(v2 + eps))`` (``v``: the mean of each example's
    covariance diagonal, or each position's variance where each position's features are
    normalized on their own), then the affine parameters' terms (see LayerNorm)."""
    if len(k.shape1) - n_axes == 1:  # the whole per-example shape: one variance per example
        v1, v2 = (_diagonal_variances(c, k.diagonal_spatial) for c in (k.cov1, k.cov2))
        r1, r2 = (jax.lax.rsqrt(v.reshape(v.shape[0], -1).mean(1) + eps) for v in (v1, v2))
        pad = (1,) * (k.nngp.ndim - 2)
        factors = {"nngp": (r1.reshape(-1, 1, *pad), r2.reshape(1, -1, *pad)),
                   "cov1": (r1.reshape(-1, *pad),) * 2, "cov2": (r2.reshape(-1, *pad),) * 2}
    else:  # each position of (N, T, d) or (N, *S, d): its own variance, broadcast to each entry
        factors = {name: tuple(jax.lax.rsqrt(v + eps) for v in pair)
                   for name, pair in variances(k).items()}
    scaled = lambda a, name: a * factors[name][0] * factors[name][1]
    nngp = scaled(k.nngp, "nngp")
    w2 = 1.0 if weight is None else weight ** 2
    b2 = 0.0 if bias is None else bias ** 2
    own = (0.0 if weight is None else nngp) + (0.0 if bias is None else 1.0)
    ntk = None if k.ntk is None else w2 * scaled(k.ntk, "nngp") + own
    return k.replace(nngp=w2 * nngp + b2, ntk=ntk, cov1=w2 * scaled(k.cov1, "cov1") + b2,
                     cov2=w2 * scaled(k.cov2, "cov2") + b2,
                     is_gaussian=k.is_gaussian and b2 == 0)  # else not centred
