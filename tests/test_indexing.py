"""Indexing, reductions, stacking, concatenation along any axis and sum pooling: forwards against
torch, kernels of a convolution followed by the operation against torch.func's exact NTK (the
model is linear in its weights), Monte-Carlo of wide models where a nonlinearity follows,
layouts, refusals by name."""

import numpy as np
import pytest
import torch
from torch import nn

import ntbridge
from ntbridge import errors

from helpers import assert_forwards_match, assert_kernels, linear_kernels, same_positions
from montecarlo import check_architecture
from reference import channel_averaged_ntk


class Applied(nn.Module):
    """``fn`` of the outputs of convolutions of ``x`` (``branches`` of them, independent)."""

    def __init__(self, fn, ndim=2, branches=1, channels=3, width=4):
        super().__init__()
        torch.manual_seed(0)
        conv = getattr(nn, f"Conv{ndim}d")
        self.convs = nn.ModuleList([conv(channels, width, 1) for _ in range(branches)])
        self.fn = fn

    def forward(self, x):
        return self.fn(*[conv(x) for conv in self.convs])


LINEAR = {  # name: (fn of the conv outputs (N, 4, 4, 5), branches, needs the full layout)
    "x[:, :, 1]": (lambda h: h[:, :, 1], 1, False),
    "x[..., 2:5]": (lambda h: h[..., 2:5], 1, False),
    "x[:, 1:3, ::2, -1]": (lambda h: h[:, 1:3, ::2, -1], 1, False),
    "x[:, 0] (positions become channels)": (lambda h: h[:, 0], 1, False),
    "x[:, 2, 1:3, 0]": (lambda h: h[:, 2, 1:3, 0], 1, False),
    "narrow": (lambda h: h.narrow(-1, 1, 3), 1, False),
    "torch.narrow negative start": (lambda h: torch.narrow(h, 2, -2, 2), 1, False),
    "select": (lambda h: h.select(2, -1), 1, False),
    "mean(-1)": (lambda h: h.mean(-1), 1, True),
    "sum((2, 3), keepdim)": (lambda h: h.sum((2, 3), keepdim=True), 1, True),
    "mean(1) (channels)": (lambda h: h.mean(1), 1, True),  # as x.mean(1) over tokens declares
    "torch.sum(1, keepdim)": (lambda h: torch.sum(h, 1, keepdim=True), 1, False),
    "mean((1, 2, 3), keepdim)": (lambda h: h.mean((1, 2, 3), keepdim=True), 1, True),
    "unsqueeze(2)": (lambda h: h.unsqueeze(2), 1, False),
    "cat positions": (lambda a, b: torch.cat([a, b], -1), 2, False),
    "cat positions, 3 branches": (lambda a, b, c: torch.cat([a, b[:, :, :2], c], 2), 3, False),
    "stack(2)": (lambda a, b: torch.stack([a, b], 2), 2, False),
    "stack(-1)": (lambda a, b, c: torch.stack((a, b, c), dim=-1), 3, False),
    "sum pool": (nn.AvgPool2d(2, 1, divisor_override=1), 1, True),
    "divisor 3, ceil": (nn.AvgPool2d(3, 2, padding=1, ceil_mode=True, divisor_override=3), 1, True),
    "LPPool p=1": (nn.LPPool2d(1, (2, 3), stride=1), 1, True),
    "LPPool p=1, ceil": (nn.LPPool2d(1, 2, ceil_mode=True), 1, True),
}


def _model(name):
    fn, branches, _ = LINEAR[name]
    return Applied(fn, branches=branches)


def _x(n=3, dtype=torch.float64):
    return torch.randn(n, 3, 4, 5, dtype=dtype)  # conv outputs (N, 4, 4, 5)


@pytest.mark.slow
def test_kernels_of_linear_maps_are_exact():
    models, x1, x2 = {name: _model(name).double() for name in LINEAR}, _x(), _x(2)
    networks = assert_kernels({name: (model, x1, x2, linear_kernels(model, x1, x2))
                               for name, model in models.items()})
    for name, network in networks.items():
        assert network.full_spatial == LINEAR[name][2], name


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_forwards_match_torch(dtype):
    assert_forwards_match([_model(name) for name in LINEAR], [_x(dtype=dtype) for _ in LINEAR])


@pytest.mark.slow
def test_vectors_index_reduce_and_stack():
    """On ``(N, C)`` outputs: a channel slice, a channel mean kept as one channel, a stack into a
    new position axis (two independent Linear layers)."""
    class Vector(nn.Module):
        def __init__(self, fn):
            super().__init__()
            torch.manual_seed(0)
            self.a, self.b, self.fn = nn.Linear(3, 6), nn.Linear(3, 6), fn

        def forward(self, x):
            return self.fn(self.a(x), self.b(x))

    x1, x2 = torch.randn(4, 3, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64)
    for fn in (lambda a, b: a[:, 1:4], lambda a, b: b.mean(-1, keepdim=True),
               lambda a, b: torch.stack([a, b], -1)):
        model = Vector(fn).double()
        ntk = channel_averaged_ntk(model, x1, x2)
        k = ntbridge.kernel(model, x1, x2)
        np.testing.assert_allclose(k.ntk, ntk if ntk.ndim == 2 else same_positions(ntk),
                                   rtol=1e-10)


# ---------------------------------------------------------------- Monte-Carlo: nonlinearities after

def _wide(fn, branches=1, spatial=(3, 4), size=2):
    """Wide convolutions -> ``fn`` -> ReLU -> Conv (kernel ``size``) -> Flatten -> Linear."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = nn.ModuleList([nn.Conv2d(2, 128, 2, padding=1) for _ in range(branches)])
            self.fn, self.conv, self.fc = fn, nn.LazyConv2d(16, size), nn.LazyLinear(256)

        def forward(self, x):
            h = torch.relu(self.fn(*[conv(x) for conv in self.convs]))
            return self.fc(self.conv(h).flatten(1))

    def build():
        net = Net()
        net(torch.randn(1, 2, *spatial))  # materializes the lazy layers
        return net, (2, *spatial)
    return build


MONTE_CARLO = {
    "slice positions": _wide(lambda h: h[..., 1:4]),
    "select channels": _wide(lambda h: h[:, 10:60]),
    "cat positions": _wide(lambda a, b: torch.cat([a, b], -1), branches=2),
    "stack": _wide(lambda a, b: torch.stack([a, b], 2).flatten(3, 4), branches=2),
    "sum pool": _wide(nn.AvgPool2d(2, 1, divisor_override=1)),
    "mean of positions, kept": _wide(lambda h: h.mean(-1, keepdim=True), size=(2, 1)),
}


@pytest.mark.slow
@pytest.mark.parametrize("parameterization", ["standard", "ntk"])
@pytest.mark.parametrize("name", MONTE_CARLO)
def test_kernels_match_monte_carlo(name, parameterization):
    # sums of positions add up their sample noise: more samples for the standard error to test
    check_architecture(MONTE_CARLO[name], parameterization, samples=200 if "sum" in name else 100)


# ---------------------------------------------------------------- layouts and refusals

def test_correlated_branches_concatenate_along_positions_in_the_diagonal_layout():
    """cat([h, relu(h)], -1): the full layout would need their cross-covariance and is refused;
    followed by Flatten the network runs in the diagonal layout, which needs none: the kernel is
    that of the same features concatenated along the channels (exact for any branches)."""
    x = _x()
    positions = Applied(lambda h: torch.cat([h, torch.relu(h)], -1).flatten(1)).double()
    channels = Applied(lambda h: torch.cat([h.flatten(1), torch.relu(h).flatten(1)], 1)).double()
    assert not ntbridge.convert(positions).network.full_spatial
    got, expected = ntbridge.kernel(positions, x), ntbridge.kernel(channels, x)
    np.testing.assert_allclose(got.nngp, expected.nngp, rtol=1e-12)
    np.testing.assert_allclose(got.ntk, expected.ntk, rtol=1e-12)
    with pytest.raises(errors.UnsupportedLayerError, match=r"operator\.getitem|torch\.cat in "
                       r"Applied\.forward: the branches .* may be correlated, and concatenated "
                       r"along positions .*ntbridge\.monte_carlo"):
        ntbridge.ntk(Applied(lambda h: torch.cat([h, torch.relu(h)], -1).mean(-1)), x)


@pytest.mark.parametrize("fn, error, says", [
    (lambda h: torch.relu(h)[:, 1:3], errors.UnsupportedLayerError,
     r"getitem in Applied.forward: indexing .* of channels needs independent, identically "
     r"distributed channels.*pre-activations"),
    (lambda h: h.mean((2, 3))[:, 0], errors.UnsupportedLayerError, "leaves one number per example"),
    (lambda h: h[1:], errors.UnsupportedLayerError, "batch axis 0"),
    (lambda h: h[:, None], errors.UnsupportedLayerError, r"index None: only constant ints"),
    (lambda h: h.mean(), errors.UnsupportedLayerError, "give the dims to reduce"),
    (lambda h: h.sum(0), errors.UnsupportedLayerError, "over the batch axis 0 mixes examples"),
    (lambda h: h[:, :, 7], errors.ShapeError, "index 7 is out of range for axis 2 of size 4"),
    (lambda h: torch.stack([h, h], 1), errors.UnsupportedLayerError, "before the channels"),
    (nn.LPPool2d(2, 2), errors.UnsupportedLayerError,
     r"module 1 'fn' \(LPPool2d\): norm_type=2.*divisor_override=1"),
])
def test_refusals_name_the_call_and_the_alternative(fn, error, says):
    with pytest.raises(error, match=says):
        ntbridge.kernel(Applied(fn), _x())


def test_the_raw_input_channels_are_refused():
    class Raw(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 4)

        def forward(self, x):
            return self.fc(x[:, :2])

    with pytest.raises(errors.UnsupportedLayerError, match="the kernel only keeps their average"):
        ntbridge.nngp(Raw(), torch.randn(3, 5))
