"""Llama's parts: RMSNorm (``nn.RMSNorm``, the hand-written form and HF's ``LlamaRMSNorm``) against
torch's forward, direct formulas and wide-model Monte-Carlo."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ntbridge
from ntbridge import errors
from ntbridge.dlpack import precision, to_jax

from montecarlo import assert_within_standard_error, sample_kernels


def apply(model, x):
    graph = ntbridge.convert(model)
    with precision(x.dtype):
        return torch.from_dlpack(graph.apply_fn(graph.params, to_jax(x)))


class HandRMSNorm(nn.Module):
    """The hand-written RMSNorm of the last axis, weighted or not."""

    def __init__(self, d: int | None, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.scale = None if d is None else nn.Parameter(torch.full((d,), 1.5))

    def forward(self, x):
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return y if self.scale is None else y * self.scale


class CastRMSNorm(nn.Module):
    """Llama's own spelling: casts to float32 and back, the weight first, ``x * x``."""

    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.weight, self.variance_epsilon = nn.Parameter(torch.ones(d)), eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        h = hidden_states.to(torch.float32)
        h = h * torch.rsqrt((h * h).mean(dim=-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(input_dtype)


NORMS = {"nn.RMSNorm": lambda d: nn.RMSNorm(d, eps=0.1), "hand-written": lambda d: HandRMSNorm(d),
         "unweighted": lambda d: HandRMSNorm(None), "Llama's": lambda d: CastRMSNorm(d)}


@pytest.mark.parametrize("name", list(NORMS))
@pytest.mark.parametrize("shape", [(4, 8), (2, 5, 8)])
def test_forward_equals_torch(name, shape):
    model = nn.Sequential(nn.Linear(8, 8), NORMS[name](8)).double()
    x = torch.randn(*shape, dtype=torch.float64)
    # Llama's form computes in float32 in torch: its rounding, not ours
    tolerance = 1e-6 if name == "Llama's" else 1e-12
    torch.testing.assert_close(apply(model, x), model(x).detach(), rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("name", list(NORMS))
def test_kernel_is_the_normalized_input_kernel(name):
    """Per token of sequences: ``K[t] / sqrt((v1_t + eps)(v2_t + eps))``, the weight's square
    times that, and the weight's own term (the normalized NNGP) in the NTK."""
    norm = NORMS[name](8)
    model = nn.Sequential(nn.Linear(4, 8), norm).double()
    x = torch.randn(3, 5, 4, dtype=torch.float64)
    lin = ntbridge.kernel(model[:1], x)  # (N, N, T): tokens mix nowhere, each token's own
    eps = getattr(norm, "eps", None) or norm.variance_epsilon
    weight = getattr(norm, "weight", None) if not isinstance(norm, HandRMSNorm) else norm.scale
    w2 = 1.0 if weight is None else weight[0].item() ** 2
    v = lin.nngp.diagonal(0, 0, 1).T + eps  # (N, T): each token's variance
    scale = (v[:, None] * v[None]).rsqrt()
    k = ntbridge.kernel(model, x)
    own = 0.0 if weight is None else lin.nngp * scale
    torch.testing.assert_close(k.nngp, w2 * lin.nngp * scale, rtol=1e-12, atol=0)
    torch.testing.assert_close(k.ntk, w2 * lin.ntk * scale + own, rtol=1e-12, atol=0)


@pytest.mark.parametrize("parameterization", ["standard", "ntk"])
def test_rms_norm_after_relu_matches_monte_carlo(parameterization):
    """No centring: RMSNorm's rule holds after a ReLU, whose outputs have a nonzero mean
    (LayerNorm's needs a zero-mean Gaussian input). Finite width biases the mean square by
    O(1/width), ~2e-3 here, below the error."""
    x = torch.randn(4, 3, dtype=torch.float64)
    model = nn.Sequential(nn.Linear(3, 512), nn.ReLU(), HandRMSNorm(512), nn.Linear(512, 64))
    model = model.double()
    nngp, ntk = sample_kernels(model, x, 100, parameterization, chunk=20)
    k = ntbridge.kernel(model, x, parameterization=parameterization)
    assert_within_standard_error(nngp, k.nngp, "NNGP")
    assert_within_standard_error(ntk, k.ntk, f"NTK ({parameterization})")


def test_hugging_face_llama_rms_norm_is_recognised_by_its_forward():
    modeling = pytest.importorskip("transformers.models.llama.modeling_llama")
    model = nn.Sequential(nn.Linear(4, 8), modeling.LlamaRMSNorm(8, eps=1e-6)).double()
    graph = ntbridge.convert(model)
    assert isinstance(graph.layers[1].module, nn.RMSNorm) and graph.layers[1].name == "1"
    reference = nn.Sequential(model[0], nn.RMSNorm(8, eps=1e-6)).double()
    x = torch.randn(3, 4, dtype=torch.float64)
    k, expected = ntbridge.kernel(model, x), ntbridge.kernel(reference, x)
    torch.testing.assert_close(k.ntk, expected.ntk, rtol=1e-12, atol=0)


def test_refusals():
    norm = nn.RMSNorm(8)
    with torch.no_grad():
        norm.weight[0] = 2.0
    with pytest.raises(errors.UnsupportedLayerError, match="RMSNorm's weight vary"):
        ntbridge.ntk(nn.Sequential(nn.Linear(3, 8), norm), torch.randn(2, 3))
    with pytest.raises(errors.ShapeError, match="whole per-example shape"):
        ntbridge.ntk(nn.Sequential(nn.RMSNorm(4)), torch.randn(2, 3, 4))


# ------------------------------------------------------------ rotary position embeddings

def test_rotary_logits_covariance_is_the_closed_form():
    """Queries and keys of i.i.d. Gaussian channels (covariances Kq, Kk over the tokens), rotated
    as Llama rotates them: the logits' covariance is ``Kq[t,t'] Kk[s,s'] c((s-t) - (s'-t'))``, within
    5 standard errors of 20000 draws; without the factor ``c`` it is far off."""
    from llama_modules import apply_rotary_pos_emb
    from ntbridge.stax.rotary import correlation
    gen = torch.Generator().manual_seed(0)
    tokens, channels, draws = 4, 8, 20000
    frequencies = 10.0 ** (-torch.arange(0, channels, 2, dtype=torch.float64) / channels)
    lq, lk = (torch.randn(tokens, tokens, generator=gen, dtype=torch.float64) / 2 for _ in "qk")
    q = torch.einsum("ts,nsc->ntc", lq, torch.randn(draws, tokens, channels, generator=gen,
                                                    dtype=torch.float64))
    k = torch.einsum("ts,nsc->ntc", lk, torch.randn(draws, tokens, channels, generator=gen,
                                                    dtype=torch.float64))
    angles = torch.arange(tokens, dtype=torch.float64)[:, None] * frequencies
    emb = torch.cat([angles, angles], -1)
    q, k = apply_rotary_pos_emb(q, k, emb.cos(), emb.sin())
    g = (q @ k.transpose(1, 2) / channels ** 0.5).reshape(draws, -1)  # (draws, T*T)
    products = g[:, :, None] * g[:, None, :]
    kq, kk = lq @ lq.T, lk @ lk.T
    plain = torch.einsum("tu,sv->tsuv", kq, kk)
    exact = (plain * torch.from_numpy(correlation(frequencies.numpy(), tokens))).reshape(16, 16)
    se = products.std(0) / draws ** 0.5
    assert ((products.mean(0) - exact).abs() / se).max() < 5
    assert ((products.mean(0) - plain.reshape(16, 16)).abs() / se).max() > 20


def test_rotary_attention_forward_equals_torch():
    from llama_modules import LlamaAttention
    model = LlamaAttention(16, 4, 2).double()
    x = torch.randn(3, 5, 16, dtype=torch.float64)
    torch.testing.assert_close(apply(model, x), model(x).detach(), rtol=1e-12, atol=1e-12)


@pytest.mark.slow
def test_rotary_attention_matches_monte_carlo():
    """Fresh Llama-style attention layers (4 heads of 16 channels, 2 key/value heads, causal,
    rotary base 10): their empirical kernels' mean is the rotary rule's within 5 of its spread
    (the samples' standard error and the rule's own error); the rule without rotation is not, for
    the NTK (the NNGP moves by 2%, within the noise of these samples)."""
    from llama_modules import LlamaAttention
    from montecarlo import fresh_kernels, z_scores
    x = 2 * (torch.randn(3, 1, 64, dtype=torch.float64) + torch.randn(3, 4, 64, dtype=torch.float64))
    build = lambda: LlamaAttention(64, 4, 2, base=10.0)
    model = build().double()
    k = ntbridge.kernel(model, x, attention_points=256)
    error = ntbridge.expectation_error(model, x, attention_points=256)
    nngp, ntk = fresh_kernels(build, x, 64)
    assert z_scores(nngp, k.nngp, error).max() < 5 and z_scores(ntk, k.ntk, error).max() < 5
    model.inv_freq.zero_()
    unrotated = ntbridge.kernel(model, x, attention_points=256, get="ntk")
    assert z_scores(ntk, unrotated, error).max() > 3


# ------------------------------------------------------------ SwiGLU

class SwiGLU(nn.Module):
    """Llama's MLP: ``down(silu(gate(x)) * up(x))``, or with one projection ``chunk``-ed."""

    def __init__(self, d: int, hidden: int, fused: bool):
        super().__init__()
        self.fused = fused
        if fused:
            self.gate_up = nn.Linear(d, 2 * hidden, bias=False)
        else:
            self.gate, self.up = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, 256, bias=False)

    def forward(self, x):
        a, b = self.gate_up(x).chunk(2, -1) if self.fused else (self.gate(x), self.up(x))
        return self.down(F.silu(a) * b)


@pytest.mark.slow
def test_swiglu_chunked_matches_monte_carlo():
    """``a, b = gate_up(x).chunk(2, -1)``: the halves are independent factors."""
    x = torch.randn(4, 3, dtype=torch.float64)
    model = SwiGLU(3, 512, fused=True).double()
    torch.testing.assert_close(apply(model, x), model(x).detach(), rtol=1e-12, atol=1e-12)
    nngp, ntk = sample_kernels(model, x, 100, chunk=20)
    k = ntbridge.kernel(model, x)
    assert_within_standard_error(nngp, k.nngp, "NNGP")
    assert_within_standard_error(ntk, k.ntk, "NTK")


def test_swiglu_with_separate_projections_has_the_same_kernel():
    x = torch.randn(4, 3, dtype=torch.float64)
    fused, separate = (ntbridge.kernel(SwiGLU(3, 16, f).double(), x) for f in (True, False))
    torch.testing.assert_close(separate.ntk, fused.ntk, rtol=1e-12, atol=0)
    torch.testing.assert_close(separate.nngp, fused.nngp, rtol=1e-12, atol=0)


def test_chunks_read_twice_or_along_positions_are_refused():
    class Square(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 8)

        def forward(self, x):
            h = self.fc(x)
            return h.chunk(2, -1)[0] * h.chunk(2, -1)[0]

    with pytest.raises(errors.UnsupportedLayerError, match="not independent|may be dependent"):
        ntbridge.ntk(Square(), torch.randn(2, 3))

    class Positions(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 8)

        def forward(self, x):
            return self.fc(x).transpose(1, 2).chunk(2, -1)[1]

    with pytest.raises(errors.UnsupportedLayerError, match="splits an axis of positions"):
        ntbridge.ntk(Positions(), torch.randn(2, 4, 3))
