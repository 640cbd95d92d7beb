"""Transposed convolutions: forward equivalence with torch, the covariance map against a numpy
reference of torch's index arithmetic, the one-layer NTK against torch.func, Monte-Carlo of wide
models."""

import itertools
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import ntbridge
from ntbridge import errors

from helpers import assert_forward_matches, assert_kernels, assert_layouts_agree
from montecarlo import check_architecture
from reference import channel_averaged_ntk, empirical_ntk

TRANSPOSES = [
    nn.ConvTranspose1d(3, 4, 3),
    nn.ConvTranspose1d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2, dilation=2),
    nn.ConvTranspose1d(3, 4, 4, stride=3, padding=5, bias=False),  # padding crops beyond the taps
    nn.ConvTranspose2d(2, 4, 3, stride=2, padding=1, output_padding=1),
    nn.ConvTranspose2d(2, 3, (2, 3), stride=(1, 2), padding=(0, 1), dilation=(2, 1)),
    nn.ConvTranspose2d(4, 6, 2, stride=2, groups=2, bias=False),
    nn.ConvTranspose3d(2, 2, 2, stride=2),
    nn.ConvTranspose3d(2, 4, (2, 3, 1), stride=(1, 2, 3), padding=(1, 0, 0),
                       output_padding=(0, 1, 2), groups=2),
]
SPATIAL = {1: (5,), 2: (4, 5), 3: (3, 4, 3)}


def _input(conv, n=3):
    return torch.randn(n, conv.in_channels, *SPATIAL[conv.weight.ndim - 2], dtype=torch.float64)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("conv", TRANSPOSES, ids=repr)
def test_forward_matches_torch(conv, dtype):
    assert_forward_matches(conv, _input(conv).to(dtype))


# ---------------------------------------------------------------- the covariance map, exactly

def tap_matrices(conv, axis: int, length: int) -> list[np.ndarray]:
    """torch's transposed convolution along ``axis``: input ``i`` reaches output
    ``i * stride - padding + j * dilation`` through offset ``j`` (one 0/1 matrix per offset)."""
    k, s, p = conv.kernel_size[axis], conv.stride[axis], conv.padding[axis]
    d, op = conv.dilation[axis], conv.output_padding[axis]
    out = (length - 1) * s - 2 * p + d * (k - 1) + op + 1
    taps = []
    for j in range(k):
        a = np.zeros((out, length))
        for i in range(length):
            if 0 <= i * s - p + j * d < out:
                a[i * s - p + j * d, i] = 1
        taps.append(a)
    return taps


def reference_covariance(conv, x1, x2) -> np.ndarray:
    """``sum_j (A_j x1)(A_j x2)^T`` over every multi-offset ``j`` (``A_j``: per axis), averaged
    over channels: ``(N1, N2, S1, S1', S2, S2', ...)``."""
    ndim = x1.ndim - 2
    per_axis = [tap_matrices(conv, d, x1.shape[2 + d]) for d in range(ndim)]
    interleave = [i for d in range(ndim) for i in (1 + d, ndim + 2 + d)]
    total = 0
    for taps in itertools.product(*per_axis):
        y1, y2 = x1.numpy(), x2.numpy()
        for d, a in enumerate(taps):
            y1, y2 = (np.moveaxis(np.tensordot(a, y, (1, 2 + d)), 0, 2 + d) for y in (y1, y2))
        # (N, *S) x (M, *S) -> (N, M, S1, S1', ...)
        total = total + np.tensordot(y1, y2, (1, 1)).transpose(0, ndim + 1, *interleave)
    return total / x1.shape[1]


@pytest.mark.slow
def test_kernels_are_the_covariance_map():
    cases = {}
    for conv in TRANSPOSES:
        conv = conv.double()
        x1, x2 = _input(conv), _input(conv, 2)
        fan_in = conv.weight[0].numel()
        per_channel = conv.in_channels / conv.groups * reference_covariance(conv, x1, x2)
        bias = conv.bias is not None
        nngp = per_channel / (3 * fan_in) + (1 / (3 * fan_in) if bias else 0)  # torch's init
        ntk = per_channel + bias  # standard parameterization: the weights' and the bias' gradients
        np.testing.assert_allclose(channel_averaged_ntk(conv, x1, x2), ntk, rtol=1e-10,
                                   atol=1e-12, err_msg=repr(conv))
        cases[repr(conv)] = conv, x1, x2, (nngp, ntk)
    networks = assert_kernels(cases)
    assert not any(network.full_spatial for network in networks.values())  # both layouts checked


# ---------------------------------------------------------------- Monte-Carlo over random inits
# One nonlinearity per network: the expected empirical kernels equal the analytic ones at any
# width, so only the sampling error remains.

def decoder_2d():
    return nn.Sequential(
        nn.ConvTranspose2d(2, 128, 3, stride=2, padding=1, output_padding=1), nn.ReLU(),
        nn.ConvTranspose2d(128, 32, 2, padding=1, dilation=2, groups=4), nn.Flatten(),
        nn.Linear(32 * 4 * 4, 128)), (2, 2, 2)


def decoder_1d():
    return nn.Sequential(
        nn.ConvTranspose1d(3, 128, 4, stride=3, padding=2, output_padding=1, dilation=2), nn.ReLU(),
        nn.ConvTranspose1d(128, 64, 3, groups=8, bias=False), nn.Flatten(),
        nn.Linear(64 * 12, 128)), (3, 3)


def decoder_3d_then_conv():
    return nn.Sequential(
        nn.ConvTranspose3d(2, 64, 2, stride=2), nn.ReLU(),
        nn.Conv3d(64, 16, (1, 2, 1), padding=(0, 1, 0)), nn.Flatten(),
        nn.Linear(16 * 4 * 5 * 4, 128)), (2, 2, 2, 2)


@pytest.mark.slow
@pytest.mark.parametrize("parameterization", ["standard", "ntk"])
@pytest.mark.parametrize("build", [decoder_2d, decoder_1d, decoder_3d_then_conv])
def test_decoder_kernels_match_monte_carlo(build, parameterization):
    check_architecture(build, parameterization)


# ---------------------------------------------------------------- invariants and errors

def test_layouts_agree_after_two_transposes():
    model = nn.Sequential(
        nn.ConvTranspose2d(3, 8, 3, stride=2, padding=1), nn.ReLU(),
        nn.ConvTranspose2d(8, 8, 2, stride=2, output_padding=1, dilation=2), nn.ReLU(),
        nn.Flatten(), nn.Linear(8 * 12 * 12, 2)).double()
    assert_layouts_agree(model, torch.randn(4, 3, 3, 3, dtype=torch.float64))


@pytest.mark.parametrize("implementation", ["jacobian", "structured"])
def test_empirical_ntk_is_torch_funcs(implementation):
    model = nn.Sequential(nn.ConvTranspose2d(3, 4, 3, stride=2, groups=1), nn.ReLU(), nn.Flatten(),
                          nn.Linear(4 * 9 * 9, 3)).double()
    x = torch.randn(4, 3, 4, 4, dtype=torch.float64)
    torch.testing.assert_close(ntbridge.empirical_ntk(model, x, implementation=implementation),
                               empirical_ntk(model, x, x), rtol=1e-12, atol=1e-14)


def test_torch_init_is_read_with_torchs_fan_in():
    """torch draws a (in, out / groups, *k) weight with fan_in = out / groups * prod(k): a fresh
    module passes the init check, kaiming_normal_ (whose fan_in is the same) does not."""
    conv, x = nn.ConvTranspose2d(64, 8, 3, groups=2), torch.randn(2, 64, 3, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ntbridge.ntk(conv, x)
    nn.init.kaiming_normal_(conv.weight)
    with pytest.warns(errors.InitMismatchWarning,
                      match=r"the model \(ConvTranspose2d\): weight has"):
        ntbridge.ntk(conv, x)


def test_bad_inputs_name_the_module():
    model = nn.Sequential(nn.ConvTranspose2d(3, 8, 3), nn.ReLU(), nn.ConvTranspose2d(4, 8, 3))
    with pytest.raises(errors.ShapeError, match=r"module 2 '2' \(ConvTranspose2d\): expects "
                                                r"inputs of shape \(N, 4, H, W\)"):
        ntbridge.ntk(model, torch.randn(2, 3, 4, 4))
    with pytest.raises(errors.ShapeError, match=r"module 0 '0' .*gives no output positions"):
        ntbridge.ntk(nn.Sequential(nn.ConvTranspose1d(3, 4, 1, padding=1)), torch.randn(2, 3, 2))
    with pytest.raises(errors.InputError, match=r"module 0 '0' \(ConvTranspose1d\): "
                                                r"output_padding \(1,\) must be smaller"):
        ntbridge.ntk(nn.Sequential(nn.ConvTranspose1d(3, 4, 3, output_padding=1)),
                     torch.randn(2, 3, 5))
