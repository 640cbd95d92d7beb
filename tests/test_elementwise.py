"""Elementwise functions without a module, traced by fx (torch.exp, torch.sin, x ** k, chains such
as exp(-h ** 2)): forward passes as torch's, kernels against adaptive integration, Monte-Carlo."""

import functools
import math

import numpy as np
import pytest
import torch
from torch import nn

import ntbridge
from montecarlo import check_architecture
from ntbridge.dlpack import precision, to_jax
from ntbridge.errors import UnsupportedLayerError
from reference import expectation, scale

SIGN = lambda v: float(np.sign(v))
# (name, torch function of the pre-activation h, f, f', kinks)
CASES = [
    ("exp", torch.exp, math.exp, math.exp, ()),
    ("sin", lambda h: h.sin(), math.sin, math.cos, ()),
    ("cos", torch.cos, math.cos, lambda v: -math.sin(v), ()),
    ("erf", torch.special.erf, math.erf, lambda v: 2 / math.sqrt(math.pi) * math.exp(-v * v), ()),
    ("abs", torch.abs, abs, SIGN, (0.0,)),
    ("sign", lambda h: h.sign(), SIGN, lambda v: 0.0, (0.0,)),
    ("square", torch.square, lambda v: v * v, lambda v: 2 * v, ()),
    ("cube", lambda h: h ** 3, lambda v: v ** 3, lambda v: 3 * v * v, ()),
    ("gaussian", lambda h: torch.exp(-h ** 2), lambda v: math.exp(-v * v),
     lambda v: -2 * v * math.exp(-v * v), ()),
    ("1 - cos/2", lambda h: 1 - torch.cos(h) / 2, lambda v: 1 - math.cos(v) / 2,
     lambda v: math.sin(v) / 2, ()),
    ("2|h| + 1", lambda h: torch.abs(h) * 2 + 1, lambda v: 2 * abs(v) + 1, lambda v: 2 * SIGN(v),
     (0.0,)),
    ("exp(h/2 - 1)", lambda h: (h / 2 - 1).exp(), lambda v: math.exp(v / 2 - 1),
     lambda v: math.exp(v / 2 - 1) / 2, ()),
]
IDS = [case[0] for case in CASES]


class Applied(nn.Module):
    """``fn(fc(x))``, with a readout when ``out`` is given."""

    def __init__(self, fn, d=3, width=512, out=None, bias=False):
        super().__init__()
        self.fn, self.fc = fn, nn.Linear(d, width, bias=bias)
        self.out = nn.Linear(width, out) if out else nn.Identity()

    def forward(self, x):
        return self.out(self.fn(self.fc(x)))


def inputs(dtype=torch.float64):
    """Three examples whose pre-activations (W_std = 1, no bias) have variances 0.3 to 4 and
    correlations of both signs."""
    x = torch.tensor([[0.9, 0.2, -0.3], [-1.2, 1.5, 0.4], [2.0, -1.5, 2.6]], dtype=dtype)
    return x


@pytest.mark.parametrize("i", range(len(CASES)), ids=IDS)
def test_forward_is_torchs(i):
    torch.manual_seed(0)
    model = Applied(CASES[i][1], out=2).double()
    graph = ntbridge.convert(model)
    x = inputs()
    with precision(torch.float64):
        got = torch.from_dlpack(graph.apply_fn(graph.params, to_jax(x)))
    torch.testing.assert_close(got, model(x), rtol=1e-12, atol=1e-12)


@functools.cache  # the same for both dtypes (and the quick test): adaptive integration is slow
def _references(i):
    """``(a, b, (NNGP, its scale), (NTK, its scale))`` for every pair of the three examples, of
    the first layer's float64 kernel ``pre``."""
    _, _, f, df, kinks = CASES[i]
    pre = ntbridge.kernel(nn.Linear(3, 512, bias=False).double(), inputs(), W_std=1.0)
    q = pre.nngp.diagonal().tolist()
    out = []
    for a in range(3):
        for b in range(3):
            c = float(pre.nngp[a, b])
            nngp = expectation(f, f, q[a], q[b], c, kinks), scale(f, q[a], q[b], kinks)
            dot = expectation(df, df, q[a], q[b], c, kinks), scale(df, q[a], q[b], kinks)
            size = math.sqrt(float(pre.ntk[a, a] * pre.ntk[b, b]))  # bounds |pre.ntk[a, b]|
            out.append((a, b, nngp, (dot[0] * float(pre.ntk[a, b]), dot[1] * size)))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("dtype, rtol", [(torch.float64, 1e-8), (torch.float32, 2e-5)])
@pytest.mark.parametrize("i", range(len(CASES)), ids=IDS)
def test_kernels_match_adaptive_integration(i, dtype, rtol):
    """NNGP = E[f(u) f(v)] and NTK = E[f'(u) f'(v)] x the pre-activation's NTK, (u, v) Gaussian
    with the first layer's NNGP, relative to the scale sqrt(E f(u)^2 E f(v)^2)."""
    k = ntbridge.kernel(Applied(CASES[i][1]).to(dtype), inputs(dtype), W_std=1.0)
    assert k.nngp.dtype == dtype
    # With a kink, E[f'(u) f'(v)] has an infinite slope in the correlation rho at 1 (as ReLU's):
    # an example's correlation with itself is 1 only to within a few roundings (say 8 eps), an
    # angle theta = arccos(rho) up to sqrt(2 * 8 eps), and these derivatives' jumps (sign-like, at
    # 0) move the expectation by (2 / pi) theta of its scale: 3.8e-8 in float64, 8.8e-4 in float32
    # (measured on "2|h| + 1": 2.9e-10 and 3.2e-4).
    eps = torch.finfo(dtype).eps
    kinked = rtol + 2 / math.pi * math.sqrt(16 * eps) if CASES[i][4] else rtol
    for a, b, (nngp, nngp_scale), (ntk, ntk_scale) in _references(i):
        assert abs(float(k.nngp[a, b]) - nngp) <= rtol * nngp_scale, ("NNGP", a, b)
        tol = kinked if a == b else rtol
        assert abs(float(k.ntk[a, b]) - ntk) <= tol * ntk_scale, ("NTK", a, b)


def test_one_function_and_the_gaussian_chain_quickly():
    """The quick subset's check: exp in closed form and exp(-h^2) numerically, in float64."""
    for i in (0, 8):
        test_kernels_match_adaptive_integration(i, torch.float64, 1e-8)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gaussian", "sin", "cube"])
def test_wide_networks_converge_to_the_kernels(name):
    fn = CASES[IDS.index(name)][1]
    torch.manual_seed(0)
    check_architecture(lambda: (Applied(fn, d=4, width=512, out=64, bias=True), (4,)), "standard",
                       samples=200)


def test_chains_share_one_module_and_are_reused_by_their_consumers():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.a, self.b = nn.Linear(3, 8), nn.Linear(8, 2), nn.Linear(8, 2)

        def forward(self, x):
            g = torch.exp(-self.fc(x) ** 2)
            return self.a(g) + self.b(g)

    modules = [node.module for node in ntbridge.convert(Twice()).layers]
    assert [type(m).__name__ for m in modules] == ["Linear", "Elementwise", "Linear", "Linear",
                                                   "Add"]
    assert repr(modules[1]) == "Elementwise(pow 2, neg, exp)"


@pytest.mark.parametrize("fn, says", [
    (lambda h: h ** 0.5, "only positive integer powers"),
    (lambda h: torch.abs(torch.sin(h)), "applies abs or sign after another function"),
    (lambda h: h * h, "are not independent: they are the same tensor"),
])
def test_functions_without_an_exact_rule_are_refused_by_name(fn, says):
    with pytest.raises(UnsupportedLayerError, match=says):
        ntbridge.nngp(Applied(fn), inputs(torch.float32))


def test_a_function_of_the_raw_input_needs_an_affine_layer_first():
    class Raw(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            return self.fc(torch.sin(x))

    with pytest.raises(UnsupportedLayerError, match="needs a Gaussian input"):
        ntbridge.nngp(Raw(), inputs(torch.float32))
