"""Core ATen operators as JAX functions: the table :mod:`.translator` translates a program with.

``OPS`` maps an ATen operator (its overload packet, e.g. ``torch.ops.aten.add``: the overloads
``add.Tensor`` and ``add.Scalar`` share an entry) to a function taking the node's arguments as
the ATen schema names them, tensors replaced by JAX arrays. Arguments about memory (``device``,
``layout``, ``pin_memory``, ``memory_format``) are ignored: JAX places and lays out its own arrays.
A function returns what the operator returns (a tuple for several outputs). Gradients follow
torch's where they are defined by convention: ``relu'(0) = 0``, no gradient to an embedding's
``padding_idx`` row.

Example:
    >>> OPS[torch.ops.aten.addmm](bias, x, w.T)     # bias + x @ w.T
"""

from __future__ import annotations

import itertools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import torch
from jax import lax

from .aten_layers import LAYERS

aten = torch.ops.aten


def jax_dtype(torch_dtype: torch.dtype | None):
    """The JAX dtype of a torch dtype (int64/float64 become 32-bit unless x64 is on), or None."""
    if torch_dtype is None:
        return None
    return jax.dtypes.canonicalize_dtype(jnp.dtype(str(torch_dtype).removeprefix("torch.")))


def _axis(x: jax.Array, dim: int) -> int:
    return dim % max(x.ndim, 1)


def _axes(dim: int | Sequence[int] | None) -> tuple[int, ...] | None:
    """torch's ``dim`` of a reduction as JAX's ``axis``: None or ``[]`` reduce over all axes."""
    if dim is None or isinstance(dim, int):
        return dim
    return tuple(dim) or None


def _at(x: jax.Array, dim: int, index) -> tuple:
    """The index tuple selecting ``index`` (an int or a slice) along axis ``dim``."""
    return (slice(None),) * _axis(x, dim) + (index,)


# ------------------------------------------------------------ elementwise

def _div(a, b, *, rounding_mode=None):
    if rounding_mode == "floor":
        return jnp.floor_divide(a, b)
    q = jnp.true_divide(a, b)
    return q if rounding_mode is None else jnp.trunc(q).astype(jnp.result_type(a, b))


def _elu(x, alpha=1.0, scale=1.0, input_scale=1.0):
    return scale * jnp.where(x > 0, x, alpha * jnp.expm1(input_scale * jnp.minimum(x, 0)))


_UNARY = {name: getattr(jnp, name) for name in (
    "abs", "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sqrt", "sin", "cos", "tan",
    "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "sign", "floor",
    "ceil", "trunc", "reciprocal", "logical_not", "isnan", "isinf")}
_BINARY = {name: getattr(jnp, name) for name in (
    "maximum", "minimum", "fmod", "remainder", "atan2", "logical_and", "logical_or", "logical_xor",
    "bitwise_and", "bitwise_or", "bitwise_xor")}
_COMPARISONS = {"eq": jnp.equal, "ne": jnp.not_equal, "lt": jnp.less, "le": jnp.less_equal,
                "gt": jnp.greater, "ge": jnp.greater_equal}

_ELEMENTWISE: dict[str, Callable] = {
    **_UNARY, **_BINARY, **_COMPARISONS,
    "neg": jnp.negative, "round": jnp.round, "bitwise_not": jnp.invert, "pow": jnp.power,
    "add": lambda a, b, *, alpha=1: a + alpha * b, "sub": lambda a, b, *, alpha=1: a - alpha * b,
    "mul": jnp.multiply, "div": _div, "rsqrt": lax.rsqrt, "erf": jax.scipy.special.erf,
    "sigmoid": jax.nn.sigmoid, "relu": jax.nn.relu,
    "gelu": lambda x, approximate="none": jax.nn.gelu(x, approximate=approximate == "tanh"),
    "leaky_relu": lambda x, negative_slope=0.01: jnp.where(x > 0, x, negative_slope * x),
    "hardtanh": lambda x, min_val=-1.0, max_val=1.0: jnp.clip(x, min_val, max_val),
    "elu": _elu,
    "clamp": lambda x, min=None, max=None: jnp.clip(x, min, max),
    "where": jnp.where,
}


# ------------------------------------------------------------ reductions and scans

def _reduction(fn: Callable) -> Callable:
    """A torch reduction ``op(x, dim=None, keepdim=False, *, dtype=None)`` from a jnp one."""
    def op(x, dim=None, keepdim=False, *, dtype=None):
        return fn(x if dtype is None else x.astype(jax_dtype(dtype)), axis=_axes(dim),
                  keepdims=keepdim)
    return op


def _max_min(fn: Callable, arg: Callable, pairwise: Callable) -> Callable:
    """``max``/``min``: of all elements, along ``dim`` (values and indices), or of two tensors."""
    def op(x, dim=None, keepdim=False):
        if isinstance(dim, jax.Array):
            return pairwise(x, dim)
        if dim is None:
            return fn(x)
        return fn(x, axis=dim, keepdims=keepdim), arg(x, axis=dim, keepdims=keepdim)
    return op


def _scan(fn: Callable) -> Callable:
    return lambda x, dim, *, dtype=None: fn(x, axis=dim, dtype=jax_dtype(dtype))


def _sort(x, dim=-1, descending=False):
    i = jnp.argsort(x, axis=dim, descending=descending)
    return jnp.take_along_axis(x, i, axis=dim), i


def _topk(x, k, dim=-1, largest=True, sorted=True):
    return tuple(lax.slice_in_dim(a, 0, k, axis=_axis(x, dim)) for a in _sort(x, dim, largest))


_REDUCTIONS: dict[str, Callable] = {
    "sum": _reduction(jnp.sum), "mean": _reduction(jnp.mean), "prod": _reduction(jnp.prod),
    "amax": _reduction(jnp.max), "amin": _reduction(jnp.min),
    "any": _reduction(jnp.any), "all": _reduction(jnp.all),
    "argmax": _reduction(jnp.argmax), "argmin": _reduction(jnp.argmin),
    "max": _max_min(jnp.max, jnp.argmax, jnp.maximum),
    "min": _max_min(jnp.min, jnp.argmin, jnp.minimum),
    "var": lambda x, dim=None, *, correction=None, keepdim=False:  # torch's None: 1
        jnp.var(x, axis=_axes(dim), ddof=1 if correction is None else correction, keepdims=keepdim),
    "linalg_vector_norm": lambda x, ord=2, dim=None, keepdim=False, *, dtype=None:
        jnp.linalg.vector_norm(x, ord=ord, axis=_axes(dim), keepdims=keepdim),
    "cumsum": _scan(jnp.cumsum), "cumprod": _scan(jnp.cumprod),
    "_softmax": lambda x, dim, half_to_float=False: jax.nn.softmax(x, axis=dim),
    "_log_softmax": lambda x, dim, half_to_float=False: jax.nn.log_softmax(x, axis=dim),
    "sort": _sort, "topk": _topk,
}


# ------------------------------------------------------------ shapes, indexing, creation

def _expand(x, size, *, implicit=False):
    lead = len(size) - x.ndim
    return jnp.broadcast_to(x, [x.shape[i - lead] if s == -1 else s for i, s in enumerate(size)])


def _squeeze(x, dim=None):
    dims = range(x.ndim) if dim is None else [dim] if isinstance(dim, int) else dim
    axes = {_axis(x, d) for d in dims}
    return jnp.squeeze(x, tuple(d for d in axes if x.shape[d] == 1))


def _split_with_sizes(x, split_sizes, dim=0):
    return tuple(jnp.split(x, list(itertools.accumulate(split_sizes[:-1])), axis=dim))


def _gather(x, dim, index, *, sparse_grad=False):
    """torch's gather allows ``index`` smaller than ``x`` on the other axes: crop ``x`` to it."""
    axis = _axis(x, dim)
    x = x[tuple(slice(None) if d == axis else slice(0, n) for d, n in enumerate(index.shape))]
    return jnp.take_along_axis(x, index, axis=axis)


def _indices(indices) -> tuple:
    """``index.Tensor``'s list of index arrays (None: the whole axis) as a numpy-style index."""
    return tuple(slice(None) if i is None else i for i in indices)


def _index_put(x, indices, values, accumulate=False):
    at = x.at[_indices(indices)]
    return at.add(values) if accumulate else at.set(values)


def _pad(x, pad, value=0.0):
    """``pad`` lists (before, after) pairs from the last axis backwards; negative values crop."""
    pairs = [(0, 0, 0)] * (x.ndim - len(pad) // 2) + [
        (pad[i], pad[i + 1], 0) for i in reversed(range(0, len(pad), 2))]
    return lax.pad(x, jnp.asarray(value, x.dtype), pairs)


def _cat(tensors, dim=0):
    """torch's ``cat``, which skips 1-D empty tensors whatever the others' shapes (e.g. the empty
    caches of Hugging Face models)."""
    kept = [t for t in tensors if t.shape != (0,)]
    return jnp.concatenate(kept or tensors[:1], axis=dim)


def _identity(x, *args, **kwargs):
    return x


_SHAPES: dict[str, Callable] = {
    "view": jnp.reshape,
    "permute": jnp.transpose, "expand": _expand, "squeeze": _squeeze,
    "unsqueeze": jnp.expand_dims, "flip": lambda x, dims: jnp.flip(x, tuple(dims)),
    "repeat": lambda x, repeats: jnp.tile(x, repeats),
    "slice": lambda x, dim=0, start=None, end=None, step=1: x[_at(x, dim, slice(start, end, step))],
    "select": lambda x, dim, index: x[_at(x, dim, index)],
    "cat": _cat,
    "split_with_sizes": _split_with_sizes,
    "slice_scatter": lambda x, src, dim=0, start=None, end=None, step=1:
        x.at[_at(x, dim, slice(start, end, step))].set(src),
    "select_scatter": lambda x, src, dim, index: x.at[_at(x, dim, index)].set(src),
    "index": lambda x, indices: x[_indices(indices)], "index_put": _index_put, "gather": _gather,
    "index_select": lambda x, dim, index: jnp.take(x, index, axis=dim),
    "constant_pad_nd": _pad,
    "full": lambda size, fill_value, *, dtype=None, **memory:
        jnp.full(size, fill_value, jax_dtype(dtype)),
    "full_like": lambda x, fill_value, *, dtype=None, **memory:
        jnp.full_like(x, fill_value, jax_dtype(dtype)),
    "scalar_tensor": lambda s, *, dtype=None, **memory:
        jnp.asarray(s, jax_dtype(dtype) or jnp.float32),  # torch's default dtype
    "arange": lambda start, end=None, step=1, *, dtype=None, **memory:
        jnp.arange(start, end, step, jax_dtype(dtype)),
    "_to_copy": lambda x, *, dtype=None, **memory: x.astype(jax_dtype(dtype) or x.dtype),
    "copy": lambda x, src, non_blocking=False: jnp.broadcast_to(src, x.shape).astype(x.dtype),
    "clone": _identity, "alias": _identity,
    "sym_size": lambda x, dim: x.shape[dim],
    "_assert_tensor_metadata": lambda *args, **kwargs: None,
    "_assert_scalar": lambda *args, **kwargs: None,
}

OPS: dict = {getattr(aten, name): fn for table in (_ELEMENTWISE, _REDUCTIONS, LAYERS, _SHAPES)
             for name, fn in table.items()}
"""ATen overload packet -> its JAX function."""
