"""Transformers: attention as torch computes it, embeddings, positions, per-token layers, masks.

The forward passes are torch's to rounding; the kernels are checked against Monte-Carlo estimates
of fresh wide models (tolerances from the samples' standard errors plus the analytic kernel's own
reported error), the numerical expectation's error against its refinement, and masks against
shorter sequences.
"""

import collections
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch import nn

import ntbridge
from ntbridge import errors, programs, stax
from ntbridge.stax import softmax_moments
from ntbridge.stax.attention import SelfAttention, Stds
from ntbridge.stax.attention_rule import sandwich
from ntbridge.stax.covariances import evaluate, evaluate_error

from helpers import Attention


class TextClassifier(nn.Module):
    """Embedding + learned positions, an encoder, a pooling head and a Linear."""

    def __init__(self, vocab=40, d=32, length=6, heads=2, layers=1, pool="mean", norm_first=False,
                 activation="relu", padding_idx=None):
        super().__init__()
        self.emb = nn.Embedding(vocab, d, padding_idx=padding_idx)
        self.pos = nn.Parameter(0.5 * torch.randn(length, d))
        layer = nn.TransformerEncoderLayer(d, heads, 2 * d, dropout=0.1, batch_first=True,
                                           norm_first=norm_first, activation=activation)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d * length if pool == "flatten" else d, 1)
        self.pool = pool

    def forward(self, ids):
        h = self.enc(self.emb(ids) + self.pos)
        h = {"mean": lambda: h.mean(1), "first": lambda: h[:, 0],
             "flatten": lambda: h.flatten(1)}[self.pool]()
        return self.head(h)


class Padded(nn.Module):
    """Token ids padded with 0: the encoder's attention skips them (``key_padding_mask``)."""

    def __init__(self, vocab=12, d=16, heads=2, norm_first=False):
        super().__init__()
        self.emb = nn.Embedding(vocab, d, padding_idx=0)
        layer = nn.TransformerEncoderLayer(d, heads, 2 * d, batch_first=True,
                                           norm_first=norm_first)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    def forward(self, ids):
        return self.enc(self.emb(ids), src_key_padding_mask=ids == 0)


def _forward_error(model, x):
    g = ntbridge.convert(model)
    ours = np.asarray(g.apply_fn(g.params, jnp.asarray(x.numpy())))
    return np.abs(ours - model(x).detach().numpy()).max()


def _assert_float64_forward(model, x):
    """The converted graph's forward of a float64 model is torch's, to float64 rounding."""
    g = ntbridge.convert(model)
    with jax.enable_x64(True):
        np.testing.assert_allclose(np.asarray(g.apply_fn(g.params, jnp.asarray(x))),
                                   model(x).detach().numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bias, causal", [(True, False), (False, True)])
def test_attention_forward_is_torchs(bias, causal):
    torch.manual_seed(0)
    mask = nn.Transformer.generate_square_subsequent_mask(5) if causal else None
    model = Attention(16, 4, bias, mask).eval()
    assert _forward_error(model, torch.randn(3, 5, 16)) < 1e-5


@pytest.mark.parametrize("norm_first, activation, pool", [(False, "relu", "mean"),
                                                          (True, "gelu", "first"),
                                                          (False, "gelu", "flatten")])
def test_text_classifier_forward_is_torchs(norm_first, activation, pool):
    torch.manual_seed(0)
    model = TextClassifier(norm_first=norm_first, activation=activation, pool=pool,
                           layers=2, padding_idx=0).eval()
    assert _forward_error(model, torch.randint(0, 40, (4, 6))) < 1e-5


@pytest.mark.parametrize("norm_first", [False, True])
def test_padded_forward_is_torchs(norm_first):
    torch.manual_seed(0)
    ids = torch.tensor([[3, 4, 5, 0, 0], [1, 2, 3, 4, 5], [7, 8, 0, 0, 0]])
    assert _forward_error(Padded(norm_first=norm_first).eval(), ids) < 1e-5


class Encoder(nn.Module):
    """Embedding, an encoder and a pooling head, batch-first or time-major (``batch_first=False``
    layers between two transposes)."""

    def __init__(self, batch_first=True, pool="mean", transpose=True):
        super().__init__()
        self.emb = nn.Embedding(40, 32)
        layer = nn.TransformerEncoderLayer(32, 2, 64, batch_first=batch_first)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(32, 1)
        self.batch_first, self.pool, self.transpose = batch_first, pool, transpose

    def forward(self, ids):
        if self.batch_first:
            h = self.enc(self.emb(ids))
            return self.head(h.mean(1) if self.pool == "mean" else h[:, -1])
        h = self.enc(self.emb(ids).transpose(0, 1) if self.transpose else self.emb(ids))
        return self.head({"mean": lambda: h.mean(0), "last": lambda: h[-1],
                          "flatten": lambda: h.flatten(1)}[self.pool]())


@pytest.mark.parametrize("pool", ["mean", "last"])
def test_time_major_models_are_their_batch_first_twins(pool):
    # batch_first=False layers between transposes: torch's forward, and the batch-first model's
    # kernels exactly (the conversion runs the stretch batch-first; the closed-form attention, as
    # the layout, not softmax's rule, is tested here)
    ids = torch.randint(0, 40, (3, 6), generator=torch.Generator().manual_seed(7))
    models = []
    for batch_first in (False, True):
        torch.manual_seed(0)
        models.append(Encoder(batch_first, pool).eval())
    assert _forward_error(models[0], ids) < 1e-5
    time_major, batch_first = (ntbridge.kernel(m, ids, attention="linear") for m in models)
    assert torch.equal(time_major.ntk, batch_first.ntk)
    assert torch.equal(time_major.nngp, batch_first.nngp)


def _close(mc, analytic, error, sigmas=5.0):
    """|mc - analytic| within ``sigmas`` of the combined standard errors (both estimates')."""
    spread = torch.sqrt(mc.standard_error ** 2 + (error * analytic.abs().max()) ** 2)
    z = ((mc.mean - analytic).abs() / spread).max().item()
    assert z < sigmas, z


@pytest.mark.slow
def test_attention_kernels_match_monte_carlo():
    # torch's attention, every parameter trained: NNGP and NTK of wide heads (two examples: each
    # sample's NTK costs a Jacobian per example and output unit)
    torch.manual_seed(1)
    x = torch.randn(2, 4, 64, dtype=torch.float64)
    model = Attention(64, 2).double()
    k = ntbridge.kernel(model, x)
    error = ntbridge.expectation_error(model, x)
    assert 0 < error < 0.02
    for get in ("nngp", "ntk"):
        est = ntbridge.monte_carlo(model, x, n_samples=32, get=get)
        _close(est, getattr(k, get), error)


@pytest.mark.slow
def test_text_classifier_nngp_matches_monte_carlo():
    torch.manual_seed(2)
    ids = torch.randint(0, 12, (3, 5))
    model = TextClassifier(vocab=12, d=128, length=5, heads=8).double().eval()
    analytic = ntbridge.nngp(model, ids)
    est = ntbridge.monte_carlo(model, ids, n_samples=100, get="nngp")
    _close(est, analytic, ntbridge.expectation_error(model, ids, get="nngp"))


@pytest.mark.slow
def test_expectation_error_shrinks_with_refinement():
    # the kernel's reported error falls at least at Monte-Carlo's order (x16 points: / 4), and the
    # coarse kernel lies within a few of its error bars of the refined one
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 4, 8)))
    stds = Stds(1.0, 1.0, 1.0, 1.0, None, None, None, None)
    layer = lambda points: stax.serial(SelfAttention(8, 1, stds, rule=stax.Rule(points, 8)))
    coarse, fine = layer(32), layer(512)
    error = lambda net: float(evaluate_error(net, x, None, ("nngp", "ntk")))
    coarse_error = error(coarse)  # once: each call compiles its program anew
    assert 0 < error(fine) < coarse_error / 4 * 1.5
    kernels = jax.jit(lambda a: [evaluate(net, a, None, ("nngp",))["nngp"]  # one program
                                 for net in (coarse, fine)])(x)
    scale = float(jnp.abs(kernels[1]).max())
    assert float(jnp.abs(kernels[0] - kernels[1]).max()) / scale < 5 * coarse_error


@pytest.mark.slow
def test_tiles_give_the_kernel_within_its_error_and_progress_moves_over_them():
    """Tiling (a batch_size, or progress=True, which tiles a numerical expectation in 4 row
    blocks) changes which pairs' estimates are transposes of others, not the kernel beyond its
    reported error; the off-diagonal tiles' pairs are the untiled kernel's own."""
    torch.manual_seed(3)
    x = torch.randn(8, 3, 8, dtype=torch.float64)
    model = Attention(8, 2).double()
    whole, info = ntbridge.kernel(model, x, return_info=True, progress=False)
    error = ntbridge.expectation_error(model, x)
    assert info.tiles == 1
    shown, info = ntbridge.kernel(model, x, return_info=True, progress=True)
    assert (info.tiles, info.tile) == (10, (2, 2))
    for get in ("nngp", "ntk"):
        a, b = getattr(whole, get), getattr(shown, get)
        assert (a - b).abs().max() / a.abs().max() < 5 * error
        torch.testing.assert_close(a[:2, 2:], b[:2, 2:], rtol=1e-12, atol=0)
    tiled = ntbridge.kernel(model, x, batch_size=3)
    assert ((tiled.ntk - whole.ntk).abs().max() / whole.ntk.abs().max()) < 5 * error
    dropped = nn.Sequential(model, nn.Dropout(0.2)).train()  # an example with itself: one tile
    assert ntbridge.kernel(dropped, x, return_info=True, progress=True)[1].tiles == 1


@pytest.mark.slow
def test_attention_points_set_the_error_of_the_expectation():
    torch.manual_seed(5)
    x = torch.randn(4, 3, 8, dtype=torch.float64)
    model = Attention(8, 2).double()
    coarse, fine = (ntbridge.ntk(model, x, attention_points=p) for p in (4, 64))
    errors_ = [ntbridge.expectation_error(model, x, attention_points=p) for p in (4, 64)]
    assert 0 < errors_[1] < errors_[0]
    assert 0 < (coarse - fine).abs().max() / fine.abs().max() < 5 * errors_[0]
    for bad in (0, 3, 2.0, True):
        with pytest.raises(errors.InputError, match="attention_points must be a power of 2"):
            ntbridge.ntk(model, x, attention_points=bad)


def test_expectation_terms_are_the_per_point_formulas():
    """The rule's sums over points (long matrix products, ``softmax_moments._chunk_terms``) equal
    each point's terms written out (float64, a causal mask): ``a Kv c^T`` and the NTK's ``a Tv c^T
    + sum_{u,u'} TG[t,t',u,u'] (J_a Kv J_c)[u,u']`` with the softmaxes' Jacobians ``J = diag(a_t)
    - a_t a_t^T`` and the logits' NTK ``TG = Tq Kk + Kq Tk``."""
    t, points = 3, 4
    rng = np.random.default_rng(0)
    psd = lambda n: (lambda a: a @ a.T / n)(rng.standard_normal((n, n + 2)))
    kv, tv, kq, kk, tq, tk = (rng.standard_normal((t, t)) for _ in range(6))
    z = rng.standard_normal((1, points, 2 * t, 2 * t))
    allowed = np.tril(np.ones((t, t), bool))
    with jax.enable_x64(True):
        lq, lk = (np.asarray(softmax_moments.psd_factor(jnp.asarray(psd(2 * t))))
                  for _ in range(2))
        blocks = softmax_moments.Blocks(*(jnp.asarray(a) for a in (
            lq[:t], lq[t:], lk[:t], lk[t:], kv, kq, kk, tq, tk, tv)))
        nngp, ntk = softmax_moments.pair_moments(blocks, jnp.asarray(z), allowed, allowed, 2)

    def softmax(g):
        e = np.where(allowed, np.exp(g - g.max(-1, keepdims=True)), 0)
        return e / e.sum(-1, keepdims=True)

    expected = np.zeros((2, t, t))
    for p in z[0]:
        a, c = softmax(lq[:t] @ p @ lk[:t].T), softmax(lq[t:] @ p @ lk[t:].T)
        expected[0] += a @ kv @ c.T / points
        jac = lambda w: np.diag(w) - np.outer(w, w)
        for i in range(t):
            for j in range(t):
                tg = tq[i, j] * kk + kq[i, j] * tk
                own = (jac(a[i]) @ kv @ jac(c[j]) * tg).sum()
                expected[1, i, j] += ((a @ tv @ c.T)[i, j] + own) / points
    np.testing.assert_allclose(np.stack([nngp, ntk]), expected, rtol=1e-12, atol=1e-12)


def test_a_logit_scale_is_the_queries_scaled():
    """Logits ``alpha q k^T / sqrt(d)`` are those of queries ``alpha q``: with the NTK
    parameterization (where a weight's std scales its own NTK term too) the layer's kernels equal
    those of ``W_q, b_q`` times ``alpha``, exactly; the forward pass likewise."""
    x = np.random.default_rng(0).standard_normal((3, 4, 8))
    stds = Stds(0.8, 1.1, 0.9, 1.0, 0.2, 0.1, 0.3, 0.1)
    layer = lambda s, scale: SelfAttention(8, 2, s, parameterization="ntk", logit_scale=scale,
                                           rule=stax.Rule(8, 2))
    scaled = layer(stds, 1.5)
    queries = layer(stds._replace(W_q=1.5 * stds.W_q, b_q=1.5 * stds.b_q), 1.0)
    with jax.enable_x64(True):
        x = jnp.asarray(x)
        got, expected = jax.jit(lambda a: [evaluate(stax.serial(net), a, None, ("nngp", "ntk"))
                                           for net in (scaled, queries)])(x)  # one program
        for get in ("nngp", "ntk"):  # the logits' factors (an example with itself: singular
            # covariances, made definite by a 1e-10 ramp) amplify the rounding of 1.5**2 * K
            np.testing.assert_allclose(got[get], expected[get], rtol=1e-9)
        params = scaled.init_fn(jax.random.key(0), x.shape)[1]
        params_q = dict(params, in_proj_weight=params["in_proj_weight"].at[:8].multiply(1.5),
                        in_proj_bias=params["in_proj_bias"].at[:8].multiply(1.5))
        np.testing.assert_allclose(scaled.apply_fn(params, x), queries.apply_fn(params_q, x),
                                   rtol=1e-12, atol=1e-12)
    with pytest.raises(errors.UnsupportedLayerError, match="linear_scaling"):
        SelfAttention(8, 2, stds, linear_scaling=True, logit_scale=2.0)


def test_attention_programs_call_no_library_routines():
    # XLA's CPU runtime runs independent library calls side by side, and a batched LAPACK call
    # waits on its worker thread for work queued on the same threads: two of them deadlocked the
    # kernel of 64 sequences. The program must be XLA's own operations only (the PSD factors of
    # the logits' covariances included).
    x = jnp.asarray(np.random.default_rng(0).standard_normal((3, 4, 8)))
    stds = Stds(1.0, 1.0, 1.0, 1.0, None, None, None, None)
    net = stax.serial(SelfAttention(8, 2, stds, rule=stax.Rule(16, 2)), stax.Relu(),
                      SelfAttention(8, 2, stds, rule=stax.Rule(16, 2)))
    text = jax.jit(lambda a: evaluate(net, a, None, ("nngp", "ntk"))).lower(x).compile().as_text()
    assert "custom-call" not in text


def test_causal_first_token_is_exact():
    # with a causal mask, token 0 sees only itself: probability 1, whatever the logits, so its
    # kernel is the values' own, exactly as for sequences of length 1
    torch.manual_seed(3)
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    mask = nn.Transformer.generate_square_subsequent_mask(5, dtype=torch.float64)
    long = ntbridge.kernel(Attention(8, 2, mask=mask).double(), x)
    short = ntbridge.kernel(Attention(8, 2).double(), x[:, :1])
    for name in ("nngp", "ntk"):
        torch.testing.assert_close(getattr(long, name)[:, :, 0, 0], getattr(short, name)[:, :, 0, 0])


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["softmax", "linear"])
def test_a_padded_batch_gives_the_kernels_of_its_sequences(attention):
    # each sequence's token pairs in the padded batch: as computed for its length alone (the
    # softmax rule's points differ with the length: within both estimates' error bars; the
    # linear variant is exact: its error, 0 (test_linear_scaling_is_deterministic_attention), is
    # not computed); independent layers (the copies of one layer cost twice the time). Four long
    # sequences alone, the first two of them in the padded batch: one shape, one kernel program
    # and one error program for both
    torch.manual_seed(5)
    model = Padded().double().eval()
    short = torch.tensor([[3, 4, 5], [7, 8, 9]])
    long = torch.tensor([[1, 2, 3, 4, 5], [6, 5, 4, 3, 2], [2, 4, 6, 8, 10], [9, 7, 5, 3, 1]])
    batch = torch.cat([nn.functional.pad(short, (0, 2)), long[:2]])
    rule = dict(attention=attention, shared_weights="independent")
    error_of = lambda ids: (0.0 if attention == "linear"
                            else ntbridge.expectation_error(model, ids, **rule))
    padded, error = ntbridge.kernel(model, batch, **rule), error_of(batch)
    for ids, rows in ((short, slice(0, 2)), (long, slice(2, 4))):
        alone = ntbridge.kernel(model, ids, **rule)
        both = error + error_of(ids)
        t = ids.shape[1]
        for name in ("nngp", "ntk"):
            got, want = getattr(padded, name)[rows, rows, :t, :t], getattr(alone, name)[:2, :2]
            scale = want.abs().max()
            assert ((got - want).abs().max() / scale).item() <= (5 * both if both else 1e-12)


def test_padding_ids_contribute_nothing():
    # Embedding(padding_idx): padded tokens have zero embeddings, so their kernel entries are 0;
    # W_std**2 [id == id'] otherwise (torch's N(0, 1) init), for every pair of tokens
    model = nn.Sequential(nn.Embedding(10, 16, padding_idx=0))
    ids = torch.tensor([[0, 3, 5], [0, 3, 4]])
    k = ntbridge.kernel(model, ids)  # (2, 2, 3, 3): token pairs
    assert k.nngp[0, 1].tolist() == [[0, 0, 0], [0, 1, 0], [0, 0, 0]]
    assert k.nngp[0, 0].tolist() == [[0, 0, 0], [0, 1, 0], [0, 0, 1]]
    assert k.ntk[0, 1].tolist() == k.nngp[0, 1].tolist()


def test_exact_rules_report_no_error():
    # a ReLU network's rules are exact, though ReLU could sample (after a layer that is not
    # Gaussian): its replicates are equal, and float32's rounding of their mean is no error
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1))
    assert ntbridge.expectation_error(model, torch.randn(4, 3)) == 0.0


def test_linear_scaling_is_deterministic_attention(monkeypatch):
    # the tied, 1/d variant: closed form, no numerical error (expectation_error builds no
    # program); its NNGP is that of the values weighted by softmax(sq^2 K_nn) (checked by hand on
    # two examples)
    torch.manual_seed(4)
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    model = Attention(8, 2, bias=False).double()
    k = ntbridge.nngp(model, x, attention="linear")
    built = []
    monkeypatch.setattr(ntbridge.programs, "compile", lambda *a, **k: built.append(a))
    assert ntbridge.expectation_error(model, x, attention="linear") == 0.0
    assert built == []
    kx = torch.einsum("ntc,msc->nmts", x, x) / 8
    a = torch.softmax(0.5 * torch.stack([kx[0, 0], kx[1, 1]]), -1)
    expected = torch.einsum("ts,sr,ur->tu", a[0], 0.5 * kx[0, 1], a[1]) / 3
    torch.testing.assert_close(k[0, 1], expected)


@pytest.mark.parametrize("tokens", [1, 3, 33])
def test_sandwich_weighs_each_pair_by_its_two_examples(tokens):
    """sandwich(a1, c, a2)[n, m] = a1[n] c[n, m] a2[m]^T, each pair with its own examples."""
    rng = np.random.default_rng(0)
    a1, a2 = rng.standard_normal((2, tokens, tokens)), rng.standard_normal((3, tokens, tokens))
    c = rng.standard_normal((2, 3, tokens, tokens))
    with jax.enable_x64(True):
        out = np.asarray(sandwich(a1, c, a2))
    for n in range(2):
        for m in range(3):
            np.testing.assert_allclose(out[n, m], a1[n] @ c[n, m] @ a2[m].T, rtol=1e-12,
                                       atol=1e-12)


def test_bad_transformer_inputs_are_named():
    x = torch.randn(2, 3, 8)

    class Cross(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

        def forward(self, x):
            return self.attn(x, 2 * x, 2 * x)[0]

    class Weights(Cross):
        def forward(self, x):
            out, w = self.attn(x, x, x)
            return out + w.sum()

    with pytest.raises(errors.UnsupportedLayerError, match="cross-attention"):
        ntbridge.ntk(Cross(), x)
    with pytest.raises(errors.UnsupportedLayerError, match="attention weights"):
        ntbridge.ntk(Weights(), x)
    bias_kv = Attention(8, 2)
    bias_kv.attn = nn.MultiheadAttention(8, 2, add_bias_kv=True, batch_first=True)
    with pytest.raises(errors.UnsupportedLayerError, match="add_bias_kv"):
        ntbridge.ntk(bias_kv, x)
    with pytest.raises(errors.UnsupportedLayerError, match=r"attn_mask must be one \(T, T\)"):
        ntbridge.ntk(Attention(8, 2, mask=torch.zeros(4, 3, 3)), x)
    class Buffered(Cross):  # a fixed per-example padding mask: it cannot follow the examples
        def __init__(self):
            super().__init__()
            self.register_buffer("pad", torch.zeros(2, 3, dtype=torch.bool))

        def forward(self, x):
            return self.attn(x, x, x, key_padding_mask=self.pad)[0]

    with pytest.raises(errors.UnsupportedLayerError, match=r"key_padding_mask=\(ids == pad_id\)"):
        ntbridge.ntk(Buffered(), x)
    ids = torch.ones(2, 6, dtype=torch.long)
    with pytest.raises(errors.UnsupportedLayerError, match=r"batch_first=False but gets "
                                                          r"sequences \(N, T, E\)"):
        ntbridge.ntk(Encoder(batch_first=False, transpose=False).eval(), ids)
    with pytest.raises(errors.UnsupportedLayerError, match=r"acts on a time-major sequence"):
        ntbridge.ntk(Encoder(batch_first=False, pool="flatten").eval(), ids)
    with pytest.raises(errors.ShapeError, match=r"pad them to one length and mask"):
        ntbridge.ntk(TextClassifier().eval(), torch.ones(2, 6, dtype=torch.long),
                     torch.ones(2, 5, dtype=torch.long))
    with pytest.raises(errors.InputError, match=r"outside the range \[0, 40\)"):
        ntbridge.ntk(TextClassifier().eval(), torch.tensor([[1, 2, 3, 4, 5, 40]]))
    with pytest.raises(errors.InputTypeError, match="nn.Embedding"):
        ntbridge.ntk(nn.Sequential(nn.Linear(3, 2)), torch.ones(2, 3, dtype=torch.long))


@pytest.mark.slow
def test_per_token_layers_without_attention_act_on_each_token():
    """nn.Linear reads sequences (N, T, d) features last, as torch applies it: the kernel of a
    per-token MLP is, token by token, the MLP's kernel of that token's vectors (exactly: the same
    rule on the same numbers), and a Flatten head averages it over the tokens."""
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 32), nn.GELU(),
                        nn.Linear(32, 1)).double()
    x, y = torch.randn(5, 4, 6, dtype=torch.float64), torch.randn(3, 4, 6, dtype=torch.float64)
    tokens = ntbridge.kernel(mlp, x, y)  # (N1, N2, T): each token with the same token
    assert tokens.ntk.shape == (5, 3, 4)
    for t in range(4):
        k = ntbridge.kernel(mlp, x[:, t], y[:, t])
        torch.testing.assert_close(tokens.nngp[..., t], k.nngp, rtol=1e-13, atol=0)
        torch.testing.assert_close(tokens.ntk[..., t], k.ntk, rtol=1e-13, atol=0)
    flat = nn.Sequential(mlp[:4], nn.Flatten(), nn.Linear(4 * 32, 1, bias=False)).double()
    per_token = nn.Sequential(mlp[:4], nn.Linear(32, 1, bias=False)).double()
    torch.testing.assert_close(ntbridge.nngp(flat, x, y),
                               ntbridge.nngp(per_token, x, y).mean(-1), rtol=1e-13, atol=0)

    with pytest.raises(errors.UnsupportedLayerError, match=r"when it takes the model's input"):
        ntbridge.ntk(nn.Sequential(nn.Dropout(0.1), mlp).eval(), x)  # read channels first


class SlicedPositions(TextClassifier):
    """Positions of up to ``length`` tokens, added as torch code writes them for shorter
    sequences: ``pos[:T]``, ``pos[None, :T]`` (2-d ``pos``), ``pos[:, :T, :]`` (``(1, L, d)``),
    ``pos[None]``, ``pos.unsqueeze(0)``."""

    def __init__(self, view, length=9):
        super().__init__(length=length)
        self.view = view
        if view == "batched":
            self.pos = nn.Parameter(self.pos.detach()[None])

    def forward(self, ids):
        t = ids.shape[1]
        pos = {"rows": lambda: self.pos[:t], "none rows": lambda: self.pos[None, :t],
               "batched": lambda: self.pos[:, :t, :], "none": lambda: self.pos[None],
               "unsqueeze": lambda: self.pos.unsqueeze(0)}[self.view]()
        return self.head(self.enc(self.emb(ids) + pos).mean(1))


@pytest.mark.slow
@pytest.mark.parametrize("view", ["rows", "none rows", "batched", "none", "unsqueeze"])
def test_positions_sliced_to_the_sequence(view):
    """A positional embedding longer than the sequences, sliced in forward: torch's forward, and
    the kernel of a model whose positions are the first T rows (their variance, read from the
    values, set to the whole parameter's): the same to rounding."""
    torch.manual_seed(0)
    length = 6 if view in ("none", "unsqueeze") else 9  # views of the whole parameter: T = L
    model = SlicedPositions(view, length).double().eval()
    ids = torch.randint(0, 40, (3, 6))
    _assert_float64_forward(model, ids)
    reference = TextClassifier().double().eval()
    reference.load_state_dict({**model.state_dict(), "pos": torch.zeros(6, 32)}, strict=False)
    rows = model.pos.detach().reshape(-1, 32)
    rms = lambda p: p.pow(2).mean().sqrt()
    reference.pos = nn.Parameter(rows[:6] * rms(rows) / rms(rows[:6]))
    for got, expected in zip(ntbridge.kernel(model, ids, attention="linear"),
                             ntbridge.kernel(reference, ids, attention="linear")):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=0)


class EmbeddedPositions(TextClassifier):
    """Positions embedded by an ``nn.Embedding`` of ``torch.arange(T)``, as GPT-style code writes
    them: with the ids' device, ``arange(0, T, dtype=...)``, ``.unsqueeze(0)``, an int ``T``."""

    def __init__(self, form, padding_idx=None):
        super().__init__(length=9)
        self.pos, self.form = None, form
        self.wpe = nn.Embedding(9, 32, padding_idx=padding_idx)

    def forward(self, ids):
        t = ids.shape[1]
        positions = {"device": lambda: torch.arange(t, device=ids.device),
                     "dtype": lambda: torch.arange(0, t, dtype=torch.long, device=ids.device),
                     "unsqueeze": lambda: torch.arange(ids.size(1)).unsqueeze(0),
                     "int": lambda: torch.arange(6)}[self.form]()
        return self.head(self.enc(self.emb(ids) + self.wpe(positions)).mean(1))


@pytest.mark.slow
@pytest.mark.parametrize("form", ["device", "dtype", "unsqueeze", "int"])
def test_positions_embedded_from_arange(form):
    """``x + self.wpe(torch.arange(T))`` adds the embedding's first T rows: torch's forward, and,
    its variance that of torch's N(0, 1) init (whatever the weights hold, as for token
    embeddings), the kernels of the model whose positions parameter has variance 1: the same to
    rounding."""
    torch.manual_seed(0)
    model = EmbeddedPositions(form).double().eval()
    with torch.no_grad():
        model.wpe.weight *= 0.5  # not the init's variance: the kernel must not read it
    ids = torch.randint(0, 40, (3, 6))
    _assert_float64_forward(model, ids)
    reference = SlicedPositions("rows").double().eval()
    rows = model.wpe.weight.detach()
    reference.load_state_dict({**model.state_dict(), "pos": rows / rows.pow(2).mean().sqrt()},
                              strict=False)
    for got, expected in zip(ntbridge.kernel(model, ids), ntbridge.kernel(reference, ids)):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=0)


def test_embedded_positions_refuse_padding():
    """A positions embedding with a padding row has no rule: refused by the module's name."""
    with pytest.raises(errors.UnsupportedLayerError, match="'wpe'.*padding_idx"):
        ntbridge.nngp(EmbeddedPositions("device", padding_idx=0), torch.randint(0, 40, (2, 6)))


class Joined(nn.Module):
    """Attention and a per-token Linear of the same sequences, concatenated along ``dim``."""

    def __init__(self, dim):
        super().__init__()
        self.attn, self.proj, self.dim = Attention(8, 2), nn.Linear(8, 8), dim

    def forward(self, x):
        return torch.cat([self.attn(x), self.proj(x)], dim=self.dim)


@pytest.mark.parametrize("dim", [1, 2, -1])
def test_sequences_concatenate_along_tokens_or_features(dim):
    """torch.cat of sequences (N, T, d): along the features (dim 2 or -1) the channel-weighted
    average of the branches' kernels, along the tokens (dim 1) each branch's kernel on its own
    tokens and zero across (the branches end in independent Linear layers)."""
    torch.manual_seed(0)
    model = Joined(dim).double()
    x, y = torch.randn(3, 4, 8, dtype=torch.float64), torch.randn(2, 4, 8, dtype=torch.float64)
    kernel = lambda m: ntbridge.nngp(m, x, y, attention="linear")
    a = kernel(model.attn)  # (3, 2, 4, 4)
    # the Linear's NNGP of every token pair, torch's init: W_std^2 = 1/3, b_std^2 = 1/(3 * 8)
    b = torch.einsum("ntd,msd->nmts", x, y) / (3 * 8) + 1 / 24
    if dim == 1:
        expected = torch.zeros(3, 2, 8, 8, dtype=torch.float64)
        expected[..., :4, :4], expected[..., 4:, 4:] = a, b
    else:
        expected = (a + b) / 2
    torch.testing.assert_close(kernel(model), expected, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("layer", [nn.Conv1d(4, 2, 3), nn.ConvTranspose1d(4, 2, 3),
                                   nn.AvgPool1d(2), nn.AdaptiveAvgPool1d(1),
                                   nn.BatchNorm1d(4).eval(), nn.Upsample(scale_factor=2),
                                   nn.Unflatten(2, (2, 4))], ids=lambda m: type(m).__name__)
@pytest.mark.parametrize("before", ["attention", "Linear"])
def test_channels_first_layers_refuse_sequences(layer, before):
    """After attention or a per-token Linear, a layer torch applies channels first (its channels
    the tokens) has no kernel rule: refused by name, not computed on the wrong axes."""
    first = Attention(8, 2) if before == "attention" else nn.Linear(8, 8)
    with pytest.raises(errors.UnsupportedLayerError,
                       match=rf"module 1 '1' \({type(layer).__name__}\): its input here is a "
                             rf"sequence \(N, T, d\), features last"):
        ntbridge.ntk(nn.Sequential(first, layer), torch.randn(3, 4, 8), attention="linear")
    conv_first = nn.Sequential(nn.Conv1d(4, 6, 3), nn.ReLU(), nn.Flatten(), nn.Linear(36, 1))
    assert ntbridge.ntk(conv_first, torch.randn(3, 4, 8)).shape == (3, 3)  # channels first


class PatchEncoder(nn.Module):
    """A small ViT: 4 x 4 patches embedded by a strided Conv2d (``patches=False``: the model's
    inputs are the flattened patches, embedded by the same weights as a Linear), a class token,
    learned positions, an encoder layer, the class token's output through a Linear."""

    def __init__(self, patches: bool):
        super().__init__()
        self.patches, self.embed = patches, nn.Conv2d(3, 16, 4, stride=4)
        self.linear = nn.Linear(48, 16)
        self.cls = nn.Parameter(torch.randn(1, 1, 16))
        self.pos = nn.Parameter(0.5 * torch.randn(5, 16))
        self.enc = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        h = self.linear(x) if self.patches else self.embed(x).flatten(2).transpose(1, 2)
        h = torch.cat([self.cls.expand(x.shape[0], -1, -1), h], dim=1)
        return self.head(self.enc(h + self.pos)[:, 0])


def _patches(x, p=4):
    """Images (N, C, H, W) as their p x p patches (N, H W / p^2, C p^2), row-major, each patch
    flattened as a Conv2d's weight (channel, row, column)."""
    n, c = x.shape[:2]
    return x.unfold(2, p, p).unfold(3, p, p).permute(0, 2, 3, 1, 4, 5).reshape(n, -1, c * p * p)


@pytest.mark.slow
def test_image_patches_become_tokens():
    """``conv(x).flatten(2).transpose(1, 2)`` makes the patches' positions tokens (a ViT, with a
    class token): the kernels of the model fed the flattened patches, embedded by a Linear (the
    same weights and init), to rounding; and ``transpose(1, 2)`` around a 1x1 Conv1d over tokens
    is a per-token Linear."""
    torch.manual_seed(0)
    images, vit = torch.randn(3, 3, 8, 8, dtype=torch.float64), PatchEncoder(False).double().eval()
    flat = PatchEncoder(True).double().eval()
    flat.load_state_dict({**vit.state_dict(), "linear.weight": vit.embed.weight.reshape(16, 48),
                          "linear.bias": vit.embed.bias})
    torch.testing.assert_close(vit(images), flat(_patches(images)), rtol=1e-12, atol=1e-12)
    for got, expected in zip(ntbridge.kernel(vit, images, attention="linear"),
                             ntbridge.kernel(flat, _patches(images), attention="linear")):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=0)
    over_tokens = nn.Sequential(Attention(8, 2), Swapped(nn.Conv1d(8, 8, 1)))
    per_token = nn.Sequential(Attention(8, 2), nn.Linear(8, 8))
    x = torch.randn(3, 4, 8, dtype=torch.float64)
    for got, expected in zip(ntbridge.kernel(over_tokens.double(), x, attention="linear"),
                             ntbridge.kernel(per_token.double(), x, attention="linear")):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=0)


class ClassToken(nn.Module):
    """A learned class token joining attention's tokens: ``torch.cat([cls, h], dim=1)``, the token
    made by ``expand`` or ``repeat``."""

    def __init__(self, repeat=False):
        super().__init__()
        self.attn, self.repeat = Attention(8, 2), repeat
        self.cls = nn.Parameter(0.3 * torch.randn(1, 1, 8))

    def forward(self, x):
        n = x.shape[0]
        cls = self.cls.repeat(n, 1, 1) if self.repeat else self.cls.expand(n, -1, -1)
        return torch.cat([cls, self.attn(x)], dim=1)


@pytest.mark.parametrize("repeat", [False, True])
@pytest.mark.parametrize("parameterization", ["standard", "ntk"])
def test_a_class_token_is_one_vector_for_every_example(repeat, parameterization):
    """The token's kernel is its variance (read from the values) for every pair of examples, its
    NTK 1 (NTK parameterization: the variance), zero with the other tokens, whose kernels are
    attention's alone; torch's forward to rounding."""
    torch.manual_seed(0)
    model = ClassToken(repeat).double()
    x, y = torch.randn(3, 4, 8, dtype=torch.float64), torch.randn(2, 4, 8, dtype=torch.float64)
    _assert_float64_forward(model, x)
    got = ntbridge.kernel(model, x, y, attention="linear", parameterization=parameterization)
    alone = ntbridge.kernel(model.attn, x, y, attention="linear", parameterization=parameterization)
    var = model.cls.detach().pow(2).mean()
    for k, a, own in ((got.nngp, alone.nngp, var), (got.ntk, alone.ntk,
                                                     var if parameterization == "ntk" else 1.0)):
        assert k.shape == (3, 2, 5, 5)
        torch.testing.assert_close(k[..., 0, 0], torch.full((3, 2), float(own), dtype=k.dtype),
                                   rtol=1e-14, atol=0)
        assert (k[..., 0, 1:] == 0).all() and (k[..., 1:, 0] == 0).all()
        torch.testing.assert_close(k[..., 1:, 1:], a, rtol=1e-14, atol=0)


@pytest.mark.slow
def test_class_token_rows_against_monte_carlo():
    """Fresh initialisations of the model (the token drawn with its variance): the class token's
    rows of the empirical NNGP, its variance with itself and 0 with the other tokens, hold at any
    width, within 5 standard errors of the samples; those of the empirical NTK exactly."""
    torch.manual_seed(0)
    model, x = ClassToken().double(), torch.randn(3, 4, 8, dtype=torch.float64)
    analytic = ntbridge.kernel(model, x, attention="linear")
    for get in ("nngp", "ntk"):
        estimate = ntbridge.monte_carlo(model, x, n_samples=64, get=get, seed=1)
        rows = lambda k: torch.cat([k[..., 0, :], k[..., 1:, 0]], -1)
        error, se = (rows(estimate.mean) - rows(getattr(analytic, get))).abs(), rows(
            estimate.standard_error)
        assert (error <= 5 * se + 1e-12).all(), (get, error.max(), se.max())


class Swapped(nn.Module):
    """``layer`` applied channels first to a sequence:
    ``layer(h.transpose(1, 2)).transpose(1, 2)``."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, h):
        return self.layer(h.transpose(1, 2)).transpose(1, 2)


@pytest.mark.parametrize("fn,message", [
    (lambda x: x.transpose(1, 2), r"transpose\(1, 2\) of outputs \(3, 2, 4, 4\)"),
    (lambda x: x.transpose(2, 3), r"transpose\(2, 3\): only transpose\(1, 2\)"),
    (lambda x: x.permute(0, 2, 1, 3), r"permute\(0, 2, 1, 3\): only permute\(0, 2, 1\)"),
])
def test_other_transposes_are_refused(fn, message):
    class M(nn.Module):
        def forward(self, x):
            return fn(x).flatten(1)

    with pytest.raises(errors.UnsupportedLayerError, match=message):
        ntbridge.nngp(M(), torch.randn(3, 2, 4, 4))


@pytest.mark.slow
def test_gradients_of_the_kernel_are_those_of_its_estimate():
    # d/dx of the softmax attention's NTK (fixed rule points: a smooth function of x) against
    # central differences, for x1 = x2 (examples paired with themselves) and for two inputs
    torch.manual_seed(6)
    model = Attention(8, 2).double()
    for x2 in (None, torch.randn(2, 4, 8, dtype=torch.float64)):
        x = torch.randn(3, 4, 8, dtype=torch.float64, requires_grad=True)
        w = torch.randn(3, 3 if x2 is None else 2, 4, 4, dtype=torch.float64)
        f = lambda x: (ntbridge.ntk(model, x, x2) * w).sum()
        f(x).backward()
        d, h = torch.randn_like(x), 1e-5
        with torch.no_grad():
            fd = (f(x + h * d) - f(x - h * d)) / (2 * h)
        assert torch.isfinite(x.grad).all()
        assert abs((x.grad * d).sum() - fd) <= 1e-6 * abs(fd)


PROCESS = textwrap.dedent("""
    import sys, torch, ntbridge
    from torch import nn
    torch.manual_seed(0)
    attn = nn.MultiheadAttention(8, 2, batch_first=True).double()

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = attn

        def forward(self, x):
            return self.attn(x, x, x, need_weights=False)[0]

    torch.save(ntbridge.ntk(Model(), torch.randn(3, 4, 8, dtype=torch.float64)), sys.argv[1])
""")


@pytest.mark.slow
def test_a_second_process_runs_the_attention_program_from_disk(tmp_path, monkeypatch):
    # a fresh process runs the program this one compiled (the same script, run here first with
    # the in-memory programs set aside, into an empty cache directory): it gets the same kernels
    # and leaves the directory's entries as they were (it compiled none again)
    cache = tmp_path / "cache"
    monkeypatch.setenv("NTBRIDGE_CACHE_DIR", str(cache))
    monkeypatch.setattr(programs, "_ENTRIES", collections.OrderedDict())
    monkeypatch.setattr(sys, "argv", ["-c", str(tmp_path / "a.pt")])
    exec(PROCESS, {"__name__": "first"})
    entries = lambda: {path.name: path.stat().st_mtime_ns for path in cache.iterdir()}
    stored = entries()
    assert stored
    done = subprocess.run([sys.executable, "-c", PROCESS, str(tmp_path / "b.pt")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert entries() == stored
    assert torch.equal(torch.load(tmp_path / "a.pt"), torch.load(tmp_path / "b.pt"))


class TokenMeanHead(nn.Module):
    """``head(relu(l1(x)).mean(1))`` (or ``.sum(1)``) on sequences ``(N, T, d)``."""

    def __init__(self, d: int, width: int, reduce: str):
        super().__init__()
        self.l1, self.head, self.reduce = nn.Linear(d, width), nn.Linear(width, 1), reduce

    def forward(self, x):
        return self.head(getattr(torch.relu(self.l1(x)), self.reduce)(1))


def _relu_mean_head_kernels(x1, x2, width, W, b, scale):
    """NNGP and NTK of :class:`TokenMeanHead` (torch's parameterization, every ``W_std = W`` and
    ``b_std = b``), in float64 numpy: the per-token-pair ReLU kernel of the first layer's
    outputs (the arc-cosine formula), averaged over token pairs (times ``scale``: T**2 for a sum),
    then the head's affine map."""
    x1, x2 = x1.numpy(), x2.numpy()
    d = x1.shape[-1]
    dot = lambda a, c: np.einsum("atd,bsd->abts", a, c) / d  # (N1, N2, T1, T2)
    k0, q1, q2 = dot(x1, x2), np.einsum("atd,atd->at", x1, x1) / d, np.einsum("btd,btd->bt", x2, x2) / d
    k1 = W ** 2 * k0 + b ** 2
    v1, v2 = W ** 2 * q1 + b ** 2, W ** 2 * q2 + b ** 2
    norms = np.sqrt(v1[:, None, :, None] * v2[None, :, None, :])
    theta = np.arccos(np.clip(k1 / norms, -1, 1))
    relu = norms * (np.sin(theta) + (np.pi - theta) * np.cos(theta)) / (2 * np.pi)
    relu_dot = (np.pi - theta) / (2 * np.pi)
    ntk1 = d * k0 + 1  # the first layer's weights and bias
    k2, t2 = scale * relu.mean((2, 3)), scale * (relu_dot * ntk1).mean((2, 3))
    return W ** 2 * k2 + b ** 2, width * k2 + 1 + W ** 2 * t2


@pytest.mark.parametrize("reduce, scale", [("mean", 1), ("sum", 16)])
def test_per_token_layers_then_a_mean_over_tokens(reduce, scale):
    """A mean (or sum) over tokens ahead makes the per-token layers before it keep every pair of
    tokens: the kernel of Dense-ReLU-mean is the mean over token pairs of the pair's ReLU kernel."""
    torch.manual_seed(0)
    model = TokenMeanHead(3, 16, reduce).double()
    x1, x2 = torch.randn(4, 4, 3, dtype=torch.float64), torch.randn(3, 4, 3, dtype=torch.float64)
    got = ntbridge.kernel(model, x1, x2, W_std=1.3, b_std=0.4)
    nngp, ntk = _relu_mean_head_kernels(x1, x2, 16, 1.3, 0.4, scale)
    np.testing.assert_allclose(got.nngp.numpy(), nngp, rtol=1e-12, atol=0)
    np.testing.assert_allclose(got.ntk.numpy(), ntk, rtol=1e-12, atol=0)
