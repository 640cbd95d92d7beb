"""LayerNorm, BatchNorm and Dropout: forwards against torch, kernels against Monte-Carlo and
direct formulas, and their refusals."""

import pytest
import torch
from torch import nn

import ntbridge
from ntbridge import errors
from ntbridge.dlpack import precision, to_jax

from montecarlo import assert_within_standard_error, check_architecture, sample_kernels


def apply(module, x):
    graph = ntbridge.convert(module)
    with precision(x.dtype):
        return torch.from_dlpack(graph.apply_fn(graph.params, to_jax(x)))


@pytest.mark.slow
@pytest.mark.parametrize("module,shape", [
    (nn.LayerNorm(16), (5, 16)), (nn.LayerNorm((3, 4, 5), eps=1e-3), (2, 3, 4, 5)),
    (nn.BatchNorm1d(16), (5, 16)), (nn.BatchNorm2d(3), (4, 3, 5, 5)),
    (nn.BatchNorm2d(3).eval(), (4, 3, 5, 5)), (nn.BatchNorm1d(16, track_running_stats=False).eval(), (5, 16)),
    (nn.Dropout(0.3).eval(), (5, 16)), (nn.Dropout2d(0.3).eval(), (2, 3, 4, 4))])
def test_forward_equals_module(module, shape):
    with torch.no_grad():
        for p in module.parameters():
            p.uniform_(0.5, 1.5)
        if getattr(module, "running_mean", None) is not None:
            module.running_mean.uniform_(-1, 1)
            module.running_var.uniform_(0.5, 2)
    x = torch.randn(*shape) * 3 + 1
    expected = module(x).detach()
    torch.testing.assert_close(apply(module, x), expected, rtol=1e-5, atol=1e-5)


def test_layernorm_kernel_is_normalised_input_kernel():
    # One layer: K / sqrt((q1 + eps)(q2 + eps)) of the Linear's kernel, NTK with weight and bias.
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8, eps=0.1)).double()
    x = torch.randn(5, 4, dtype=torch.float64)
    lin = ntbridge.kernel(model[:1], x)
    d = (lin.nngp.diagonal() + 0.1).sqrt()
    normalised = lin.nngp / torch.outer(d, d)
    k = ntbridge.kernel(model, x)
    torch.testing.assert_close(k.nngp, normalised, rtol=1e-12, atol=0)
    torch.testing.assert_close(k.ntk, lin.ntk / torch.outer(d, d) + normalised + 1, rtol=1e-12, atol=0)


@pytest.mark.parametrize("parameterization", ["standard", "ntk"])
def test_layernorm_mlp_matches_monte_carlo(parameterization):
    # Finite width biases LayerNorm's variance estimate by O(1/width): ~1e-3 here, below the error.
    x = torch.randn(4, 3, dtype=torch.float64)
    model = nn.Sequential(nn.Linear(3, 512), nn.LayerNorm(512, elementwise_affine=False), nn.ReLU(),
                          nn.Linear(512, 64)).double()
    nngp, ntk = sample_kernels(model, x, 100, parameterization, chunk=20)
    k = ntbridge.kernel(model, x, parameterization=parameterization)
    assert_within_standard_error(nngp, k.nngp, "NNGP")
    assert_within_standard_error(ntk, k.ntk, f"NTK ({parameterization})")


class ChannelsLast(nn.Module):
    """ConvNeXt's block: a depthwise convolution, then the channels moved last for a LayerNorm and
    an MLP of Linear layers, and back, times a layer scale (``scale``: ``(C, 1, 1)`` after moving
    back, ``(C,)`` before; fixed values, one per channel), added to the block's input."""

    def __init__(self, width=128, scale=None):
        super().__init__()
        self.stem, self.depthwise = nn.Conv2d(2, width, 1), nn.Conv2d(width, width, 3, padding=1,
                                                                      groups=width)
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(),
                                 nn.Linear(2 * width, width))
        self.head = nn.Linear(width * 9, 256)
        shape = (width,) if scale == "last" else (width, 1, 1)
        values = 3 * torch.rand(shape, generator=torch.Generator().manual_seed(2))
        self.gamma, self.scale = nn.Parameter(values) if scale else None, scale

    def forward(self, x):
        h = self.stem(x)
        y = self.mlp(self.norm(self.depthwise(h).permute(0, 2, 3, 1)))
        y = (self.gamma * y if self.scale == "last" else y).permute(0, 3, 1, 2)
        return self.head((h + (self.gamma * y if self.scale == "first" else y)).flatten(1))


@pytest.mark.parametrize("scale", [None, "first", "last"])
def test_channels_moved_last_and_back_forward_is_torchs(scale):
    model, x = ChannelsLast(8, scale).double(), torch.randn(3, 2, 3, 3, dtype=torch.float64)
    torch.testing.assert_close(apply(model, x), model(x).detach(), rtol=1e-12, atol=1e-12)


def test_a_scale_of_another_axis_than_the_channels_is_refused():
    class Misaligned(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.gamma = nn.Conv2d(2, 3, 1), nn.Parameter(torch.rand(3))

        def forward(self, x):  # (3,) against (N, 3, 3, 3): torch scales the last axis
            return self.gamma * self.conv(x)

    with pytest.raises(errors.UnsupportedLayerError, match=r"multiplies axis 3 .* not their "
                                                           r"channels \(axis 1\)"):
        ntbridge.nngp(Misaligned(), torch.randn(2, 2, 3, 3))


def test_flattening_channels_last_gives_the_kernel_of_channels_first():
    class Flat(nn.Module):
        def __init__(self, last):
            super().__init__()
            self.conv, self.fc, self.last = nn.Conv2d(2, 8, 1), nn.Linear(8 * 9, 1), last

        def forward(self, x):
            h = self.conv(x)
            return self.fc((h.permute(0, 2, 3, 1) if self.last else h).flatten(1))

    x = torch.randn(3, 2, 3, 3, dtype=torch.float64)
    last, first = (ntbridge.kernel(Flat(last).double(), x) for last in (True, False))
    torch.testing.assert_close(last.nngp, first.nngp, rtol=1e-12, atol=0)
    torch.testing.assert_close(last.ntk, first.ntk, rtol=1e-12, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("scale", [None, "first", "last"])
def test_channels_last_layers_match_monte_carlo(scale):
    # measured max |z| (NNGP, NTK): 1.29, 1.30 without a scale, 1.29, 1.50 with one either side;
    # with every channel given the mean scale instead, 5.23, 7.50
    check_architecture(lambda: (ChannelsLast(scale=scale), (2, 3, 3)), "standard")


def test_layernorm_refusals():
    with pytest.raises(errors.UnsupportedLayerError, match="zero-mean Gaussian"):
        ntbridge.ntk(nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.LayerNorm(8)), torch.randn(2, 3))
    ln = nn.LayerNorm(8)
    with torch.no_grad():
        ln.weight[0] = 2.0
    with pytest.raises(errors.UnsupportedLayerError, match="weight vary"):
        ntbridge.ntk(nn.Sequential(nn.Linear(3, 8), ln), torch.randn(2, 3))
    with pytest.raises(errors.ShapeError, match="whole per-example shape"):
        ntbridge.ntk(nn.Sequential(nn.LayerNorm(4)), torch.randn(2, 3, 4))


def test_batchnorm_has_forward_but_no_kernel():
    with pytest.raises(errors.UnsupportedLayerError, match=r"\(BatchNorm1d\).*empirical_ntk"):
        ntbridge.ntk(nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8)), torch.randn(4, 3))


def test_dropout_train_scales_same_example_entries():
    # Only an example with itself shares a mask: E[m^2] / keep^2 = 1 / keep on the diagonal.
    model = nn.Sequential(nn.Linear(3, 8), nn.Dropout(0.25), nn.Linear(8, 2)).double()
    x1, x2 = torch.randn(4, 3, dtype=torch.float64), torch.randn(3, 3, dtype=torch.float64)
    train, lin = ntbridge.kernel(model, x1), ntbridge.kernel(model[:1], x1)
    ev = ntbridge.kernel(model.eval(), x1)
    # W_std**2 = 1/3; standard parameterization: the last layer's own NTK term is fan_in * its input's NNGP
    extra = {"nngp": lin.nngp.diagonal() / 3, "ntk": lin.ntk.diagonal() / 3 + 8 * lin.nngp.diagonal()}
    for name in ("nngp", "ntk"):
        torch.testing.assert_close(getattr(train, name) - getattr(ev, name),
                                   torch.diag(extra[name] * (1 / 0.75 - 1)), rtol=1e-12, atol=1e-15)
    model.train()
    torch.testing.assert_close(ntbridge.nngp(model, x1, x2), ntbridge.nngp(model.eval(), x1, x2))


def test_dropout_train_forward_refused():
    model = nn.Sequential(nn.Linear(3, 8), nn.Dropout(0.5))
    with pytest.raises(errors.UnsupportedLayerError, match=r"Dropout in training mode is random.*eval"):
        ntbridge.empirical_ntk(model, torch.randn(2, 3))
