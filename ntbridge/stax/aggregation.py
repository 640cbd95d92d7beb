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


def NodeFeatures() -> Layer:
    """``x`` of a graph model's ``forward(x, adjacency)``: packed inputs ``(N, V + C, V) ->
    (N, C, V)`` (module doc); the kernel is the features', without the adjacencies.

    Example:
        >>> NodeFeatures().init_fn(None, (8, 5 + 3, 5))[0]
        (8, 3, 5)
    """

    def init_fn(key, shape):
        _check_packed(shape, "the node features")
        return (shape[0], shape[1] - shape[2], shape[2]), {}

    kernel_fn = lambda k: k.replace(adjacency1=None, adjacency2=None)
    return Layer(init_fn, lambda params, x: unpacked(x)[1], kernel_fn, affine=True,
                 input_kernel=node_features_kernel)


def InputAggregate(transposed: bool = False, name: str = "InputAggregate") -> Layer:
    """``(h (N, C, V), inputs (N, V + C', V)) -> (N, C, V)``: each example's nodes aggregated
    with its own adjacency ``A`` from the packed graph inputs, ``h @ A^T`` (torch:
    ``h @ adjacency.transpose(1, 2)``), or ``h @ A`` when ``transposed``.

    Example:
        >>> InputAggregate().init_fn(None, ((8, 16, 5), (8, 5 + 3, 5)))[0]
        (8, 16, 5)
    """

    def init_fn(key, shapes):
        h, packed = shapes
        _check_packed(packed, name)
        if len(h) != 3 or h[-1] != packed[-1]:
            raise ShapeError(f"{name}: aggregates node features (N, C, {packed[-1]}) with each "
                             f"example's adjacency ({packed[-1]} nodes), got features {tuple(h)}")
        return tuple(h), {}

    def weights(a: jax.Array) -> jax.Array:  # A (N, U, V): output node u from input node v
        return jnp.swapaxes(a, 1, 2) if transposed else a

    def apply_fn(params, inputs):
        h, packed = inputs
        return jnp.einsum("ncv,nuv->ncu", h, weights(unpacked(packed)[0]))

    def kernel_fn(ks) -> Kernel:
        k, graphs = ks
        if graphs.adjacency1 is None or k.diagonal_spatial:
            raise UnsupportedLayerError(f"{name} needs the model's graph inputs and the covariance "
                                        f"of every pair of nodes")
        a1, a2 = weights(graphs.adjacency1), weights(graphs.adjacency2)
        hi = jax.lax.Precision.HIGHEST
        pairs = lambda t: jnp.einsum("auv,abvw,bxw->abux", a1, t, a2, precision=hi)
        own = lambda c, a: jnp.einsum("auv,avw,axw->aux", a, c, a, precision=hi)
        cov1 = own(k.cov1, a1)
        return k.replace(nngp=pairs(k.nngp), ntk=None if k.ntk is None else pairs(k.ntk),
                         cov1=cov1, cov2=cov1 if k.x1_is_x2 else own(k.cov2, a2))

    return Layer(init_fn, apply_fn, kernel_fn, full_spatial=True, input_kernel=node_features_kernel)
