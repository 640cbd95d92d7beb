"""Token embeddings: torch's ``nn.Embedding`` of integer ids and learned positional embeddings.

``nn.Embedding(V, d)`` is a linear map of one-hot ids, ``W[:, id]``: with entries of variance
``W_std**2`` (torch's ``N(0, 1)`` init: ``W_std = 1``) its kernel is ``W_std**2 [id == id']`` for
every pair of tokens, and 0 where either is ``padding_idx`` (a zero row that is not trained). A
learned positional embedding ``x + P`` (``P`` of shape ``(T, d)`` with entries of variance
``std**2``) adds ``std**2 [t == t']``; its NTK adds ``[t == t']`` (``std**2`` in the NTK
parameterization), as a bias of each token would. A learned token ``c`` (a ViT's class token,
``(1, 1, d)``) is the same vector in every example: its kernel is ``std**2`` for every pair of
examples (NTK ``1``, or ``std**2``), and it is uncorrelated with the other tokens it joins.
"""

from __future__ import annotations

import jax.numpy as jnp

from ..errors import ShapeError, UnsupportedLayerError
from .kernel import Kernel, jax_kernel_dtype
from .layers import Layer, _sample, dense_rule


def ids_kernel(num_embeddings: int, padding_idx: int | None):
    """``input_kernel`` of token ids ``(N, T)``: the kernel of their one-hot vectors (``(N, T, V)``
    features, padding ids zero), ``[id == id'] / V`` for every pair of tokens."""

    def make(x1, x2, *, compute_ntk: bool, diagonal_spatial: bool) -> Kernel:
        if x1.ndim != 2:
            raise ShapeError(f"token ids are (N, T), got {tuple(x1.shape)}")
        dtype = jax_kernel_dtype(x1.dtype)
        valid = lambda x: jnp.ones(x.shape, bool) if padding_idx is None else x != padding_idx

        def same(a, b, pairs):
            a, b = (a[:, None], b[None]) if pairs else (a, b)
            if diagonal_spatial:
                eq = (a == b) & valid(a) & valid(b)
            else:
                eq = ((a[..., :, None] == b[..., None, :]) & valid(a)[..., :, None]
                      & valid(b)[..., None, :])
            return eq.astype(dtype) / num_embeddings

        x1_is_x2, y = x2 is None, x1 if x2 is None else x2
        nngp, cov1 = same(x1, y, True), same(x1, x1, False)
        return Kernel(nngp=nngp, ntk=jnp.zeros_like(nngp) if compute_ntk else None, cov1=cov1,
                      cov2=cov1 if x1_is_x2 else same(y, y, False),
                      shape1=(*x1.shape, num_embeddings), shape2=(*y.shape, num_embeddings),
                      x1_is_x2=x1_is_x2, is_gaussian=False, diagonal_spatial=diagonal_spatial,
                      tokens=True, ids1=x1, ids2=y)

    return make


def Embedding(num_embeddings: int, embedding_dim: int, *, W_std: float,
              padding_idx: int | None = None, parameterization: str = "standard") -> Layer:
    """torch's ``nn.Embedding(num_embeddings, embedding_dim, padding_idx)``: ids ``(N, T)`` ->
    ``(N, T, embedding_dim)``; params ``{"weight": (num_embeddings, embedding_dim)}``, entries of
    standard deviation ``W_std`` (module doc).

    Example:
        >>> layer = Embedding(100, 16, W_std=1.0)
        >>> layer.init_fn(jax.random.key(0), (4, 7))[0]
        (4, 7, 16)
    """

    def init_fn(key, input_shape):
        if len(input_shape) != 2:
            raise ShapeError(f"takes token ids (N, T), got inputs {tuple(input_shape)}")
        w = _sample(key, (num_embeddings, embedding_dim), W_std, "normal")
        if padding_idx is not None:
            w = w.at[padding_idx].set(0)
        return (*input_shape, embedding_dim), {"weight": w}

    def kernel_fn(k: Kernel) -> Kernel:
        if not k.tokens or k.shape1[-1] != num_embeddings:
            raise UnsupportedLayerError("nn.Embedding's kernel rule needs the model's token ids "
                                        "as its input (it must be the first layer)")
        return dense_rule(k, num_embeddings, embedding_dim, W_std * num_embeddings ** 0.5, None,
                          parameterization).replace(ids1=None, ids2=None)

    # a sequence model keeps every pair of tokens: its heads (x.mean(1)) and attention need them
    return Layer(init_fn, lambda params, x: params["weight"][x], kernel_fn, full_spatial=True,
                 input_kernel=ids_kernel(num_embeddings, padding_idx))


def Positions(length: int, dim: int, *, std: float, batched: bool = False,
              parameterization: str = "standard", name: str = "weight",
              prefix: bool = False) -> Layer:
    """``x + P`` for a learned positional embedding ``P`` of shape ``(length, dim)`` (``batched``:
    ``(1, length, dim)``) on sequences ``(N, length, dim)``; params ``{name: P}``. With
    ``prefix``, sequences ``(N, T, dim)`` of any ``T <= length`` take ``P``'s first ``T`` rows
    (``x + P[:T]``). The kernel adds ``std**2 [t == t']`` (the NTK, its parameters' part).

    Example:
        >>> Positions(7, 16, std=0.02).init_fn(jax.random.key(0), (4, 7, 16))[0]
        (4, 7, 16)
    """
    shape = (1, length, dim) if batched else (length, dim)

    def init_fn(key, input_shape):
        t = input_shape[1] if len(input_shape) == 3 else None
        if t is None or input_shape[2] != dim or (t > length if prefix else t != length):
            raise ShapeError(f"adds positions of shape {shape} to sequences (N, "
                             f"{'T <= ' if prefix else ''}{length}, {dim}), got "
                             f"{tuple(input_shape)}")
        return tuple(input_shape), {name: _sample(key, shape, std, "normal")}

    def apply_fn(params, x):
        return x + params[name][..., :x.shape[1], :]

    def kernel_fn(k: Kernel) -> Kernel:
        if not k.tokens:
            raise UnsupportedLayerError(f"positional embeddings add to sequences (N, {length}, "
                                        f"{dim}); got a kernel of inputs {k.shape1}")
        tokens = k.shape1[1]
        delta = jnp.ones(tokens) if k.diagonal_spatial else jnp.eye(tokens)
        own = std ** 2 * delta if parameterization == "ntk" else delta
        return k.replace(nngp=k.nngp + std ** 2 * delta, cov1=k.cov1 + std ** 2 * delta,
                         cov2=k.cov2 + std ** 2 * delta,
                         ntk=None if k.ntk is None else k.ntk + own)

    return Layer(init_fn, apply_fn, kernel_fn)


def Row(rows: int, dim: int, *, row: int, std: float, parameterization: str = "standard",
        name: str = "weight") -> Layer:
    """``x + P[row]`` for a table ``P`` of shape ``(rows, dim)``: one learned vector added to every
    token of every example (BERT's token type 0). Its entries, of standard deviation ``std``, are
    shared by all tokens, so the kernel adds ``std**2`` to every pair (the NTK, its parameters'
    part: 1, or ``std**2`` in NTK parameterization).

    Example:
        >>> Row(2, 16, row=0, std=0.02).init_fn(jax.random.key(0), (4, 7, 16))[0]
        (4, 7, 16)
    """

    def init_fn(key, input_shape):
        if input_shape[-1] != dim:
            raise ShapeError(f"adds a vector of {dim} features, got inputs {tuple(input_shape)}")
        return tuple(input_shape), {name: _sample(key, (rows, dim), std, "normal")}

    def kernel_fn(k: Kernel) -> Kernel:
        own = std ** 2 if parameterization == "ntk" else 1.0
        return k.replace(nngp=k.nngp + std ** 2, cov1=k.cov1 + std ** 2, cov2=k.cov2 + std ** 2,
                         ntk=None if k.ntk is None else k.ntk + own)

    return Layer(init_fn, lambda params, x: x + params[name][row], kernel_fn)


def Token(dim: int, *, std: float, parameterization: str = "standard",
          name: str = "weight") -> Layer:
    """A learned token ``P`` of shape ``(1, 1, dim)`` for each example of any input ``x``:
    ``P.expand(N, -1, -1)``, ``(N, ...) -> (N, 1, dim)``, entries of standard deviation ``std``
    (module doc); ``torch.cat([token, h], dim=1)`` puts it before the tokens of ``h``.

    Example:
        >>> Token(16, std=0.02).init_fn(jax.random.key(0), (4, 7, 16))[0]
        (4, 1, 16)
    """
    one = lambda shape: (shape[0], 1, dim)

    def kernel_fn(k: Kernel) -> Kernel:
        tokens = (1,) if k.diagonal_spatial else (1, 1)
        full = lambda value, *batch: jnp.full((*batch, *tokens), value, k.nngp.dtype)
        n1, n2 = k.shape1[0], k.shape2[0]
        own = std ** 2 if parameterization == "ntk" else 1.0
        return k.replace(nngp=full(std ** 2, n1, n2), cov1=full(std ** 2, n1),
                         cov2=full(std ** 2, n2), ntk=None if k.ntk is None else full(own, n1, n2),
                         shape1=one(k.shape1), shape2=one(k.shape2), is_gaussian=True,
                         tokens=True, ids1=None, ids2=None)

    return Layer(lambda key, shape: (one(shape), {name: _sample(key, (1, 1, dim), std, "normal")}),
                 lambda params, x: jnp.broadcast_to(params[name], one(x.shape)), kernel_fn)
