"""Aggregation over adjacency matrices (graph networks): the modules standing for ``h @ M`` in a
traced ``forward`` (the spellings are :mod:`.trace.adjacency`'s), their converters, and
:func:`pack` of a model's paired inputs. ``h`` has shape ``(N, C, *S, V)``, the ``V`` nodes along
its last axis (channels first: a per-node Linear is ``nn.Conv1d(C, C', 1)``). The output node
``u`` is ``sum_v M[v, u] h[..., v]``: NT's ``Aggregate`` with the adjacency ``A = M^T``, exact.

* ``M`` a constant matrix of the model (a buffer or attribute, dense or ``torch.sparse``, possibly
  transposed: ``h @ self.adjacency.T``): one adjacency for every example (:class:`Aggregate`,
  ``stax.Aggregate``).
* ``M`` each example's own adjacency, given to ``forward(x, adjacency)`` with ``x`` ``(N, C, V)``
  and ``adjacency`` ``(N, V, V)`` (``h @ adjacency.transpose(1, 2)``, ``.mT``, or
  ``h @ adjacency``): :class:`NodeFeatures` stands for ``x`` and :class:`InputAggregate` for the
  products (``stax.InputAggregate``); the kernels take the inputs as a pair, ``ntbridge.ntk(model,
  (x1, adjacency1), (x2, adjacency2))``, packed into one tensor by :func:`pack`. The adjacency
  enters only through such products (normalise it before passing it).

Example:
    >>> class GCN(nn.Module):
    ...     def __init__(self, adjacency):
    ...         super().__init__()
    ...         self.register_buffer("adjacency", adjacency)   # (V, V), dense or sparse
    ...         self.node = nn.Conv1d(3, 256, 1)
    ...     def forward(self, x):                              # x: (N, 3, V)
    ...         return torch.relu(self.node(x) @ self.adjacency.T).mean(-1)
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch
from torch import nn

from .. import stax
from ..errors import InputError, ShapeError
from ..stax.aggregation import unpacked
from .registry import Context, register


class Aggregate(nn.Module):
    """``h @ adjacency.T``: ``y[..., u] = sum_v adjacency[u, v] h[..., v]`` (``adjacency (U, V)``,
    a constant of the model, kept as a float64 copy); ``nodes_first``: ``adjacency @ h`` of
    ``h (N, V, C)``, nodes first (Kipf's layout)."""

    def __init__(self, adjacency: torch.Tensor, nodes_first: bool = False):
        super().__init__()
        dense = adjacency.detach().to_dense() if adjacency.is_sparse else adjacency.detach()
        self.matrix, self.nodes_first = dense.cpu().double().numpy(), nodes_first

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        a = torch.as_tensor(self.matrix, dtype=h.dtype, device=h.device)
        return a @ h if self.nodes_first else h @ a.T

    def extra_repr(self) -> str:  # the kernel depends on every entry: the signature has a digest
        digest = hashlib.sha256(np.ascontiguousarray(self.matrix).tobytes()).hexdigest()[:16]
        return f"adjacency={self.matrix.shape}, sha256={digest}, nodes_first={self.nodes_first}"


@register(Aggregate)
def _aggregate(module: Aggregate, ctx: Context) -> stax.Layer:
    rule = stax.NodesFirstAggregate if module.nodes_first else stax.Aggregate
    return rule(module.matrix, name="graph aggregation")


class NodeFeatures(nn.Module):
    """``x`` of ``forward(x, adjacency)``: the node features ``(N, C, V)`` of the packed
    inputs ``(N, V + C, V)`` (:func:`pack`), or ``(N, V, C)`` when the model reads them
    ``nodes_first`` (``adjacency @ h``)."""

    def __init__(self, nodes_first: bool = False):
        super().__init__()
        self.nodes_first = nodes_first

    def forward(self, packed: torch.Tensor) -> torch.Tensor:
        x = unpacked(packed)[1]
        return x.transpose(1, 2) if self.nodes_first else x

    def extra_repr(self) -> str:
        return f"nodes_first={self.nodes_first}"


class InputAggregate(nn.Module):
    """``h @ adjacency.transpose(1, 2)`` with each example's adjacency from the packed
    inputs (``transposed``: ``h @ adjacency``); ``nodes_first``: ``adjacency @ h``
    (``transposed``: ``adjacency.transpose(1, 2) @ h``)."""

    def __init__(self, transposed: bool = False, nodes_first: bool = False):
        super().__init__()
        self.transposed, self.nodes_first = transposed, nodes_first

    def forward(self, h: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        a = unpacked(packed)[0]
        if self.nodes_first:
            return (a.transpose(1, 2) if self.transposed else a) @ h
        return h @ (a if self.transposed else a.transpose(1, 2))

    def extra_repr(self) -> str:
        return f"transposed={self.transposed}, nodes_first={self.nodes_first}"


@register(NodeFeatures)
def _node_features(module: NodeFeatures, ctx: Context) -> stax.Layer:
    return stax.NodeFeatures(module.nodes_first)


@register(InputAggregate)
def _input_aggregate(module: InputAggregate, ctx: Context) -> stax.Layer:
    return stax.InputAggregate(module.transposed, name="graph aggregation",
                               nodes_first=module.nodes_first)


def pack(inputs, name: str, nodes_first: bool = False) -> torch.Tensor:
    """A model's paired inputs ``(x (N, C, V), adjacency (N, V, V))`` as one tensor ``(N, V + C, V)``
    (adjacency first, in x's dtype; a sparse adjacency made dense), differentiable in both; x
    ``(N, V, C)`` for a model reading it ``nodes_first``.

    Example:
        >>> pack((torch.randn(8, 3, 5), torch.eye(5).expand(8, 5, 5)), "x1").shape
        torch.Size([8, 8, 5])
    """
    if not (isinstance(inputs, (tuple, list)) and len(inputs) == 2
            and all(isinstance(t, torch.Tensor) for t in inputs)):
        raise InputError(f"{name} is {type(inputs).__name__}; a graph model's inputs are a pair "
                         f"of tensors, {name}=(x, adjacency), for x1 and x2 alike.")
    x, a = inputs
    a = a.to_dense() if a.is_sparse else a
    if x.ndim == 3 and nodes_first:
        x = x.transpose(1, 2)
    if x.ndim != 3 or a.ndim != 3 or a.shape != (x.shape[0], x.shape[2], x.shape[2]):
        form = "(N, V, C), nodes first as the model reads them," if nodes_first else "(N, C, V)"
        shape = tuple(x.transpose(1, 2).shape if nodes_first and x.ndim == 3 else x.shape)
        raise ShapeError(f"{name}=(x, adjacency) needs node features x {form} and adjacencies "
                         f"(N, V, V), got x {shape} and adjacency {tuple(a.shape)}.")
    if x.device != a.device:
        raise InputError(f"{name}: x is on {x.device} and its adjacency on {a.device}; move them "
                         f"to one device.")
    if not (x.is_floating_point() and a.is_floating_point()):
        raise InputError(f"{name}=(x, adjacency) are floating-point tensors, got {x.dtype} and "
                         f"{a.dtype}.")
    return torch.cat((a.to(x.dtype), x), 1)
