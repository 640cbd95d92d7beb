"""Self-attention spelled as people write it by hand (beside nanoGPT's, :mod:`nanogpt`): separate
projections without biases, heads by ``reshape``/``permute`` or ``unflatten``, masks from
buffers (boolean or additive), a given ``scale``, grouped-query heads by ``repeat_kv`` or
``enable_gqa``, rotary position embeddings; and spellings that have no kernel rule."""

import math

import torch
import torch.nn.functional as F
from torch import nn


class Separate(nn.Module):
    """``q, k, v`` by three Linear layers without biases, ``reshape``/``permute`` heads, SDPA
    with a boolean "may attend" buffer sliced to the length, ``scale`` given."""

    def __init__(self, d: int, heads: int, length: int = 16):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(d, d, bias=False) for _ in range(3))
        self.o = nn.Linear(d, d, bias=False)
        self.heads = heads
        self.register_buffer("allowed", torch.ones(length, length, dtype=torch.bool).tril())

    def forward(self, x):
        n, t, d = x.shape
        split = lambda a: a.reshape(n, t, self.heads, -1).permute(0, 2, 1, 3)
        y = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)),
                                           attn_mask=self.allowed[:t, :t],
                                           scale=(d // self.heads) ** -0.5)
        return self.o(y.permute(0, 2, 1, 3).reshape(n, t, d))


class Chunked(nn.Module):
    """One fused projection ``.chunk(3, -1)``, ``unflatten`` heads, logits divided by
    ``sqrt(d_head)``, an additive ``-inf`` buffer, softmax, ``@ v``."""

    def __init__(self, d: int, heads: int, length: int = 16):
        super().__init__()
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.heads = heads
        mask = torch.full((length, length), -math.inf).triu(1)
        self.register_buffer("mask", mask[None, None])

    def forward(self, x):
        n, t, d = x.shape
        q, k, v = (a.unflatten(-1, (self.heads, -1)).transpose(1, 2)
                   for a in self.qkv(x).chunk(3, -1))
        logits = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + self.mask[:, :, :t, :t]
        y = torch.softmax(logits, dim=-1) @ v
        return self.out(y.transpose(1, 2).reshape(n, t, d))


def repeat_kv(h: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Llama's repeat of key/value heads ``(N, G, T, D) -> (N, G * n_rep, T, D)``."""
    n, g, t, d = h.shape
    return h[:, :, None, :, :].expand(n, g, n_rep, t, d).reshape(n, g * n_rep, t, d)


class Grouped(nn.Module):
    """Grouped-query attention: ``heads`` query heads sharing ``kv_heads`` key/value heads, by
    ``repeat_kv`` and the manual path, or by SDPA's ``enable_gqa``; causal."""

    def __init__(self, d: int, heads: int, kv_heads: int, gqa: bool = False):
        super().__init__()
        self.dh, self.heads, self.kv_heads, self.gqa = d // heads, heads, kv_heads, gqa
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, kv_heads * self.dh, bias=False)
        self.v_proj = nn.Linear(d, kv_heads * self.dh, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)

    def forward(self, x):
        n, t, d = x.shape
        q = self.q_proj(x).view(n, t, -1, self.dh).transpose(1, 2)
        k = self.k_proj(x).view(n, t, -1, self.dh).transpose(1, 2)
        v = self.v_proj(x).view(n, t, -1, self.dh).transpose(1, 2)
        if self.gqa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            k, v = (repeat_kv(a, self.heads // self.kv_heads) for a in (k, v))
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            logits = torch.matmul(q, k.transpose(2, 3)) * self.dh ** -0.5
            y = torch.matmul(torch.softmax(logits.masked_fill(causal, -math.inf), -1), v)
        return self.o_proj(y.transpose(1, 2).contiguous().view(n, t, d))


class Rescaled(Separate):
    """SDPA with logits scaled by ``2 / sqrt(d_head)``, twice the default."""

    def forward(self, x):
        n, t, d = x.shape
        split = lambda a: a.reshape(n, t, self.heads, -1).transpose(1, 2)
        y = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)),
                                           scale=2 * (d // self.heads) ** -0.5)
        return self.o(y.transpose(1, 2).reshape(n, t, d))


class Rotated(Separate):
    """Rotary position embeddings (Llama's ``q * cos + rotate_half(q) * sin``, the same for
    ``k``) from ``cos``/``sin`` buffers sliced to the length, then causal SDPA. ``stretch``
    scales both tables: other than 1 they are no rotation (no rule)."""

    def __init__(self, d: int, heads: int, length: int = 16, stretch: float = 1.0):
        super().__init__(d, heads, length)
        half = d // heads // 2
        j = torch.arange(half, dtype=torch.float64)
        angles = torch.arange(length, dtype=torch.float64)[:, None] * 10000.0 ** (-j / half)
        angles = torch.cat([angles, angles], -1)
        self.register_buffer("cos", stretch * angles.cos())
        self.register_buffer("sin", stretch * angles.sin())

    def forward(self, x):
        n, t, d = x.shape
        split = lambda a: a.view(n, t, self.heads, -1).transpose(1, 2)
        half = d // self.heads // 2
        turn = lambda a: a * self.cos[:t] + torch.cat([-a[..., half:], a[..., :half]], -1) * \
            self.sin[:t]
        y = F.scaled_dot_product_attention(turn(split(self.q(x))), turn(split(self.k(x))),
                                           split(self.v(x)), is_causal=True)
        return self.o(y.transpose(1, 2).reshape(n, t, d))


class Unnormalised(Chunked):
    """Logits through ``relu`` instead of a softmax: no rule."""

    def forward(self, x):
        n, t, d = x.shape
        q, k, v = (a.unflatten(-1, (self.heads, -1)).transpose(1, 2)
                   for a in self.qkv(x).chunk(3, -1))
        y = torch.relu(q @ k.transpose(-2, -1)) @ v
        return self.out(y.transpose(1, 2).reshape(n, t, d))


class Cross(Separate):
    """Keys and values from another sequence than the queries: cross-attention, no rule."""

    def forward(self, x):
        n, t, d = x.shape
        memory = torch.tanh(x)
        split = lambda a: a.reshape(n, t, self.heads, -1).transpose(1, 2)
        y = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(memory)),
                                           split(self.v(memory)))
        return self.o(y.transpose(1, 2).reshape(n, t, d))


class Padded(nn.Module):
    """Token ids embedded, then attention whose keys of id ``pad`` are masked by ``masked_fill``
    of ``(ids == pad)[:, None, None, :]``."""

    def __init__(self, d: int, heads: int, vocab: int = 10, pad: int = 0):
        super().__init__()
        self.emb, self.qkv, self.out = nn.Embedding(vocab, d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.heads, self.pad = heads, pad

    def forward(self, ids):
        x = self.emb(ids)
        n, t, d = x.shape
        q, k, v = (a.view(n, t, self.heads, -1).transpose(1, 2) for a in self.qkv(x).split(d, -1))
        logits = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
        logits = logits.masked_fill((ids == self.pad)[:, None, None, :], float("-inf"))
        y = torch.softmax(logits, dim=-1) @ v
        return self.out(y.transpose(1, 2).reshape(n, t, d))


class PaddedSDPA(Padded):
    """The keys that may be attended, ``(ids != pad)[:, None, None, :]``, as SDPA's boolean
    ``attn_mask``."""

    def forward(self, ids):
        x = self.emb(ids)
        n, t, d = x.shape
        q, k, v = (a.view(n, t, self.heads, -1).transpose(1, 2) for a in self.qkv(x).split(d, -1))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=(ids != self.pad)[:, None, None, :])
        return self.out(y.transpose(1, 2).reshape(n, t, d))
