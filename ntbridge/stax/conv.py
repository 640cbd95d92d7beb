"""Convolutions (torch's ``nn.Conv1d/2d/3d``) and the sliding windows they share with pooling.

Kernel rule (Neural Tangents' mathematics): output position ``s`` of a convolution sees input
positions ``p(s, j) = s * stride + j * dilation - pad`` through the weight at offset ``j``, shared by
all positions, so ``nngp_out[s, s'] = W_std**2 * mean_j nngp_in[p(s, j), p(s', j)] + b_std**2``
(same ``j`` on both sides; on the diagonal layout ``s = s'``, where the mean over ``j`` along each
axis is a matrix, :func:`window_matrix`, applied by one product). Zero padding has zero covariance;
circular, reflect and replicate padding copy input positions, so their covariance is the input's at
the copied positions (exact). Groups do not change the infinite-width kernel: each group averages
over its own i.i.d. channels.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import InputError, ShapeError
from .features import Features, affine_features, refused
from .kernel import Kernel, map_arrays, spatial_axes
from .layers import Layer, Outer, _sample, affine_hyper, affine_ntk, channels_first

# torch padding_mode -> jnp.pad mode
PADDING_MODES = {"zeros": "constant", "circular": "wrap", "reflect": "reflect", "replicate": "edge"}
Pads = tuple[tuple[int, int], ...]


def as_tuple(value: int | Sequence[int], ndim: int) -> tuple[int, ...]:
    """torch's ``_ntuple``: an int repeated ``ndim`` times, or a sequence of ``ndim`` ints."""
    return (int(value),) * ndim if isinstance(value, int) else tuple(int(v) for v in value)


def conv_padding(padding: str | int | Sequence[int], kernel_size: tuple[int, ...],
                 dilation: tuple[int, ...]) -> Pads:
    """``(low, high)`` zeros per spatial dim for torch's ``padding`` (int(s), ``"same"``, ``"valid"``).

    ``"same"`` pads ``dilation * (k - 1)`` in all, the odd one at the end, as torch does.
    """
    if padding == "valid":
        return ((0, 0),) * len(kernel_size)
    if padding == "same":
        totals = [d * (k - 1) for k, d in zip(kernel_size, dilation)]
        return tuple((t // 2, t - t // 2) for t in totals)
    return tuple((p, p) for p in as_tuple(padding, len(kernel_size)))


def window_count(length: int, size: int, stride: int, dilation: int, pad: tuple[int, int]) -> int:
    """Number of windows of ``size`` (dilated) taken every ``stride`` along a padded axis."""
    return (length + pad[0] + pad[1] - dilation * (size - 1) - 1) // stride + 1


def window_reduce(a: jax.Array, axes: tuple[int, ...], size: int, stride: int, dilation: int,
                  pad: tuple[int, int], mode: str, op: Callable, fill: float = 0.0) -> jax.Array:
    """``out[i] = op_j a_pad[i * stride + j * dilation]``, the same ``j`` on every axis of ``axes``.

    ``a`` is first padded by ``pad`` on each of ``axes`` (all of one length), with ``fill`` for
    ``mode="constant"``, else with the ``jnp.pad`` mode.
    """
    widths = [(0, 0)] * a.ndim
    for ax in axes:
        widths[ax] = pad
    a = (jnp.pad(a, widths, constant_values=fill) if mode == "constant"
         else jnp.pad(a, widths, mode=mode))
    count = window_count(a.shape[axes[0]], size, stride, dilation, (0, 0))

    def window(j):
        index = [slice(None)] * a.ndim
        for ax in axes:
            index[ax] = slice(j * dilation, j * dilation + (count - 1) * stride + 1, stride)
        return a[tuple(index)]

    return functools.reduce(op, map(window, range(size)))


def window_matrix(length: int, size: int, stride: int, dilation: int, pad: tuple[int, int],
                  mode: str) -> np.ndarray:
    """``(windows, length)``: :func:`window_reduce` with ``op=add`` along one axis of ``length`` as
    a linear map, ``out[i] = sum_j a_pad[i * stride + j * dilation]`` (``mode``: a ``jnp.pad``
    mode; zeros, or copies of input positions).

    Example:
        >>> window_matrix(3, 2, 1, 1, (1, 0), "constant")
        array([[1., 0., 0.],
               [1., 1., 0.],
               [0., 1., 1.]])
    """
    eye = np.pad(np.eye(length), [pad, (0, 0)], mode=mode)  # padded positions as sums of inputs
    count = window_count(length, size, stride, dilation, pad)
    return sum(eye[j * dilation: j * dilation + (count - 1) * stride + 1: stride]
               for j in range(size))


def contract(a: jax.Array, m: np.ndarray, axis: int) -> jax.Array:
    """``a`` with ``m (out, in)`` applied along ``axis``."""
    out = jnp.tensordot(jnp.asarray(m, a.dtype), a, axes=(1, axis),
                        precision=jax.lax.Precision.HIGHEST)
    return jnp.moveaxis(out, 0, axis)


def window_patches(x: jax.Array, size: tuple[int, ...], stride: tuple[int, ...],
                   dilation: tuple[int, ...]) -> jax.Array:
    """``(N, C, *S) -> (N, P, prod(size), C)``: the (dilated) windows of ``x`` taken every
    ``stride`` at the ``P = prod(S_out)`` output positions (row-major), offsets in row-major order.
    Channels last, as convolutions lay out their outputs: one gather of runs of ``C`` contiguous
    values, at fixed indices.

    Example:
        >>> window_patches(jnp.ones((2, 3, 8, 8)), (3, 3), (1, 1), (1, 1)).shape
        (2, 36, 9, 3)
    """
    spatial = x.shape[2:]
    counts = [window_count(*dims, (0, 0)) for dims in zip(spatial, size, stride, dilation)]
    starts = np.stack(np.meshgrid(*(np.arange(n) * st for n, st in zip(counts, stride)),
                                  indexing="ij"), -1).reshape(-1, 1, len(spatial))
    offsets = np.stack(np.meshgrid(*(np.arange(k) * d for k, d in zip(size, dilation)),
                                   indexing="ij"), -1).reshape(1, -1, len(spatial))
    index = np.ravel_multi_index(tuple(np.moveaxis(starts + offsets, -1, 0)), spatial)  # (P, J)
    return jnp.moveaxis(x, 1, -1).reshape(x.shape[0], -1, x.shape[1])[:, index]


def check_spatial_input(input_shape, channels: int | None, ndim: int) -> None:
    """Raise ShapeError unless ``input_shape`` is ``(N, channels, *S)`` with ``ndim`` spatial dims."""
    ok = len(input_shape) == ndim + 2 and (channels is None or input_shape[1] == channels)
    if not ok:
        spatial = {1: "L", 2: "H, W", 3: "D, H, W"}.get(ndim, f"<{ndim} spatial dims>")
        raise ShapeError(f"expects inputs of shape (N, {channels or 'C'}, {spatial}), "
                         f"got {tuple(input_shape)}")


def conv_init_fn(in_channels: int, out_channels: int, weight_shape: tuple[int, ...],
                 out_spatial: Callable, empty: str, weight_std: float, b_std: float | None,
                 distribution: str) -> Callable:
    """``init_fn`` of a convolution ``(N, in_channels, *S) -> (N, out_channels, *out_spatial(S))``:
    a weight of ``weight_shape`` (standard deviation ``weight_std``) and, with ``b_std``, a bias
    ``(out_channels,)``; ``empty`` ends the error when ``S`` gives no output positions."""
    ndim = len(weight_shape) - 2

    def init_fn(key, input_shape):
        check_spatial_input(input_shape, in_channels, ndim)
        spatial = out_spatial(input_shape[2:])
        if min(spatial) < 1:
            raise ShapeError(f"input of spatial size {tuple(input_shape[2:])} {empty}")
        kw, kb = jax.random.split(key)
        params = {"weight": _sample(kw, weight_shape, weight_std, distribution)}
        if b_std is not None:
            params["bias"] = _sample(kb, (out_channels,), b_std, distribution)
        return (input_shape[0], out_channels, *spatial), params

    return init_fn


def affine_output(k: Kernel, W_std: float, b_std: float | None, fan_in: int,
                  parameterization: str, out_channels: int, out_spatial: Callable) -> Kernel:
    """The kernel of a convolution's outputs ``(N, out_channels, *out_spatial(S))`` from ``k``,
    the mean over its weight offsets of the input covariances each offset sees."""
    b_var = 0.0 if b_std is None else b_std ** 2
    affine = lambda c: W_std ** 2 * c + b_var
    nngp = affine(k.nngp)
    return k.replace(
        nngp=nngp, ntk=affine_ntk(k, nngp, fan_in, W_std, b_std is not None, parameterization),
        cov1=affine(k.cov1), cov2=affine(k.cov2),
        shape1=(k.shape1[0], out_channels, *out_spatial(k.shape1[2:])),
        shape2=(k.shape2[0], out_channels, *out_spatial(k.shape2[2:])), is_gaussian=True)


def Conv(in_channels: int, out_channels: int, kernel_size: Sequence[int], *, W_std: float,
         b_std: float | None, stride: Sequence[int] | int = 1,
         padding: str | int | Sequence[int] = 0, dilation: Sequence[int] | int = 1,
         groups: int = 1, padding_mode: str = "zeros", parameterization: str = "standard",
         distribution: str = "uniform") -> Layer:
    """torch's ``nn.Conv{n}d`` with ``n = len(kernel_size)``, ``bias=b_std is not None``.

    Shapes: ``x (N, in_channels, *S) -> (N, out_channels, *S_out)``. Params ``{"weight": (out,
    in / groups, *kernel_size), "bias": (out,)}``, weight variance ``W_std**2 / fan_in`` with
    ``fan_in = in / groups * prod(kernel_size)``, bias variance ``b_std**2``.

    Example:
        >>> conv = Conv(3, 16, (3, 3), padding="same", W_std=1.0, b_std=0.1)
        >>> conv.init_fn(jax.random.key(0), (2, 3, 8, 8))[0]
        (2, 16, 8, 8)
    """
    ndim = len(kernel_size)
    kernel_size = as_tuple(kernel_size, ndim)
    stride, dilation = as_tuple(stride, ndim), as_tuple(dilation, ndim)
    if padding_mode not in PADDING_MODES:
        raise InputError(f"padding_mode must be one of {tuple(PADDING_MODES)}, got {padding_mode!r}.")
    if padding == "same" and any(s != 1 for s in stride):
        raise InputError(f"padding='same' needs stride 1, got stride {stride}.")
    pads, mode = conv_padding(padding, kernel_size, dilation), PADDING_MODES[padding_mode]
    fan_in = in_channels // groups * math.prod(kernel_size)
    has_bias, hyper = b_std is not None, affine_hyper(W_std, b_std)

    def out_spatial(spatial):
        return tuple(window_count(*dims) for dims in zip(spatial, kernel_size, stride, dilation, pads))

    init_fn = conv_init_fn(in_channels, out_channels,
                           (out_channels, in_channels // groups, *kernel_size), out_spatial,
                           f"is smaller than the (dilated, padded) kernel {kernel_size}",
                           W_std / fan_in ** 0.5, b_std, distribution)

    def padded(x):
        """``x`` with non-zero padding applied, and the zero padding left to the convolution."""
        if mode == "constant":
            return x, pads
        return jnp.pad(x, [(0, 0), (0, 0), *pads], mode=mode), ((0, 0),) * ndim

    def apply_fn(params, x):
        x, conv_pads = padded(x)
        conv = lambda x, w: jax.lax.conv_general_dilated(
            x, w, stride, conv_pads, rhs_dilation=dilation, precision=jax.lax.Precision.HIGHEST)
        # Groups as separate convolutions: JAX cannot vmap the Jacobian of a grouped convolution.
        y = jnp.concatenate([conv(xg, wg) for xg, wg in zip(
            jnp.split(x, groups, axis=1), jnp.split(params["weight"], groups, axis=0))], axis=1)
        return y + params["bias"].reshape(-1, *[1] * ndim) if has_bias else y

    def patch_mean(a, n_batch, diagonal_spatial):
        if diagonal_spatial:  # a matrix per axis: compiles and runs faster than shifted sums
            for d, dims in enumerate(zip(a.shape[n_batch:], kernel_size, stride, dilation, pads)):
                a = contract(a, window_matrix(*dims, mode) / dims[1], n_batch + d)
            return a
        for axes, *dims in zip(spatial_axes(n_batch, ndim, False), kernel_size, stride, dilation,
                               pads):
            a = window_reduce(a, axes, *dims, mode, jnp.add) / dims[0]
        return a

    def kernel_fn(k: Kernel, hyper: dict = hyper) -> Kernel:
        k = map_arrays(k, lambda a, n: patch_mean(a, n, k.diagonal_spatial))
        return affine_output(k, hyper["W_std"], hyper.get("b_std"), fan_in, parameterization,
                             out_channels, out_spatial)

    structure = _structure(padded, kernel_size, stride, dilation, groups, out_channels, has_bias)
    features = conv_features(kernel_size, stride, pads, dilation, mode, fan_in, hyper,
                             parameterization)
    return channels_first(Layer(init_fn, apply_fn, kernel_fn, structure=structure, affine=True,
                                hyper=hyper, features=features))


def _structure(padded: Callable, kernel_size: tuple[int, ...], stride: tuple[int, ...],
               dilation: tuple[int, ...], groups: int, out_channels: int, has_bias: bool) -> Callable:
    """``structure(params, x)`` of a convolution (see :class:`~ntbridge.stax.Layer`): the
    weight's and bias' :class:`Outer` factors; ``padded(x)``: x padded as the layer pads it."""

    def structure(params, x):
        # weight[o, c, j] sees patch (j, c) at every output position p (K = kernel offsets x
        # channels, offsets major); with groups, output channel o sees its own group's channels:
        # positions are repeated per group and the rows of other groups' channels are zero, so only
        # same-group pairs meet.
        x, conv_pads = padded(x)
        patches = window_patches(jnp.pad(x, [(0, 0), (0, 0), *conv_pads]), kernel_size, stride,
                                 dilation)
        n, positions, offsets = patches.shape[:3]
        patches = patches.reshape(n, positions, offsets, groups, -1).transpose(
            0, 3, 1, 2, 4)  # (N, G, P, J, C / G)
        rows = lambda g: jnp.moveaxis(g, 1, -1).reshape(g.shape[0], -1, out_channels)  # (M, P, C)
        mask = jnp.repeat(jnp.eye(groups, dtype=x.dtype), out_channels // groups, axis=1)

        def group_rows(g):  # (M, G * P, C_out)
            g = rows(g)
            return g if groups == 1 else (mask[None, :, None] * g[:, None]).reshape(
                g.shape[0], -1, out_channels)

        outer = {"weight": Outer(patches.reshape(n, groups * positions, -1), group_rows)}
        return {**outer, "bias": Outer(None, rows)} if has_bias else outer

    return structure


def conv_features(kernel_size: tuple[int, ...], stride: tuple[int, ...], pads: Pads,
                  dilation: tuple[int, ...], mode: str, fan_in: int, hyper: dict[str, float],
                  parameterization: str) -> Features:
    """The feature map of :func:`Conv` (``stax.features``): channels ``(N, C, *S)`` through
    weights ``(F, C, *kernel_size)`` as the convolution maps its input (groups do not change the
    infinite-width kernel, so the features use one group), for zero padding only."""
    if mode != "constant":
        return refused("no random-features rule (features cover Linear and Conv1d/2d/3d with "
                       "zero padding); use ntbridge.kernel.")
    size = math.prod(kernel_size)

    def project(h, g):
        return jax.lax.conv_general_dilated(h, g / math.sqrt(h.shape[1] * size), stride, pads,
                                            rhs_dilation=dilation,
                                            precision=jax.lax.Precision.HIGHEST)

    return affine_features(project, kernel_size, fan_in, hyper, parameterization)
