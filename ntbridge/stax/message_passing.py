"""Message passing on graphs as PyTorch Geometric writes them: node features ``(V, F)``, nodes
first, and the graph's edges, read from one packed array ``(1, V, 3V + F)`` (one example: the
nodes of every graph of a batch, as PyG batches them):

* ``W (V, V)``: ``W[i, j]`` the summed weights of the edges ``j -> i`` (1 per edge without
  weights); ``C (V, V)`` their count;
* ``P^T (V, V)``: ``P[g, v] = 1`` when node ``v`` belongs to graph ``g`` (rows past the number of
  graphs are zero: a pooled model's output has ``V`` rows, those of the graphs first);
* ``x (V, F)``: the node features.

Each layer is linear maps of the nodes' features (:func:`~.layers.Dense`, a network of layers)
applied to ``M h`` or to ``h`` and summed, ``M`` a matrix of the graph (:data:`MATRICES`): since
``M`` acts on nodes and the weights on features, ``M (h W^T) = (M h) W^T``, and the kernel of
``M h`` is ``M1 K M2^T`` over node pairs, exact (Neural Tangents' ``Aggregate`` with a pattern);
branches with independent weights add their kernels.
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp

from ..errors import ShapeError, UnsupportedLayerError
from .aggregation import aggregated
from .kernel import Kernel, sequence_kernel
from .layers import Layer, with_hyper

HIGHEST = jax.lax.Precision.HIGHEST
GRAPH_PARTS = 3  # W, C, P^T


def parts(packed: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """``(W, C, P^T, x)`` of a packed array ``(N, V, 3V + F)`` (module doc)."""
    v = packed.shape[1]
    return tuple(packed[..., i * v:(i + 1) * v] for i in range(GRAPH_PARTS)) + (
        packed[..., GRAPH_PARTS * v:],)


def _check_packed(shape: tuple[int, ...], name: str) -> None:
    if len(shape) != 3 or shape[2] <= GRAPH_PARTS * shape[1]:
        raise ShapeError(f"{name}: graphs are read packed as (1, V, 3V + F), got {tuple(shape)}")


def geometric_kernel(x1: jax.Array, x2: jax.Array | None, *, compute_ntk: bool,
                     diagonal_spatial: bool) -> Kernel:
    """The kernel of packed graphs (module doc): that of the node features, every pair of nodes,
    carrying the graphs' matrices ``(N, V, 3V)`` as ``adjacency1``, ``adjacency2``.

    Example:
        >>> k = geometric_kernel(jnp.ones((1, 4, 12 + 2)), None, compute_ntk=False,
        ...                      diagonal_spatial=False)
        >>> k.nngp.shape, k.adjacency1.shape
        ((1, 1, 4, 4), (1, 4, 12))
    """
    graphs = lambda x: x[..., :GRAPH_PARTS * x.shape[1]]
    features = lambda x: x[..., GRAPH_PARTS * x.shape[1]:]
    k = sequence_kernel(features(x1), None if x2 is None else features(x2),
                        compute_ntk=compute_ntk, diagonal_spatial=False)
    return k.replace(adjacency1=graphs(x1), adjacency2=graphs(x1 if x2 is None else x2))


def GeometricFeatures() -> Layer:
    """``x`` of a PyG model's ``forward(x, edge_index, ...)``: ``(1, V, 3V + F) -> (1, V, F)``.

    Example:
        >>> GeometricFeatures().init_fn(None, (1, 4, 12 + 2))[0]
        (1, 4, 2)
    """

    def init_fn(key, shape):
        _check_packed(shape, "the node features")
        return (shape[0], shape[1], shape[2] - GRAPH_PARTS * shape[1]), {}

    kernel_fn = lambda k: k.replace(adjacency1=None, adjacency2=None)
    return Layer(init_fn, lambda params, x: parts(x)[3], kernel_fn, full_spatial=True,
                 input_kernel=geometric_kernel)


def _with_self_loops(a: jax.Array, fill: float) -> jax.Array:
    """``a`` with ``fill`` on the diagonal where it has no self-loop (PyG's
    ``add_remaining_self_loops``)."""
    eye = jnp.eye(a.shape[-1], dtype=a.dtype)
    return a + eye * jnp.where(jnp.diagonal(a, axis1=-2, axis2=-1) == 0, fill, 0)[..., None]


def _rsqrt_or_zero(d: jax.Array) -> jax.Array:
    return jnp.where(d > 0, jax.lax.rsqrt(jnp.where(d > 0, d, 1)), 0)


def gcn_matrix(a: jax.Array, self_loops: bool, fill: float) -> jax.Array:
    """PyG's ``gcn_norm``: ``D^-1/2 (A + I) D^-1/2``, ``D`` the weighted in-degrees."""
    a = _with_self_loops(a, fill) if self_loops else a
    d = _rsqrt_or_zero(a.sum(-1))
    return d[..., :, None] * a * d[..., None, :]


def mean_matrix(a: jax.Array, counts: jax.Array) -> jax.Array:
    """The mean over each node's incoming edges (weighted sums over their count; 0 without)."""
    return a / jnp.maximum(counts.sum(-1, keepdims=True), 1)


# kind -> fn(W, C, P^T, options) -> M (N, U, V): how a layer's messages reach each node
MATRICES: dict[str, Callable] = {
    "add": lambda w, c, pt, o: w if o.get("weighted") else c,
    "mean": lambda w, c, pt, o: mean_matrix(w if o.get("weighted") else c, c),
    "gcn": lambda w, c, pt, o: gcn_matrix(w if o.get("weighted") else c, o["self_loops"],
                                          o["fill"]),
    "gin": lambda w, c, pt, o: c + (1 + o["eps"]) * jnp.eye(c.shape[-1], dtype=c.dtype),
    "pool_add": lambda w, c, pt, o: jnp.swapaxes(pt, -1, -2),
    "pool_mean": lambda w, c, pt, o: mean_matrix(jnp.swapaxes(pt, -1, -2),
                                                 jnp.swapaxes(pt, -1, -2)),
}


def propagated(k: Kernel, m1: jax.Array, m2: jax.Array) -> Kernel:
    """The kernel of ``M h`` for nodes-first ``h`` of kernel ``k`` (every pair of nodes):
    ``M1 K M2^T``, exact."""
    shape = lambda s, m: (s[0], m.shape[1], s[2])
    return aggregated(k, m1, m2).replace(shape1=shape(k.shape1, m1), shape2=shape(k.shape2, m2))


def _summed(ks: Sequence[Kernel]) -> Kernel:
    """The kernel of a sum of branches with independent weights: the branches' kernels summed."""
    add = lambda name: None if getattr(ks[0], name) is None else sum(getattr(k, name) for k in ks)
    return ks[0].replace(nngp=add("nngp"), ntk=add("ntk"), cov1=add("cov1"), cov2=add("cov2"),
                         is_gaussian=all(k.is_gaussian for k in ks))


class Branch(tuple):
    """``(layer, names, propagated)``: a network of layers applied to ``M h`` (``propagated``) or
    to ``h``; ``names``: its params' pytree with the module's parameter names as leaves."""

    def __new__(cls, layer: Layer, names, propagated: bool):
        return super().__new__(cls, (layer, names, propagated))


def MessagePassing(kind: str, branches: Sequence[Branch], options: dict | None = None,
                   name: str = "MessagePassing", refusal: str | None = None) -> Layer:
    """``(h (1, V, C), packed (1, V, 3V + F)) -> (1, U, C')``: the sum of the branches (module
    doc), ``M`` of ``MATRICES[kind]``; ``options``: the matrix's (``weighted``, ``self_loops``,
    ``fill``, ``eps``); ``refusal``: why its kernel has no rule (forward only), or None.

    Example:
        >>> pool = MessagePassing("pool_mean", [])
        >>> pool.init_fn(None, ((1, 4, 8), (1, 4, 12 + 2)))[0]
        (1, 4, 8)
    """
    options = options or {}
    matrix = lambda packed: MATRICES[kind](*parts(packed)[:GRAPH_PARTS], options)
    tree = lambda names, flat: jax.tree.map(lambda n: flat[n], names)

    def init_fn(key, shapes):
        h, packed = shapes
        _check_packed(packed, name)
        if len(h) != 3 or h[1] != packed[1]:
            raise ShapeError(f"{name}: node features (1, {packed[1]}, C), got {tuple(h)}")
        shape, params = tuple(h), {"eps": jnp.full((1,), options.get("eps", 0.0))}
        for key, (layer, names, _) in zip(jax.random.split(key, max(len(branches), 1)), branches):
            shape, p = layer.init_fn(key, tuple(h))
            params.update(zip(jax.tree.leaves(names), jax.tree.leaves(p)))
        return shape, params if kind == "gin" else {k: v for k, v in params.items() if k != "eps"}

    def apply_fn(params, inputs):
        h, packed = inputs
        eps = {"eps": params["eps"][0]} if kind == "gin" else {}
        m = MATRICES[kind](*parts(packed)[:GRAPH_PARTS], {**options, **eps})
        mh = jnp.einsum("nuv,nvc->nuc", m, h, precision=HIGHEST)
        if not branches:
            return mh
        return sum(layer.apply_fn(tree(names, params), mh if prop else h)
                   for layer, names, prop in branches)

    def kernel_fn(ks, hyper=tuple(b[0].hyper for b in branches)):
        k, graphs = ks
        if refusal is not None:
            raise UnsupportedLayerError(refusal)
        if graphs.adjacency1 is None:
            raise UnsupportedLayerError(f"{name} needs the model's graphs as its second input")
        m1, m2 = matrix(graphs.adjacency1), matrix(graphs.adjacency2)
        mk = propagated(k, m1, m2)
        if not branches:
            return mk
        return _summed([with_hyper(layer, hp)(mk if prop else k)
                        for (layer, _, prop), hp in zip(branches, hyper)])

    return Layer(init_fn, apply_fn, kernel_fn, full_spatial=True,
                 hyper=tuple(b[0].hyper for b in branches), input_kernel=geometric_kernel)
