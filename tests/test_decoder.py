"""Models of two sequences, ``forward(x, memory)``: torch's decoders and ``nn.Transformer``, whose
cross-attention reads the queries from one sequence and the keys and values from the other."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functional_call, jacrev

import ntbridge
from ntbridge import errors, stax
from ntbridge.converters.sequence_pair import pack_sequences, sequence_features
from ntbridge.dlpack import to_jax
from ntbridge.stax.covariances import evaluate

from montecarlo import fresh_kernels, standard_error, z_scores

D = 16


class Decoder(nn.Module):
    """Sequences of 5 and 3 features embedded to ``d`` and decoded (queries from ``x``)."""

    def __init__(self, d=D, heads=2, norm_first=False, layers=1):
        super().__init__()
        self.ex, self.em = nn.Linear(5, d), nn.Linear(3, d)
        layer = nn.TransformerDecoderLayer(d, heads, d, dropout=0.0, batch_first=True,
                                           norm_first=norm_first)
        self.dec = layer if layers == 1 else nn.TransformerDecoder(layer, layers)

    def forward(self, x, memory):
        return self.dec(self.ex(x), self.em(memory))


class Seq2Seq(nn.Module):
    """``nn.Transformer`` on embedded sequences, with a causal mask of the target."""

    def __init__(self):
        super().__init__()
        self.es, self.et = nn.Linear(5, D), nn.Linear(5, D)
        self.tr = nn.Transformer(D, 2, 2, 2, 32, dropout=0.0, batch_first=True)
        # the target (the pair's second sequence) has 4 tokens
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(4))

    def forward(self, src, tgt):
        return self.tr(self.es(src), self.et(tgt), tgt_mask=self.mask, tgt_is_causal=True)


def pair(n=3, t=3, s=4, features=(5, 3), seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, t, features[0], generator=g, dtype=torch.float64),
            torch.randn(n, s, features[1], generator=g, dtype=torch.float64))


def independent_layers(module: nn.TransformerDecoder) -> nn.TransformerDecoder:
    for layer in module.layers:
        for p in layer.parameters():
            nn.init.normal_(p, std=p.shape[-1] ** -0.5)
    return module


MODELS = {
    "decoder layer": (lambda: nn.TransformerDecoderLayer(D, 2, 32, dropout=0.0,
                                                         batch_first=True), (D, D)),
    "pre-norm decoder layer": (lambda: nn.TransformerDecoderLayer(
        D, 2, 32, dropout=0.0, batch_first=True, norm_first=True), (D, D)),
    "decoder stack": (lambda: independent_layers(nn.TransformerDecoder(
        nn.TransformerDecoderLayer(D, 2, 32, dropout=0.0, batch_first=True), 2,
        norm=nn.LayerNorm(D))), (D, D)),
    "embedded decoder": (lambda: Decoder(), (5, 3)),
    "nn.Transformer": (lambda: Seq2Seq(), (5, 5)),
}


@pytest.mark.parametrize("name", MODELS)
def test_the_converted_forward_is_the_models(name):
    build, features = MODELS[name]
    torch.manual_seed(0)
    model = build().double().eval()
    x, memory = pair(features=features)
    graph = ntbridge.convert(model)
    assert sequence_features(graph) == features
    with jax.enable_x64(True):
        y = graph.apply_fn(graph.params, to_jax(pack_sequences((x, memory), "x1", features)))
    np.testing.assert_allclose(np.asarray(y), model(x, memory).detach().numpy(), atol=1e-12)


@pytest.mark.slow
def test_cross_attention_on_one_sequence_is_self_attention():
    # memory = x: the rule reads the same kernel for queries and for keys and values, as
    # self-attention's, up to rounding (float64, a causal mask, biases, NTK parameterization)
    stds = stax.Stds(0.9, 1.1, 0.8, 1.0, 0.1, 0.2, 0.3, 0.1)
    mask = jnp.asarray(np.triu(np.full((4, 4), -np.inf), 1))
    rule = stax.Rule(8, 2)
    own = stax.serial(stax.SelfAttention(8, 2, stds, rule=rule, mask=mask,
                                         parameterization="ntk"))
    cross = stax.dag([stax.SequencePair((8, 8), 0), stax.SequencePair((8, 8), 1),
                      stax.CrossAttention(8, 2, stds, rule=rule, mask=mask,
                                          parameterization="ntk")],
                     [(stax.INPUT,), (stax.INPUT,), (0, 1)])
    with jax.enable_x64(True):
        x = jnp.asarray(np.random.default_rng(0).standard_normal((3, 4, 8)))
        packed = stax.pack_pair(x, x)
        a, b = ({k: np.asarray(v) for k, v in evaluate(net, inputs, None, ("nngp", "ntk")).items()}
                for net, inputs in ((own, x), (cross, packed)))
        _, params = own.init_fn(jax.random.key(0), x.shape)
        np.testing.assert_allclose(cross.apply_fn(({}, {}, params[0]), packed),
                                   own.apply_fn(params, x), atol=1e-13)
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-10, atol=1e-10 * abs(a[name]).max())


@pytest.mark.slow
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_a_decoder_matches_fresh_wide_models(norm_first):
    # 128 channels in 8 heads: the mean of 32 fresh models' empirical NNGP and NTK (every pair of
    # target tokens) within 5 standard errors of the kernel; with the memory scaled by 1.5 in the
    # kernel alone, the NTK lies 22 (post-norm) and 27 (pre-norm) standard errors off (the test
    # can fail)
    x = pair()
    nngps, ntks = fresh_kernels(lambda: Decoder(128, 8, norm_first).eval(), x, 32, seed=100)
    k = ntbridge.kernel(Decoder(128, 8, norm_first).double().eval(), x)
    for get, samples in (("nngp", nngps), ("ntk", ntks)):
        exact = getattr(k, get)
        assert standard_error(samples).max() < 0.03 * exact.abs().max(), get
        assert z_scores(samples, exact).max() < 5, get


@pytest.mark.slow
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_cloned_decoder_layers_match_fresh_wide_models(norm_first):
    # nn.TransformerDecoder(layer, 2) as torch builds it (its layers deep copies of one) at width
    # 128: the mean kernels of 24 fresh models lie within 5 combined standard errors (the samples'
    # and the attention rule's own) of the kernel of copies, and not of independent layers'
    # (measured max z, NNGP and NTK: 3.2 and 3.5 post-norm, 3.6 and 3.1 pre-norm; independent:
    # 8.9 and 16, 12 and 2.8)
    x = pair()
    samples = fresh_kernels(lambda: Decoder(128, 8, norm_first, layers=2).eval(), x, 24, seed=100)
    model = Decoder(128, 8, norm_first, layers=2).double().eval()
    error = ntbridge.expectation_error(model, x)
    worst = {sharing: max(z_scores(s, getattr(ntbridge.kernel(model, x, shared_weights=sharing),
                                              get), error).max().item()
                          for get, s in zip(("nngp", "ntk"), samples))
             for sharing in ("auto", "independent")}
    assert worst["auto"] < 5 < worst["independent"], worst


@pytest.mark.slow
def test_the_empirical_ntk_is_torch_funcs():
    torch.manual_seed(0)
    model = Decoder().double().eval()
    x1, x2 = pair(), pair(2, seed=1)
    params = {k: v.detach() for k, v in model.named_parameters()}
    jac = lambda x: jacrev(lambda p: functional_call(model, p, x))(params)
    j1, j2 = jac(x1), jac(x2)
    expected = sum(torch.einsum("ntd...,mud...->nmtu", j1[k], j2[k]) for k in params) / D
    np.testing.assert_allclose(ntbridge.empirical_ntk(model, x1, x2).detach(), expected,
                               rtol=1e-8, atol=1e-10)


@pytest.mark.slow
def test_the_kernels_of_a_pair():
    torch.manual_seed(0)
    model = Decoder().double().eval()
    x1, x2 = pair(), pair(2, seed=1)
    k = ntbridge.kernel(model, x1)
    assert k.ntk.shape == (3, 3, 3, 3)
    torch.testing.assert_close(k.ntk, k.ntk.permute(1, 0, 3, 2), rtol=0, atol=0)
    assert ntbridge.kernel(model, x1, x2).nngp.shape == (3, 2, 3, 3)
    assert ntbridge.monte_carlo(model, x1, x2, n_samples=2).mean.shape == (3, 2, 3, 3)
    assert ntbridge.empirical_nngp(model, x1, x2).shape == (3, 2, 3, 3)


def test_nn_transformer_is_read_as_it_initialises():
    # xavier_uniform_ of every weight matrix: W_std**2 = 2 fan_in / (fan_in + fan_out)
    graph = ntbridge.convert(Seq2Seq())
    hyper = next(n.hyper for n in graph.layers if n.name == "tr")
    assert hyper["encoder.layers.0.linear1.W_std"] == pytest.approx((2 * D / (D + 32)) ** 0.5)
    assert hyper["decoder.layers.1.multihead_attn.W_std"] == (0.5 ** 0.5,) * 3 + (1.0,)
    decoder = next(n for n in ntbridge.convert(Decoder()).layers if n.name == "dec")
    assert decoder.hyper["self_attn.W_std"][3] == 3 ** -0.5  # torch's Linear init elsewhere


def test_what_is_refused():
    torch.manual_seed(0)
    model, x = Decoder(), pair()
    with pytest.raises(errors.InputError, match=r"x1=\(x, memory\)"):
        ntbridge.ntk(model, x[0])
    with pytest.raises(errors.ShapeError, match=r"\(N, T, 5\) and \(N, S, 3\)"):
        ntbridge.ntk(model, (x[0], x[0]))
    with pytest.raises(errors.InputError, match="forward takes one tensor"):
        ntbridge.ntk(nn.Sequential(nn.Linear(5, 4)), x)

    class Padded(Decoder):
        def __init__(self):
            super().__init__()
            self.register_buffer("padding", torch.zeros(3, 4, dtype=torch.bool))

        def forward(self, x, memory):
            return self.dec(self.ex(x), self.em(memory), memory_key_padding_mask=self.padding)

    with pytest.raises(errors.UnsupportedLayerError, match="key padding masks of a decoder"):
        ntbridge.ntk(Padded(), x)

    class Values(Decoder):
        def forward(self, x, memory):
            h = self.ex(x)
            return self.dec.multihead_attn(h, self.em(memory), h, need_weights=False)[0]

    with pytest.raises(errors.UnsupportedLayerError, match="different keys and values"):
        ntbridge.ntk(Values(), (x[0], x[0][..., :3]))
