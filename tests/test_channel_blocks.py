"""An elementwise function after a concatenation along channels (``f(torch.cat([a, b], 1))``):
its kernel is that of ``cat(f(a), f(b))``, exactly, for vectors, images and sequences, nested
concatenations and numerical rules; fresh wide models agree; what still needs a Gaussian input is
refused."""

import pytest
import torch
from torch import nn

import ntbridge
from ntbridge import errors

from montecarlo import fresh_kernels, standard_error, z_scores


class Branches(nn.Module):
    """Two branches of different widths (and laws: ``b`` reads ``3 x``), concatenated along
    ``dim``; ``inside``: ``act`` after the concatenation, else on each branch before it; then a
    read-out."""

    def __init__(self, act, inside, conv=False, dim=1, widths=(8, 16), features=3, outputs=2):
        super().__init__()
        layer = (lambda i, o: nn.Conv2d(i, o, 3, padding=1)) if conv else nn.Linear
        self.a, self.b = layer(features, widths[0]), layer(features, widths[1])
        self.out = layer(sum(widths), outputs)
        self.act, self.inside, self.dim = act, inside, dim

    def forward(self, x):
        a, b = self.a(x), self.b(3 * x)
        h = self.act(torch.cat([a, b], self.dim)) if self.inside else \
            torch.cat([self.act(a), self.act(b)], self.dim)
        return self.out(h)


class Nested(nn.Module):
    """``gelu(cat(cat(a, b), c))`` (``inside``) or ``cat(gelu(a), gelu(b), gelu(c))``."""

    def __init__(self, inside):
        super().__init__()
        self.a, self.b, self.c, self.out = (nn.Linear(3, 4), nn.Linear(3, 6), nn.Linear(3, 2),
                                            nn.Linear(12, 1))
        self.inside = inside

    def forward(self, x):
        f, a, b, c = nn.functional.gelu, self.a(x), self.b(2 * x), self.c(3 * x)
        if self.inside:
            return self.out(f(torch.cat([torch.cat([a, b], 1), c], 1)))
        return self.out(torch.cat([f(a), f(b), f(c)], 1))


CASES = {
    "vectors, relu": (lambda inside: Branches(nn.ReLU(), inside), (5, 3)),
    "vectors, silu (numerical)": (lambda inside: Branches(nn.SiLU(), inside), (5, 3)),
    "images": (lambda inside: Branches(nn.ReLU(), inside, conv=True), (3, 3, 4, 4)),
    "sequences": (lambda inside: Branches(nn.GELU(), inside, dim=-1), (3, 4, 3)),
    "nested": (Nested, (5, 3)),
}


@pytest.mark.parametrize("case", CASES)
def test_a_function_of_a_concatenation_is_the_concatenation_of_its_branches_functions(case):
    build, shape = CASES[case]
    x = torch.randn(*shape, dtype=torch.float64)
    inside, outside = (build(inside).double() for inside in (True, False))
    k, expected = ntbridge.kernel(inside, x), ntbridge.kernel(outside, x)
    for get in ("nngp", "ntk"):
        torch.testing.assert_close(getattr(k, get), getattr(expected, get), rtol=1e-12, atol=0)


@pytest.mark.slow
def test_fresh_wide_models_agree():
    # 256 and 512 channels as torch initialises them, tanh, 256 outputs: the mean of 128 fresh
    # models' empirical NNGP and NTK within 5 standard errors of the kernel (measured max z 1.4
    # and 2.1); the inputs have 64 features, so that the first layer's uniform weights give nearly
    # Gaussian pre-activations. Power: one Gaussian branch with the concatenation's averaged
    # kernel, tanh(Linear(c x)) with c**2 = (256 + 512 * 9) / 768, is refuted (z 19 and 95)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    build = lambda: Branches(nn.Tanh(), True, widths=(256, 512), features=64, outputs=256)
    nngps, ntks = fresh_kernels(build, x, 128, seed=100)
    torch.manual_seed(99)
    k = ntbridge.kernel(build().double(), x)
    averaged = nn.Sequential(nn.Linear(64, 768), nn.Tanh(), nn.Linear(768, 256)).double()
    naive = ntbridge.kernel(averaged, ((256 + 512 * 9) / 768) ** 0.5 * x)
    for get, samples in (("nngp", nngps), ("ntk", ntks)):
        exact = getattr(k, get)
        assert standard_error(samples).max() < 0.05 * exact.abs().max(), get
        assert z_scores(samples, exact).max() < 5 < z_scores(samples, getattr(naive, get)).max()


def test_a_concatenation_still_needs_an_affine_layer_before_a_second_function():
    class Twice(Branches):
        def forward(self, x):
            return self.out(torch.relu(torch.relu(torch.cat([self.a(x), self.b(x)], 1))))

    with pytest.raises(errors.UnsupportedLayerError, match="needs a Gaussian input"):
        ntbridge.kernel(Twice(nn.ReLU(), True), torch.randn(4, 3))
