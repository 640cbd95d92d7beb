"""A model's two sequences, ``forward(x, memory)`` (a decoder's target and the encoder's memory),
read from one packed array.

The kernels' programs take one input array, so the pair ``x (N, T, E)``, ``memory (N, S, F)`` is
packed as ``(N, T + S, W + T)`` with ``W = max(E, F)``: ``x`` in the first ``T`` rows and ``E``
columns, ``memory`` in the next ``S`` rows and first ``F`` columns, zeros elsewhere (the ``T``
last columns' count says where ``x`` ends). The input kernel is the sequence kernel of the ``T +
S`` tokens' ``W`` entries; the pair's own layers (:func:`SequencePair`) take each sequence's
block of it, rescaled to its own features (the blocks between them
are never needed: every layer after reads one sequence, and cross-attention's queries and keys
have independent weights, :func:`~.attention.CrossAttention`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..errors import ShapeError
from .kernel import Kernel, sequence_kernel
from .layers import Layer


def _lengths(shape: tuple[int, ...], features: tuple[int, int]) -> tuple[int, int]:
    """``(T, S)`` of a pair packed as ``shape`` (module doc)."""
    e, f = features
    t = shape[-1] - max(features) if len(shape) == 3 else -1
    if not 0 < t < shape[1]:
        raise ShapeError(f"a pair of sequences (x (N, T, {e}), memory (N, S, {f})) is packed as "
                         f"(N, T + S, {max(features)} + T), got {tuple(shape)}")
    return t, shape[1] - t


def SequencePair(features: tuple[int, int], index: int) -> Layer:
    """Sequence ``index`` of the packed pair (module doc) of sequences of ``features = (E, F)``:
    0, ``x``, ``(N, T + S, W + T) -> (N, T, E)``, or 1, ``memory``, ``-> (N, S, F)``; its kernel,
    the block of the pair's.

    Example:
        >>> SequencePair((4, 6), 1).init_fn(None, (2, 3 + 5, 6 + 3))[0]
        (2, 5, 6)
    """
    width, own = max(features), features[index]

    def rows(n: int, t: int) -> slice:
        return slice(None, t) if index == 0 else slice(t, n)

    def init_fn(key, shape):
        t, s = _lengths(shape, features)
        return (shape[0], t if index == 0 else s, own), {}

    def apply_fn(params, x):
        t, _ = _lengths(x.shape, features)
        return x[:, rows(x.shape[1], t), :own]

    def input_kernel(x1: jax.Array, x2: jax.Array | None, *, compute_ntk: bool,
                     diagonal_spatial: bool) -> Kernel:
        tokens = lambda x: None if x is None else x[..., :width]
        k = sequence_kernel(tokens(x1), tokens(x2), compute_ntk=compute_ntk,
                            diagonal_spatial=diagonal_spatial)
        return k.replace(shape1=tuple(x1.shape), shape2=tuple((x1 if x2 is None else x2).shape))

    def kernel_fn(k: Kernel) -> Kernel:
        t, _ = _lengths(k.shape1, features)
        r = rows(k.shape1[1], t)
        block = lambda a: None if a is None else a[..., r, r] * (width / own)
        return k.replace(nngp=block(k.nngp), ntk=block(k.ntk), cov1=block(k.cov1),
                         cov2=block(k.cov2), shape1=init_fn(None, k.shape1)[0],
                         shape2=init_fn(None, k.shape2)[0])

    return Layer(init_fn, apply_fn, kernel_fn, full_spatial=True, input_kernel=input_kernel)


def pack_pair(x: jax.Array, memory: jax.Array) -> jax.Array:
    """The pair packed as :func:`SequencePair` reads it (module doc), for JAX inputs.

    Example:
        >>> pack_pair(jnp.ones((2, 3, 4)), jnp.ones((2, 5, 6))).shape
        (2, 8, 9)
    """
    t, width = x.shape[1], max(x.shape[2], memory.shape[2])
    widen = lambda a, extra: jnp.pad(a, ((0, 0), (0, 0), (0, width - a.shape[2] + extra)))
    return jnp.concatenate([widen(x, t), widen(memory, t)], 1)
