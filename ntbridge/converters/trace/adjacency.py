"""Adjacency matrices in a traced ``forward`` (graph networks): ``h @ M`` of a constant matrix of the
model, and the products of ``forward(x, adjacency)``'s second input; the modules standing for
them are :mod:`..aggregation`'s, which says what each computes.
"""

from __future__ import annotations

import operator

import torch
from torch import fx

from ...errors import ConversionError, UnsupportedLayerError
from ..aggregation import Aggregate, InputAggregate


def adjacency_view(node: fx.Node, adjacencies: dict[fx.Node, bool]) -> bool | None:
    """When ``node`` transposes the adjacency input (or a transpose of it; ``adjacencies``: those
    seen so far, each with whether it is transposed), whether the result is transposed; None
    otherwise."""
    if not node.args or node.args[0] not in adjacencies:
        return None
    rest = tuple(node.args[1:]) + tuple(node.kwargs.values())
    swaps = {(1, 2), (2, 1), (-1, -2), (-2, -1), (1, -1), (-1, 1), (-2, 2), (2, -2)}
    if ((node.op == "call_method" and node.target == "transpose" and rest in swaps)
            or (node.op == "call_function" and node.target is torch.transpose and rest in swaps)
            or (node.op == "call_method" and node.target == "permute"
                and rest in {(0, 2, 1), ((0, 2, 1),)})
            or (node.op == "call_function" and node.target is getattr and rest == ("mT",))):
        return not adjacencies[node.args[0]]
    return None


PRODUCTS = {operator.matmul, torch.matmul, torch.bmm}


def _is_product(node: fx.Node) -> bool:
    return ((node.op == "call_function" and node.target in PRODUCTS)
            or (node.op == "call_method" and node.target in ("matmul", "bmm")))


def reads_nodes_first(graph: fx.Graph, adjacency: fx.Node) -> bool:
    """Whether ``forward(x, adjacency)`` multiplies the node features by the adjacency from the
    left, ``adjacency @ h`` on ``(N, V, C)`` (nodes first), rather than from the right; a model
    doing both is refused."""
    views, sides = {adjacency: False}, set()
    for node in graph.nodes:
        if (view := adjacency_view(node, views)) is not None:
            views[node] = view
        elif _is_product(node) and len(node.args) >= 2:
            sides |= {"left"} if node.args[0] in views else set()
            sides |= {"right"} if node.args[1] in views else set()
    if len(sides) > 1:
        raise UnsupportedLayerError(
            "forward multiplies node features by the adjacency from the left (adjacency @ h, "
            "features (N, V, C)) and from the right (h @ adjacency.mT, features (N, C, V)): "
            "write every aggregation in one layout.")
    return sides == {"left"}


def input_aggregation(node: fx.Node, adjacencies: dict[fx.Node, bool]) -> tuple | None:
    """``(InputAggregate, h)`` when ``node`` is ``h @ M`` or ``M @ h`` with ``M`` the adjacency
    input or its transpose; None when it does not use the adjacency; any other use is refused."""
    if not any(a in adjacencies for a in node.all_input_nodes):
        return None
    if not _is_product(node):
        second = next(iter(adjacencies)).name
        raise ConversionError(
            f"{node.name} ({getattr(node.target, '__name__', node.target)}) computes with "
            f"forward's second input '{second}'. ntbridge models take one tensor, forward(x), or "
            f"node features and each example's graph, forward(x, adjacency), whose adjacency "
            f"enters only through products h @ adjacency.transpose(1, 2) (or h @ adjacency) of "
            f"features (N, C, V), or adjacency @ h of features (N, V, C): normalise it before "
            f"passing it.")
    first, second = node.args[:2]
    if (first in adjacencies) == (second in adjacencies) or node.kwargs:
        raise UnsupportedLayerError(f"{node.name}: the adjacency aggregates node features, "
                                    f"adjacency @ h or h @ adjacency.mT, not itself.")
    if first in adjacencies:  # A @ h (or A^T @ h): nodes first
        return InputAggregate(transposed=adjacencies[first], nodes_first=True), second
    return InputAggregate(transposed=not adjacencies[second]), first


def _matmul(h, m, *, out=None):
    """``h @ M`` (nodes along h's last axis) or ``A @ h`` (nodes first, ``h (N, V, C)``) with a
    constant matrix of the model."""
    if isinstance(h, torch.Tensor) and isinstance(m, fx.Node) and out is None:
        if h.ndim != 2:
            raise UnsupportedLayerError(f"A @ h needs a constant matrix A (V, V), got a tensor of "
                                        f"shape {tuple(h.shape)}.")
        return Aggregate(h, nodes_first=True), [m]
    if isinstance(m, fx.Node) or not isinstance(h, fx.Node) or out is not None:
        raise UnsupportedLayerError(
            "only h @ M or A @ h with a constant matrix of the model (a buffer, the graph's "
            "adjacency, or a normalisation of it computed in forward), or with each example's "
            "adjacency given to forward, has a kernel rule: nodes lie along h's last axis, "
            "h (N, C, V) @ self.adjacency.T, or first, self.adjacency @ h (N, V, C).")
    if not isinstance(m, torch.Tensor) or m.ndim != 2:
        raise UnsupportedLayerError(f"h @ M needs a constant matrix M, got {m!r}.")
    return Aggregate(m.T), [h]


FUNCTIONS = {operator.matmul: _matmul, torch.matmul: _matmul}
METHODS = {"matmul": _matmul}
