"""Graph aggregation in a traced ``forward``: ``h @ M`` (``torch.matmul``, ``Tensor.matmul``) with a
constant matrix ``M`` (a buffer or attribute of the model, dense or ``torch.sparse``, possibly
transposed: ``h @ self.adjacency.T``), ``h`` of shape ``(N, C, *S, V)`` with the graph's ``V``
nodes along its last axis (channels first: a per-node Linear is ``nn.Conv1d(C, C', 1)``).

The output node ``u`` is ``sum_v M[v, u] h[..., v]``: NT's ``Aggregate`` with the adjacency
``A = M^T`` (``stax.Aggregate``: ``K' = A K A^T``, exact). The adjacency is part of the model,
the same for every example (node signals on one graph); ntbridge models take one input tensor, so
a per-example adjacency passed to ``forward`` is refused.

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
import operator

import numpy as np
import torch
from torch import fx, nn

from .. import stax
from ..errors import UnsupportedLayerError
from .registry import Context, register


class Aggregate(nn.Module):
    """``h @ adjacency.T``: ``y[..., u] = sum_v adjacency[u, v] h[..., v]`` (``adjacency (U, V)``,
    a constant of the model, kept as a float64 copy)."""

    def __init__(self, adjacency: torch.Tensor):
        super().__init__()
        dense = adjacency.detach().to_dense() if adjacency.is_sparse else adjacency.detach()
        self.matrix = dense.cpu().double().numpy()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h @ torch.as_tensor(self.matrix.T, dtype=h.dtype, device=h.device)

    def extra_repr(self) -> str:  # the kernel depends on every entry: the signature has a digest
        digest = hashlib.sha256(np.ascontiguousarray(self.matrix).tobytes()).hexdigest()[:16]
        return f"adjacency={self.matrix.shape}, sha256={digest}"


@register(Aggregate)
def _aggregate(module: Aggregate, ctx: Context) -> stax.Layer:
    return stax.Aggregate(module.matrix, name="graph aggregation")


def _matmul(h, m, *, out=None):
    if isinstance(m, fx.Node) or not isinstance(h, fx.Node) or out is not None:
        raise UnsupportedLayerError(
            "only h @ M with a constant matrix M of the model (a buffer: the graph's adjacency "
            "transposed) has a kernel rule: nodes lie along h's last axis (N, C, V), so write "
            "h @ self.adjacency.T rather than adjacency @ h; an adjacency given to forward as a "
            "second input is not supported (register it as a buffer).")
    if not isinstance(m, torch.Tensor) or m.ndim != 2:
        raise UnsupportedLayerError(f"h @ M needs a constant matrix M, got {m!r}.")
    return Aggregate(m.T), [h]


FUNCTIONS = {operator.matmul: _matmul, torch.matmul: _matmul}
METHODS = {"matmul": _matmul}
