"""ntbridge.monte_carlo: converges to the closed form, its error shrinks as 1/sqrt(n), tiles;
BatchNorm: eval mode as a fresh module in every sample, batch statistics refused."""

import copy

import jax
import numpy as np
import pytest
import torch
from torch import nn

import ntbridge

from reference import empirical_ntk

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
    assert torch.isfinite(ntbridge.ntk(net, x)).all()  # and an analytic rule (stax/maxpool.py)


def test_bad_sample_counts():
    x = torch.randn(3, 4, dtype=torch.float64)
    for n, err in [(0, ntbridge.errors.InputError), ([5, 3], ntbridge.errors.InputError),
                   ("many", ntbridge.errors.InputTypeError)]:
        with pytest.raises(err, match="n_samples"):
            ntbridge.monte_carlo(model(), x, n_samples=n)


def trained_batchnorm_model():
    """Linear, eval-mode BatchNorm whose buffers and affine parameters are not a fresh module's,
    ReLU, Linear (float64)."""
    model = nn.Sequential(nn.Linear(3, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 2)).double()
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for t in (model[1].running_mean, model[1].weight, model[1].bias):
            t.copy_(torch.randn(6, generator=gen, dtype=torch.float64))
        model[1].running_var.uniform_(0.5, 2.0, generator=gen)
    return model.eval()


def torch_samples(model, x1, x2, n_samples, get):
    """Each sample's kernel computed by torch: the affine layers' weights drawn as monte_carlo
    documents (``convert(model).init_fn(fold_in(key(seed=0), s))``), the BatchNorm a fresh module
    (its own ``reset_parameters()``), the NTK w.r.t. the parameters by torch.func."""
    sample = copy.deepcopy(model)
    sample[1].reset_parameters()
    graph = ntbridge.convert(model)
    kernels = []
    with jax.enable_x64(True):
        for s in range(n_samples):
            _, drawn = graph.init_fn(jax.random.fold_in(jax.random.key(0), s), tuple(x1.shape))
            affine = {k: torch.tensor(np.asarray(v)) for k, v in drawn.items()
                      if not k.startswith("1.")}
            sample.load_state_dict(affine, strict=False)
            with torch.no_grad():
                f1, f2 = sample(x1), sample(x2)
            kernels.append(empirical_ntk(sample, x1, x2) if get == "ntk" else f1 @ f2.T / 2)
    return torch.stack(kernels)


@pytest.mark.slow
@pytest.mark.parametrize("get", ["ntk", "nngp"])
def test_eval_batchnorm_is_a_fresh_module_in_every_sample(get):
    model = trained_batchnorm_model()
    x1, x2 = torch.randn(4, 3, dtype=torch.float64), torch.randn(3, 3, dtype=torch.float64)
    est = ntbridge.monte_carlo(model, x1, x2, n_samples=3, get=get)
    samples = torch_samples(model, x1, x2, 3, get)
    torch.testing.assert_close(est.mean, samples.mean(0), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(est.standard_error, samples.std(0) / 3 ** 0.5, rtol=1e-7, atol=1e-12)


@pytest.mark.parametrize("bn,why", [
    (nn.BatchNorm1d(6), "in training mode"),
    (nn.BatchNorm1d(6, track_running_stats=False).eval(),
     r"without running statistics \(track_running_stats=False\)"),
], ids=["training-mode", "no-running-statistics"])
def test_batch_statistics_are_refused_by_name(bn, why):
    model = nn.Sequential(nn.Linear(3, 6), bn, nn.ReLU(), nn.Linear(6, 2))
    with pytest.raises(ntbridge.errors.UnsupportedLayerError,
                       match=rf"module '1' \(BatchNorm1d\) {why} normalises with the batch's own "
                             rf"statistics.*kernel of each pair of examples. Call model.eval\(\)"):
        ntbridge.monte_carlo(model, torch.randn(4, 3), n_samples=2)
