"""Attention layers as torch's ``nn.MultiheadAttention`` computes them: self-attention
(:func:`SelfAttention`, and Neural Tangents' ``linear_scaling`` variant) and a decoder's
cross-attention (:func:`CrossAttention`). Their kernel rule, its limit and its error estimate are
:mod:`.attention_rule`'s.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..errors import ShapeError, UnsupportedLayerError
from .attention_rule import Stds, attention_rule
from .kernel import sequence_kernel
from .layers import Layer, _sample
from .rotary import check_frequencies, rotate
from .softmax_moments import Rule


def _heads(x, n_heads):
    return x.reshape(*x.shape[:-1], n_heads, x.shape[-1] // n_heads)


def SelfAttention(embed_dim: int, num_heads: int, stds: Stds, *,
                  parameterization: str = "standard", mask: jax.Array | None = None,
                  linear_scaling: bool = False, rule: Rule = Rule(),
                  padding_id: int | None = None, distribution: str = "uniform",
                  logit_scale: float = 1.0,
                  frequencies: tuple[float, ...] | None = None) -> Layer:
    """torch's ``nn.MultiheadAttention(embed_dim, num_heads, bias=stds.b_q is not None,
    batch_first=True)`` called as ``attn(x, x, x, attn_mask=mask, need_weights=False)[0]``, or
    with ``padding_id`` as ``attn(x, x, x, key_padding_mask=ids == padding_id, ...)``.

    Shapes: ``x (N, T, E) -> (N, T, E)``; with ``padding_id`` the layer takes ``(x, ids)``, the
    model's token ids ``(N, T)`` second (its kernel: their input kernel). Params as torch names
    them: ``in_proj_weight (3E, E)``, ``in_proj_bias (3E,)``, ``out_proj.weight (E, E)``,
    ``out_proj.bias (E,)``. ``mask``: an additive ``(T, T)`` float mask (``-inf`` where a query may
    not see a key, as torch turns a boolean mask). ``linear_scaling``: the tied, ``1/d`` variant
    (module doc), whose forward ties the keys to the queries. ``rule``: the numerical
    expectation's (:class:`Rule`). ``logit_scale``: logits ``logit_scale * q k^T / sqrt(d)``
    (e.g. ``F.scaled_dot_product_attention``'s ``scale=`` times ``sqrt(d)``). ``frequencies``:
    queries and keys rotated by rotary position embeddings of these ``d / 2`` frequencies
    (:func:`~.rotary.rotate`, Llama's), the logits' covariance then :mod:`.rotary`'s.

    Example:
        >>> stds = Stds(*(0.5 ** 0.5,) * 3, 3 ** -0.5, 0.0, 0.0, 0.0, 0.0)
        >>> layer = SelfAttention(64, 4, stds)
        >>> layer.init_fn(jax.random.key(0), (2, 5, 64))[0]
        (2, 5, 64)
    """
    if linear_scaling and (logit_scale != 1.0 or frequencies is not None):
        raise UnsupportedLayerError("linear_scaling takes the logits q q^T / d as they are "
                                    "(logit_scale 1, no rotary embeddings).")
    return _attention(embed_dim, num_heads, stds, parameterization, mask, linear_scaling, rule,
                      padding_id, distribution, logit_scale, frequencies)


def CrossAttention(embed_dim: int, num_heads: int, stds: Stds, *,
                   parameterization: str = "standard", mask: jax.Array | None = None,
                   rule: Rule = Rule(), distribution: str = "uniform") -> Layer:
    """torch's ``nn.MultiheadAttention(embed_dim, num_heads, bias=stds.b_q is not None,
    batch_first=True)`` called as ``attn(x, memory, memory, attn_mask=mask,
    need_weights=False)[0]``: queries from ``x``, keys and values from ``memory`` (a decoder's
    cross-attention).

    Shapes: ``(x (N, T, E), memory (N, S, E)) -> (N, T, E)``; ``mask``: an additive ``(T, S)``
    float mask. Params as :func:`SelfAttention`'s. Kernel rule: :func:`SelfAttention`'s with the
    queries' covariances from ``x``'s kernel and the keys' and values' from ``memory``'s (the
    logits' covariance ``Kq[nt, mt'] Kk[ns, ms']``); the two sequences' covariance with each
    other is never needed, as queries and keys have independent weights.

    Example:
        >>> stds = Stds(*(0.5 ** 0.5,) * 3, 3 ** -0.5, 0.0, 0.0, 0.0, 0.0)
        >>> CrossAttention(64, 4, stds).init_fn(jax.random.key(0), ((2, 5, 64), (2, 7, 64)))[0]
        (2, 5, 64)
    """
    return _attention(embed_dim, num_heads, stds, parameterization, mask, False, rule, None,
                      distribution, 1.0, None, cross=True)


def _attention(embed_dim: int, num_heads: int, stds: Stds, parameterization: str, mask,
               linear_scaling: bool, rule: Rule, padding_id: int | None, distribution: str,
               logit_scale: float, frequencies: tuple[float, ...] | None,
               cross: bool = False) -> Layer:
    """The layer of :func:`SelfAttention` (``cross``: of :func:`CrossAttention`)."""
    if embed_dim % num_heads:
        raise ShapeError(f"embed_dim={embed_dim} is not divisible by num_heads={num_heads}")
    s, has_bias = stds, stds.b_q is not None
    head_dim = embed_dim // num_heads
    if frequencies is not None:
        check_frequencies(head_dim, frequencies)

    def operands(x):  # (the queries' sequences, the keys' and values', the token ids or None)
        if cross:
            return x[0], x[1], None
        return (x[0], x[0], x[1]) if padding_id is not None else (x, x, None)

    def init_fn(key, input_shape):
        queries, memory, _ = operands(input_shape)
        for shape in (queries, memory):
            if len(shape) != 3 or shape[-1] != embed_dim or shape[0] != queries[0]:
                raise ShapeError(f"expects sequences (N, T, {embed_dim}), got {tuple(shape)}")
        if mask is not None and tuple(mask.shape) != (queries[1], memory[1]):
            raise ShapeError(f"the attention mask has shape {tuple(mask.shape)}, but the queries "
                             f"and keys are {queries[1]} and {memory[1]} tokens")
        keys = jax.random.split(key, 8)
        draw = lambda i, shape, std: _sample(keys[i], shape, std, distribution)
        w = [draw(i, (embed_dim, embed_dim), std / embed_dim ** 0.5)
             for i, std in enumerate((s.W_q, s.W_k, s.W_v, s.W_o))]
        params = {"in_proj_weight": jnp.concatenate(w[:3]), "out_proj.weight": w[3]}
        if has_bias:
            b = [draw(4 + i, (embed_dim,), std) for i, std in enumerate((s.b_q, s.b_k, s.b_v))]
            params.update({"in_proj_bias": jnp.concatenate(b),
                           "out_proj.bias": draw(7, (embed_dim,), s.b_o)})
        return tuple(queries), params

    def apply_fn(params, x):
        x, memory, ids = operands(x)
        mm = lambda a, w: jnp.matmul(a, w.T, precision=jax.lax.Precision.HIGHEST)
        w, b = params["in_proj_weight"], params.get("in_proj_bias")

        def project(a, i):  # the queries' (i = 0), keys' or values' heads
            y = mm(a, w[i * embed_dim:(i + 1) * embed_dim])
            return _heads(y if b is None else y + b[i * embed_dim:(i + 1) * embed_dim],
                          num_heads)

        q, k, v = project(x, 0), project(memory, 1), project(memory, 2)
        k = q if linear_scaling else k
        if frequencies is not None:
            q, k = (rotate(a, jnp.asarray(frequencies)) for a in (q, k))
        logits = jnp.einsum("nthd,nshd->nhts", q, k, precision=jax.lax.Precision.HIGHEST)
        logits = logits * (logit_scale / (head_dim if linear_scaling else head_dim ** 0.5))
        if mask is not None:
            logits = logits + mask
        if ids is not None:
            logits = jnp.where((ids == padding_id)[:, None, None, :], -jnp.inf, logits)
        a = jax.nn.softmax(logits, axis=-1)
        z = jnp.einsum("nhts,nshd->nthd", a, v, precision=jax.lax.Precision.HIGHEST)
        y = mm(z.reshape(x.shape), params["out_proj.weight"])
        return y + params["out_proj.bias"] if has_bias else y

    return Layer(init_fn, apply_fn,
                 attention_rule(embed_dim, stds, parameterization, mask, linear_scaling, rule,
                                padding_id, frequencies, logit_scale, cross),
                 full_spatial=True, input_kernel=sequence_kernel,
                 replicates=0 if linear_scaling else rule.replicates)
