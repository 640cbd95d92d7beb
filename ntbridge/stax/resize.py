"""Resizing: torch's ``nn.Upsample`` / ``F.interpolate``, ``nn.PixelShuffle``, ``PixelUnshuffle``.

Every interpolation mode of torch (``nearest``, ``nearest-exact``, ``(bi/tri)linear``, ``bicubic``,
``area``; without anti-aliasing) is separable: along spatial axis ``d`` it is a fixed matrix
``A_d (out, in)`` computed by torch's own index arithmetic (:func:`resize_matrix`), the same for
every channel and example. Its kernel rule is exact, ``cov'[s, s'] = sum A[s, i] A[s', i']
cov[i, i']`` along each axis pair (:func:`~.pooling.separable_linear`). Nearest modes select one
input per output (one entry per row), so they also run on the diagonal layout; the others mix
neighbouring positions and need the full spatial covariance.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax.numpy as jnp
import numpy as np

from ..errors import InputError, ShapeError, UnsupportedLayerError
from .conv import as_tuple
from .kernel import Kernel, map_arrays, spatial_axes
from .layers import Layer, channels_first
from .pooling import adaptive_matrix, separable_linear

# interpolating modes and the number of spatial dims torch takes them for
INTERPOLATING = {"linear": 1, "bilinear": 2, "bicubic": 2, "trilinear": 3}
MODES = ("nearest", "nearest-exact", "area", *INTERPOLATING)
CUBIC_A = -0.75  # torch's bicubic convolution coefficient (Keys' kernel)


def _source_step(length: int, out: int, align_corners: bool, scale: float | None) -> float:
    """torch's ``area_pixel_compute_scale``: input positions per output position; ``scale``: the
    user's scale factor where torch uses it (None: the sizes' ratio)."""
    if align_corners:
        return (length - 1) / (out - 1) if out > 1 else 0.0
    return 1 / scale if scale else length / out


def _nearest(length: int, out: int, scale: float | None, exact: bool) -> np.ndarray:
    """Source indices of torch's ``nearest`` (``floor(dst * step)``) or ``nearest-exact``
    (``floor((dst + 0.5) * step)``), computed in float32 as torch computes them."""
    dst = np.arange(out)
    step = np.float32(1 / scale if scale else np.float32(length) / np.float32(out))
    src = ((dst + 0.5) * np.float64(step)).astype(np.float32) if exact else (
        dst.astype(np.float32) * step)
    return np.minimum(np.floor(src).astype(np.int64), length - 1)


def _cubic_weights(t: np.ndarray) -> list[np.ndarray]:
    """Keys' cubic convolution weights of the inputs at offsets -1, 0, 1, 2 from ``floor(src)``."""
    near = lambda x: ((CUBIC_A + 2) * x - (CUBIC_A + 3)) * x * x + 1  # |x| <= 1
    far = lambda x: ((CUBIC_A * x - 5 * CUBIC_A) * x + 8 * CUBIC_A) * x - 4 * CUBIC_A  # 1 < |x| < 2
    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def resize_matrix(length: int, out: int, mode: str, align_corners: bool = False,
                  scale: float | None = None) -> np.ndarray:
    """``A (out, length)``: torch's 1d interpolation ``mode`` as a linear map (``mode``: a
    torch mode, ``bilinear`` etc. meaning their 1d factor; ``scale``: see :func:`_source_step`).

    Example:
        >>> resize_matrix(2, 4, "linear")
        array([[1.  , 0.  ],
               [0.75, 0.25],
               [0.25, 0.75],
               [0.  , 1.  ]])
    """
    if mode == "area":
        return adaptive_matrix(length, out)
    m, dst = np.zeros((out, length)), np.arange(out)
    if mode.startswith("nearest"):
        m[dst, _nearest(length, out, scale, mode == "nearest-exact")] = 1
        return m
    cubic = mode == "bicubic"
    step = _source_step(length, out, align_corners, scale)
    src = step * dst if align_corners else step * (dst + 0.5) - 0.5
    src = src if cubic or align_corners else np.maximum(src, 0)  # linear clamps at the edge
    low = np.minimum(np.floor(src).astype(np.int64), length - 1)
    t = np.clip(src - low, 0, 1)
    taps = zip(range(-1, 3), _cubic_weights(t)) if cubic else ((0, 1 - t), (1, t))
    for offset, weight in taps:  # inputs beyond the edges are the edge's (torch clamps indices)
        np.add.at(m, (dst, np.clip(low + offset, 0, length - 1)), weight)
    return m


def Upsample(size: int | Sequence[int] | None = None,
             scale_factor: float | Sequence[float] | None = None, mode: str = "nearest",
             align_corners: bool | None = None, recompute_scale_factor: bool | None = None,
             name: str = "Upsample") -> Layer:
    """torch's ``nn.Upsample`` (``F.interpolate`` without ``antialias``), ``(N, C, *S) ->
    (N, C, *S_out)``: ``S_out = size``, or ``floor(S * scale_factor)``; ``mode`` one of
    :data:`MODES` (``linear``, ``bilinear``/``bicubic``, ``trilinear``: 1, 2, 3 spatial dims;
    the others: any). ``name``: the torch module's, for error messages.

    Example:
        >>> Upsample(scale_factor=2, mode="bilinear").init_fn(None, (5, 3, 4, 4))[0]
        (5, 3, 8, 8)
    """
    if mode not in MODES:
        raise InputError(f"mode={mode!r} is not one of torch's modes {MODES}.")
    if (size is None) == (scale_factor is None):
        raise InputError("give exactly one of size and scale_factor.")
    if align_corners is not None and mode not in INTERPOLATING:
        raise InputError(f"align_corners is only for the interpolating modes "
                         f"{tuple(INTERPOLATING)}, not mode={mode!r}.")

    def matrices(spatial):
        ndim = len(spatial)
        if isinstance(scale_factor, Sequence) and len(scale_factor) != ndim:
            raise ShapeError(f"scale_factor {tuple(scale_factor)} has {len(scale_factor)} "
                             f"entries for inputs of {ndim} spatial dims")
        if size is not None:
            out, scales = as_tuple(size, ndim), (None,) * ndim
        else:
            factors = tuple(scale_factor) if isinstance(scale_factor, Sequence) else (
                (scale_factor,) * ndim)
            out = tuple(math.floor(n * float(f)) for n, f in zip(spatial, factors))
            scales = (None,) * ndim if recompute_scale_factor else factors
        return [resize_matrix(n, o, mode, bool(align_corners), s)
                for n, o, s in zip(spatial, out, scales)]

    return separable_linear(INTERPOLATING.get(mode), matrices, name,
                            one_per_row=mode.startswith("nearest"))


def _pixel_layer(factor: int, up: bool) -> Layer:
    """PixelShuffle (``up``) or PixelUnshuffle by ``factor`` on ``(N, C, H, W)``."""
    name = "PixelShuffle" if up else "PixelUnshuffle"

    def out_shape(shape):
        divided = ("C", factor ** 2, shape[1:2]) if up else ("H and W", factor, shape[2:])
        if len(shape) != 4 or any(d % divided[1] for d in divided[2]):
            raise ShapeError(f"{name}({factor}) expects inputs of shape (N, C, H, W) with "
                             f"{divided[0]} divisible by {divided[1]}, got {tuple(shape)}")
        n, c, h, w = shape
        if up:
            return n, c // factor ** 2, h * factor, w * factor
        return n, c * factor ** 2, h // factor, w // factor

    def apply_fn(params, x):
        n, c, h, w = out_shape(x.shape)
        if up:  # channel (c, i, j) at (h, w) -> channel c at (h r + i, w r + j)
            x = x.reshape(n, c, factor, factor, h // factor, w // factor)
            return x.transpose(0, 1, 4, 2, 5, 3).reshape(n, c, h, w)
        x = x.reshape(n, c // factor ** 2, h, factor, w, factor)
        return x.transpose(0, 1, 3, 5, 2, 4).reshape(n, c, h, w)

    def axis_rule(a, axes, diagonal):
        """One spatial axis (pair): spread (``up``) or gather the ``factor`` sub-positions."""
        if diagonal:
            ax = axes[0]
            return jnp.repeat(a, factor, ax) if up else a.reshape(
                *a.shape[:ax], -1, factor, *a.shape[ax + 1:]).mean(ax + 1)
        first, second = axes
        if up:  # kron(a, I): sub-positions i != i' come from different, independent channels
            eye = jnp.eye(factor, dtype=a.dtype).reshape(
                [factor if i in (first + 1, second + 2) else 1 for i in range(a.ndim + 2)])
            a = jnp.expand_dims(a, (first + 1, second + 2)) * eye
            return a.reshape(*a.shape[:first], -1, a.shape[first + 2] * factor,
                             *a.shape[first + 4:])
        # mean over i of a[h r + i, h' r + i]: channel (c, i, j) pairs with itself only
        a = a.reshape(*a.shape[:first], -1, factor, a.shape[second] // factor, factor,
                      *a.shape[second + 1:])
        return jnp.diagonal(a, axis1=first + 1, axis2=first + 3).mean(-1)

    def kernel_fn(k: Kernel) -> Kernel:
        if up and not k.is_gaussian:
            raise UnsupportedLayerError(
                "PixelShuffle's kernel rule needs independent, identically distributed channels "
                "(the output of a Linear/Conv layer): it puts different channels side by side. "
                "Shuffle right after the convolution (an elementwise activation commutes with it), "
                "or use ntbridge.empirical_ntk / ntbridge.monte_carlo.")

        shape1, shape2 = out_shape(k.shape1), out_shape(k.shape2)

        def fn(a, n_batch):
            for axes in spatial_axes(n_batch, 2, k.diagonal_spatial):
                a = axis_rule(a, axes, k.diagonal_spatial)
            return a

        # after unshuffling, channels of different sub-positions differ: not identically distributed
        return map_arrays(k, fn).replace(shape1=shape1, shape2=shape2,
                                         is_gaussian=k.is_gaussian and up)

    return channels_first(Layer(lambda key, shape: (out_shape(tuple(shape)), {}), apply_fn,
                                kernel_fn, affine=True))


def PixelShuffle(upscale_factor: int) -> Layer:
    """torch's ``nn.PixelShuffle(r)``: ``(N, C r^2, H, W) -> (N, C, H r, W r)``, output channel
    ``c`` at ``(h r + i, w r + j)`` being input channel ``c r^2 + i r + j`` at ``(h, w)``.

    Kernel: with independent, identically distributed input channels (an affine layer's outputs),
    positions of one sub-pixel class ``(i, j)`` keep the input's covariance, and those of
    different classes come from different channels, so they are uncorrelated:
    ``K'[(h r + i, w r + j), (h' r + i', w' r + j')] = K[(h, w), (h', w')] [i = i'] [j = j']``,
    the NTK likewise. Exact; refused for other inputs (e.g. the model's raw input, whose channels
    correlate).

    Example:
        >>> PixelShuffle(2).init_fn(None, (5, 12, 4, 4))[0]
        (5, 3, 8, 8)
    """
    return _pixel_layer(upscale_factor, up=True)


def PixelUnshuffle(downscale_factor: int) -> Layer:
    """torch's ``nn.PixelUnshuffle(r)``: ``(N, C, H r, W r) -> (N, C r^2, H, W)``, the inverse.

    Kernel (per output channel, averaged over channels): output channel ``c r^2 + i r + j`` at
    ``(h, w)`` is input channel ``c`` at ``(h r + i, w r + j)``, so ``K'[(h, w), (h', w')] =
    mean_{i, j} K[(h r + i, w r + j), (h' r + i, w' r + j)]``. Exact for any input; the output's
    channels are no longer identically distributed, so it feeds affine layers only.

    Example:
        >>> PixelUnshuffle(2).init_fn(None, (5, 3, 8, 8))[0]
        (5, 12, 4, 4)
    """
    return _pixel_layer(downscale_factor, up=False)
