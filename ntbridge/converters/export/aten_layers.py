"""Core ATen operators of layers as JAX functions: products, convolutions (transposed and grouped),
normalization, embeddings and pooling; part of :data:`.aten.OPS` (its conventions apply).

Example:
    >>> LAYERS["addmm"](bias, x, w.T)     # bias + x @ w.T
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from jax import lax

from ...errors import UnsupportedLayerError

_HIGHEST = lax.Precision.HIGHEST


def _transposed(w, groups: int):
    """A transposed convolution's weight ``(C_in, C_out / groups, *k)`` as the weight
    ``(C_out, C_in / groups, *k)`` of the convolution computing it, its kernel flipped."""
    (c_in, c_out), k = (w.shape[0] // groups, w.shape[1]), w.shape[2:]
    w = w.reshape(groups, c_in, c_out, *k).swapaxes(1, 2).reshape(groups * c_out, c_in, *k)
    return jnp.flip(w, tuple(range(2, w.ndim)))


def _convolution(x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    spatial = "DHW"[-len(stride):]
    if transposed:  # the input dilated by the stride, padded to the transposed output's size
        k = w.shape[2:]
        padding = [(d * (n - 1) - p, d * (n - 1) - p + o)
                   for n, p, d, o in zip(k, padding, dilation, output_padding)]
        w, lhs_dilation, stride = _transposed(w, groups), stride, [1] * len(stride)
    else:
        padding, lhs_dilation = [(p, p) for p in padding], None
    conv = lambda x, w: lax.conv_general_dilated(
        x, w, stride, padding, lhs_dilation, dilation,
        (f"NC{spatial}", f"OI{spatial}", f"NC{spatial}"), precision=_HIGHEST)
    # groups as separate convolutions: JAX cannot batch (vmap inside shard_map) the Jacobian of a
    # grouped convolution
    y = jnp.concatenate([conv(xg, wg) for xg, wg in zip(jnp.split(x, groups, axis=1),
                                                        jnp.split(w, groups, axis=0))], axis=1)
    return y if b is None else y + b.reshape(-1, *(1,) * len(stride))


def _affine(y, weight, bias, shape: Sequence[int]):
    """``y * weight + bias`` (either may be None), the parameters reshaped to ``shape``."""
    y = y if weight is None else y * weight.reshape(shape)
    return y if bias is None else y + bias.reshape(shape)


def _batch_norm(x, weight, bias, running_mean, running_var, momentum, eps):
    channels = (-1,) + (1,) * (x.ndim - 2)  # the channel axis is 1
    y = (x - running_mean.reshape(channels)) * lax.rsqrt(running_var + eps).reshape(channels)
    empty = jnp.zeros((0,), x.dtype)
    return _affine(y, weight, bias, channels), empty, empty


def _normalize(x, axes: tuple[int, ...], eps: float):
    """``((x - mean) * rstd, mean, rstd)`` over ``axes`` (biased variance), means kept as axes."""
    mean = jnp.mean(x, axis=axes, keepdims=True)
    rstd = lax.rsqrt(jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True) + eps)
    return (x - mean) * rstd, mean, rstd


def _layer_norm(x, normalized_shape, weight, bias, eps):
    y, mean, rstd = _normalize(x, tuple(range(x.ndim - len(normalized_shape), x.ndim)), eps)
    return _affine(y, weight, bias, normalized_shape), mean, rstd


def _group_norm(x, weight, bias, n, c, hxw, group, eps):
    y, mean, rstd = _normalize(x.reshape(x.shape[0], group, -1), (2,), eps)
    y = _affine(y.reshape(x.shape), weight, bias, (-1,) + (1,) * (x.ndim - 2))
    return y, mean.reshape(x.shape[0], group), rstd.reshape(x.shape[0], group)


def _embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    y = jnp.take(weight, indices, axis=0)
    if padding_idx < 0:
        return y
    return jnp.where((indices == padding_idx)[..., None], lax.stop_gradient(y), y)


_matmul = functools.partial(jnp.matmul, precision=_HIGHEST)

def _pool(x, kernel, stride, padding, dilation, init, reducer):
    """``reduce_window`` over the last ``len(kernel)`` axes with torch's symmetric padding."""
    lead = (1,) * (x.ndim - len(kernel))
    return lax.reduce_window(x, init, reducer, lead + tuple(kernel), lead + tuple(stride or kernel),
                             [(0, 0)] * len(lead) + [(p, p) for p in padding],
                             window_dilation=lead + tuple(dilation))


def _no_ceil(ceil_mode: bool) -> None:
    if ceil_mode:
        raise UnsupportedLayerError("pooling with ceil_mode=True is not translated; pad the "
                                    "input on the right instead (F.pad) and use ceil_mode=False.")


def _per_axis(v: int | Sequence[int], kernel_size: Sequence[int]) -> Sequence[int]:
    return [v] * len(kernel_size) if isinstance(v, int) else v


def _max_pool(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    _no_ceil(ceil_mode)
    y = _pool(x, kernel_size, stride, _per_axis(padding, kernel_size),
              _per_axis(dilation, kernel_size), -jnp.inf, lax.max)
    return y, None  # the indices: only used for max_unpool, which is not translated


def _avg_pool(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
              divisor_override=None):
    _no_ceil(ceil_mode)
    window_sum = lambda a: _pool(a, kernel_size, stride, _per_axis(padding, kernel_size),
                                 _per_axis(1, kernel_size), 0.0, lax.add)
    if divisor_override:
        return window_sum(x) / divisor_override
    if count_include_pad:
        return window_sum(x) / math.prod(kernel_size)
    return window_sum(x) / window_sum(jnp.ones_like(x))


def _attention_mask(mask, is_causal: bool, length: int, source: int, dtype):
    """The additive mask of ``scaled_dot_product_attention``: a boolean ``mask`` (True: attend) as
    0/-inf, a float one as it is, ``is_causal`` as the lower triangle of ``(length, source)``."""
    if is_causal:
        mask = jnp.tril(jnp.ones((length, source), bool))
    if mask is None:
        return jnp.zeros((), dtype)
    return jnp.where(mask, 0.0, -jnp.inf).astype(dtype) if mask.dtype == jnp.bool_ else mask


def _scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                  is_causal=False, *, scale=None, enable_gqa=False):
    """``softmax(q k^T * scale + mask) v`` over ``(..., heads, L, E)``; key/value heads repeated for
    grouped queries; rows with nothing to attend to are 0, as torch's (safe softmax)."""
    if dropout_p:
        raise UnsupportedLayerError("attention dropout is not translated: call model.eval().")
    if key.shape[-3] != query.shape[-3] and query.ndim >= 3:  # grouped-query attention
        groups = query.shape[-3] // key.shape[-3]
        key, value = (jnp.repeat(a, groups, axis=-3) for a in (key, value))
    scale = 1 / math.sqrt(query.shape[-1]) if scale is None else scale
    logits = _matmul(query, key.swapaxes(-1, -2)) * scale
    logits = logits + _attention_mask(attn_mask, is_causal, *logits.shape[-2:], logits.dtype)
    attends = jnp.any(logits > -jnp.inf, axis=-1, keepdims=True)
    weights = jnp.where(attends, jax.nn.softmax(jnp.where(attends, logits, 0.0), axis=-1), 0.0)
    return _matmul(weights, value)


LAYERS: dict[str, Callable] = {
    "scaled_dot_product_attention": _scaled_dot_product_attention,
    "mm": _matmul, "bmm": _matmul,
    "addmm": lambda bias, a, b, *, beta=1, alpha=1: beta * bias + alpha * _matmul(a, b),
    "convolution": _convolution,
    "_native_batch_norm_legit_no_training": _batch_norm,
    "native_layer_norm": _layer_norm, "native_group_norm": _group_norm,
    "embedding": _embedding,
    "max_pool2d_with_indices": _max_pool, "max_pool3d_with_indices": _max_pool,
    "avg_pool2d": _avg_pool, "avg_pool3d": _avg_pool,
}
"""ATen operator name -> its JAX function."""
