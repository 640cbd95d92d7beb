"""Llama's attention written by hand in torch (rotary embeddings with ``rotate_half``, grouped
queries, causal), for the tests of the rotary rule; its converter to ``stax.RotaryAttention``."""

import torch
import torch.nn.functional as F
from torch import nn

import ntbridge
from ntbridge import stax


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin):
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class LlamaAttention(nn.Module):
    def __init__(self, d: int, heads: int, kv_heads: int, causal: bool = True,
                 base: float = 10000.0):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.causal = heads, kv_heads, d // heads, causal
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        j = torch.arange(0, self.head_dim, 2, dtype=torch.float64)
        self.register_buffer("inv_freq", base ** (-j / self.head_dim))

    def forward(self, x):
        n, t, d = x.shape
        q = self.q_proj(x).view(n, t, self.heads, -1).transpose(1, 2)
        k = self.k_proj(x).view(n, t, self.kv_heads, -1).transpose(1, 2)
        v = self.v_proj(x).view(n, t, self.kv_heads, -1).transpose(1, 2)
        freqs = torch.arange(t, dtype=x.dtype)[:, None] * self.inv_freq.to(x.dtype)
        emb = torch.cat((freqs, freqs), dim=-1)
        q, k = apply_rotary_pos_emb(q, k, emb.cos(), emb.sin())
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, enable_gqa=True)
        return self.o_proj(y.transpose(1, 2).reshape(n, t, d))


@ntbridge.register_converter(LlamaAttention)
def _llama_attention(module: LlamaAttention, ctx) -> stax.Layer:
    stds = stax.Stds(*(3 ** -0.5,) * 4, None, None, None, None)  # torch's Linear init
    return stax.RotaryAttention(module.heads * module.head_dim, module.heads, stds,
                                frequencies=tuple(module.inv_freq.tolist()),
                                kv_heads=module.kv_heads, causal=module.causal,
                                parameterization=ctx.parameterization)
