"""An audit of every analytic family against wide models at their own width, as torch builds them.

For each family, 32 to 128 fresh models are constructed by their own constructors (torch's
uniform init; torch's ``N(0, 1)`` embeddings; the copies ``nn.TransformerEncoder`` makes of its
layer; class tokens and positions drawn by the model as ViT and BERT draw them, ``0.02 *
torch.randn``), and their empirical NNGP (output covariance averaged over the output units) and
empirical NTK (every parameter's Jacobian contraction, averaged over a few output units) are
computed with plain torch autograd, independently of ntbridge. Their means must lie within 5
standard errors of the samples (ddof=1) of ``ntbridge.kernel`` of one such model, entry by entry;
for softmax attention, the analytic kernel's own reported error is added in quadrature.

The inputs have enough features that the first layer's pre-activations, sums of uniform weights,
are close to Gaussian, as the analytic kernel assumes: with few inputs the uniform init's kernel
differs from the Gaussian one at any width (docs/empirical.md, benchmarks/README.md). The models'
finite width biases their mean kernels by about 1% of the largest entry (0.7% for the graph
network's NTK at 256 channels, 0.2% at 1024), below the resolution of these samples (standard
errors of 0.1-2.3%).
"""

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ntbridge
from montecarlo import fresh_kernels, standard_error, z_scores

WIDTH = 256  # channels of the sequence models and of most hidden layers
HEADS = 16
OUTPUTS = 256  # output units of the heads: the NNGP's average
Z_MAX = 5.0
POWER = 0.05  # the largest standard error must be below this share of the kernel's largest entry


@dataclass(frozen=True)
class Case:
    """A family's model (a constructor), its inputs, and whether it holds softmax attention."""

    build: Callable[[], nn.Module]
    inputs: Callable[[torch.Generator], torch.Tensor]
    samples: int = 64
    attention: bool = False


def normal(*shape: int) -> Callable[[torch.Generator], torch.Tensor]:
    return lambda gen: torch.randn(*shape, generator=gen, dtype=torch.float64)


# ---------------------------------------------------------------- the families' models

class Attention(nn.Module):
    """Self-attention alone: ``WIDTH`` channels, ``HEADS`` heads."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(WIDTH, HEADS, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


class TextClassifier(nn.Module):
    """Token embeddings (torch's N(0, 1)), learned positions of std 0.02, two encoder layers
    (``nn.TransformerEncoder``'s copies of one layer), the tokens' mean, a Linear head."""

    def __init__(self, vocab: int = 20, length: int = 4):
        super().__init__()
        self.emb = nn.Embedding(vocab, WIDTH)
        self.pos = nn.Parameter(0.02 * torch.randn(length, WIDTH))
        layer = nn.TransformerEncoderLayer(WIDTH, HEADS, 2 * WIDTH, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, OUTPUTS)

    def forward(self, ids):
        return self.head(self.enc(self.emb(ids) + self.pos).mean(1))


class VisionTransformer(nn.Module):
    """4 x 4 patches embedded by a strided Conv2d, a class token and positions of std 0.02, an
    encoder layer, the class token's output through a Linear head."""

    def __init__(self, channels: int = 8, patches: int = 2):
        super().__init__()
        self.embed = nn.Conv2d(channels, WIDTH, 4, stride=4)
        self.cls = nn.Parameter(0.02 * torch.randn(1, 1, WIDTH))
        self.pos = nn.Parameter(0.02 * torch.randn(patches + 1, WIDTH))
        self.enc = nn.TransformerEncoderLayer(WIDTH, HEADS, 2 * WIDTH, batch_first=True)
        self.head = nn.Linear(WIDTH, OUTPUTS)

    def forward(self, x):
        h = self.embed(x).flatten(2).transpose(1, 2)
        h = torch.cat([self.cls.expand(x.shape[0], -1, -1), h], dim=1)
        return self.head(self.enc(h + self.pos)[:, 0])


def batchnorm() -> nn.Module:
    """Fresh eval-mode BatchNorm before a convolution, and one without affine parameters before a
    ReLU."""
    return nn.Sequential(
        nn.Conv2d(16, WIDTH, 3, padding=1), nn.BatchNorm2d(WIDTH), nn.Conv2d(WIDTH, 128, 3),
        nn.BatchNorm2d(128, affine=False), nn.ReLU(), nn.Flatten(),
        nn.Linear(128 * 2 * 2, OUTPUTS)).eval()


def transposed() -> nn.Module:
    return nn.Sequential(
        nn.ConvTranspose2d(64, WIDTH, 3, stride=2, padding=1, output_padding=1), nn.ReLU(),
        nn.ConvTranspose2d(WIDTH, 32, 2, stride=2, groups=2), nn.Flatten(),
        nn.Linear(32 * 8 * 8, OUTPUTS))


def resized() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(32, WIDTH, 2, padding=1), nn.ReLU(), nn.Upsample(scale_factor=1.5,
                                                                   mode="bilinear"),
        nn.Conv2d(WIDTH, 32, 2), nn.Flatten(), nn.Linear(32 * 3 * 3, OUTPUTS))


class Gated(nn.Module):
    """A SwiGLU block on a wide ReLU layer: ``out(silu(fc1(h)) * fc2(h))``."""

    def __init__(self, d: int = 64):
        super().__init__()
        self.hidden = nn.Sequential(nn.Linear(d, WIDTH), nn.ReLU())
        self.fc1, self.fc2 = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)
        self.out = nn.Linear(WIDTH, OUTPUTS)

    def forward(self, x):
        h = self.hidden(x)
        return self.out(F.silu(self.fc1(h)) * self.fc2(h))


def adjacency(nodes: int = 5) -> torch.Tensor:
    """A fixed graph with self-loops, normalized as GCN's ``D^-1/2 (A + I) D^-1/2``."""
    a = torch.eye(nodes, dtype=torch.float64)
    for i, j in [(0, 1), (1, 2), (2, 3), (1, 4)]:
        a[i, j] = a[j, i] = 1
    d = a.sum(1).rsqrt()
    return d[:, None] * a * d[None, :]


class GraphNet(nn.Module):
    """Two rounds of (per-node Linear, aggregation by a buffer, ReLU), the nodes' mean, a head."""

    def __init__(self, d: int = 32):
        super().__init__()
        self.register_buffer("adj", adjacency())
        self.node1, self.node2 = nn.Conv1d(d, WIDTH, 1), nn.Conv1d(WIDTH, WIDTH, 1)
        self.head = nn.Linear(WIDTH, OUTPUTS)

    def forward(self, x):
        h = torch.relu(self.node1(x) @ self.adj.T)
        h = torch.relu(self.node2(h) @ self.adj.T)
        return self.head(h.mean(-1))


class Elementwise(nn.Module):
    """``head(exp(-fc2(sin(fc1(x))) ** 2))``: a function in closed form, then one by quadrature."""

    def __init__(self, d: int = 128):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 2 * WIDTH), nn.Linear(2 * WIDTH, 2 * WIDTH)
        self.head = nn.Linear(2 * WIDTH, OUTPUTS)

    def forward(self, x):
        return self.head(torch.exp(-self.fc2(torch.sin(self.fc1(x))) ** 2))


# the attention families' samples tell a wrong rule apart, measured max z (NNGP, NTK): of
# W_std=3**-0.5 throughout (Linear's variance for the xavier in_proj) 19.5, 24.1 (attention; 22.7,
# 26.5 at 48 samples), 60.3, 61.0 (class token); of shared_weights="independent" for the encoder's
# copies 8.1, 4.1 (6.3, 4.3 at 32 samples: 48 kept)
CASES = {
    "attention": Case(Attention, normal(3, 4, WIDTH), samples=32, attention=True),
    "embeddings, positions, encoder copies": Case(
        lambda: TextClassifier().eval(),
        lambda gen: torch.tensor([[1, 2, 3, 4], [3, 5, 6, 1], [7, 7, 8, 2]]), samples=48,
        attention=True),
    "class token, positions, patches": Case(lambda: VisionTransformer().eval(),
                                            normal(3, 8, 4, 8), attention=True),
    "batchnorm": Case(batchnorm, normal(3, 16, 4, 4)),
    "transposed convolutions": Case(transposed, normal(3, 64, 2, 2)),
    "resizing": Case(resized, normal(3, 32, 2, 2), samples=128),
    "products": Case(Gated, normal(3, 64), samples=128),
    "graphs": Case(GraphNet, normal(3, 32, 5), samples=128),
    "elementwise functions": Case(Elementwise, normal(3, 128)),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", CASES)
def test_kernels_are_the_mean_of_fresh_torch_models(name):
    """NNGP and NTK of one fresh model: the mean over fresh models' empirical kernels, within
    ``Z_MAX`` standard errors of the samples (and the attention rule's reported error)."""
    case = CASES[name]
    x = case.inputs(torch.Generator().manual_seed(1))
    nngps, ntks = fresh_kernels(case.build, x, case.samples, seed=100)
    torch.manual_seed(99)
    model = case.build().double()
    analytic = ntbridge.kernel(model, x)
    error = ntbridge.expectation_error(model, x) if case.attention else 0.0
    for get, samples in (("nngp", nngps), ("ntk", ntks)):
        exact = getattr(analytic, get)
        assert exact.shape == samples.shape[1:], (get, exact.shape, samples.shape)
        assert standard_error(samples).max() < POWER * exact.abs().max(), (
            f"{name}, {get}: too few samples to test anything")
        z = z_scores(samples, exact, error).max().item()
        assert z < Z_MAX, f"{name}, {get}: max |z| = {z:.2f}"
