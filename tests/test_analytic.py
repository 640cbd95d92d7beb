"""Analytic NNGP/NTK of Linear/ReLU networks: closed forms and Monte-Carlo over wide networks."""

import math

import numpy as np
import pytest
import torch
from torch import nn

import ntbridge

from helpers import mlp
from montecarlo import B_STD, W_STD, assert_within_standard_error, sample_kernels


def test_one_relu_layer_nngp_matches_numpy_arccos_kernel():
    x = torch.randn(7, 5, dtype=torch.float64)
    model = mlp(5, [16], 1)
    got = ntbridge.nngp(model, x).numpy()

    xn = x.numpy()
    k0 = W_STD ** 2 * xn @ xn.T / 5 + B_STD(5) ** 2
    d = np.sqrt(np.diag(k0))
    cos = np.clip(k0 / np.outer(d, d), -1, 1)
    t = np.arccos(cos)
    k1 = np.outer(d, d) * (np.sin(t) + (np.pi - t) * np.cos(t)) / (2 * np.pi)
    expected = W_STD ** 2 * k1 + B_STD(16) ** 2
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_relu_kernel_and_derivative_match_independent_integrals():
    """E[relu(u) relu(v)] by adaptive 2D integration; E[relu'(u) relu'(v)] = P(u > 0, v > 0) by
    Sheppard's orthant formula 1/4 + asin(rho) / (2 pi)."""
    import jax
    from scipy import integrate, stats
    from ntbridge.stax import ab_relu_rule

    for q1, q2, c in [(1.3, 0.7, 0.4), (1.0, 2.0, -1.1), (0.5, 0.5, 0.499)]:
        density = stats.multivariate_normal([0, 0], [[q1, c], [c, q2]]).pdf
        expected, _ = integrate.dblquad(lambda v, u: u * v * density([u, v]), 0, 12, 0, 12,
                                        epsabs=1e-11, epsrel=1e-10)
        with jax.enable_x64(True):
            nngp, dot = ab_relu_rule(0.0, 1.0)(np.array(c), np.array(q1), np.array(q2))
        np.testing.assert_allclose(float(nngp), expected, rtol=1e-7)
        np.testing.assert_allclose(float(dot), 0.25 + math.asin(c / math.sqrt(q1 * q2)) / (2 * math.pi),
                                   rtol=1e-12)


def test_symmetric_exactly_and_dtypes():
    model = mlp(4, [32, 32], 2)
    x = torch.randn(9, 4)
    k = ntbridge.kernel(model, x)
    for v in k:
        assert v.dtype == torch.float32
        assert torch.equal(v, v.T)
    k64 = ntbridge.kernel(model, x.double())
    assert k64.ntk.dtype == torch.float64 and torch.equal(k64.ntk, k64.ntk.T)
    torch.testing.assert_close(k64.ntk.float(), k.ntk, rtol=1e-5, atol=0)
    assert ntbridge.ntk(model, x.half()).dtype == torch.float32


def test_x2_matches_blocks_of_the_joint_kernel():
    model = mlp(4, [32], 1)
    x1, x2 = torch.randn(5, 4), torch.randn(3, 4)
    full = ntbridge.ntk(model, torch.cat([x1, x2]))
    torch.testing.assert_close(ntbridge.ntk(model, x1, x2), full[:5, 5:], rtol=1e-5, atol=1e-6)


def test_hyperparameters_init_infer_and_explicit():
    model = mlp(4, [256], 1).double()
    x = torch.randn(6, 4, dtype=torch.float64)
    with torch.no_grad():
        for m in model:
            if isinstance(m, nn.Linear):
                m.weight.normal_(0, 1.7 / m.in_features ** 0.5)
                m.bias.fill_(0.2)
    hyper = {n.name: n.hyper for n in ntbridge.convert(model, init="infer").layers if n.hyper}
    for name, h in hyper.items():
        count = model.get_submodule(name).weight.numel()
        # the variance estimate from `count` Gaussian entries has relative std sqrt(2 / count)
        assert abs(h["W_std"] ** 2 / 1.7 ** 2 - 1) < 5 * (2 / count) ** 0.5
        assert h["b_std"] == pytest.approx(0.2, rel=1e-12)
    explicit = ntbridge.nngp(model, x, W_std={k: h["W_std"] for k, h in hyper.items()}, b_std=0.2)
    torch.testing.assert_close(ntbridge.nngp(model, x, init="infer"), explicit, rtol=1e-12, atol=0)
    assert not torch.allclose(explicit, ntbridge.nngp(model, x), rtol=0.1)


# ---------------------------------------------------------------- Monte-Carlo over random inits

@pytest.mark.slow
@pytest.mark.parametrize("widths,samples", [([512], 100), ([512, 512], 50)])
@pytest.mark.parametrize("parameterization", ["standard", "ntk"])
def test_analytic_kernels_match_monte_carlo_of_wide_networks(widths, samples, parameterization):
    # One hidden layer: the expected empirical kernels equal the analytic ones at any width. Two:
    # the bias is O(1/width), about 2e-3 relative here, below one standard error.
    x = torch.randn(5, 4, dtype=torch.float64)
    model = mlp(4, widths, 256).double()  # many i.i.d. outputs: the NNGP's own noise is O(1)
    nngp_samples, ntk_samples = sample_kernels(model, x, samples, parameterization)
    k = ntbridge.kernel(model, x, parameterization=parameterization)
    assert_within_standard_error(nngp_samples, k.nngp, "NNGP")
    assert_within_standard_error(ntk_samples, k.ntk, f"NTK ({parameterization})")
