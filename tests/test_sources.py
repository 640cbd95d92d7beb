"""Non-Gaussian inputs of nonlinearities and MaxPool (``stax.sources``): eval-mode BatchNorm with
any statistics before a nonlinearity, MaxPool, nonlinearities after residual sums, against wide
models' Monte-Carlo (Gaussian weights redrawn, BatchNorm's buffers and affine parameters kept), in
the samples' standard errors and the kernel's own reported error; fresh BatchNorm in closed form."""

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import ntbridge
from ntbridge import devices, programs
from montecarlo import sample_kernels, standard_error, z_scores

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))


def trained(bn: nn.modules.batchnorm._BatchNorm, seed: int):
    """``bn`` in eval mode with running statistics and affine parameters as training leaves
    them: channel-dependent scales, shifts and means (some gammas negative)."""
    gen = torch.Generator().manual_seed(seed)
    draw = lambda lo, hi: lo + (hi - lo) * torch.rand(bn.num_features, generator=gen)
    with torch.no_grad():
        bn.running_var.copy_(draw(0.3, 3))
        bn.running_mean.copy_(draw(-1, 1))
        if bn.weight is not None:
            bn.weight.copy_(draw(-1, 2))
            bn.bias.copy_(draw(-1, 1))
    return bn.eval()


def check(model: nn.Module, x: torch.Tensor, samples: int, z_max: float = 5.0):
    """The analytic NNGP and NTK (standard parameterization) within ``z_max`` of the Monte-Carlo
    mean of ``samples`` Gaussian redraws, in its standard error, which must be small enough for
    the check to mean something, and the kernel's reported error, which must be small."""
    model = model.double().eval()
    k = ntbridge.kernel(model, x)
    error = ntbridge.expectation_error(model, x)
    nngp, ntk = sample_kernels(model, x, samples, chunk=50, ntk_outputs=2)
    assert error < 0.02, error
    for name, s, a in (("nngp", nngp, k.nngp), ("ntk", ntk, k.ntk)):
        assert standard_error(s).max() < 0.05 * a.abs().max(), f"{name}: too few samples"
        z = z_scores(s, a, error)
        assert z.max() < z_max, f"{name}: max z {z.max():.2f}\n{z}"
    return k, error


@pytest.mark.slow  # 2 s or more
def test_batchnorm_with_trained_statistics_before_relu_matches_monte_carlo():
    """conv -> BN (every channel its own scale, shift and mean) -> ReLU: in closed form
    (``stax.orthant``: no numerical expectation, so no reported error), NNGP and NTK with gamma's
    and beta's terms."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv1d(2, 32, 2), trained(nn.BatchNorm1d(32), 0), nn.ReLU(),
                          nn.Flatten(), nn.Linear(32 * 3, 64))
    _, error = check(model, torch.randn(3, 2, 4, dtype=torch.float64), 100)
    assert error < 1e-12


def test_fresh_batchnorm_before_relu_is_closed_form():
    """Fresh buffers: y = h / sqrt(1 + eps), so the NNGP is the plain rule's over 1 + eps, exactly,
    and the kernel is exact (no reported error); the NTK's gamma and beta terms are checked
    against Monte-Carlo."""
    torch.manual_seed(1)
    conv = nn.Conv2d(2, 16, 2)
    with_bn = nn.Sequential(conv, nn.BatchNorm2d(16, eps=0.25), nn.ReLU(), nn.Flatten(),
                            nn.Linear(16 * 4, 32)).double().eval()
    plain = nn.Sequential(conv, nn.ReLU()).double()
    x = torch.randn(3, 2, 3, 3, dtype=torch.float64)
    relu = ntbridge.nngp(nn.Sequential(with_bn[:3]), x)
    torch.testing.assert_close(relu, ntbridge.nngp(plain, x) / 1.25, rtol=1e-12, atol=0)
    _, error = check(with_bn, x, 100)
    assert error < 1e-12  # every replicate the same: no numerical expectation


@pytest.mark.slow  # 2 s or more
@pytest.mark.parametrize("pool", [nn.MaxPool2d(3, 2, 1), nn.AdaptiveMaxPool2d((2, 1)),
                                  nn.MaxPool1d(3, stride=2, padding=1, dilation=2, ceil_mode=True)],
                         ids=repr)
def test_maxpool_matches_monte_carlo(pool):
    """conv -> ReLU -> MaxPool (padding, stride, dilation, ceil mode, adaptive windows): the
    maximum of jointly Gaussian windows, NNGP and NTK through the argmax."""
    torch.manual_seed(2)
    one = isinstance(pool, nn.MaxPool1d)
    conv, shape = (nn.Conv1d(2, 32, 2), (2, 7)) if one else (nn.Conv2d(2, 32, 2), (2, 4, 4))
    x = torch.randn(3, *shape, dtype=torch.float64)
    features = nn.Sequential(conv, nn.ReLU(), pool, nn.Flatten())
    model = nn.Sequential(*features, nn.Linear(features(x.float()).shape[1], 64))
    check(model, x, 100)


def reduced_resnet(block: str, statistics: str, width: int) -> nn.Module:
    """torchvision's layout (``examples/torchvision_resnets.py``) with two stages of one block each
    (the second with its strided downsample shortcut), eval mode, BatchNorm fresh or trained."""
    from torchvision_resnets import BasicBlock, Bottleneck, ResNet, trained_statistics

    model = ResNet({"basic": BasicBlock, "bottleneck": Bottleneck}[block], [1, 1], 64, width)
    return trained_statistics(model, 3) if statistics == "trained" else model.eval()


@pytest.mark.slow  # 2 s or more
@pytest.mark.parametrize("block,statistics", [("basic", "trained"), ("bottleneck", "fresh")])
def test_reduced_resnet_matches_monte_carlo_at_its_own_width(block, statistics):
    """Stem (conv, BN, ReLU, MaxPool), a BasicBlock/Bottleneck (ReLU after ``out + identity``, the
    identity MaxPool's output), one with the downsample shortcut (``conv1x1 stride 2 + BN``),
    global average pooling, Linear: NNGP and NTK at the model's own width."""
    torch.manual_seed(3)
    model = reduced_resnet(block, statistics, 32 if block == "basic" else 16)
    check(model, torch.randn(3, 3, 8, 8, dtype=torch.float64), 100)


@pytest.mark.slow  # 2 s or more
def test_float32_gives_the_float64_kernel_through_many_residual_blocks():
    """Seven BasicBlocks on 8x8 images: float32's kernel is float64's up to float32's rounding
    grown through the blocks' expectations (measured 7e-6 NNGP, 7e-4 NTK). Sampling the second
    point from ``q2 - c**2 / q1``, which cancels for correlated points, it was 0.38 / 0.18 off."""
    from torchvision_resnets import BasicBlock, ResNet

    torch.manual_seed(0)
    model = ResNet(BasicBlock, [3, 4], 10, 16).eval()
    x = torch.randn(2, 3, 8, 8)
    single, double = ntbridge.kernel(model, x), ntbridge.kernel(model.double(), x.double())
    for a, b in zip(single, double):
        assert (a.double() - b).abs().max() < 5e-3 * b.abs().max()


def test_refusals_name_the_module_and_what_works():
    """MaxPool after a residual sum (its windows are no map of one Gaussian); a bad number of
    points."""
    from torchvision_resnets import BasicBlock

    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), BasicBlock(8, 8),
                          nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 4, 2)).eval()
    x = torch.randn(2, 3, 4, 4)
    with pytest.raises(ntbridge.errors.UnsupportedLayerError,
                       match=r"'3' \(MaxPool2d\): MaxPool2d's kernel rule needs a Gaussian input "
                             r"or an elementwise map of one .*after a residual sum.*monte_carlo"):
        ntbridge.nngp(model, x)
    with pytest.raises(ntbridge.errors.InputError, match="expectation_points must be a power of 2"):
        ntbridge.nngp(model[:2], x, expectation_points=100)


@pytest.mark.slow  # 2 s or more
@pytest.mark.parametrize("small_work", [devices.SMALL_WORK, 0],
                         ids=["small", "default options"])
def test_replicates_of_a_bottleneck(monkeypatch, small_work):
    """A small program (these 3 images) compiles with the "small" options; taken as not small, with
    the defaults. With them, one replicate came out wrong (its entry (1, 1) after the second
    stage's residual sum at twice its value, a reported error of 0.12) while the samples of two
    points went through ``q2 - c**2 / q1``, which cancels for correlated points
    (``stax.sources._pairs``)."""
    monkeypatch.setattr(devices, "SMALL_WORK", small_work)
    programs.clear()  # compiled afresh with these options
    torch.manual_seed(3)
    model = reduced_resnet("bottleneck", "fresh", 16).double()
    x = torch.randn(3, 3, 8, 8, dtype=torch.float64)
    assert ntbridge.expectation_error(model, x) < 0.02
