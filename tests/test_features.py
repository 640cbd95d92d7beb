"""Random features of the analytic kernels (ntbridge.features): their Gram matrices average to
the analytic NNGP and NTK over seeds (tolerances from the seeds' standard errors), their error
falls as the features grow, chunks and dtypes do not change them, and bad input is refused."""

import math
import warnings

import pytest
import torch
from torch import nn

import ntbridge
from ntbridge.errors import AccuracyWarning, InputError, ShapeError, UnsupportedLayerError

SEEDS = 12


def _grams(model, x, n_features, seeds=SEEDS, **kw):
    """Per seed, the NNGP and NTK Gram matrices of the features: ``(seeds, N, N)`` each."""
    out = [ntbridge.features(model, x, n_features, get=("nngp", "ntk"), seed=s, **kw)
           for s in range(seeds)]
    return {name: torch.stack([f[i] @ f[i].T for f in out]) for i, name in enumerate(("nngp", "ntk"))}


def _assert_mean_matches(grams, model, x, **kw):
    """The seeds' mean within 5 standard errors of the analytic kernels, entry by entry."""
    exact = ntbridge.kernel(model, x, **kw)
    for name, g in grams.items():
        mean, se = g.mean(0), g.std(0) / math.sqrt(len(g))
        k = getattr(exact, name)
        assert ((mean - k).abs() <= 5 * se + 1e-12 * k.abs().max()).all(), name


class Residual(nn.Module):
    def __init__(self, d=6, width=32):
        super().__init__()
        self.inp, self.f1, self.f2, self.out = (nn.Linear(d, width), nn.Linear(width, width),
                                                nn.Linear(width, width), nn.Linear(width, 2))

    def forward(self, x):
        h = self.inp(x)
        h = h + self.f2(torch.relu(self.f1(torch.relu(h))))
        return self.out(torch.relu(h))


@pytest.mark.parametrize("parameterization", ["standard", "ntk"])
@pytest.mark.parametrize("act", [nn.ReLU, nn.Tanh])
def test_one_hidden_layer_is_unbiased(act, parameterization):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 64), act(), nn.Linear(64, 3)).double()
    x = torch.randn(10, 5, dtype=torch.float64)
    grams = _grams(model, x, 256, parameterization=parameterization)
    _assert_mean_matches(grams, model, x, parameterization=parameterization)


@pytest.mark.parametrize("build, shape", [
    (lambda: nn.Sequential(nn.Conv2d(2, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, stride=2),
                           nn.GELU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 1)),
     (2, 6, 6)),
    (lambda: nn.Sequential(nn.Conv1d(2, 8, 3), nn.ReLU(), nn.AvgPool1d(2), nn.Flatten(),
                           nn.Linear(48, 16), nn.ReLU(), nn.Linear(16, 1)), (2, 14)),
    (Residual, (6,)),
], ids=["cnn-gap", "cnn1d-flatten", "residual-mlp"])
def test_deep_networks_converge(build, shape):
    """Deeper networks are biased by O(depth / F) (each layer sees the last one's finite
    features), here ~1% of the kernel at most, within the 5 standard errors of 12 seeds (~15%)."""
    torch.manual_seed(0)
    model = build().double()
    x = torch.randn(6, *shape, dtype=torch.float64)
    _assert_mean_matches(_grams(model, x, 256), model, x)


def test_error_falls_with_the_number_of_features():
    """Relative error of the Gram matrix at F and 16 F (mean over 4 seeds): ~ F^-1/2 predicts a
    4x drop; the test asks for 2x."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                          nn.Linear(32, 1)).double()
    x = torch.randn(16, 4, dtype=torch.float64)
    exact = ntbridge.kernel(model, x)
    for name in ("nngp", "ntk"):
        k = getattr(exact, name)
        error = {f: sum(float((g - k).norm() / k.norm()) for g in _grams(model, x, f, 4)[name]) / 4
                 for f in (64, 1024)}
        assert error[1024] < error[64] / 2, (name, error)


def test_chunks_and_dtypes_do_not_change_features():
    torch.manual_seed(2)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(16, 1))
    x = torch.randn(7, 1, 4, 4)
    whole = ntbridge.features(model, x, 32, get="ntk", seed=3)
    chunked = ntbridge.features(model, x, 32, get="ntk", seed=3, batch_size=3)
    torch.testing.assert_close(chunked, whole)  # the same draws: equal up to summation order
    f64 = ntbridge.features(model, x.double(), 32, get="ntk", seed=3)
    assert f64.dtype == torch.float64 and torch.allclose(whole.double(), f64, rtol=1e-4, atol=1e-5)
    assert not torch.equal(whole, ntbridge.features(model, x, 32, get="ntk", seed=4))


def test_rtol_warns_with_the_expected_error():
    model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1))
    x = torch.randn(20, 3)
    with pytest.warns(AccuracyWarning, match="features would reach rtol"):
        ntbridge.features(model, x, 16, rtol=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ntbridge.features(model, x, 16, rtol=10.0)


def test_bad_input_is_refused():
    mlp = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1))
    x = torch.randn(4, 3)
    with pytest.raises(UnsupportedLayerError, match=r"module 1 '1' \(MaxPool2d\)"):
        ntbridge.features(nn.Sequential(nn.Conv2d(1, 2, 3), nn.MaxPool2d(2), nn.Flatten(),
                                        nn.Linear(8, 1)), torch.randn(2, 1, 6, 6), 8)
    with pytest.raises(UnsupportedLayerError, match="Gaussian inputs"):
        ntbridge.features(nn.Sequential(nn.ReLU(), nn.Linear(3, 1)), x, 8)
    with pytest.raises(ShapeError, match="does not fit the model"):
        ntbridge.features(mlp, torch.randn(4, 5), 8)
    with pytest.raises(ShapeError, match="end the model in a Linear"):
        ntbridge.features(nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU()), torch.randn(2, 1, 5, 5), 8)
    for bad in (0, 2.5, True):
        with pytest.raises(InputError, match="n_features"):
            ntbridge.features(mlp, x, bad)
    with pytest.raises(InputError, match="get"):
        ntbridge.features(mlp, x, 8, get="jacobian")
    with pytest.raises(InputError, match=r"x has dtype torch.int64.*pass x.float\(\)"):
        ntbridge.features(mlp, x.long(), 8)
