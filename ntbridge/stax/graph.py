"""Graph aggregation: a fixed linear map of the nodes of a graph, ``y[..., u] = sum_v A[u, v]
h[..., v]`` (Neural Tangents' ``Aggregate`` with one adjacency for every example).

Nodes lie along the last spatial axis of ``(N, C, *S, V)``, features along the channels (torch's
channels-first layout: a per-node Linear is a ``Conv1d`` of kernel size 1), so the aggregation is
the matrix ``A (U, V)`` applied along that axis, the same for every channel and example, and its
kernel rule is exact: ``K'[u, u'] = sum_{v, v'} A[u, v] A[u', v'] K[v, v']``, i.e. ``A K A^T``
(:func:`~.pooling.separable_linear`). It mixes nodes, so it needs the full covariance of node pairs.
"""

from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from .layers import Layer
from .pooling import separable_linear


def Aggregate(adjacency: np.ndarray, name: str = "Aggregate") -> Layer:
    """``(N, C, *S, V) -> (N, C, *S, U)``: each output node the ``adjacency (U, V)``-weighted sum
    of the input nodes (torch: ``h @ adjacency.T``). ``name`` is the module's, for errors.

    Example:
        >>> ring = np.roll(np.eye(5), 1, 1) + np.roll(np.eye(5), -1, 1)
        >>> Aggregate(ring).init_fn(None, (8, 16, 5))[0]
        (8, 16, 5)
    """
    adjacency = np.asarray(adjacency, np.float64)
    if adjacency.ndim != 2:
        raise ShapeError(f"{name}: the adjacency must be a matrix (U, V), got shape "
                         f"{adjacency.shape}")

    def matrices(spatial):
        if spatial[-1] != adjacency.shape[1]:
            raise ShapeError(f"{name}: inputs of {spatial[-1]} nodes along the last axis, for an "
                             f"adjacency of {adjacency.shape[1]} (shape {adjacency.shape})")
        return [None] * (len(spatial) - 1) + [adjacency]

    return separable_linear(None, matrices, name)
