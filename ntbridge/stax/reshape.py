"""Reshapes: torch's ``nn.Flatten`` and ``nn.Unflatten``.

Kernel rules (inputs ``(N, C, *S)``, kernels averaged over channels): flattening the channels with
spatial dims turns each (channel, position) pair into a feature, so the kernel becomes the mean over
those positions of the same-position covariance (a Linear after ``Flatten()`` sees exactly that
mean). Reshaping spatial dims among themselves reshapes the kernel's spatial axes (exact).
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp

from ..errors import ShapeError, UnsupportedLayerError
from .features import Channels, Sampler, linear_features
from .kernel import Kernel, map_arrays, reshape_spatial
from .layers import Layer, channels_first


def axis_of(dim: int, rank: int, arg: str) -> int:
    """``dim`` as a non-negative axis of a rank-``rank`` array, or ShapeError."""
    if not -rank <= dim < rank:
        raise ShapeError(f"{arg}={dim} is out of range for inputs of rank {rank}")
    return dim % rank


def _mean_leading_positions(a: jax.Array, n_batch: int, count: int, diagonal_spatial: bool):
    """Mean over the first ``count`` spatial dims of the same-position entries of ``a``."""
    if diagonal_spatial:
        return a.mean(axis=tuple(range(n_batch, n_batch + count)))
    for d in reversed(range(count)):  # each diagonal goes last; earlier axes keep their place
        a = jnp.diagonal(a, axis1=n_batch + 2 * d, axis2=n_batch + 2 * d + 1)
    return a.mean(axis=tuple(range(a.ndim - count, a.ndim)))


def reshaped(k: Kernel, shape1: tuple[int, ...], shape2: tuple[int, ...]) -> Kernel:
    """``k`` for inputs whose spatial dims were reshaped (row-major) to ``shape1[2:]``."""
    fn = lambda a, n: reshape_spatial(a, n, k.diagonal_spatial, shape1[2:])
    return map_arrays(k, fn).replace(shape1=shape1, shape2=shape2)


def Flatten(start_dim: int = 1, end_dim: int = -1) -> Layer:
    """torch's ``nn.Flatten(start_dim, end_dim)``: dims ``start_dim..end_dim`` merged into one.

    Kernel rule for ``start_dim=1`` (channels with positions): the mean over the merged positions;
    for ``start_dim >= 2``: the merged spatial axes. ``start_dim=0`` (examples) has none.

    Example:
        >>> Flatten().init_fn(jax.random.key(0), (5, 3, 4, 4))[0]
        (5, 48)
    """

    def out_shape(shape):
        s, e = axis_of(start_dim, len(shape), "start_dim"), axis_of(end_dim, len(shape), "end_dim")
        if s > e:
            raise ShapeError(f"start_dim={start_dim} comes after end_dim={end_dim} for inputs "
                             f"of rank {len(shape)}")
        return (*shape[:s], math.prod(shape[s:e + 1]), *shape[e + 1:])

    def kernel_fn(k: Kernel) -> Kernel:
        rank = len(k.shape1)
        s, e = start_dim % rank, end_dim % rank
        shape1, shape2 = out_shape(k.shape1), out_shape(k.shape2)
        if s == 0 and e > 0:
            raise UnsupportedLayerError("Flatten(start_dim=0) merges examples together; the "
                                        "kernel is per example, so keep start_dim >= 1")
        if s != 1 or e == 1:
            return reshaped(k, shape1, shape2)
        count = e - 1  # spatial dims merged into the channels
        fn = lambda a, n: _mean_leading_positions(a, n, count, k.diagonal_spatial)
        # features at different positions have different variances: no longer one Gaussian
        gaussian = k.is_gaussian and math.prod(k.shape1[2:e + 1]) == 1
        return map_arrays(k, fn).replace(shape1=shape1, shape2=shape2, is_gaussian=gaussian)

    apply_fn = lambda params, x: x.reshape(out_shape(x.shape))
    linear = linear_features(apply_fn)

    def features(c: Channels, sampler: Sampler) -> Channels:
        # channels with several positions, merged: features of different variances, not Gaussian
        out = linear(c, sampler)
        return out._replace(gaussian=out.gaussian and c.z[0, 0].size == 1)

    return Layer(lambda key, shape: (out_shape(tuple(shape)), {}), apply_fn, kernel_fn,
                 affine=True, features=features)


def Unflatten(dim: int, sizes: Sequence[int]) -> Layer:
    """torch's ``nn.Unflatten(dim, sizes)``: dim ``dim`` split into ``sizes`` (one may be -1).

    Kernel rule only for a spatial ``dim`` (>= 2): the kernel's spatial axes are split. Splitting
    the channels into positions has none here.
    """

    def out_shape(shape):
        d = axis_of(dim, len(shape), "dim")
        known = math.prod(n for n in sizes if n != -1)
        resolved = tuple(shape[d] // known if n == -1 else n for n in sizes)
        if math.prod(resolved) != shape[d] or list(sizes).count(-1) > 1:
            raise ShapeError(f"sizes {tuple(sizes)} do not unflatten dim {dim} of size {shape[d]}")
        return (*shape[:d], *resolved, *shape[d + 1:])

    def kernel_fn(k: Kernel) -> Kernel:
        if dim % len(k.shape1) < 2:
            raise UnsupportedLayerError(
                f"Unflatten of dim {dim} (examples or channels) has no kernel rule here; unflatten "
                f"a spatial dim, or use ntbridge.empirical_ntk / ntbridge.monte_carlo.")
        return reshaped(k, out_shape(k.shape1), out_shape(k.shape2))

    return channels_first(Layer(lambda key, shape: (out_shape(tuple(shape)), {}),
                                lambda params, x: x.reshape(out_shape(x.shape)), kernel_fn,
                                affine=True))
