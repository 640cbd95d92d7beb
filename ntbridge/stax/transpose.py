"""Transposed convolutions: torch's ``nn.ConvTranspose1d/2d/3d``.

Along each spatial axis, a transposed convolution with kernel size ``k``, ``stride``, ``padding``,
``output_padding`` and ``dilation`` equals a convolution of stride 1 and the same dilation over the
input *dilated* by ``stride`` (``stride - 1`` zeros between positions) and zero-padded by
``lo = dilation * (k - 1) - padding`` before and ``lo + output_padding`` after (negative: cropped),
with the kernel flipped. Output position ``s`` sees the dilated input through weight offset ``j``
at ``s + j * dilation``.

Kernel rule (Neural Tangents' ``ConvTranspose`` mathematics, torch's geometry): the weights at
offset ``j`` are shared by all positions and independent across offsets, so
``nngp_out[s, s'] = sigma_w**2 * (C_in / groups) * sum_j nngp_dil[s + j d, s' + j d] + b_std**2``
(the same ``j`` on both sides), where ``nngp_dil`` is the input covariance on the dilated, padded
axes (zero wherever a side is an inserted zero). Positions between the input's receive fewer
offsets than others; their variance is smaller, as in the finite model. On the diagonal layout
(``s = s'``) the sum along each axis is one matrix, :func:`transpose_matrix`. Torch's default init
draws the weight ``(C_in, C_out / groups, *k)`` with ``fan_in = C_out / groups * prod(k)``
(``weight.size(1) * prod(k)``) and ``sigma_w**2 = W_std**2 / fan_in``, so the factor on the sum is
``W_std**2 * C_in / (C_out * prod(k))``. Groups do not change the kernel otherwise.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import InputError
from .conv import (affine_output, as_tuple, conv_init_fn, contract, window_matrix,
                   window_reduce)
from .kernel import Kernel, map_arrays, spatial_axes
from .layers import Layer, affine_hyper, channels_first


def transpose_pads(size: int, padding: int, output_padding: int, dilation: int) -> tuple[int, int]:
    """``(low, high)`` zeros around the dilated input (negative: positions cropped)."""
    low = dilation * (size - 1) - padding
    return low, low + output_padding


def dilation_matrix(length: int, stride: int, pads: tuple[int, int]) -> np.ndarray:
    """``(padded, length)``: an axis dilated by ``stride`` and padded by ``pads`` as a linear map.

    Example:
        >>> dilation_matrix(2, 2, (1, 0))
        array([[0., 0.],
               [1., 0.],
               [0., 0.],
               [0., 1.]])
    """
    rows = pads[0] + np.arange(length) * stride
    m = np.zeros((pads[0] + (length - 1) * stride + 1 + pads[1], length))
    keep = (rows >= 0) & (rows < m.shape[0])
    m[rows[keep], np.arange(length)[keep]] = 1
    return m


def transpose_matrix(length: int, size: int, stride: int, padding: int, output_padding: int,
                     dilation: int) -> np.ndarray:
    """``(out, length)``: entry ``(s, i)`` counts the kernel offsets through which output ``s`` of
    a 1d transposed convolution sees input ``i`` (0 or 1 unless offsets coincide).

    Example (stride 2, kernel 3, padding 1: each input feeds three outputs, centred at 2 i):
        >>> transpose_matrix(2, 3, 2, 1, 0, 1)
        array([[1., 0.],
               [1., 1.],
               [0., 1.]])
    """
    pads = transpose_pads(size, padding, output_padding, dilation)
    dilated = dilation_matrix(length, stride, pads)
    return window_matrix(dilated.shape[0], size, 1, dilation, (0, 0), "constant") @ dilated


def ConvTranspose(in_channels: int, out_channels: int, kernel_size: Sequence[int], *,
                  W_std: float, b_std: float | None, stride: Sequence[int] | int = 1,
                  padding: Sequence[int] | int = 0, output_padding: Sequence[int] | int = 0,
                  dilation: Sequence[int] | int = 1, groups: int = 1,
                  parameterization: str = "standard", distribution: str = "uniform") -> Layer:
    """torch's ``nn.ConvTranspose{n}d`` with ``n = len(kernel_size)``, ``bias=b_std is not None``.

    Shapes: ``x (N, in_channels, *S) -> (N, out_channels, *S_out)`` with ``S_out = (S - 1) *
    stride - 2 * padding + dilation * (k - 1) + output_padding + 1``. Params ``{"weight": (in,
    out / groups, *kernel_size), "bias": (out,)}``, weight variance ``W_std**2 / fan_in`` with
    torch's ``fan_in = out / groups * prod(kernel_size)``, bias variance ``b_std**2``.

    Example:
        >>> up = ConvTranspose(16, 8, (2, 2), stride=2, W_std=1.0, b_std=0.1)
        >>> up.init_fn(jax.random.key(0), (2, 16, 4, 4))[0]
        (2, 8, 8, 8)
    """
    ndim = len(kernel_size)
    kernel_size = as_tuple(kernel_size, ndim)
    stride, dilation = as_tuple(stride, ndim), as_tuple(dilation, ndim)
    padding, output_padding = as_tuple(padding, ndim), as_tuple(output_padding, ndim)
    if any(op >= max(s, d) for op, s, d in zip(output_padding, stride, dilation)):
        raise InputError(f"output_padding {output_padding} must be smaller than stride {stride} "
                         f"or dilation {dilation}, as torch requires.")
    pads = [transpose_pads(*dims) for dims in zip(kernel_size, padding, output_padding, dilation)]
    fan_in = out_channels // groups * math.prod(kernel_size)
    # sigma_w**2 * (in / groups) = W_std**2 * taps_factor / prod(kernel_size): see the module doc
    taps_factor = in_channels / out_channels
    has_bias, hyper = b_std is not None, affine_hyper(W_std, b_std)

    def out_spatial(spatial):
        return tuple((n - 1) * s + lo + hi + 1 - d * (k - 1)
                     for n, s, (lo, hi), d, k in zip(spatial, stride, pads, dilation, kernel_size))

    init_fn = conv_init_fn(in_channels, out_channels,
                           (in_channels, out_channels // groups, *kernel_size), out_spatial,
                           f"gives no output positions (padding {padding} crops them all)",
                           W_std / fan_in ** 0.5, b_std, distribution)

    def apply_fn(params, x):
        flip = tuple(range(2, 2 + ndim))

        def conv(xg, wg):  # wg (in / groups, out / groups, *k) -> (out, in, *k), flipped
            return jax.lax.conv_general_dilated(
                xg, jnp.flip(jnp.swapaxes(wg, 0, 1), flip), (1,) * ndim, pads,
                lhs_dilation=stride, rhs_dilation=dilation, precision=jax.lax.Precision.HIGHEST)

        # Groups as separate convolutions, as in stax.Conv (JAX cannot vmap their Jacobian).
        y = jnp.concatenate([conv(xg, wg) for xg, wg in zip(
            jnp.split(x, groups, axis=1), jnp.split(params["weight"], groups, axis=0))], axis=1)
        return y + params["bias"].reshape(-1, *[1] * ndim) if has_bias else y

    def tap_mean(a, n_batch, diagonal_spatial):
        """``taps_factor * mean_j`` of the input covariance seen through offset ``j``."""
        dims = zip(kernel_size, stride, padding, output_padding, dilation, pads)
        if diagonal_spatial:
            for d, (k, s, p, op, dil, _) in enumerate(dims):
                m = transpose_matrix(a.shape[n_batch + d], k, s, p, op, dil)
                a = contract(a, m / k, n_batch + d)
            return taps_factor * a
        for axes, (k, s, _, _, dil, (lo, hi)) in zip(spatial_axes(n_batch, ndim, False), dims):
            config = [(0, 0, 0)] * a.ndim
            for ax in axes:
                config[ax] = (lo, hi, s - 1)
            a = jax.lax.pad(a, jnp.zeros((), a.dtype), config)
            a = window_reduce(a, axes, k, 1, dil, (0, 0), "constant", jnp.add) / k
        return taps_factor * a

    def kernel_fn(k: Kernel, hyper: dict = hyper) -> Kernel:
        k = map_arrays(k, lambda a, n: tap_mean(a, n, k.diagonal_spatial))
        return affine_output(k, hyper["W_std"], hyper.get("b_std"), fan_in, parameterization,
                             out_channels, out_spatial)

    return channels_first(Layer(init_fn, apply_fn, kernel_fn, affine=True, hyper=hyper))
