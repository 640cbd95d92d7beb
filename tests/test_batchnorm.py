"""Eval-mode BatchNorm: kernels against Monte-Carlo of wide models with the module's own buffers,
the default buffers' 1 / (1 + eps), programs keyed by the buffers, and the refusals."""

import pytest
import torch
from torch import nn

import ntbridge
from ntbridge import errors

from montecarlo import check_architecture


def _buffers(bn: nn.modules.batchnorm._BatchNorm, seed: int, uniform: bool = False):
    """``bn`` in eval mode with running statistics and affine parameters away from the defaults
    (``uniform``: the same scale on every channel and no shift, as a fresh module's)."""
    gen = torch.Generator().manual_seed(seed)
    draw = lambda lo, hi: lo + (hi - lo) * torch.rand(bn.num_features, generator=gen)
    with torch.no_grad():
        bn.running_var.copy_(torch.full_like(bn.running_var, 2.0) if uniform else draw(0.3, 3))
        bn.running_mean.copy_(torch.zeros_like(bn.running_mean) if uniform else draw(-1, 1))
        if bn.weight is not None:
            bn.weight.copy_(torch.full_like(bn.weight, 1.5) if uniform else draw(-2, 2))
            bn.bias.copy_(torch.zeros_like(bn.bias) if uniform else draw(-1, 1))
    return bn.eval()


# ---------------------------------------------------------------- Monte-Carlo over random inits
# The BatchNorm's buffers and affine parameters stay the module's; Linear/Conv are redrawn.

def mlp_readout():
    return nn.Sequential(nn.Linear(3, 512), _buffers(nn.BatchNorm1d(512), 0),
                         nn.Linear(512, 256)), (3,)


def cnn_then_relu():
    return nn.Sequential(
        nn.Conv2d(2, 128, 2, padding=1), _buffers(nn.BatchNorm2d(128, eps=0.1), 1),
        nn.Conv2d(128, 128, 2), nn.ReLU(), nn.Conv2d(128, 64, 1),
        _buffers(nn.BatchNorm2d(64, affine=False), 2), nn.Flatten(),
        nn.Linear(64 * 9, 128)), (2, 3, 3)


def uniform_then_relu():
    return nn.Sequential(
        nn.Conv1d(2, 256, 2), _buffers(nn.BatchNorm1d(256, affine=False), 3, uniform=True),
        nn.ReLU(),
        nn.Conv1d(256, 64, 2), nn.Flatten(), nn.Linear(64 * 3, 128)), (2, 5)


@pytest.mark.slow
@pytest.mark.parametrize("parameterization", ["standard", "ntk"])
@pytest.mark.parametrize("build", [mlp_readout, cnn_then_relu, uniform_then_relu])
def test_eval_batchnorm_kernels_match_monte_carlo(build, parameterization):
    check_architecture(build, parameterization)


def _graded(bn: nn.BatchNorm2d, shift: float) -> nn.BatchNorm2d:
    """``bn`` with running statistics and affine parameters rising from its first channel to its
    last (a block of channels then has constants of its own), ``shift`` added (modules differ)."""
    rise = lambda lo, hi: torch.linspace(lo, hi, bn.num_features) + shift
    with torch.no_grad():
        for t, lo, hi in ((bn.running_var, 0.2, 4), (bn.running_mean, -1, 1), (bn.weight, 0.5, 2),
                          (bn.bias, -3, 3)):
            t.copy_(rise(lo, hi))
    return bn.eval()


class DenseBlock(nn.Module):
    """DenseNet's layout (torchvision's): a stem ``maxpool(relu(bn(conv(x))))``, then layers that
    each read the concatenation of every earlier output through BatchNorm, ReLU and a convolution
    (the first, a concatenation of one tensor), and a BatchNorm and ReLU of the last
    concatenation before a Linear readout; ``trained``: BatchNorms whose constants rise across
    the channels, so that the concatenated blocks' differ."""

    def __init__(self, width=128, layers=2, trained=False):
        super().__init__()
        norm = lambda c, i: _graded(nn.BatchNorm2d(c), i / 100) if trained else nn.BatchNorm2d(c)
        self.stem = nn.Sequential(nn.Conv2d(2, width, 2, padding=1), norm(width, 0), nn.ReLU(),
                                  nn.MaxPool2d(2))
        self.norms = nn.ModuleList([norm(width * (i + 1), i + 1) for i in range(layers)])
        self.convs = nn.ModuleList([nn.Conv2d(width * (i + 1), width, 3, padding=1)
                                    for i in range(layers)])
        self.norm = norm(width * (layers + 1), 9)
        self.head = nn.Linear(width * (layers + 1) * 4, 256)

    def forward(self, x):
        features = [self.stem(x)]
        for norm, conv in zip(self.norms, self.convs):
            features.append(conv(torch.relu(norm(torch.cat(features, 1)))))
        return self.head(torch.relu(self.norm(torch.cat(features, 1))).flatten(1))


@pytest.mark.slow
@pytest.mark.parametrize("trained", [False, True], ids=["fresh", "trained"])
def test_batchnorm_of_a_concatenation_matches_monte_carlo(trained):
    # each block of channels normalised by its own channels' constants: measured max |z| (NNGP,
    # NTK) 1.58, 2.12 fresh and 0.17, 1.76 trained; every block given all channels' constants
    # instead, the trained model is 28.7, 91.7 standard errors off
    check_architecture(lambda: (DenseBlock(trained=trained).eval(), (2, 3, 3)), "standard")


# ---------------------------------------------------------------- exact identities

def test_default_buffers_scale_by_one_over_one_plus_eps():
    """Fresh buffers: y = x / sqrt(1 + eps); gamma adds K / (1 + eps) to the NTK, beta 1."""
    x = torch.randn(5, 3, dtype=torch.float64)
    linear = nn.Linear(3, 8).double()
    bn = nn.BatchNorm1d(8, eps=0.25).double().eval()
    k, lin = ntbridge.kernel(nn.Sequential(linear, bn), x), ntbridge.kernel(linear, x)
    torch.testing.assert_close(k.nngp, lin.nngp / 1.25, rtol=1e-12, atol=0)
    torch.testing.assert_close(k.ntk, lin.ntk / 1.25 + lin.nngp / 1.25 + 1, rtol=1e-12, atol=0)


def test_programs_are_keyed_by_the_buffers():
    model = nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8)).double().eval()
    x = torch.randn(4, 3, dtype=torch.float64)
    before = ntbridge.nngp(model, x)
    with torch.no_grad():
        model[1].running_var.fill_(4.0)
    torch.testing.assert_close(ntbridge.nngp(model, x), before * (1 + 1e-5) / (4 + 1e-5),
                               rtol=1e-12, atol=0)


# ---------------------------------------------------------------- refusals

def test_training_mode_is_refused_saying_why():
    for bn in (nn.BatchNorm2d(8), nn.BatchNorm2d(8, track_running_stats=False).eval()):
        model = nn.Sequential(nn.Conv2d(3, 8, 2), bn)
        with pytest.raises(errors.UnsupportedLayerError,
                           match=r"module 1 '1' \(BatchNorm2d\): BatchNorm in training mode .*"
                                 r"couple the examples.*model.eval\(\).*ntbridge.empirical_ntk"):
            ntbridge.ntk(model, torch.randn(2, 3, 4, 4))


def test_inputs_it_has_no_rule_for():
    """The raw data (not Gaussian, made of no Gaussian sources): BatchNorm and a nonlinearity
    after it are refused, naming the module."""
    x = torch.randn(3, 3)
    with pytest.raises(errors.UnsupportedLayerError,
                       match=r"module 0 '0' \(BatchNorm1d\): eval-mode BatchNorm's kernel rule "
                             r"needs a zero-mean Gaussian input"):
        ntbridge.ntk(nn.Sequential(nn.BatchNorm1d(3).eval(), nn.Linear(3, 2)), x)
    with pytest.raises(errors.UnsupportedLayerError,
                       match=r"module 1 '1' \(Tanh\).*input is the raw data"):
        ntbridge.ntk(nn.Sequential(nn.AvgPool1d(1), nn.Tanh()), x[:, None])
