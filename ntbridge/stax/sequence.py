"""Sequences ``(N, T, d)``, features last: the heads that pool the tokens (their input kernel is
:func:`~ntbridge.stax.kernel.sequence_kernel`), and the swap between a 1-D signal's positions and
a sequence's tokens.

A kernel of sequences keeps every pair of tokens (``(N1, N2, T, T')``, :class:`Kernel` with
``tokens``): per-token layers (Linear, activations, LayerNorm of the last axis, Dropout) act on
it entry by entry, attention mixes tokens, and a head brings it back to vectors: the mean over
tokens (``x.mean(1)``: the mean over all token pairs) or one token (``x[:, i]``: its entry).
"""

from __future__ import annotations

import jax.numpy as jnp

from ..errors import ShapeError, UnsupportedLayerError
from .kernel import Kernel, spatial_diagonal
from .layers import Layer


def _tokens_only(k: Kernel, name: str) -> None:
    if not k.tokens:
        raise UnsupportedLayerError(f"{name} pools the tokens of sequences (N, T, d); its input "
                                    f"here has shape {k.shape1}.")


def _head(k: Kernel, fn) -> Kernel:
    """``k`` with ``fn(array, n_batch)`` turning token pairs into vectors ``(N, d)``."""
    cov1 = fn(k.cov1, 1)
    return k.replace(nngp=fn(k.nngp, 2), ntk=None if k.ntk is None else fn(k.ntk, 2), cov1=cov1,
                     cov2=cov1 if k.x1_is_x2 else fn(k.cov2, 1),
                     shape1=(k.shape1[0], k.shape1[-1]), shape2=(k.shape2[0], k.shape2[-1]),
                     tokens=False)


def TokenMean() -> Layer:
    """``x.mean(1)`` of sequences ``(N, T, d) -> (N, d)``: the kernel's mean over token pairs.

    Example:
        >>> TokenMean().init_fn(jax.random.key(0), (4, 7, 16))[0]
        (4, 16)
    """

    def kernel_fn(k: Kernel) -> Kernel:
        _tokens_only(k, "the mean over tokens")
        if k.diagonal_spatial:
            raise UnsupportedLayerError(
                "the mean over tokens needs the covariance of every pair of tokens, which kernels "
                "keep in models with attention or an nn.Embedding; one of per-token layers alone "
                "keeps each token's with the same token. Take one token (x[:, 0]) or flatten the "
                "tokens (x.flatten(1)) before the head, or use ntbridge.empirical_ntk.")
        return _head(k, lambda a, n: a.mean((n, n + 1)))

    return Layer(lambda key, shape: ((shape[0], shape[-1]), {}), lambda params, x: x.mean(1),
                 kernel_fn, full_spatial=True, affine=True)


def TokenSelect(index: int) -> Layer:
    """``x[:, index]`` of sequences ``(N, T, d) -> (N, d)``: one token's entry of the kernel.

    Example:
        >>> TokenSelect(0).init_fn(jax.random.key(0), (4, 7, 16))[0]
        (4, 16)
    """

    def init_fn(key, shape):
        if len(shape) != 3 or not -shape[1] <= index < shape[1]:
            raise ShapeError(f"token {index} of sequences {tuple(shape)} does not exist")
        return (shape[0], shape[-1]), {}

    def kernel_fn(k: Kernel) -> Kernel:
        _tokens_only(k, f"x[:, {index}]")
        pick = lambda a, n: spatial_diagonal(a, n, k.diagonal_spatial)[..., index]
        return _head(k, pick)

    return Layer(init_fn, lambda params, x: x[:, index], kernel_fn, affine=True)


def SwapLast(to_last: bool | None = None) -> Layer:
    """``x.transpose(1, 2)`` of ``(N, C, L) <-> (N, L, C)``: a channels-first 1-D signal's positions
    become a sequence's tokens, its channels the features (a ViT's patch embedding,
    ``conv(x).flatten(2).transpose(1, 2)``), or back (a convolution over the tokens,
    ``conv(h.transpose(1, 2)).transpose(1, 2)``). ``to_last``: the channels of ``(N, C, *S)``
    moved last, ``x.permute(0, 2, 3, 1)`` (True), or back, ``x.permute(0, 3, 1, 2)`` (False), for
    any number of position axes (ConvNeXt's channels-last LayerNorm and Linear layers). The
    kernel's arrays stay as they are (every pair of positions is every pair of tokens,
    ``(N1, N2, L, L')``); the channels change axis.

    Example:
        >>> SwapLast().init_fn(jax.random.key(0), (4, 16, 9))[0]
        (4, 9, 16)
        >>> SwapLast(to_last=True).init_fn(jax.random.key(0), (4, 16, 5, 6))[0]
        (4, 5, 6, 16)
    """
    source, target = {None: (1, 2), True: (1, -1), False: (-1, 1)}[to_last]

    def move(shape) -> tuple[int, ...]:
        if len(shape) != 3 if to_last is None else len(shape) < 3:
            raise UnsupportedLayerError(
                f"transpose(1, 2) of outputs {tuple(shape)}: only (N, C, L) <-> (N, L, C), "
                f"positions <-> tokens, has a kernel rule; flatten the positions first "
                f"(x.flatten(2)), or permute the channels of (N, C, H, W) last and back.")
        axes = list(range(len(shape)))
        axes.insert(target % len(shape), axes.pop(source % len(shape)))
        return tuple(shape[a] for a in axes)

    def init_fn(key, shape):
        return move(tuple(shape)), {}

    def kernel_fn(k: Kernel) -> Kernel:
        if to_last is not None and k.tokens == to_last:
            raise UnsupportedLayerError(f"a permutation moving the channels "
                                        f"{'last' if to_last else 'first'} of outputs whose "
                                        f"channels are already there, {k.shape1}.")
        return k.replace(shape1=move(k.shape1), shape2=move(k.shape2), tokens=not k.tokens)

    return Layer(init_fn, lambda params, x: jnp.moveaxis(x, source, target), kernel_fn,
                 affine=True)
