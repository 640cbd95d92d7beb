"""The analytic route over torch.export graphs: attention as people write it (nanoGPT's, separate
projections, chunks, masks from buffers, grouped-query heads, rotary embeddings) converted into
the attention rule.

Each spelling's converted forward is the model's own; its kernel is that of the equivalent
``nn.MultiheadAttention`` at the same variances (exactly; rotary embeddings: the rotary rule's);
nanoGPT's attention at its own width
agrees with fresh torch models' Monte-Carlo (NNGP and NTK); other spellings are refused with the
recognised form.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ntbridge
from ntbridge import errors
from ntbridge.dlpack import precision, to_jax

from attention_spellings import (Chunked, Cross, Grouped, Padded, PaddedSDPA, Rescaled,
                                 Rotated, Separate, Unnormalised)
from montecarlo import fresh_kernels, standard_error, z_scores
from nanogpt import CausalSelfAttention

D, HEADS, T = 32, 4, 5
SPELLINGS = {  # name: (build, has biases, kernel checked: spellings of one signature share it)
    "nanoGPT, SDPA": (lambda: CausalSelfAttention(D, HEADS, 16, flash=True), True, True),
    "nanoGPT, masked_fill": (lambda: CausalSelfAttention(D, HEADS, 16, flash=False), True, True),
    "separate, no biases": (lambda: Separate(D, HEADS), False, False),
    "chunk, additive mask": (lambda: Chunked(D, HEADS), True, False),
    "grouped, repeat_kv": (lambda: Grouped(D, HEADS, 2), False, True),
    "grouped, enable_gqa": (lambda: Grouped(D, HEADS, 2, gqa=True), False, True),
    "SDPA, scale 2 / sqrt(d_head)": (lambda: Rescaled(D, HEADS), False, False),
    "rotary embeddings": (lambda: Rotated(D, HEADS), False, False),
}


def _inputs(n=3, d=D, seed=0):
    return torch.randn(n, T, d, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


class _Reference(nn.Module):
    """The same causal attention as ``nn.MultiheadAttention``."""

    def __init__(self, bias: bool):
        super().__init__()
        self.attn = nn.MultiheadAttention(D, HEADS, bias=bias, batch_first=True)

    def forward(self, x):
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        return self.attn(x, x, x, attn_mask=mask, need_weights=False)[0]


@pytest.mark.parametrize("name", SPELLINGS)
def test_each_spelling_is_the_attention_rule(name):
    # every spelling but the rescaled one is causal; the grouped ones' kernel is the full heads'
    # (the limit of many query heads per key head: the cross terms of heads sharing a key average
    # out)
    build, bias, kernel = SPELLINGS[name]
    torch.manual_seed(0)
    model, x = build().double().eval(), _inputs()
    graph = ntbridge.convert(model, example=x)
    assert [type(n.module).__name__ for n in graph.layers] == ["ExportedAttention"]
    with precision(torch.float64):
        y = np.asarray(graph.apply_fn(graph.params, to_jax(x)))
    np.testing.assert_allclose(y, model(x).detach().numpy(), rtol=1e-12, atol=1e-12)
    if not kernel:
        return
    # the kernel of nn.MultiheadAttention at the same variances, exactly
    stds = dict(W_std=0.6, b_std=0.1 if bias else None)
    k = ntbridge.kernel(model, x, **stds)
    reference = ntbridge.kernel(_Reference(bias).double(), x, **stds)
    for get in ("nngp", "ntk"):
        torch.testing.assert_close(getattr(k, get), getattr(reference, get), rtol=1e-12,
                                   atol=0)


def test_rotary_embeddings_are_the_rotary_rule():
    # the frequencies read from the cos and sin tables are those of the hand-written Llama
    # attention whose converter builds stax.RotaryAttention (causal, no biases): the same kernel
    from llama_modules import LlamaAttention

    torch.manual_seed(0)
    model, x = Rotated(D, HEADS).double().eval(), _inputs()
    assert "rotary" in repr(ntbridge.convert(model, example=x))
    reference = ntbridge.kernel(LlamaAttention(D, HEADS, HEADS).double(), x)
    k = ntbridge.kernel(model, x)
    for get in ("nngp", "ntk"):
        torch.testing.assert_close(getattr(k, get), getattr(reference, get), rtol=1e-12, atol=0)


def test_stax_self_attention_rotates_as_the_model():
    # stax.SelfAttention(frequencies=...) applies the rotation the rotary rule assumes
    import jax.numpy as jnp
    from ntbridge import stax

    torch.manual_seed(0)
    model, x = Rotated(D, HEADS).double().eval(), _inputs()
    half = D // HEADS // 2
    frequencies = tuple(10000.0 ** (-j / half) for j in range(half))
    causal = jnp.where(jnp.tril(jnp.ones((T, T), bool)), 0.0, -jnp.inf)
    layer = stax.SelfAttention(D, HEADS, stax.Stds(*(1.0,) * 4, None, None, None, None),
                               mask=causal, frequencies=frequencies)
    weights = torch.cat([model.q.weight, model.k.weight, model.v.weight]).detach()
    params = {"in_proj_weight": to_jax(weights), "out_proj.weight": to_jax(model.o.weight.detach())}
    with precision(torch.float64):
        y = np.asarray(layer.apply_fn(params, to_jax(x)))
    np.testing.assert_allclose(y, model(x).detach().numpy(), rtol=1e-12, atol=1e-12)


def test_a_residual_block_around_the_attention():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = nn.LayerNorm(D)
            self.attn = CausalSelfAttention(D, HEADS, 16)
            self.fc = nn.Linear(D, D)

        def forward(self, x):
            x = x + self.attn(self.ln(x))
            return self.fc(torch.nn.functional.gelu(x))

    torch.manual_seed(1)
    model, x = Block().double().eval(), _inputs()
    graph = ntbridge.convert(model, example=x)
    assert [n.name for n in graph.layers] == ["ln", "attn", "add", "gelu", "fc"]
    with precision(torch.float64):
        y = np.asarray(graph.apply_fn(graph.params, to_jax(x)))
    np.testing.assert_allclose(y, model(x).detach().numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("spelling", [Padded, PaddedSDPA], ids=["masked_fill", "SDPA"])
def test_a_padding_mask_of_the_token_ids(spelling):
    class Reference(nn.Module):  # nn.MultiheadAttention with key_padding_mask=(ids == 0)
        def __init__(self):
            super().__init__()
            self.emb, self.attn = nn.Embedding(10, D), nn.MultiheadAttention(D, HEADS,
                                                                             batch_first=True)

        def forward(self, ids):
            x = self.emb(ids)
            return self.attn(x, x, x, key_padding_mask=ids == 0, need_weights=False)[0]

    torch.manual_seed(2)
    model, ids = spelling(D, HEADS).double().eval(), torch.tensor([[3, 4, 0, 0], [5, 1, 2, 0]])
    graph = ntbridge.convert(model, example=ids)
    assert graph.layers[1].inputs == (0, -1)  # the attention reads the ids too
    with precision(torch.float64):
        y = np.asarray(graph.apply_fn(graph.params, to_jax(ids)))
    np.testing.assert_allclose(y, model(ids).detach().numpy(), rtol=1e-12, atol=1e-12)
    stds = dict(W_std=0.6, b_std=0.1)
    k, reference = (ntbridge.kernel(m, ids, **stds) for m in (model, Reference().double()))
    for get in ("nngp", "ntk"):
        torch.testing.assert_close(getattr(k, get), getattr(reference, get), rtol=1e-12, atol=0)


def test_a_padding_mask_of_the_queries_is_refused():
    class Queries(Padded):  # (ids != pad) masking the queries: not the keys' padding
        def forward(self, ids):
            x = self.emb(ids)
            n, t, d = x.shape
            q, k, v = (a.view(n, t, self.heads, -1).transpose(1, 2)
                       for a in self.qkv(x).split(d, -1))
            mask = (ids != self.pad)[:, None, :, None]
            return self.out(F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                            .transpose(1, 2).reshape(n, t, d))

    with pytest.raises(errors.UnsupportedLayerError, match="used other than as keys"):
        ntbridge.convert(Queries(D, HEADS), example=torch.tensor([[3, 4, 0, 0], [5, 1, 2, 0]]))


@pytest.mark.slow
@pytest.mark.parametrize("build, width, n", [
    (lambda d: CausalSelfAttention(d, 4, 16, flash=True), 128, 48),
    (lambda d: Grouped(d, 16, 2, gqa=True), 256, 64),
    (lambda d: Rescaled(d, 4), 128, 48),
], ids=["nanoGPT", "grouped", "rescaled"])
def test_attention_matches_fresh_wide_models(build, width, n):
    # as torch initialises them (uniform weights and biases): nanoGPT's attention (its
    # masked_fill path is the same function of the same weights) and logits at twice the default
    # scale at 128 channels in 4 heads, 16 query heads sharing 2 key heads at 256 channels (at 128,
    # 8 channels a head, the NNGP's standard error is 0.058 of its largest entry: too few
    # samples); the mean of 48 (grouped: 64) fresh models' empirical NNGP and NTK within 5
    # combined standard errors (the samples' and the rule's); measured max z 2.2 (nanoGPT), 2.0
    # (grouped), 1.9 (rescaled), the standard errors at most 0.026, 0.036 and 0.039 of the
    # largest entry
    x = _inputs(3, width, seed=1)
    nngps, ntks = fresh_kernels(lambda: build(width).eval(), x, n, seed=100)
    model = build(width).double().eval()
    k, error = ntbridge.kernel(model, x), ntbridge.expectation_error(model, x)
    for get, samples in (("nngp", nngps), ("ntk", ntks)):
        exact = getattr(k, get)
        assert standard_error(samples).max() < 0.05 * exact.abs().max(), get
        assert z_scores(samples, exact, error).max() < 5, get


@pytest.mark.parametrize("model, message", [
    (lambda: Unnormalised(D, HEADS), r"relu of logits values.*recognised form of self-attention"),
    (lambda: Cross(D, HEADS), r"different sequences: cross-attention.*recognised form"),
    (lambda: Rotated(D, HEADS, stretch=2.0),
     r"not cos\(t w\) and sin\(t w\).*recognised form is Llama's"),
])
def test_other_spellings_are_refused_with_the_recognised_form(model, message):
    with pytest.raises(errors.UnsupportedLayerError, match=message):
        ntbridge.ntk(model().double().eval(), _inputs())


def test_without_an_example_the_fx_route_alone_answers():
    with pytest.raises(errors.UnsupportedLayerError, match=r"Tensor.split in CausalSelfAttention"):
        ntbridge.convert(CausalSelfAttention(D, HEADS, 16))
