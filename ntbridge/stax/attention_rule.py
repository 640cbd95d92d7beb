"""The kernel rule of attention as torch's ``nn.MultiheadAttention`` computes it (the layers:
:mod:`.attention`), and of Neural Tangents' variant.

Inputs are sequences ``(N, T, E)`` (features last, :class:`~ntbridge.stax.kernel.Kernel` with
``tokens``). For each head, ``q = x Wq^T + bq``, ``k``, ``v`` likewise, logits ``q k^T / sqrt(d)``
(``d = E / heads``) plus an optional mask, ``A = softmax`` over keys, and the heads' ``A v``
concatenated go through ``out_proj``.

The limit: infinitely many channels per head and infinitely many heads.
Per channel, queries, keys and values are Gaussian with covariances ``Kq = sq**2 K + bq**2`` (keys,
values alike), independent of each other; the logits of a pair of examples are jointly Gaussian
with ``Cov(G_n[t, s], G_m[t', s']) = Kq[nt, mt'] Kk[ns, ms']`` and independent of the values
(Hron et al. 2020, "Infinite attention", sec. 3), so the output NNGP is
``so**2 E[A_n Kv A_m^T] + bo**2``: the values' covariance weighted by the expectation of products
of softmaxes (no closed form: :mod:`.softmax_moments` computes it, in independent replicates
whose spread through the network estimates the kernel's error, ``covariances.evaluate_error``).
The NTK adds every parameter's part: values and ``out_proj`` as affine layers
(``E[A_n Tv A_m^T]``), queries and keys through the softmax's Jacobian ``J = diag(a) - a a^T``:
``E[sum (J_n Kv J_m) * TG]`` with the logits' NTK ``TG = Tq Kk + Kq Tk`` (product rule).

Which limit: a head's channels share its logits, so with a fixed number of heads the layer's
output is a mixture of Gaussians. Its own NNGP (second moment) is exact at any head count, but a
nonlinearity after it sees a Gaussian only when the heads grow too; rules after attention assume
that (grow heads with width, e.g. ``heads ~ sqrt(width)``, to approach this kernel).

``linear_scaling=True`` is Neural Tangents' ``GlobalSelfAttention`` variant: keys tied to the
queries (``k = q``) and logits ``q q^T / d``, which converge to the constant ``sq**2 K_nn + bq**2``
(NT's ``W_query_std * W_key_std`` is ``sq**2``): closed form; the queries and keys then carry no
NTK of their own.

Cross-attention (a decoder's ``attn(x, memory, memory)``) is the same rule with the queries'
covariances from ``x``'s kernel and the keys' and values' from the memory's: the logits'
covariance is still ``Kq[nt, mt'] Kk[ns, ms']``, and the two sequences' covariance with each
other is never needed, as queries and keys have independent weights.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import UnsupportedLayerError
from .kernel import Kernel
from .layers import dense_rule
from .rotary import correlation, rotary_moments
from .softmax_moments import Blocks, Rule, masked_softmax, normal_points, pair_moments, psd_factor


class Stds(NamedTuple):
    """Standard deviations of the projections: weights ``W_std`` (variance ``W_std**2 / E``) and
    biases ``b_std`` (None: no bias), for queries, keys, values and the output."""

    W_q: float
    W_k: float
    W_v: float
    W_o: float
    b_q: float | None
    b_k: float | None
    b_v: float | None
    b_o: float | None


def _joint(c_n, c_nm, c_m):
    """The ``(2T, 2T)`` covariance of both examples' tokens from its blocks."""
    return jnp.concatenate([jnp.concatenate([c_n, c_nm], -1),
                            jnp.concatenate([jnp.swapaxes(c_nm, -1, -2), c_m], -1)], -2)


@functools.partial(jax.jit, static_argnames="rule")  # traced once per shapes, not per call
def _softmax_moments(kq, kk, kv, ntks, allowed, rule: Rule, replicate, corr=None):
    """``E[A_n Kv A_m^T]`` (and the NTK's expectation) for the pairs of ``kq`` etc.: tuples
    ``(cov_n, cov_nm, cov_m)`` of arrays broadcasting to ``(..., T, T)`` (queries') and to ``kv``
    ``(..., S, S)`` (keys'); ``ntks``: ``(tq, tk, tv)`` cross NTKs or None; ``allowed``:
    ``(allowed_n, allowed_m)``, boolean arrays broadcasting to ``(..., T, S)`` (None: every
    key); ``replicate``: the rule's replicate to use alone (None: all); ``corr``: rotary
    embeddings' correlation of the logits (:mod:`.rotary`; None: none). Returns ``(nngp, ntk)``
    arrays ``(..., T, T)`` (NTK None without ``ntks``)."""
    t, s, batch = kq[1].shape[-1], kv.shape[-1], kv.shape[:-2]
    z = jnp.asarray(normal_points(rule, t, s), kv.dtype)
    z = z if replicate is None else jnp.take(z, replicate, 0)[None]
    spread = lambda b, n: jnp.broadcast_to(b, (*batch, n, n))
    masks = tuple(jnp.ones((*batch, t, s), bool) if a is None else
                  jnp.broadcast_to(a, (*batch, t, s)) for a in allowed)
    if corr is not None:
        blocks = lambda c: tuple(spread(b, t) for b in c)
        return rotary_moments(blocks(kq), blocks(kk), kv, ntks, masks, z, rule.chunk, corr)
    full = lambda blocks, n: _joint(*(spread(b, n) for b in blocks))
    lq, lk = psd_factor(full(kq, t)), psd_factor(full(kk, s))
    tq, tk, tv = ntks if ntks is not None else (None, None, None)
    blocks = Blocks(lq[..., :t, :], lq[..., t:, :], lk[..., :s, :], lk[..., s:, :], kv,
                    spread(kq[1], t), spread(kk[1], s), tq, tk, tv)
    flat = jax.tree.map(lambda a: a.reshape(-1, *a.shape[-2:]), (blocks, masks))
    out = jax.vmap(lambda b, m: pair_moments(b, z, *m, rule.chunk))(*flat)
    return jax.tree.map(lambda a: a.reshape(*batch, t, t), out)


def _pair_moments(k: Kernel, kq, kk, kv, ntks, allowed, rule: Rule, corr):
    """:func:`_softmax_moments` of the pairs ``(n, m)``; with x2 = x1, of the pairs ``n <= m``
    only, the others being their transposes (half the work, and exactly symmetric)."""
    sides = lambda c: (c[1][:, None], c[0], c[2][None])
    masks = (_expand(allowed[0], 1), _expand(allowed[1], 0))
    if not k.x1_is_x2:
        return _softmax_moments(sides(kq), sides(kk), kv[0], ntks, masks, rule, k.replicate, corr)
    n = kv[0].shape[0]
    i, j = np.triu_indices(n)
    pick = lambda a: None if a is None else jnp.broadcast_to(a, (n, n, *a.shape[-2:]))[i, j]
    picks = lambda arrays: None if arrays is None else tuple(pick(a) for a in arrays)
    upper = _softmax_moments(picks(sides(kq)), picks(sides(kk)), pick(kv[0]), picks(ntks),
                             picks(masks), rule, k.replicate, corr)

    def fill(u):  # (pairs, T, T) -> (N, N, T, T)
        full = jnp.zeros((n, n, *u.shape[1:]), u.dtype)
        return full.at[j, i].set(jnp.swapaxes(u, -1, -2)).at[i, j].set(u)

    return jax.tree.map(fill, upper)


def _expectations(k: Kernel, kq, kk, kv, ntks, allowed, rule: Rule, corr):
    """``E[A Kv A'^T]`` for ``(nngp, cov1, cov2)`` and the NTK's expectation for ``nngp`` (None
    without ``ntks``); ``allowed``: each side's keys (:func:`_allowed`); ``corr``: rotary
    embeddings' (None: none)."""
    nngp, ntk = _pair_moments(k, kq, kk, kv, ntks, allowed, rule, corr)
    own = lambda j: _softmax_moments((kq[j],) * 3, (kk[j],) * 3, kv[j], None,
                                     (allowed[j - 1],) * 2, rule, k.replicate, corr)[0]
    cov1 = own(1)
    return [nngp, cov1, cov1 if k.x1_is_x2 else own(2)], ntk


def _limit_weights(c, s: Stds, allowed):
    """``linear_scaling``: the deterministic attention ``softmax(sq**2 c + bq**2)`` of each
    example (the keys are the queries)."""
    return masked_softmax(s.W_q ** 2 * c + (0.0 if s.b_q is None else s.b_q ** 2), allowed)


def _linear_limit(k: Kernel, s: Stds, kv, tv, allowed):
    """``linear_scaling``: ``A_n Kv A_m^T`` with deterministic attention weights, and the NTK's."""
    a1, a2 = (_limit_weights(c, s, a) for c, a in zip((k.cov1, k.cov2), allowed))
    own = lambda a, c: jnp.einsum("nts,nsr,nur->ntu", a, c, a, precision=_EXACT)
    z = [sandwich(a1, kv[0], a2), own(a1, kv[1]), own(a2, kv[2])]
    return z, None if tv is None else sandwich(a1, tv, a2)


_EXACT = jax.lax.Precision.HIGHEST


def sandwich(a1, c, a2):
    """``a1[n] @ c[n, m] @ a2[m]^T`` for every pair of examples: ``a1`` ``(N1, T, T)``, ``c``
    ``(N1, N2, T, T)``, ``a2`` ``(N2, T, T)``. Two batched matrix products, over ``n`` then over
    ``m``: one form for every T, faster than XLA's fusion of ``2 T`` broadcast products at most
    T (the ``sandwich`` rows of ``benchmarks/attention.py``; figures in ``benchmarks/README.md``)."""
    left = jnp.einsum("nts,nmsr->nmtr", a1, c, precision=_EXACT)
    return jnp.einsum("nmtr,mur->nmtu", left, a2, precision=_EXACT)


def _expand(allowed, axis: int):
    """Per-example ``allowed`` ``(N, T, T)`` as one side of the pairs (None stays None)."""
    return allowed if allowed is None or allowed.ndim == 2 else jnp.expand_dims(allowed, axis)


def _allowed(mask, padding_id, ids: Kernel | None):
    """The keys each query may see, ``(allowed1, allowed2)``: the ``(T, T)`` mask's finite entries,
    and per example ``(N, T, T)`` without the keys whose id is ``padding_id``; None: all."""
    fixed = None if mask is None else jnp.isfinite(mask)
    if padding_id is None:
        return fixed, fixed
    if ids is None or ids.ids1 is None:
        raise UnsupportedLayerError("key_padding_mask = (ids == padding id) needs the model's "
                                    "token ids as its input (N, T)")
    keys = lambda x: jnp.broadcast_to((x != padding_id)[:, None, :], (*x.shape, x.shape[-1]))
    return tuple(keys(x) if fixed is None else keys(x) & fixed for x in (ids.ids1, ids.ids2))


def attention_rule(embed_dim: int, stds: Stds, parameterization: str, mask: jax.Array | None,
                   linear_scaling: bool, rule: Rule, padding_id: int | None = None,
                   frequencies: tuple[float, ...] | None = None, logit_scale: float = 1.0,
                   cross: bool = False):
    """The kernel rule of :func:`SelfAttention` (see the module doc); ``frequencies``: those of
    rotary position embeddings of the queries and keys (:mod:`.rotary`; None: none);
    ``logit_scale``: the logits' factor over ``1/sqrt(d_head)``, which scales the queries' kernels
    (NNGP and NTK) by its square; ``cross``: :func:`CrossAttention`'s, the kernels of the
    queries' sequences and of the memory's as a pair."""
    s = stds

    def kernel_fn(k) -> Kernel:
        k, other = k if cross or padding_id is not None else (k, None)
        memory, ids = (other, None) if cross else (k, other)
        for seq in (k, memory):
            if not seq.tokens or seq.diagonal_spatial:
                raise UnsupportedLayerError(
                    f"attention needs sequence inputs (N, T, {embed_dim}) and the covariance of "
                    f"every pair of tokens; got a kernel of inputs {seq.shape1}.")
        allowed = _allowed(mask, padding_id, ids)
        # the projections, per channel: the kernels (nngp, cov1, cov2) and the NTK of each
        affine = lambda k, W, b: dense_rule(k, embed_dim, embed_dim, W, b, parameterization)
        arrays = lambda p: ((p.nngp, p.cov1, p.cov2), p.ntk)
        (kq, tq), (kv, tv) = arrays(affine(k, s.W_q, s.b_q)), arrays(affine(memory, s.W_v, s.b_v))
        if logit_scale != 1.0:  # the queries as the logits see them
            kq = tuple(logit_scale ** 2 * c for c in kq)
            tq = None if tq is None else logit_scale ** 2 * tq
        if linear_scaling:
            z, tz = _linear_limit(k, s, kv, tv, allowed)
        else:
            kk, tk = arrays(affine(memory, s.W_k, s.b_k))
            ntks = None if k.ntk is None else (tq, tk, tv)
            corr = None if frequencies is None else jnp.asarray(
                correlation(np.asarray(frequencies), k.shape1[-2]), k.nngp.dtype)
            z, tz = _expectations(k, kq, kk, kv, ntks, allowed, rule, corr)
        mixed = k.replace(nngp=z[0], cov1=z[1], cov2=z[2], ntk=tz)  # the heads' A v
        return affine(mixed, s.W_o, s.b_o)

    return kernel_fn
