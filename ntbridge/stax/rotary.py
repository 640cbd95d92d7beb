"""Rotary position embeddings: the attention logits' covariance when queries and keys are rotated
by position-dependent angles (Su et al. 2021, "RoFormer"; Llama's ``apply_rotary_pos_emb``).

Each head's channels come in pairs ``(i, i + d/2)`` (``rotate_half``), the pair ``j`` of a token at
position ``t`` rotated by the angle ``t w_j``, ``w_j`` the frequencies (Llama's ``inv_freq``,
``base**(-2j/d)``). The logit of tokens ``t, s`` is then ``sum_j q_t^j . R((s - t) w_j) k_s^j /
sqrt(d)``: a rotation by the relative position. With each pair's channels independent Gaussians of
covariances ``Kq`` (queries) and ``Kk`` (keys), as in the limit without rotation, the cross terms
of a pair's two channels vanish and

    Cov(G_n[t, s], G_m[t', s']) = Kq[nt, mt'] Kk[ns, ms'] c((s - t) - (s' - t')),
    c(D) = mean_j cos(D w_j)

(``c(0) = 1``: without rotation the rule is the plain one). For ``base**(-2j/d)`` and many channels
per head, ``c(D) = int_0^1 cos(D base**-u) du = (Ci(|D|) - Ci(|D| / base)) / ln(base)`` (``Ci`` the
cosine integral); ntbridge uses the model's own frequencies, the finite mean. The logits' NTK has
the same factor: ``(Tq Kk + Kq Tk) c``. The covariance no longer factors into queries' times keys',
so the logits of a pair of examples are drawn from the factor of their full ``2T^2 x 2T^2``
covariance (the same normal points as the factored rule's, fewer of them), and the NTK's
expectation is contracted over all four token indices.

Example:
    >>> c = correlation(np.array([1.0, 0.1, 0.01]), 4)     # (T, T, T, T): [t, s, t', s']
    >>> float(c[0, 0, 0, 0]), float(c[0, 1, 1, 0]) == float(np.mean(np.cos(-2 * np.array([1.0, 0.1, 0.01]))))
    (1.0, True)
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ShapeError
from .softmax_moments import HIGHEST, masked_softmax, pair_moments, psd_factor, summed


def correlation(frequencies: np.ndarray, tokens: int) -> np.ndarray:
    """``c[t, s, t', s'] = mean_j cos(((s - t) - (s' - t')) w_j)`` for ``T = tokens`` positions
    ``0 .. T-1`` (float64, ``(T, T, T, T)``)."""
    t = np.arange(tokens)
    relative = t[None, :] - t[:, None]  # [t, s] -> s - t
    delta = relative[:, :, None, None] - relative[None, None]
    return np.cos(delta[..., None] * np.asarray(frequencies, np.float64)).mean(-1)


def check_frequencies(head_dim: int, frequencies: tuple[float, ...]) -> None:
    """Raise ShapeError unless ``frequencies`` fit heads of ``head_dim`` channels (one per pair of
    channels ``(i, i + head_dim/2)``)."""
    if len(frequencies) != head_dim // 2 or head_dim % 2:
        raise ShapeError(f"rotary embeddings of heads of {head_dim} channels need "
                         f"{head_dim // 2} frequencies (an even head size), got {len(frequencies)}")


def rotate(x: jax.Array, frequencies: jax.Array) -> jax.Array:
    """Llama's ``x * cos + rotate_half(x) * sin`` for heads ``x`` ``(N, T, H, D)``, the angle of
    channel ``i`` (and ``i + D/2``) at position ``t`` being ``t * frequencies[i]``."""
    angles = jnp.arange(x.shape[1], dtype=x.dtype)[:, None] * frequencies.astype(x.dtype)
    angles = jnp.concatenate([angles, angles], -1)[None, :, None, :]  # (1, T, 1, D)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * jnp.cos(angles) + rotated * jnp.sin(angles)


class RotaryBlocks(NamedTuple):
    """One pair's arrays: the rows of the logits' factor ``l_n, l_m`` ``(T*T, 2T*T)`` (example
    ``n``'s logits, then ``m``'s), the values' cross covariance ``kv`` ``(T, T)``, and for the NTK
    the logits' cross NTK ``tg`` ``(T, T, T, T)`` (``[t, t', s, s']``) and the values' ``tv``."""

    l_n: jax.Array
    l_m: jax.Array
    kv: jax.Array
    tg: jax.Array | None
    tv: jax.Array | None


def _logit_tangent(a, b, kv, tg):
    """``sum_{s,s'} (J_a Kv J_b)[s, s'] TG[t, t', s, s']`` for every query pair ``(t, t')``, with
    ``J_a = diag(a_t) - a_t a_t^T``: ``(J_a Kv J_b)[s, s'] = a_ts b_t's' (Kv[s, s'] - (Kv b_t')_s
    - (a_t Kv)_s' + a_t Kv b_t')``."""
    y = a[:, None, :, None] * b[None, :, None, :] * tg  # [t, t', s, s']
    p = jnp.einsum("sr,ur->us", kv, b, precision=HIGHEST)  # (Kv b_t')_s, [t', s]
    q = jnp.einsum("tr,rs->ts", a, kv, precision=HIGHEST)  # (a_t Kv)_s', [t, s']
    r = jnp.einsum("tr,rs,us->tu", a, kv, b, precision=HIGHEST)
    return (jnp.einsum("tusv,sv->tu", y, kv, precision=HIGHEST)
            - jnp.einsum("tusv,us->tu", y, p, precision=HIGHEST)
            - jnp.einsum("tusv,tv->tu", y, q, precision=HIGHEST) + r * y.sum((2, 3)))


def sample_terms(b: RotaryBlocks, z: jax.Array, allowed_n, allowed_m):
    """For one point ``z`` ``(2T, 2T)`` (its first ``2T^2`` entries): the value-covariance term
    and, with the NTK, its term (:func:`~.softmax_moments.pair_moments` averages them)."""
    t = b.kv.shape[-1]
    flat = z.reshape(-1)[:b.l_n.shape[-1]]
    g_n, g_m = (jnp.matmul(l, flat, precision=HIGHEST).reshape(t, t) for l in (b.l_n, b.l_m))
    a, c = masked_softmax(g_n, allowed_n), masked_softmax(g_m, allowed_m)
    mm = lambda x, y: jnp.matmul(x, y, precision=HIGHEST)
    nngp = mm(mm(a, b.kv), c.T)
    if b.tv is None:
        return nngp, None
    return nngp, mm(mm(a, b.tv), c.T) + _logit_tangent(a, c, b.kv, b.tg)


def rotary_blocks(kq, kk, kv, ntks, corr: jax.Array) -> RotaryBlocks:
    """One pair's :class:`RotaryBlocks` from the blocks ``(cov_n, cov_nm, cov_m)`` ``(T, T)`` of
    queries and keys, the values' cross covariance ``kv``, the cross NTKs ``(tq, tk, tv)`` (or
    None) and the correlation ``corr`` ``[t, s, t', s']`` (:func:`correlation`)."""
    t = kv.shape[-1]
    logits = lambda q, k: (q[:, None, :, None] * k[None, :, None, :] * corr).reshape(t * t, t * t)
    (qn, qnm, qm), (kn, knm, km) = kq, kk
    cross = logits(qnm, knm)
    full = jnp.concatenate([jnp.concatenate([logits(qn, kn), cross], 1),
                            jnp.concatenate([cross.T, logits(qm, km)], 1)], 0)
    factor = psd_factor(full)
    tg = tv = None
    if ntks is not None:
        tq, tk, tv = ntks
        # [t, t', s, s']: (Tq Kk + Kq Tk) c, the logits' cross NTK
        tg = ((tq[:, :, None, None] * knm[None, None] + qnm[:, :, None, None] * tk[None, None])
              * jnp.transpose(corr, (0, 2, 1, 3)))
    return RotaryBlocks(factor[:t * t], factor[t * t:], kv, tg, tv)


def rotary_moments(kq, kk, kv, ntks, masks, z: jax.Array, chunk: int, corr: jax.Array):
    """The rotary rule's ``E[A_n Kv A_m^T]`` (and the NTK's expectation) for every pair of the
    leading axes: ``kq``, ``kk`` blocks ``(cov_n, cov_nm, cov_m)`` and ``kv``, ``ntks``, ``masks``
    as :func:`~.attention._softmax_moments` takes them, spread to ``kv``'s shape ``(..., T, T)``;
    ``z``: the rule's normal points."""
    batch, t = kv.shape[:-2], kv.shape[-1]
    flat = jax.tree.map(lambda a: a.reshape(-1, t, t), (kq, kk, kv, ntks, masks))

    def one(q, k, v, n, m):
        return pair_moments(rotary_blocks(q, k, v, n, corr), z, *m, chunk, summed(sample_terms))

    out = jax.vmap(one)(*flat)
    return jax.tree.map(lambda a: a.reshape(*batch, t, t), out)
