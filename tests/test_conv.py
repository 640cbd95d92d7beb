"""Convolutions: forward equivalence with torch, kernel rules against Monte-Carlo, layout invariants."""

import jax
import numpy as np
import pytest
import torch
from torch import nn

import ntbridge
from ntbridge import errors

from helpers import assert_forward_matches, assert_layouts_agree
from montecarlo import check_architecture

CONVS = [
    nn.Conv1d(3, 4, 3),
    nn.Conv1d(3, 6, 4, stride=2, padding=3, dilation=2, groups=3, bias=False),
    nn.Conv1d(3, 4, 4, padding="same", dilation=3, padding_mode="circular"),
    nn.Conv1d(3, 4, 3, padding=2, padding_mode="reflect"),
    nn.Conv2d(2, 4, 3),
    nn.Conv2d(2, 4, (2, 3), stride=(2, 1), padding=(1, 2), dilation=(2, 1)),
    nn.Conv2d(4, 6, 2, padding="same", groups=2),
    nn.Conv2d(2, 4, 3, padding="valid", bias=False),
    nn.Conv2d(2, 4, 3, padding=1, padding_mode="circular", stride=2),
    nn.Conv2d(2, 4, (3, 2), padding=(2, 1), padding_mode="replicate"),
    nn.Conv3d(2, 4, 2),
    nn.Conv3d(2, 4, (2, 3, 1), stride=(1, 2, 1), padding=(1, 0, 1), dilation=(2, 1, 1)),
    nn.Conv3d(2, 2, 3, padding="same", padding_mode="reflect", groups=2),
]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("conv", CONVS, ids=repr)
def test_conv_forward_matches_torch(conv, dtype):
    spatial = {1: (7,), 2: (6, 5), 3: (5, 4, 5)}[conv.weight.ndim - 2]
    assert_forward_matches(conv, torch.randn(3, conv.in_channels, *spatial, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_small_cnn_forward_matches_torch(dtype):
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, stride=2, groups=4),
        nn.ReLU(), nn.Flatten(), nn.Linear(8 * 3 * 3, 5))
    assert_forward_matches(model, torch.randn(4, 3, 7, 7, dtype=dtype))


# ---------------------------------------------------------------- Monte-Carlo over random inits
# One nonlinearity in each network: the expected empirical kernels then equal the analytic ones at
# any width, so only the sampling error remains (that of the test's own samples).

def cnn_2d_flatten():
    return nn.Sequential(
        nn.Conv2d(2, 64, 3, padding=1), nn.ReLU(),
        nn.Conv2d(64, 64, (2, 3), stride=2, padding=(0, 2), dilation=(1, 2), groups=4),
        nn.Flatten(), nn.Linear(64 * 2 * 2, 128)), (2, 4, 4)


def cnn_1d_reflect_groups():
    return nn.Sequential(
        nn.Conv1d(3, 128, 3, stride=2, padding=2, dilation=2, padding_mode="reflect"), nn.ReLU(),
        nn.Conv1d(128, 64, 2, groups=8, bias=False, padding="same", padding_mode="circular"),
        nn.Flatten(), nn.Linear(64 * 4, 128)), (3, 7)


def cnn_3d_replicate():
    return nn.Sequential(
        nn.Conv3d(2, 64, 2, padding=1, padding_mode="replicate"), nn.ReLU(),
        nn.Conv3d(64, 32, 2, stride=2), nn.Flatten(), nn.Linear(32 * 8, 128)), (2, 3, 3, 3)


@pytest.mark.slow
@pytest.mark.parametrize("parameterization", ["standard", "ntk"])
@pytest.mark.parametrize("build", [cnn_2d_flatten, cnn_1d_reflect_groups, cnn_3d_replicate])
def test_cnn_kernels_match_monte_carlo(build, parameterization):
    check_architecture(build, parameterization)


# ---------------------------------------------------------------- invariants

def deep_cnn():
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 2, stride=2, dilation=1),
        nn.ReLU(), nn.Conv2d(16, 16, 3, padding="same", padding_mode="circular"), nn.Flatten(),
        nn.Linear(16 * 9, 3))


@pytest.mark.slow
def test_diagonal_and_full_spatial_layouts_agree():
    model, x = deep_cnn().double(), torch.randn(5, 3, 6, 6, dtype=torch.float64)
    _, diagonal = assert_layouts_agree(model, x)
    assert diagonal.nngp.shape == (5, 5)


@pytest.mark.parametrize("mode", ["constant", "wrap", "reflect", "edge"])
def test_window_matrix_is_the_window_sum(mode):
    """The matrix of the diagonal layout sums the same windows as the shifted sums of the full one,
    for every padding mode, stride and dilation."""
    from ntbridge.stax.conv import window_matrix, window_reduce
    rng = np.random.default_rng(0)
    for length, size, stride, dilation, pad in [(7, 3, 1, 1, (1, 1)), (8, 2, 2, 1, (0, 1)),
                                                (9, 3, 2, 2, (2, 2)), (5, 4, 1, 1, (2, 1))]:
        a = rng.standard_normal((2, length))
        expected = window_reduce(jax.numpy.asarray(a), (1,), size, stride, dilation, pad, mode,
                                 jax.numpy.add)
        # float32 sums of at most size * size terms (reflections repeat an input) against exact ones
        atol = size ** 2 * np.finfo(np.float32).eps * np.abs(a).max()
        np.testing.assert_allclose(a @ window_matrix(length, size, stride, dilation, pad, mode).T,
                                   expected, rtol=0, atol=atol)


def test_symmetric_psd_and_dtypes():
    model, x = deep_cnn(), torch.randn(7, 3, 6, 6)
    k32, k64 = ntbridge.kernel(model, x), ntbridge.kernel(model.double(), x.double())
    for k in (k32, k64):
        for v in k:
            assert torch.equal(v, v.T)
            assert torch.linalg.eigvalsh(v.double()).min() > -1e-6 * v.abs().max()
    torch.testing.assert_close(k64.ntk.float(), k32.ntk, rtol=1e-5, atol=0)
    torch.testing.assert_close(k64.nngp.float(), k32.nngp, rtol=1e-5, atol=0)


def test_x2_matches_blocks_of_the_joint_kernel():
    model, x1, x2 = deep_cnn().double(), *torch.randn(2, 4, 3, 6, 6, dtype=torch.float64)
    joint = ntbridge.ntk(model, torch.cat([x1, x2]))
    torch.testing.assert_close(ntbridge.ntk(model, x1, x2), joint[:4, 4:], rtol=1e-12, atol=0)


def test_wrong_channel_count_names_the_conv_and_expected_shape():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(4, 8, 3))
    with pytest.raises(errors.ShapeError,
                       match=r"module 2 '2' \(Conv2d\): expects inputs of shape \(N, 4, H, W\), "
                             r"got \(2, 8, 4, 4\)"):
        ntbridge.ntk(model, torch.randn(2, 3, 6, 6))
    with pytest.raises(errors.ShapeError, match=r"smaller than the \(dilated, padded\) kernel"):
        ntbridge.ntk(nn.Conv2d(3, 8, 5), torch.randn(2, 3, 4, 4))
