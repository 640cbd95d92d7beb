"""ntbridge.monte_carlo: converges to the closed form, its error shrinks as 1/sqrt(n), tiles."""

import pytest
import torch
from torch import nn

import ntbridge

# Explicit W_std/b_std: init_fn then draws Gaussian weights, for which the analytic kernel of a
# one-hidden-layer network is the exact expectation at any width.
HYPER = dict(W_std=1.2, b_std=0.3)


def model(outputs=8):
    return nn.Sequential(nn.Linear(4, 256), nn.ReLU(), nn.Linear(256, outputs)).double()


@pytest.mark.slow
@pytest.mark.parametrize("get", ["ntk", "nngp"])
def test_converges_to_the_analytic_kernel(get):
    x = torch.randn(5, 4, dtype=torch.float64)
    outputs = 64 if get == "nngp" else 8  # the NNGP's sample noise is O(1): average many outputs
    est = ntbridge.monte_carlo(model(outputs), x, n_samples=300, get=get, **HYPER)
    exact = ntbridge.kernel(model(outputs), x, get=get, **HYPER)
    # within 5 standard errors (estimated from the samples), and precise enough to mean something
    assert (est.standard_error < 0.03 * exact.abs().max()).all()
    assert ((est.mean - exact).abs() < 5 * est.standard_error).all()


@pytest.mark.slow
def test_standard_error_shrinks_as_one_over_sqrt_n():
    x = torch.randn(5, 4, dtype=torch.float64)
    small, large = list(ntbridge.monte_carlo(model(), x, n_samples=[100, 400], **HYPER))
    assert (small.n_samples, large.n_samples) == (100, 400)
    ratio = (large.standard_error.norm() / small.standard_error.norm()).item()
    # expected 0.5; the variance estimates' own relative error is about sqrt(2 / n) per entry,
    # much less for the norm over 25 entries
    assert abs(ratio - 0.5) < 0.1


@pytest.mark.slow
def test_tiling_does_not_change_the_estimate():
    x1, x2 = torch.randn(5, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    small = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2)).double()
    a = ntbridge.monte_carlo(small, x1, x2, n_samples=3, **HYPER)
    b = ntbridge.monte_carlo(small, x1, x2, n_samples=3, batch_size=2, device_count=2, **HYPER)
    torch.testing.assert_close(a.mean, b.mean, rtol=1e-10, atol=0)
    torch.testing.assert_close(a.standard_error, b.standard_error, rtol=1e-8, atol=0)
    s = ntbridge.monte_carlo(small, x1, n_samples=3, batch_size=3, **HYPER)
    assert torch.equal(s.mean, s.mean.T)


def test_works_for_a_model_with_maxpool():
    net = nn.Sequential(nn.Conv2d(2, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                        nn.Linear(16 * 4, 3))
    x = torch.randn(4, 2, 4, 4)
    est = ntbridge.monte_carlo(net, x, n_samples=20)
    assert est.mean.shape == (4, 4) and torch.isfinite(est.mean).all()
    assert (est.standard_error > 0).all()
    with pytest.raises(ntbridge.errors.UnsupportedLayerError, match="MaxPool2d"):
        ntbridge.ntk(net, x)


def test_bad_sample_counts():
    x = torch.randn(3, 4, dtype=torch.float64)
    for n, err in [(0, ntbridge.errors.InputError), ([5, 3], ntbridge.errors.InputError),
                   ("many", ntbridge.errors.InputTypeError)]:
        with pytest.raises(err, match="n_samples"):
            ntbridge.monte_carlo(model(), x, n_samples=n)
