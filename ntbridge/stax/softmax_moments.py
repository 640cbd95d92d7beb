"""Moments of softmaxes of Gaussian attention logits, by randomised quasi-Monte-Carlo.

In the infinite-width limit of torch's attention (logits ``q . k / sqrt(d_head)``, independent
query and key weights), the logits of two examples ``n``, ``m`` are jointly Gaussian with
``Cov(G_n[t, s], G_m[t', s']) = Kq[nt, mt'] Kk[ns, ms']``: the covariance of the queries of both
examples' ``2T`` tokens, ``Kq``, Kronecker the keys' (``2S`` of them: ``S = T`` in
self-attention, the memory's length in cross-attention), ``Kk`` (Hron et al. 2020, sec. 3). With
factors ``Lq Lq^T = Kq`` (``2T x 2T``) and ``Lk Lk^T = Kk`` (``2S x 2S``) and a standard normal
``Z`` ``(2T, 2S)``, ``Lq Z Lk^T`` has exactly that covariance: one ``Z`` gives every logit of the
pair, for all query tokens at once. There is no closed form for the expectations of softmaxes of
them, so they are computed numerically:

* the rule: ``points`` scrambled Sobol points in ``4 T S`` dimensions (Owen scrambling, fixed
  seeds: deterministic), mapped to ``Z`` by the normal quantile, in ``replicates`` independent
  scramblings. The estimate is their mean. A network's kernel computed once per replicate (each
  alone, ``Kernel.replicate``) gives independent, unbiased estimates whose standard error is an
  honest error bar of the kernel (``covariances.evaluate_error``); it shrinks at least as
  ``points**-1/2`` (Monte-Carlo's order) and, for integrands as smooth as these, faster;
* beyond 21201 dimensions (``T = S > 72``) Sobol points do not exist and plain Gaussian samples
  are used (the same error bar, Monte-Carlo's order).

Masked positions (``allowed`` False) get probability 0 exactly.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

SOBOL_DIMENSIONS = 21201  # the largest dimension of the Sobol direction numbers scipy ships
HIGHEST = jax.lax.Precision.HIGHEST


class Rule(NamedTuple):
    """The numerical expectation's rule: ``points`` per replicate (a power of 2), ``replicates``
    independent scramblings, the base ``seed``, and ``chunk`` points evaluated at once. The time
    is proportional to the points; the default's error on a 2-layer, 16-token classifier and the
    other rules' are in ``benchmarks/README.md`` (``benchmarks/attention.py --rows rule``)."""

    points: int = 32
    replicates: int = 8
    seed: int = 0
    chunk: int = 16


@functools.lru_cache(maxsize=16)
def normal_points(rule: Rule, tokens: int, keys: int | None = None) -> np.ndarray:
    """``(replicates, points, 2T, 2S)`` standard normal points of the rule (float64, cached) for
    ``T = tokens`` queries and ``S = keys`` keys (None: ``T``)."""
    keys = tokens if keys is None else keys
    dim = 4 * tokens * keys
    shape = (rule.replicates, rule.points, 2 * tokens, 2 * keys)
    if dim > SOBOL_DIMENSIONS:
        return np.random.default_rng(rule.seed).standard_normal(shape)
    from scipy.special import ndtri  # optional at import time: only attention needs it
    from scipy.stats import qmc

    out = []
    for r in range(rule.replicates):
        u = qmc.Sobol(dim, scramble=True, seed=rule.seed + r).random(rule.points)
        out.append(ndtri(np.clip(u, 1e-12, 1 - 1e-12)))
    return np.stack(out).reshape(shape)


def psd_factor(k: jax.Array, floor: float = 0.0) -> jax.Array:
    """Lower-triangular ``L`` with ``L L^T ~ k`` for symmetric ``k`` ``(..., M, M)``, PSD up to
    the estimates' errors: Cholesky's columns one at a time, a column whose pivot is not positive
    left out (as a clipped negative eigenvalue would be). A diagonal ramp of ``1e-10`` (float64;
    ``1e-5`` in float32) of the largest diagonal entry makes singular ``k`` (an example paired
    with itself) definite, which keeps the pivots positive and the factor's gradient finite; the
    logits' variance moves by that fraction, far below the rule's error.

    Written in XLA's own operations, not LAPACK's: XLA's CPU runtime runs independent LAPACK
    calls side by side, and each batched one waits on its worker thread for work it queued on the
    same threads, so two of them can wait on each other forever.

    ``floor``: pivots up to ``floor`` times the largest diagonal entry count as not positive
    (above the ramp, e.g. ``1e-8`` in float64: positions that repeat others, whose pivots are the
    ramp plus rounding, then repeat them exactly and do not amplify that rounding)."""
    m = k.shape[-1]
    scale = jnp.max(jnp.diagonal(k, axis1=-2, axis2=-1), -1)[..., None, None]
    jitter = (1e-10 if k.dtype == jnp.float64 else 1e-5) * jnp.linspace(1, 2, m, dtype=k.dtype)
    rows = jnp.arange(m)

    def column(rest, j):  # rest: what the columns before j leave of k
        pivot = rest[..., j, j, None]
        ok = pivot > floor * scale[..., 0]
        col = jnp.where(ok & (rows >= j), rest[..., j] / jnp.sqrt(jnp.where(ok, pivot, 1)), 0)
        return rest - col[..., :, None] * col[..., None, :], col

    _, cols = jax.lax.scan(column, k + scale * jnp.diag(jitter), rows)
    return jnp.moveaxis(cols, 0, -1)


def masked_softmax(logits: jax.Array, allowed: jax.Array | None) -> jax.Array:
    """Softmax over the last axis; entries not ``allowed`` get probability 0 exactly."""
    if allowed is None:
        return jax.nn.softmax(logits, axis=-1)
    shifted = logits - jnp.max(jnp.where(allowed, logits, -jnp.inf), -1, keepdims=True)
    e = jnp.where(allowed, jnp.exp(jnp.where(allowed, shifted, 0)), 0)
    return e / e.sum(-1, keepdims=True)


def _dot(spec: str, *operands):
    return jnp.einsum(spec, *operands, precision=HIGHEST)


class Blocks(NamedTuple):
    """One pair's blocks (``n`` the x1 example, ``m`` the x2 one; ``T`` queries, ``S`` keys): the
    factors' rows ``lq_n, lq_m`` ``(T, 2T)`` and ``lk_n, lk_m`` ``(S, 2S)``, the cross
    covariances of values ``kv`` ``(S, S)``, and, for the NTK, the cross kernels ``tq, tk, tv``
    (NTKs of queries ``(T, T)``, keys and values ``(S, S)``) and ``kq``, ``kk``."""

    lq_n: jax.Array
    lq_m: jax.Array
    lk_n: jax.Array
    lk_m: jax.Array
    kv: jax.Array
    kq: jax.Array
    kk: jax.Array
    tq: jax.Array | None
    tk: jax.Array | None
    tv: jax.Array | None


def _chunk_terms(b: Blocks, z: jax.Array, allowed_n, allowed_m):
    """For points ``z`` ``(P, 2T, 2S)``: the sums over them of the value-covariance term ``A_n Kv
    A_m^T`` and, with the NTK, of its term ``A_n Tv A_m^T + Tq * D(Kk) + Kq * D(Tk)``, where
    ``D(M)[t, t'] = sum_{u,u'} M[u,u'] (J_a Kv J_c)[u,u']`` with ``J_a = diag(a_t) - a_t a_t^T``
    the softmax's Jacobian at row ``t`` of ``a = A_n`` (``c = A_m`` at ``t'``). The entries of
    ``J_a Kv J_c`` are ``a_tu c_t'u' (Kv[u,u'] - (Kv c_t')_u - (a_t Kv)_u' + a_t Kv c_t')``, so

        D(M) = (a (M * Kv) - (a M) * (a Kv)) c^T - a ((Kv c^T) * (M c^T)) + (a Kv c^T) * (a M c^T).

    The attention weights are laid out ``(T, P, S)`` (query, point, key): the first two terms'
    sums over the points are then long matrix products (the contraction runs over points and
    keys, not ``P`` small products); only the last is a product per point. ``A_n``'s logits see
    only a point's first ``T`` rows and ``S`` columns (the factors are lower-triangular)."""
    t, s = b.kq.shape[-1], b.kv.shape[-1]
    rows = jnp.swapaxes(z, 0, 1)  # [u, p, v]: the factors' products are plain matrix products
    logits = lambda lq, zr, lk: _dot("tsv,wv->tsw", _dot("tu,usv->tsv", lq, zr), lk)
    g_n = logits(b.lq_n[:, :t], rows[:t, :, :s], b.lk_n[:, :s])
    g_m = logits(b.lq_m, rows, b.lk_m)
    mask = lambda allowed: None if allowed is None else allowed[:, None]
    a, c = masked_softmax(g_n, mask(allowed_n)), masked_softmax(g_m, mask(allowed_m))
    akv = _dot("tsu,uv->tsv", a, b.kv)
    nngp = _dot("tsv,rsv->tr", akv, c)
    if b.tv is None:
        return nngp, None
    kvc = _dot("rsv,uv->rsu", c, b.kv)  # [t', s, u]
    akvc = _dot("tsu,rsu->str", a, kvc)

    def d(m):
        mc = _dot("rsv,uv->rsu", c, m)
        left = _dot("tsu,uv->tsv", a, m * b.kv) - _dot("tsu,uv->tsv", a, m) * akv
        return (_dot("tsv,rsv->tr", left, c) - _dot("tsu,rsu->tr", a, kvc * mc)
                + (akvc * _dot("tsu,rsu->str", a, mc)).sum(0))

    return nngp, _dot("tsu,uv,rsv->tr", a, b.tv, c) + b.tq * d(b.kk) + b.kq * d(b.tk)


def summed(sample):
    """A rule's terms at one point, ``sample(b, z, allowed_n, allowed_m)``, as their sums over
    the points ``z`` ``(S, ...)`` (what :func:`pair_moments` takes)."""
    def chunk_terms(b, z, allowed_n, allowed_m):
        terms = jax.vmap(lambda p: sample(b, p, allowed_n, allowed_m))(z)
        return jax.tree.map(lambda v: v.sum(0), terms)
    return chunk_terms


def pair_moments(b: Blocks, z: jax.Array, allowed_n, allowed_m, chunk: int,
                 terms=_chunk_terms):
    """Means of a rule's terms over the points ``z`` ``(R, P, 2T, 2S)`` (all replicates'):
    ``terms(b, points, allowed_n, allowed_m)`` sums them over ``chunk`` points at a time
    (:func:`_chunk_terms`, or the rotary rule's per-point terms :func:`summed`); each term
    ``(T, T)`` (the NTK's None without ``b.tv``)."""
    z = z.reshape(-1, *z.shape[2:])
    chunk = min(chunk, z.shape[0])
    sums = lambda points: terms(b, points, allowed_n, allowed_m)

    def step(total, points):
        return jax.tree.map(jnp.add, total, sums(points)), None

    zc = z.reshape(-1, chunk, *z.shape[1:])
    zero = jax.tree.map(lambda v: jnp.zeros(v.shape, v.dtype), jax.eval_shape(sums, zc[0]))
    total, _ = jax.lax.scan(step, zero, zc)
    return jax.tree.map(lambda t: t / z.shape[0], total)
