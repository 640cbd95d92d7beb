"""Indexing, reductions and stacking in a traced ``forward``: ``x[:, 0]``, ``x[..., 2:5]``,
``x.narrow(d, s, n)``, ``x.select(d, i)``, ``x.chunk(n, d)[i]``, ``x.mean(dim)`` / ``x.sum(dim)`` (``keepdim`` either
way), ``x.unsqueeze(d)``, ``torch.stack(xs, d)``: the modules standing for them, their converters
(``stax.Index``, ``Chunk``, ``Reduce``, ``Unsqueeze``, ``FanInStack``; what is exact is said there) and the
fx forms (:data:`FUNCTIONS`, :data:`METHODS`: ``(args, kwargs) -> (module, input nodes)``).

Example:
    >>> class Head(nn.Module):
    ...     def forward(self, x):
    ...         return self.fc(self.conv(x).mean((-2, -1)))   # global average pooling
"""

from __future__ import annotations

import operator

import torch
from torch import fx, nn

from .. import stax
from ..errors import UnsupportedLayerError
from .combinators import along_positions_if_uncorrelated
from .registry import Context, register


class Index(nn.Module):
    """``x[key]``, ``key`` a tuple of ints, slices and at most one Ellipsis."""

    def __init__(self, key: tuple):
        super().__init__()
        self.key = key

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[self.key]

    def extra_repr(self) -> str:
        return f"key={self.key!r}"


class Chunk(nn.Module):
    """``x.chunk(chunks, dim)[index]``: one of the chunks (``a, b = h.chunk(2, -1)``)."""

    def __init__(self, index: int, chunks: int, dim: int):
        super().__init__()
        self.index, self.chunks, self.dim = index, chunks, dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.chunk(self.chunks, self.dim)[self.index]

    def extra_repr(self) -> str:
        return f"index={self.index}, chunks={self.chunks}, dim={self.dim}"


class Reduce(nn.Module):
    """``x.mean(dims, keepdim)``, or ``x.sum`` (``mean=False``)."""

    def __init__(self, dims: tuple[int, ...], keepdim: bool = False, mean: bool = True):
        super().__init__()
        self.dims, self.keepdim, self.mean = dims, keepdim, mean

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.mean if self.mean else x.sum)(self.dims, self.keepdim)

    def extra_repr(self) -> str:
        return f"{'mean' if self.mean else 'sum'}, dims={self.dims}, keepdim={self.keepdim}"


class Unsqueeze(nn.Module):
    """``x.unsqueeze(dim)``."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.unsqueeze(self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Stack(nn.Module):
    """``torch.stack(xs, dim)``; ``correlated`` says why the branches may be correlated."""

    def __init__(self, dim: int = 0, correlated: str = ""):
        super().__init__()
        self.dim, self.correlated = dim, correlated

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return torch.stack(xs, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}" + (f", correlated={self.correlated!r}" if self.correlated else "")


@register(Index)
def _index(module: Index, ctx: Context) -> stax.Layer:
    return stax.Index(module.key, name=f"indexing {module.key}")


@register(Chunk)
def _chunk(module: Chunk, ctx: Context) -> stax.Layer:
    return stax.Chunk(module.index, module.chunks, module.dim)


@register(Reduce)
def _reduce(module: Reduce, ctx: Context) -> stax.Layer:
    return stax.Reduce(module.dims, module.keepdim, module.mean,
                       name=f"the {'mean' if module.mean else 'sum'} over dims {module.dims}")


@register(Unsqueeze)
def _unsqueeze(module: Unsqueeze, ctx: Context) -> stax.Layer:
    return stax.Unsqueeze(module.dim)


@register(Stack)
def _stack(module: Stack, ctx: Context) -> stax.Layer:
    return along_positions_if_uncorrelated(stax.FanInStack(module.dim), module.dim,
                                           module.correlated, stacked=True)


# ---------------------------------------------------------------- fx forms

def _key(key) -> tuple:
    key = key if isinstance(key, tuple) else (key,)
    for entry in key:
        parts = (entry.start, entry.stop, entry.step) if isinstance(entry, slice) else (entry,)
        if entry is None or any(isinstance(p, (fx.Node, torch.Tensor)) for p in parts) or not all(
                p is None or p is Ellipsis or (isinstance(p, int) and not isinstance(p, bool))
                for p in parts):
            raise UnsupportedLayerError(
                f"index {entry!r}: only constant ints, slices and ... are supported (no None, "
                f"tensors or lists; for a new axis use x.unsqueeze(dim)).")
    return key


def _along(dim: int, entry) -> tuple:
    """The key applying ``entry`` along ``dim`` alone."""
    return (*[slice(None)] * dim, entry) if dim >= 0 else (
        Ellipsis, entry, *[slice(None)] * (-dim - 1))


def _narrow(x, dim, start, length):
    stop = start + length
    return Index(_key(_along(dim, slice(start, None if start < 0 <= stop else stop)))), [x]


def _reduction(mean: bool):
    def make(x, dim=None, keepdim=False, *, dtype=None):
        if dim is None or dtype is not None:
            raise UnsupportedLayerError(
                "give the dims to reduce (over every axis, the batch's too, there is no kernel), "
                "and no dtype: x.mean(dim=(2, 3)), x.sum(-1, keepdim=True).")
        return Reduce(tuple(dim) if isinstance(dim, (tuple, list)) else (dim,), keepdim, mean), [x]
    return make


FORMS = {
    "getitem": lambda x, key: (Index(_key(key)), [x]),
    "narrow": _narrow,
    "select": lambda x, dim, index: (Index(_key(_along(dim, index))), [x]),
    "mean": _reduction(True), "sum": _reduction(False),
    "unsqueeze": lambda x, dim: (Unsqueeze(dim), [x]),
}
FUNCTIONS = {operator.getitem: FORMS["getitem"], torch.narrow: _narrow,
             torch.select: FORMS["select"], torch.mean: _reduction(True),
             torch.sum: _reduction(False), torch.unsqueeze: FORMS["unsqueeze"],
             torch.stack: lambda tensors, dim=0: (Stack(dim), list(tensors))}
METHODS = {name: FORMS[name] for name in ("narrow", "select", "mean", "sum", "unsqueeze")}
