"""PyTorch Geometric's ``Data`` and ``Batch`` as the inputs of a converted PyG model: one packed
array ``(1, V, 3V + F)`` (``stax.message_passing``), recognised without importing the library.

``x2`` is packed with ``x1`` as one graph of both (a disjoint union: no edge joins them), whose
kernel with itself holds the kernel of ``x1`` against ``x2`` in its off-diagonal block, exactly
(the same weights act on both, and no message crosses between them); :class:`Selection` takes
that block out of the results: node by node ``(V1, V2)``, or graph by graph ``(G1, G2)`` for a
model that pools each graph.
"""

from __future__ import annotations

import dataclasses

import torch

from ..errors import InputError, ShapeError


def is_data(x) -> bool:
    """Whether ``x`` is a PyG ``Data`` or ``Batch``."""
    return any(c.__module__.startswith("torch_geometric.data") for c in type(x).__mro__)


def _graph_count(data) -> int:
    batch = getattr(data, "batch", None)
    return 1 if batch is None else int(batch.max()) + 1 if batch.numel() else 0


def _checked(data, name: str):
    """``(x, edge_index, edge_weight, batch)`` of ``data``, checked."""
    x, edges = getattr(data, "x", None), getattr(data, "edge_index", None)
    if not isinstance(x, torch.Tensor) or not isinstance(edges, torch.Tensor):
        raise InputError(f"{name} is a {type(data).__name__} without node features x or "
                         f"edge_index; give it both (data.x (V, F), data.edge_index (2, E)).")
    if x.ndim != 2 or not x.is_floating_point() or x.shape[0] == 0:
        raise ShapeError(f"{name}.x has shape {tuple(x.shape)} and dtype {x.dtype}; node "
                         f"features are floating-point (V, F), V >= 1.")
    if edges.ndim != 2 or edges.shape[0] != 2 or (edges.numel() and (
            edges.min() < 0 or edges.max() >= x.shape[0])):
        raise ShapeError(f"{name}.edge_index must be (2, E) of node indices below {x.shape[0]}, "
                         f"got shape {tuple(edges.shape)}.")
    weight = getattr(data, "edge_weight", None)
    weight = torch.ones(edges.shape[1], dtype=x.dtype, device=x.device) if weight is None else weight
    batch = getattr(data, "batch", None)
    batch = torch.zeros(x.shape[0], dtype=torch.long, device=x.device) if batch is None else batch
    return x, edges, weight.to(x.dtype), batch


@dataclasses.dataclass(frozen=True)
class Selection:
    """Where ``x1``'s and ``x2``'s nodes and graphs lie in the packed union (module doc)."""

    nodes: tuple[int, int]  # V1, V2 (V2 = 0 when x2 is None)
    graphs: tuple[int, int]  # G1, G2

    def block(self, result, pooled: bool):
        """The kernel of ``x1`` against ``x2`` in ``result`` (a tensor ``(1, 1, R, R)`` of the
        union, or a named tuple of them): ``(V1, V2)``, or ``(G1, G2)`` when ``pooled``."""
        n1, n2 = self.graphs if pooled else self.nodes
        cols = slice(n1, n1 + n2) if n2 else slice(0, n1)

        def one(t):
            return t[0, 0, :n1, cols] if isinstance(t, torch.Tensor) and t.ndim == 4 else t

        if isinstance(result, tuple):
            return type(result)(*[one(t) for t in result])
        return one(result)


def pack_data(x1, x2) -> tuple[torch.Tensor, Selection]:
    """The packed array ``(1, V, 3V + F)`` of ``x1`` (and ``x2``: their union) and where each
    lies in it.

    Example:
        >>> data = Data(x=torch.randn(4, 3), edge_index=torch.tensor([[0, 1], [1, 2]]))
        >>> pack_data(data, None)[0].shape
        torch.Size([1, 4, 15])
    """
    if x2 is not None and not is_data(x2):
        raise InputError(f"x1 is a {type(x1).__name__}; x2 is {type(x2).__name__}: give both as "
                         f"PyTorch Geometric Data (or Batch), or x2=None.")
    graphs = [_checked(x1, "x1")] + ([] if x2 is None else [_checked(x2, "x2")])
    if len(graphs) == 2 and graphs[0][0].shape[1] != graphs[1][0].shape[1]:
        raise ShapeError(f"x1 has {graphs[0][0].shape[1]} node features and x2 "
                         f"{graphs[1][0].shape[1]}; give both the same.")
    counts = [(g[0].shape[0], _graph_count(d)) for g, d in zip(graphs, (x1, x2))]
    v, g = counts[0][0], counts[0][1]
    if len(graphs) == 2:
        x, e, w, b = graphs[1]
        graphs[1] = (x, e + v, w, b + g)
    x, edges, weight, batch = (torch.cat(t) if i != 1 else torch.cat(t, 1)
                               for i, t in enumerate(zip(*graphs)))
    size = x.shape[0]
    dense = lambda values: torch.zeros(size, size, dtype=x.dtype, device=x.device).index_put_(
        (edges[1], edges[0]), values, accumulate=True)  # [target, source]
    members = torch.zeros(size, size, dtype=x.dtype, device=x.device)
    members[torch.arange(size, device=x.device), batch] = 1
    packed = torch.cat([dense(weight), dense(torch.ones_like(weight)), members, x], 1)[None]
    second = counts[1] if len(counts) == 2 else (0, 0)
    return packed, Selection((counts[0][0], second[0]), (counts[0][1], second[1]))
