"""Llama's attention: separate query, key, value and output projections without biases, queries
and keys rotated by rotary position embeddings, grouped-query heads, an optional causal mask.

The kernel is :func:`~.attention.attention_rule`'s with the logits' rotary correlation
(:mod:`.rotary`). Grouped queries (``kv_heads < num_heads``: each key/value head serves
``num_heads / kv_heads`` query heads) leave it unchanged: the output projection's independent
weights average the heads' outputs, so pairs of heads, shared keys or not, add nothing in the
limit.

Example:
    >>> stds = Stds(*(3 ** -0.5,) * 4, None, None, None, None)
    >>> layer = RotaryAttention(64, 4, stds, frequencies=inverse_frequencies(16), kv_heads=2)
    >>> layer.init_fn(jax.random.key(0), (2, 5, 64))[0]
    (2, 5, 64)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..errors import ShapeError
from .attention_rule import Stds, attention_rule
from .kernel import sequence_kernel
from .layers import Layer, _sample
from .rotary import check_frequencies, rotate
from .softmax_moments import HIGHEST, Rule

_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj")


def inverse_frequencies(head_dim: int, base: float = 10000.0) -> tuple[float, ...]:
    """Llama's rotary frequencies ``base**(-2j / head_dim)``, ``j < head_dim / 2``."""
    return tuple(float(base ** (-2 * j / head_dim)) for j in range(head_dim // 2))


def RotaryAttention(embed_dim: int, num_heads: int, stds: Stds, *, frequencies: tuple[float, ...],
                    kv_heads: int | None = None, causal: bool = False,
                    parameterization: str = "standard", rule: Rule = Rule(),
                    distribution: str = "uniform") -> Layer:
    """Llama's self-attention on sequences ``(N, T, E) -> (N, T, E)``: ``q = x Wq^T`` (``num_heads``
    heads of ``D = E / num_heads`` channels), ``k, v`` likewise with ``kv_heads`` heads, ``q`` and
    ``k`` rotated (:func:`rotate`, ``D / 2`` ``frequencies``), logits ``q k / sqrt(D)`` (causal:
    a query sees the keys up to its own position), softmax, the heads' ``A v`` through ``o_proj``.
    Params ``q_proj.weight (E, E)``, ``k_proj.weight``, ``v_proj.weight`` ``(kv_heads D, E)``,
    ``o_proj.weight (E, E)``, drawn with variances ``stds.W_* ** 2 / E`` (no biases: ``stds.b_*``
    None)."""
    kv_heads = kv_heads or num_heads
    if embed_dim % num_heads or num_heads % kv_heads:
        raise ShapeError(f"embed_dim={embed_dim} must be divisible by num_heads={num_heads}, and "
                         f"num_heads by the key/value heads {kv_heads}")
    head_dim = embed_dim // num_heads
    check_frequencies(head_dim, frequencies)
    rows = (embed_dim, kv_heads * head_dim, kv_heads * head_dim, embed_dim)

    def init_fn(key, input_shape):
        if len(input_shape) != 3 or input_shape[-1] != embed_dim:
            raise ShapeError(f"expects sequences (N, T, {embed_dim}), got {tuple(input_shape)}")
        keys = jax.random.split(key, 4)
        return tuple(input_shape), {
            f"{name}.weight": _sample(keys[i], (n, embed_dim), std / embed_dim ** 0.5, distribution)
            for i, (name, n, std) in enumerate(zip(_NAMES, rows, stds[:4]))}

    def apply_fn(params, x):
        project = lambda name, heads: jnp.matmul(
            x, params[f"{name}.weight"].T, precision=HIGHEST).reshape(*x.shape[:2], heads, -1)
        freqs = jnp.asarray(frequencies)
        q, k = rotate(project("q_proj", num_heads), freqs), rotate(project("k_proj", kv_heads), freqs)
        k, v = (jnp.repeat(a, num_heads // kv_heads, axis=2) for a in (k, project("v_proj", kv_heads)))
        logits = jnp.einsum("nthd,nshd->nhts", q, k, precision=HIGHEST) / head_dim ** 0.5
        if causal:
            t = x.shape[1]
            logits = jnp.where(jnp.tril(jnp.ones((t, t), bool)), logits, -jnp.inf)
        z = jnp.einsum("nhts,nshd->nthd", jax.nn.softmax(logits, -1), v, precision=HIGHEST)
        return jnp.matmul(z.reshape(x.shape), params["o_proj.weight"].T, precision=HIGHEST)

    def kernel_fn(k):
        t = k.shape1[-2]
        mask = jnp.where(jnp.tril(jnp.ones((t, t), bool)), 0.0, -jnp.inf) if causal else None
        return attention_rule(embed_dim, stds, parameterization, mask, False, rule,
                              frequencies=tuple(frequencies))(k)

    return Layer(init_fn, apply_fn, kernel_fn, full_spatial=True, input_kernel=sequence_kernel,
                 replicates=rule.replicates)
