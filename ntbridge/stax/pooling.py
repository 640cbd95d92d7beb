"""Pooling: torch's ``nn.AvgPool{n}d``, ``nn.AdaptiveAvgPool{n}d``, ``nn.MaxPool{n}d``,
``nn.AdaptiveMaxPool{n}d``.

Average pooling is linear and separable: along spatial dim ``d`` it is a matrix ``M_d`` (out, in),
so its kernel rule is ``nngp_out[s, s'] = sum_{i, i'} M[s, i] M[s', i'] nngp_in[i, i']`` per dim.
It mixes different positions, so it needs the full spatial covariance (``full_spatial=True``).
Max pooling has no closed-form kernel: a numerical expectation (:mod:`.maxpool`).
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ShapeError, UnsupportedLayerError
from .conv import as_tuple, check_spatial_input, contract, window_count, window_reduce
from .features import linear_features
from .kernel import Kernel, map_arrays, spatial_axes
from .layers import Layer, channels_first
from .maxpool import adaptive_pool_windows, max_rule, pool_windows
from .sources import SAMPLING

Matrices = Callable[[tuple[int, ...]], list[np.ndarray]]


def pool_count(length: int, size: int, stride: int, pad: int, dilation: int, ceil_mode: bool) -> int:
    """torch's pooling output length; in ceil mode the last window must start inside the input
    or its left padding."""
    # ceil mode rounds the window count up: stride - 1 more positions on the right
    count = window_count(length, size, stride, dilation, (pad, pad + (stride - 1) * ceil_mode))
    return count - 1 if ceil_mode and (count - 1) * stride >= length + pad else count


def avg_matrix(length: int, size: int, stride: int, pad: int, ceil_mode: bool,
               count_include_pad: bool, summed: bool = False) -> np.ndarray:
    """``M (out, length)`` of torch's 1d average pooling (windows clipped as torch clips them);
    ``summed``: window sums instead of means."""
    m = np.zeros((pool_count(length, size, stride, pad, 1, ceil_mode), length))
    for i in range(m.shape[0]):
        start = i * stride - pad
        end = min(start + size, length + pad)
        lo, hi = max(start, 0), min(end, length)
        m[i, lo:hi] = 1 if summed else 1 / (end - start if count_include_pad else hi - lo)
    return m


def adaptive_windows(length: int, count: int) -> list[tuple[int, int]]:
    """torch's adaptive pooling windows ``[floor(i L / n), ceil((i + 1) L / n))``."""
    return [(i * length // count, -(-(i + 1) * length // count)) for i in range(count)]


def adaptive_matrix(length: int, count: int) -> np.ndarray:
    """``M (count, length)`` of torch's 1d adaptive average pooling."""
    m = np.zeros((count, length))
    for i, (lo, hi) in enumerate(adaptive_windows(length, count)):
        m[i, lo:hi] = 1 / (hi - lo)
    return m


def _same_channels(ndim: int | None, out: Callable) -> Callable:
    """``init_fn`` of a parameter-free map of positions with output spatial shape ``out(S)``;
    ``ndim=None``: any number of spatial dims (at least one)."""
    def init_fn(key, input_shape):
        check_spatial_input(input_shape, None, ndim or max(len(input_shape) - 2, 1))
        spatial = out(tuple(input_shape[2:]))
        if min(spatial) < 1:
            raise ShapeError(f"input of spatial size {tuple(input_shape[2:])} gives an empty "
                             f"output {spatial}")
        return (*input_shape[:2], *spatial), {}

    return init_fn


def _out_spatial(ms: list[np.ndarray | None], spatial: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(n if m is None else m.shape[0] for m, n in zip(ms, spatial))


def separable_linear(ndim: int | None, matrices: Matrices, name: str,
                     one_per_row: bool = False) -> Layer:
    """A channelwise linear map applying ``matrices(S)[d]`` along spatial dim ``d`` of
    ``(N, C, *S)``.

    ``ndim``: the number of spatial dims (None: any); a matrix None leaves its dim as it is.
    ``one_per_row``: every row of every matrix
    has at most one nonzero entry (a selection, as nearest-neighbour resizing), so that an output
    position's variance is that of one input position, scaled: the rule then also runs on the
    diagonal layout, with the matrices' squares. ``name`` is the torch module's, for error messages.
    """

    def apply_fn(params, x):
        for d, m in enumerate(matrices(x.shape[2:])):
            x = x if m is None else contract(x, m, 2 + d)
        return x

    def kernel_fn(k: Kernel) -> Kernel:
        ms = matrices(k.shape1[2:])  # x1 and x2 have the same spatial shape
        if k.diagonal_spatial and not one_per_row:
            raise UnsupportedLayerError(f"{name} mixes positions: its kernel rule needs the full "
                                        f"spatial covariance (diagonal_spatial=False)")

        def fn(a, n_batch):
            for m, axes in zip(ms, spatial_axes(n_batch, len(ms), k.diagonal_spatial)):
                for axis in axes if m is not None else ():
                    a = contract(a, m * m if k.diagonal_spatial else m, axis)
            return a

        out = _out_spatial(ms, k.shape1[2:])
        return map_arrays(k, fn).replace(shape1=(*k.shape1[:2], *out), shape2=(*k.shape2[:2], *out))

    out_spatial = lambda spatial: _out_spatial(matrices(spatial), spatial)
    return channels_first(Layer(_same_channels(ndim, out_spatial), apply_fn, kernel_fn,
                                full_spatial=not one_per_row, affine=True))


def _with_features(layer: Layer) -> Layer:
    """An average pooling ``layer`` with its feature map: the pooling of each random channel."""
    return layer._replace(features=linear_features(layer.apply_fn))


def AvgPool(kernel_size: Sequence[int], stride: Sequence[int] | int | None = None,
            padding: Sequence[int] | int = 0, ceil_mode: bool = False,
            count_include_pad: bool = True, divisor_override: int | None = None) -> Layer:
    """torch's ``nn.AvgPool{n}d`` with ``n = len(kernel_size)`` (stride defaults to kernel_size).

    Shapes: ``(N, C, *S) -> (N, C, *S_out)``.

    Example:
        >>> AvgPool((2, 2)).init_fn(jax.random.key(0), (5, 3, 8, 8))[0]
        (5, 3, 4, 4)
    """
    ndim = len(kernel_size)
    size = as_tuple(kernel_size, ndim)
    stride, pad = as_tuple(size if stride is None else stride, ndim), as_tuple(padding, ndim)

    def matrices(spatial):  # the divisor of a window is the product of its per-dim divisors
        ms = [avg_matrix(*dims, ceil_mode, count_include_pad, summed=bool(divisor_override))
              for dims in zip(spatial, size, stride, pad)]
        return [ms[0] / divisor_override, *ms[1:]] if divisor_override else ms

    return _with_features(separable_linear(ndim, matrices, f"AvgPool{ndim}d"))


def LPPool1(kernel_size: Sequence[int], stride: Sequence[int] | int | None = None,
            ceil_mode: bool = False) -> Layer:
    """torch's ``nn.LPPool{n}d(1, kernel_size, stride, ceil_mode)``: ``prod(kernel_size)`` times
    the window means (torch's formula; window sums where windows are whole), linear for any input.

    Example:
        >>> LPPool1((2, 2)).init_fn(None, (5, 3, 8, 8))[0]
        (5, 3, 4, 4)
    """
    ndim = len(kernel_size)
    size = as_tuple(kernel_size, ndim)
    stride = as_tuple(size if stride is None else stride, ndim)
    matrices = lambda spatial: [avg_matrix(n, k, s, 0, ceil_mode, True) * k
                                for n, k, s in zip(spatial, size, stride)]
    return separable_linear(ndim, matrices, f"LPPool{ndim}d")


def AdaptiveAvgPool(output_size: Sequence[int | None]) -> Layer:
    """torch's ``nn.AdaptiveAvgPool{n}d(output_size)``, ``n = len(output_size)`` (None keeps a dim).

    ``AdaptiveAvgPool((1, 1))`` is global average pooling: ``(N, C, H, W) -> (N, C, 1, 1)``.
    """
    ndim = len(output_size)
    matrices = lambda spatial: [adaptive_matrix(length, count or length)
                                for length, count in zip(spatial, output_size)]
    return _with_features(separable_linear(ndim, matrices, f"AdaptiveAvgPool{ndim}d"))


def MaxPool(kernel_size: Sequence[int], stride: Sequence[int] | int | None = None,
            padding: Sequence[int] | int = 0, dilation: Sequence[int] | int = 1,
            ceil_mode: bool = False) -> Layer:
    """torch's ``nn.MaxPool{n}d``, ``n = len(kernel_size)``; its kernel is a numerical
    expectation (:func:`~ntbridge.stax.maxpool.max_rule`).

    Example:
        >>> MaxPool((3, 3), 2, 1).init_fn(None, (2, 4, 16, 16))[0]
        (2, 4, 8, 8)
    """
    ndim = len(kernel_size)
    size = as_tuple(kernel_size, ndim)
    stride = as_tuple(size if stride is None else stride, ndim)
    pad, dilation = as_tuple(padding, ndim), as_tuple(dilation, ndim)
    counts = lambda spatial: tuple(pool_count(*dims, ceil_mode)
                                   for dims in zip(spatial, size, stride, pad, dilation))

    def apply_fn(params, x):
        for d, (length, count, k, s, p, dil) in enumerate(
                zip(x.shape[2:], counts(x.shape[2:]), size, stride, pad, dilation)):
            high = max((count - 1) * s + dil * (k - 1) + 1 - length - p, 0)  # ceil mode's extra
            x = window_reduce(x, (2 + d,), k, s, dil, (p, high), "constant", jnp.maximum, -jnp.inf)
        return x

    windows = lambda spatial: [pool_windows(n, c, *dims) for n, c, *dims in zip(
        spatial, counts(spatial), size, stride, pad, dilation)]
    return _max_layer(_same_channels(ndim, counts), apply_fn, max_rule(windows, f"MaxPool{ndim}d"))


def AdaptiveMaxPool(output_size: Sequence[int | None]) -> Layer:
    """torch's ``nn.AdaptiveMaxPool{n}d(output_size)``; its kernel as :func:`MaxPool`'s."""
    ndim = len(output_size)
    counts = lambda spatial: tuple(c or n for n, c in zip(spatial, output_size))

    def apply_fn(params, x):
        for d, (length, count) in enumerate(zip(x.shape[2:], counts(x.shape[2:]))):
            axis = 2 + d
            x = jnp.stack([jax.lax.slice_in_dim(x, lo, hi, axis=axis).max(axis)
                           for lo, hi in adaptive_windows(length, count)], axis)
        return x

    windows = lambda spatial: [adaptive_pool_windows(adaptive_windows(n, c))
                               for n, c in zip(spatial, counts(spatial))]
    return _max_layer(_same_channels(ndim, counts), apply_fn,
                      max_rule(windows, f"AdaptiveMaxPool{ndim}d"))


def _max_layer(init_fn, apply_fn, kernel_fn) -> Layer:
    """A max pooling layer: its rule compares positions and is a numerical expectation."""
    return channels_first(Layer(init_fn, apply_fn, kernel_fn, full_spatial=True,
                                replicates=SAMPLING.replicates))
