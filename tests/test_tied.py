"""Weights used at two places: nn.TransformerEncoder's cloned layers (the kernel of layers that
start from one set of weights, ntbridge.stax.tied), and the reuse of weights the analytic kernels
refuse rather than compute the kernel of another network."""

import copy

import jax
import numpy as np
import pytest
import torch
from torch import nn

import ntbridge
from montecarlo import fresh_kernels, z_scores
from ntbridge.converters import encoder
from ntbridge.empirical.reinit import reinitialise
from ntbridge.errors import InputError, UnsupportedLayerError


def encoder_model(d=16, heads=2, layers=2, norm_first=False, reinitialise=False):
    """A Linear (Gaussian features for the encoder) and an nn.TransformerEncoder, float64, eval;
    ``reinitialise``: every layer drawn anew (independent layers)."""
    layer = nn.TransformerEncoderLayer(d, heads, 2 * d, dropout=0.0, batch_first=True,
                                       norm_first=norm_first)
    enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
    if reinitialise:
        for module in enc.modules():
            if isinstance(module, nn.MultiheadAttention):
                module._reset_parameters()
            elif isinstance(module, nn.Linear):
                module.reset_parameters()
    return nn.Sequential(nn.Linear(8, d), enc).double().eval()


def _inputs(n=3, t=4, seed=0):
    return torch.randn(n, t, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("norm_first", [False, True])
def test_one_layer_with_the_shared_rule_is_the_layer_rule(norm_first, monkeypatch):
    # the shared-weights rule of a single layer has nothing to share: exactly the layer's rule
    torch.manual_seed(0)
    model, x = encoder_model(norm_first=norm_first, layers=1), _inputs()
    plain = ntbridge.kernel(model, x)
    monkeypatch.setattr(encoder, "shares_weights", lambda module, ctx: True)
    shared = ntbridge.kernel(model, x)
    for name in ("nngp", "ntk"):
        np.testing.assert_allclose(getattr(shared, name), getattr(plain, name), rtol=1e-13,
                                   atol=0)


@pytest.mark.slow
def test_cloned_layers_kernel_is_pairwise_and_symmetric():
    # a pair's kernel does not depend on the other examples of the call (two calls of one shape:
    # one program); x2 = x1 is symmetric
    torch.manual_seed(1)
    model, x = encoder_model(), _inputs(4)
    block = ntbridge.kernel(model, x[:3], x[1:])
    shuffled = ntbridge.kernel(model, x[[1, 2, 0]], x[[1, 2, 3]])
    full = ntbridge.kernel(model, x[:3])
    for name in ("nngp", "ntk"):
        np.testing.assert_allclose(getattr(shuffled, name)[:2], getattr(block, name)[1:],
                                   rtol=1e-12, atol=1e-14)
        k = getattr(full, name)
        assert torch.equal(k, k.permute(1, 0, 3, 2))
        assert np.linalg.eigvalsh(k.mean((2, 3)).numpy()).min() > 0


@pytest.mark.slow
def test_reinitialised_layers_get_the_independent_kernel():
    # the same architecture (one repr), two kernels: no program of one serves the other
    torch.manual_seed(2)
    x = _inputs()
    cloned, fresh = encoder_model(), encoder_model(reinitialise=True)
    assert repr(cloned) == repr(fresh)
    k_fresh = ntbridge.kernel(fresh, x)
    k_independent = ntbridge.kernel(cloned, x, shared_weights="independent")
    k_cloned = ntbridge.kernel(cloned, x)
    for name in ("nngp", "ntk"):
        np.testing.assert_array_equal(getattr(k_fresh, name), getattr(k_independent, name))
        gap = (getattr(k_cloned, name) - getattr(k_fresh, name)).norm()
        assert gap > 0.05 * getattr(k_fresh, name).norm()


def test_partly_shared_layers_and_different_variances_are_refused():
    torch.manual_seed(3)
    model = encoder_model(layers=3)
    model[1].layers[2].linear1.reset_parameters()
    with pytest.raises(UnsupportedLayerError, match="some of its layers' weights equal"):
        ntbridge.convert(model)
    ntbridge.convert(model, shared_weights="independent")
    with pytest.raises(UnsupportedLayerError, match="share their variances"):
        ntbridge.convert(encoder_model(), W_std={"1.layers.1.linear1": 1.0})
    with pytest.raises(InputError, match="shared_weights must be one of"):
        ntbridge.convert(encoder_model(), shared_weights="tied")


class _CalledTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner, self.head = nn.Linear(4, 4), nn.Linear(4, 1)

    def forward(self, x):
        return self.head(torch.relu(self.inner(torch.relu(self.inner(x)))))


class _TiedEmbeddings(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.head = nn.Embedding(10, 4), nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(self.emb(ids).mean(1))


def _reused(kind):
    torch.manual_seed(4)
    layer = nn.Linear(4, 4)
    if kind == "module twice":
        return nn.Sequential(layer, nn.ReLU(), layer), torch.randn(3, 4), "the same module"
    if kind == "called twice":
        return _CalledTwice(), torch.randn(3, 4), "the same module"
    if kind == "tied embeddings":
        return _TiedEmbeddings(), torch.randint(0, 10, (3, 5)), "the same parameter"
    copies = nn.Sequential(copy.deepcopy(layer), nn.ReLU(), copy.deepcopy(layer))
    return copies, torch.randn(3, 4), "equal values"


@pytest.mark.parametrize("kind", ["module twice", "called twice", "tied embeddings", "copies"])
def test_reused_weights_are_refused_by_name(kind):
    model, x, how = _reused(kind)
    with pytest.raises(UnsupportedLayerError, match=f"uses the weights of .*{how}") as refusal:
        ntbridge.ntk(model, x)
    assert ("no infinite-width kernel" in str(refusal.value)) == (kind == "tied embeddings")
    if kind != "tied embeddings":
        assert torch.isfinite(ntbridge.ntk(model, x, shared_weights="independent")).all()


class _ResidualLM(nn.Module):
    """Token embeddings, one residual MLP block, a final LayerNorm and logits by a head of the
    embedding's distribution (N(0, 1) entries): its own matrix, or the embedding's (tied)."""

    def __init__(self, d: int, tied: bool, vocab: int = 16):
        super().__init__()
        self.emb, self.head = nn.Embedding(vocab, d), nn.Linear(d, vocab, bias=False)
        self.mlp = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.GELU(),
                                 nn.Linear(2 * d, d))
        self.norm = nn.LayerNorm(d)
        if tied:
            self.head.weight = self.emb.weight
        else:
            nn.init.normal_(self.head.weight)

    def forward(self, ids):
        x = self.emb(ids)
        return self.head(self.norm(x + self.mlp(x)))


def _own_logits(d: int, tied: bool, samples: int = 200) -> torch.Tensor:
    """The logit of token 0 at its own position, in fresh models of width ``d``."""
    with torch.no_grad():
        return torch.stack([_ResidualLM(d, tied)(torch.arange(4)[None])[0, 0, 0]
                            for _ in range(samples)])


@pytest.mark.slow
def test_tied_embeddings_have_no_infinite_width_limit():
    # Why tied input and output embeddings are refused (reuse.TIED_EMBEDDINGS): the logit of a
    # token in the input reads the token's own row back, sum_j E_vj h_j with h holding E_v / s (s
    # the stream's scale), so its mean is of order d, while a logit is a sum of d terms of spread
    # |h| = sqrt(d) (the final LayerNorm). Its mean per width settles at 1 / s (measured 0.975 at
    # d = 64, 0.983 at 256, standard errors 0.006 and 0.003): sqrt(d) spreads at width d, no limit.
    # The untied head's own-token logit has mean 0 (measured 0.18 standard errors off).
    means = {}
    for d in (64, 256):
        logits = _own_logits(d, tied=True) / d
        means[d] = logits.mean(), logits.std() / len(logits) ** 0.5
    (m1, e1), (m2, e2) = means.values()
    assert abs(m1 - m2) < 5 * (e1 ** 2 + e2 ** 2) ** 0.5 and min(m1, m2) > 0.5, means
    untied = _own_logits(256, tied=False) / 256 ** 0.5
    assert abs(untied.mean()) < 5 * untied.std() / len(untied) ** 0.5, untied.mean()


def test_a_module_listed_twice_in_a_sequential_is_run_twice():
    # named_children lists it once: the converted forward must still be torch's
    model, x, _ = _reused("module twice")
    graph = ntbridge.convert(model, shared_weights="independent")
    assert [n.name for n in graph.layers] == ["0", "1", "2"]
    ours = graph.apply_fn(graph.params, x.numpy())
    np.testing.assert_allclose(np.asarray(ours), model(x).detach().numpy(), rtol=1e-5)


@pytest.mark.parametrize("kind", ["module twice", "called twice", "tied embeddings"])
def test_empirical_ntk_of_reused_weights_is_torch_funcs(kind):
    # a reused parameter is one parameter: its gradients from both places add up
    model, x, _ = _reused(kind)
    ours = ntbridge.empirical_ntk(model, x)  # first: torch.func's calls below swap parameters
    params = dict(model.named_parameters())
    jac = torch.func.jacrev(lambda p: torch.func.functional_call(model, p, (x,)))(params)
    flat = [j.reshape(*j.shape[:2], -1) for j in jac.values()]
    reference = sum(torch.einsum("nop,mop->nm", j, j) for j in flat) / flat[0].shape[1]
    np.testing.assert_allclose(ours.detach(), reference.detach(), rtol=1e-5, atol=1e-6)


class ViT(nn.Module):
    """4 x 4 patches of 8 x 8 images embedded by a strided Conv2d, learned positions (and a class
    token, ``cls``) of std 0.02, 2 pre-norm GELU layers, a final LayerNorm; read out as the mean
    over tokens or at the class token."""

    def __init__(self, d, heads, cls=False):
        super().__init__()
        self.patch = nn.Conv2d(3, d, 4, stride=4)
        self.cls = nn.Parameter(0.02 * torch.randn(1, 1, d)) if cls else None
        self.pos = nn.Parameter(0.02 * torch.randn(4 + cls, d))
        layer = nn.TransformerEncoderLayer(d, heads, 2 * d, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(d),
                                         enable_nested_tensor=False)

    def forward(self, images):
        h = self.patch(images).flatten(2).transpose(1, 2)
        if self.cls is not None:
            h = torch.cat([self.cls.expand(h.shape[0], -1, -1), h], dim=1)
        h = self.enc(h + self.pos)
        return h[:, 0] if self.cls is not None else h.mean(1)


def _worst_z(build, x, seeds: int) -> dict:
    """The largest deviation of the kernels from fresh models' means, in combined standard errors
    (the samples' and the attention rule's), for ``shared_weights`` ``auto`` and
    ``independent``."""
    samples = dict(zip(("nngp", "ntk"), fresh_kernels(build, x, seeds, seed=100)))
    model = build()
    error = ntbridge.expectation_error(model, x)
    return {(sharing, name): z_scores(s, getattr(ntbridge.kernel(model, x, shared_weights=sharing),
                                                 name), error).max().item()
            for sharing in ("auto", "independent") for name, s in samples.items()}


def _images():
    return torch.randn(3, 3, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))


@pytest.mark.slow
@pytest.mark.parametrize("cls", [False, True])
def test_cloned_encoder_layers_of_vits_match_wide_torch_models(cls):
    # ViTs as torch builds them (layers deep-copied from one) at their own width, read out as the
    # mean over tokens or at a class token of std 0.02: the fresh models' mean kernels lie within
    # 5 combined standard errors of the kernel of copies; the independent layers' kernel does not
    # (test_audit.py: the post-norm text classifier)
    worst = _worst_z(lambda: ViT(256, 16, cls).double().eval(), _images(), seeds=24)
    assert max(worst["auto", n] for n in ("nngp", "ntk")) < 5, worst
    assert max(worst["independent", n] for n in ("nngp", "ntk")) > 5, worst


def test_fresh_draws_of_cloned_layers_are_clones():
    # the samples of monte_carlo: the converted graph's init_fn, and the models' own resets
    torch.manual_seed(5)
    cloned, independent = encoder_model(), encoder_model(reinitialise=True)
    _, params = ntbridge.convert(cloned).init_fn(jax.random.key(0), (3, 4, 8))
    assert np.array_equal(params["1.layers.0.linear1.weight"], params["1.layers.1.linear1.weight"])
    for model, equal in ((cloned, True), (independent, False)):
        reinitialise(model, seed=0, sample=1)
        layers = model[1].layers
        assert torch.equal(layers[0].linear1.weight, layers[1].linear1.weight) == equal


class _PaddedEncoder(nn.Module):
    """Token ids padded with 0, an encoder of copies whose attention skips the padding."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 8, padding_idx=0)
        layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    def forward(self, ids):
        return self.enc(self.emb(ids), src_key_padding_mask=ids == 0)


@pytest.mark.slow
def test_padded_sequences_get_the_kernels_of_the_sequences_through_copies():
    # the padding is masked at every depth, in the pairs across depths too (the closed-form
    # attention: softmax's points differ with the length, test_attention.py)
    torch.manual_seed(6)
    model = _PaddedEncoder().double().eval()
    ids = torch.tensor([[3, 4, 5], [1, 2, 6]])
    padded = torch.cat([ids, torch.zeros(2, 2, dtype=torch.long)], 1)
    alone = ntbridge.kernel(model, ids, attention="linear")
    within = ntbridge.kernel(model, padded, attention="linear")
    for name in ("nngp", "ntk"):
        np.testing.assert_allclose(getattr(within, name)[..., :3, :3], getattr(alone, name),
                                   rtol=1e-12, atol=1e-14)
