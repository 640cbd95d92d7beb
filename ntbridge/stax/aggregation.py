"""Graph aggregation: a linear map of the nodes of a graph, ``y[..., u] = sum_v A[u, v]
h[..., v]``, with one adjacency for every example (:func:`Aggregate`) or each example's own
(:func:`InputAggregate`), as Neural Tangents' ``Aggregate`` without and with its ``pattern``.

Nodes lie along the last spatial axis of ``(N, C, *S, V)``, features along the channels (torch's
channels-first layout: a per-node Linear is a ``Conv1d`` of kernel size 1), so the aggregation is
the matrix ``A (U, V)`` applied along that axis, the same for every channel and example, and its
kernel rule is exact: ``K'[u, u'] = sum_{v, v'} A[u, v] A[u', v'] K[v, v']``, i.e. ``A K A^T``
(:func:`~.pooling.separable_linear`). It mixes nodes, so it needs the full covariance of node pairs.

A model whose ``forward(x, adjacency)`` takes each example's graph reads both from one array, the
graph inputs packed adjacency first, ``(N, V + C, V)``: the adjacencies ``(N, V, V)``, then the
node features ``(N, C, V)``. Their kernel (:func:`node_features_kernel`) is that of the features, carrying
the adjacencies (``Kernel.adjacency1``, ``adjacency2``) for the aggregations, which take the
model's input as their second input; :func:`NodeFeatures` stands for ``x``. With ``A1``, ``A2``
the adjacencies of an example pair, the rule is ``A1 K A2^T``, exact.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ShapeError, UnsupportedLayerError
from .conv import contract
from .kernel import Kernel, input_kernel, map_arrays, sequence_kernel
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


def NodesFirstAggregate(adjacency: np.ndarray, name: str = "NodesFirstAggregate") -> Layer:
    """``(N, V, C) -> (N, U, C)``, nodes first (Kipf's layout, features last as ``nn.Linear``
    reads them): each output node the ``adjacency (U, V)``-weighted sum of the input nodes (torch:
    ``adjacency @ h``). The kernel's arrays are those of :func:`Aggregate` (every pair of nodes,
    as every pair of tokens): ``A K A^T``, exact.

    Example:
        >>> NodesFirstAggregate(np.eye(5)).init_fn(None, (8, 5, 16))[0]
        (8, 5, 16)
    """
    adjacency = np.asarray(adjacency, np.float64)
    if adjacency.ndim != 2:
        raise ShapeError(f"{name}: the adjacency must be a matrix (U, V), got shape "
                         f"{adjacency.shape}")

    def init_fn(key, shape):
        if len(shape) != 3 or shape[1] != adjacency.shape[1]:
            raise ShapeError(f"{name}: adjacency @ h aggregates node features (N, "
                             f"{adjacency.shape[1]}, C), nodes first, got {tuple(shape)}")
        return (shape[0], adjacency.shape[0], shape[2]), {}

    def apply_fn(params, h):
        return jnp.einsum("uv,nvc->nuc", jnp.asarray(adjacency, h.dtype), h,
                          precision=jax.lax.Precision.HIGHEST)

    def kernel_fn(k: Kernel) -> Kernel:
        if not k.tokens or k.diagonal_spatial:
            raise UnsupportedLayerError(
                f"{name}: adjacency @ h aggregates node features (N, V, C), nodes first, read "
                f"features last (after an nn.Linear, or as the model's input); its input here is "
                f"read channels first {k.shape1}, where nodes lie along the last axis: write "
                f"h @ adjacency.T there")
        fn = lambda a, n_batch: contract(contract(a, adjacency, n_batch), adjacency, n_batch + 1)
        shape = lambda s: (s[0], adjacency.shape[0], s[2])
        return map_arrays(k, fn).replace(shape1=shape(k.shape1), shape2=shape(k.shape2))

    return Layer(init_fn, apply_fn, kernel_fn, full_spatial=True, affine=True,
                 input_kernel=sequence_kernel)


def aggregated(k: Kernel, m1: jax.Array, m2: jax.Array) -> Kernel:
    """The kernel arrays after each example's nodes are mapped by its own ``M (U, V)``
    (``m1 (N1, U, V)``, ``m2 (N2, U, V)``): ``M1 K M2^T`` over every pair of nodes, exact (the
    shapes are the caller's to set)."""
    hi = jax.lax.Precision.HIGHEST
    pairs = lambda t: jnp.einsum("auv,abvw,bxw->abux", m1, t, m2, precision=hi)
    own = lambda c, m: jnp.einsum("auv,avw,axw->aux", m, c, m, precision=hi)
    cov1 = own(k.cov1, m1)
    return k.replace(nngp=pairs(k.nngp), ntk=None if k.ntk is None else pairs(k.ntk), cov1=cov1,
                     cov2=cov1 if k.x1_is_x2 else own(k.cov2, m2))


def unpacked(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(adjacency (N, V, V), features (N, C, V))`` of graph inputs packed as ``(N, V + C, V)``."""
    v = x.shape[-1]
    return x[:, :v], x[:, v:]


def node_features_kernel(x1: jax.Array, x2: jax.Array | None, *, compute_ntk: bool,
                 diagonal_spatial: bool) -> Kernel:
    """The kernel of packed graph inputs (module doc): the features' kernel, carrying each
    example's adjacency.

    Example:
        >>> k = node_features_kernel(jnp.ones((2, 5 + 3, 5)), None, compute_ntk=False,
        ...                  diagonal_spatial=False)
        >>> k.nngp.shape, k.adjacency1.shape
        ((2, 2, 5, 5), (2, 5, 5))
    """
    (a1, f1), (a2, f2) = unpacked(x1), unpacked(x1 if x2 is None else x2)
    k = input_kernel(f1, None if x2 is None else f2, compute_ntk=compute_ntk,
                     diagonal_spatial=diagonal_spatial)
    return k.replace(adjacency1=a1, adjacency2=a2)


def _check_packed(shape: tuple[int, ...], name: str) -> None:
    if len(shape) != 3 or shape[1] <= shape[2]:
        raise ShapeError(f"{name}: graph inputs are packed as (N, V + C, V), adjacencies first, "
                         f"got {tuple(shape)}")


def NodeFeatures(nodes_first: bool = False) -> Layer:
    """``x`` of a graph model's ``forward(x, adjacency)``: packed inputs ``(N, V + C, V) ->
    (N, C, V)`` (module doc), or ``(N, V, C)`` when the model reads it ``nodes_first`` (Kipf's
    layout, features last: the kernel's arrays are the same, its outputs sequences of nodes); the
    kernel is the features', without the adjacencies.

    Example:
        >>> NodeFeatures().init_fn(None, (8, 5 + 3, 5))[0]
        (8, 3, 5)
    """

    def init_fn(key, shape):
        _check_packed(shape, "the node features")
        c, v = shape[1] - shape[2], shape[2]
        return (shape[0], v, c) if nodes_first else (shape[0], c, v), {}

    def apply_fn(params, x):
        h = unpacked(x)[1]
        return jnp.swapaxes(h, 1, 2) if nodes_first else h

    def kernel_fn(k: Kernel) -> Kernel:
        k = k.replace(adjacency1=None, adjacency2=None)
        if not nodes_first:
            return k
        swap = lambda s: (s[0], s[2], s[1])
        return k.replace(shape1=swap(k.shape1), shape2=swap(k.shape2), tokens=True)

    return Layer(init_fn, apply_fn, kernel_fn, affine=True, input_kernel=node_features_kernel)


def InputAggregate(transposed: bool = False, name: str = "InputAggregate",
                   nodes_first: bool = False) -> Layer:
    """``(h (N, C, V), inputs (N, V + C', V)) -> (N, C, V)``: each example's nodes aggregated
    with its own adjacency ``A`` from the packed graph inputs, ``h @ A^T`` (torch:
    ``h @ adjacency.transpose(1, 2)``), or ``h @ A`` when ``transposed``; ``nodes_first``: of
    ``h (N, V, C)``, ``A @ h`` (torch: ``adjacency @ h``, ``torch.bmm(adjacency, h)``), or
    ``A^T @ h`` when ``transposed``.

    Example:
        >>> InputAggregate().init_fn(None, ((8, 16, 5), (8, 5 + 3, 5)))[0]
        (8, 16, 5)
    """
    node_axis = 1 if nodes_first else 2

    def init_fn(key, shapes):
        h, packed = shapes
        _check_packed(packed, name)
        if len(h) != 3 or h[node_axis] != packed[-1]:
            form = f"(N, {packed[-1]}, C), nodes first" if nodes_first else f"(N, C, {packed[-1]})"
            raise ShapeError(f"{name}: aggregates node features {form} with each example's "
                             f"adjacency ({packed[-1]} nodes), got features {tuple(h)}")
        return tuple(h), {}

    def weights(a: jax.Array) -> jax.Array:  # A (N, U, V): output node u from input node v
        return jnp.swapaxes(a, 1, 2) if transposed else a

    def apply_fn(params, inputs):
        h, packed = inputs
        form = "nvc,nuv->nuc" if nodes_first else "ncv,nuv->ncu"
        return jnp.einsum(form, h, weights(unpacked(packed)[0]))

    def kernel_fn(ks) -> Kernel:
        k, graphs = ks
        if graphs.adjacency1 is None or k.diagonal_spatial or k.tokens != nodes_first:
            raise UnsupportedLayerError(f"{name} needs the model's graph inputs and the covariance "
                                        f"of every pair of nodes, nodes along the axis they are "
                                        f"aggregated on")
        return aggregated(k, weights(graphs.adjacency1), weights(graphs.adjacency2))

    return Layer(init_fn, apply_fn, kernel_fn, full_spatial=True, input_kernel=node_features_kernel)
