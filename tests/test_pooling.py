"""Pooling, Flatten and Unflatten: forward equivalence with torch, kernel rules against
Monte-Carlo and exact identities, errors of the modules without a kernel rule."""

import pytest
import torch
from torch import nn

import ntbridge
from ntbridge import errors

from helpers import LAYOUT_NTK_RTOL, assert_forward_matches
from montecarlo import check_architecture

POOLS = [
    nn.AvgPool1d(3),
    nn.AvgPool1d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    nn.AvgPool2d(2),
    nn.AvgPool2d((3, 2), stride=(2, 1), padding=(1, 0), ceil_mode=True),
    nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False, divisor_override=5),
    nn.AvgPool3d((2, 3, 2), stride=2, padding=(1, 1, 0), ceil_mode=True, count_include_pad=False),
    nn.AdaptiveAvgPool1d(3),
    nn.AdaptiveAvgPool2d(1),
    nn.AdaptiveAvgPool2d((3, None)),
    nn.AdaptiveAvgPool3d((2, 1, 3)),
    nn.MaxPool1d(3, stride=2, padding=1, dilation=2, ceil_mode=True),
    nn.MaxPool2d(2),
    nn.MaxPool2d((3, 2), stride=(2, 1), padding=1, ceil_mode=True),
    nn.MaxPool3d(2, stride=1, dilation=(1, 2, 1)),
    nn.AdaptiveMaxPool1d(4),
    nn.AdaptiveMaxPool2d((3, 2)),
    nn.AdaptiveMaxPool3d((None, 2, 1)),
    nn.Flatten(),
    nn.Flatten(2),
    nn.Flatten(1, 2),
    nn.Unflatten(2, (2, -1)),
]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("module", POOLS, ids=repr)
def test_forward_matches_torch(module, dtype):
    name = type(module).__name__
    ndim = int(name[-2]) if name[-2].isdigit() else 2
    spatial = {1: (8,), 2: (6, 7), 3: (5, 6, 5)}[ndim]
    assert_forward_matches(module, torch.randn(2, 3, *spatial, dtype=dtype))


def test_unflatten_channels_forward_and_cnn():
    model = nn.Sequential(nn.Linear(5, 24), nn.Unflatten(1, (6, 2, 2)), nn.Conv2d(6, 4, 2),
                          nn.ReLU(), nn.AvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))
    assert_forward_matches(model, torch.randn(4, 5, dtype=torch.float64))


# ---------------------------------------------------------------- Monte-Carlo over random inits
# One nonlinearity per network: the expected empirical kernels equal the analytic ones at any width.

def cnn_avgpool():
    return nn.Sequential(
        nn.Conv2d(2, 128, 3, padding=1), nn.ReLU(),
        nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False, ceil_mode=True),
        nn.Conv2d(128, 64, 2), nn.Flatten(), nn.Linear(64 * 4, 128)), (2, 5, 5)


def cnn_global_pool():
    return nn.Sequential(
        nn.Conv2d(3, 128, 3, padding="same", padding_mode="circular"), nn.ReLU(),
        nn.Conv2d(128, 64, 2, stride=2, groups=2), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(64, 128)), (3, 4, 4)


def cnn_1d_3d_pools():
    return nn.Sequential(
        nn.Conv3d(2, 128, 2, padding=1), nn.ReLU(), nn.AvgPool3d(2, stride=1),
        nn.AdaptiveAvgPool3d((2, 1, None)), nn.Flatten(2), nn.AvgPool1d(2, padding=1),
        nn.Conv1d(128, 64, 2), nn.AdaptiveAvgPool1d(1), nn.Flatten(),
        nn.Linear(64, 128)), (2, 3, 3, 3)


@pytest.mark.slow
@pytest.mark.parametrize("parameterization", ["standard", "ntk"])
@pytest.mark.parametrize("build", [cnn_avgpool, cnn_global_pool, cnn_1d_3d_pools])
def test_pooling_kernels_match_monte_carlo(build, parameterization):
    check_architecture(build, parameterization)


# ---------------------------------------------------------------- exact identities

@pytest.mark.slow
def test_identity_pooling_and_spatial_reshapes_leave_the_kernel_unchanged():
    """AvgPool2d(1) forces the full spatial covariance; Flatten(2) + Unflatten reshape it back."""
    head = [nn.Conv2d(3, 8, 2), nn.ReLU(), nn.Conv2d(8, 8, 2, stride=2)]
    tail = [nn.ReLU(), nn.Flatten(), nn.Linear(8 * 4, 2)]
    x = torch.randn(4, 3, 5, 5, dtype=torch.float64)
    plain = ntbridge.kernel(nn.Sequential(*head, *tail).double(), x)
    for extra in ([nn.AvgPool2d(1)], [nn.Flatten(2), nn.Unflatten(2, (2, 2))],
                  [nn.AvgPool2d(1), nn.Flatten(2), nn.Unflatten(2, (2, 2))]):
        k = ntbridge.kernel(nn.Sequential(*head, *extra, *tail).double(), x)
        torch.testing.assert_close(k.nngp, plain.nngp, rtol=1e-12, atol=0)
        torch.testing.assert_close(k.ntk, plain.ntk, rtol=LAYOUT_NTK_RTOL, atol=0)


def test_global_pooling_kernel_is_symmetric_and_psd():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(8, 2))
    for v in ntbridge.kernel(model, torch.randn(6, 3, 4, 4, dtype=torch.float64)):
        assert torch.equal(v, v.T)
        assert torch.linalg.eigvalsh(v).min() > -1e-12 * v.abs().max()


# ---------------------------------------------------------------- errors

@pytest.mark.slow
@pytest.mark.parametrize("pool", [nn.MaxPool2d(2), nn.AdaptiveMaxPool2d(1)], ids=repr)
def test_max_pooling_of_max_pooling_has_no_kernel_rule(pool):
    """MaxPool's rule needs windows of a map of one Gaussian (tests/test_sources.py); after
    another MaxPool it names the module and what works."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.MaxPool2d(2, stride=1), pool,
                          nn.Flatten(), nn.Linear(8, 1))
    name = type(pool).__name__
    with pytest.raises(errors.UnsupportedLayerError,
                       match=rf"module 3 '3' \({name}\): {name}'s kernel rule needs a Gaussian "
                             r"input or an elementwise map of one.*ntbridge.monte_carlo"):
        ntbridge.ntk(model, torch.randn(2, 3, 5, 5))
    ntbridge.empirical_ntk(model, torch.randn(2, 3, 5, 5))  # the finite model's kernel works


def test_relu_after_flatten_and_unflatten_of_channels_have_no_rule():
    x = torch.randn(2, 3, 4, 4)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(), nn.ReLU(), nn.Linear(32, 1))
    with pytest.raises(errors.UnsupportedLayerError, match=r"module 2 '2' \(ReLU\)"):
        ntbridge.ntk(model, x)
    model = nn.Sequential(nn.Linear(4, 8), nn.Unflatten(1, (2, 4)), nn.Conv1d(2, 2, 2))
    with pytest.raises(errors.UnsupportedLayerError, match=r"module 1 '1' \(Unflatten\)"):
        ntbridge.ntk(model, torch.randn(2, 4))
