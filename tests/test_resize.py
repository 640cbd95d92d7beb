"""Resizing (nn.Upsample / F.interpolate, PixelShuffle, PixelUnshuffle): the interpolation matrices
against torch on identity inputs, forwards against torch, the kernels against torch.func's exact
NTK of a conv followed by the resize, Monte-Carlo of wide models, the functional forms, refusals."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ntbridge
from ntbridge import errors
from ntbridge.stax.resize import resize_matrix

from helpers import assert_forward_matches, assert_kernels, assert_layouts_agree, linear_kernels
from montecarlo import check_architecture

# (length, size or scale factor, recompute_scale_factor): down, up, non-integer and ratio 1
SIZES = [(5, ("size", 3), None), (4, ("size", 11), None), (3, ("scale", 2.0), None),
         (7, ("scale", 0.45), None), (5, ("scale", 2.3), None), (5, ("scale", 2.3), True),
         (6, ("scale", 1 / 3), None), (1, ("size", 4), None), (4, ("size", 1), None)]
MODES = [("nearest", None), ("nearest-exact", None), ("area", None), ("linear", False),
         ("linear", True), ("bicubic", False), ("bicubic", True)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mode, align_corners", MODES)
def test_matrices_are_torchs_interpolation_of_the_identity(mode, align_corners, dtype):
    """Row i of the identity resized by torch is column i of the map (bicubic: along H only)."""
    for length, (how, value), recompute in SIZES:
        eye = torch.eye(length, dtype=dtype)[:, None, :]
        if mode == "bicubic":
            eye, value = eye[..., None], ((value, 1) if how == "size" else (value, 1.0))
        kw = dict(size=value) if how == "size" else dict(scale_factor=value,
                                                         recompute_scale_factor=recompute)
        y = F.interpolate(eye, mode=mode, align_corners=align_corners, **kw).reshape(length, -1).T
        scale = value[0] if mode == "bicubic" else value
        a = resize_matrix(length, y.shape[0], mode, bool(align_corners),
                          scale if how == "scale" and not recompute else None)
        # torch interpolates in the input's dtype (float32: weights rounded to ~1e-7)
        np.testing.assert_allclose(a, y.double().numpy(), rtol=0,
                                   atol=1e-6 if dtype == torch.float32 else 1e-13)


RESIZES = [
    nn.Upsample(scale_factor=2),
    nn.Upsample(size=(5, 9), mode="nearest-exact"),
    nn.Upsample(scale_factor=(1.5, 0.7), mode="bilinear", align_corners=False),
    nn.Upsample(scale_factor=2.5, mode="bilinear", align_corners=True, recompute_scale_factor=True),
    nn.Upsample(size=7, mode="bicubic"),
    nn.Upsample(size=(3, 5), mode="area"),
    nn.UpsamplingNearest2d(scale_factor=3),
    nn.UpsamplingBilinear2d(size=(6, 8)),
    nn.Upsample(scale_factor=1.7, mode="linear"),
    nn.Upsample(size=(4, 3, 5), mode="trilinear", align_corners=True),
    nn.Upsample(scale_factor=(2, 1, 3)),
    nn.PixelShuffle(2),
    nn.PixelUnshuffle(2),
]


def _input(module, dtype=torch.float64, n=3):
    ndim = {"linear": 1, "trilinear": 3}.get(getattr(module, "mode", None), 2)
    if isinstance(module, nn.Upsample) and isinstance(module.scale_factor, tuple):
        ndim = len(module.scale_factor)
    return torch.randn(n, 4, *{1: (5,), 2: (4, 6), 3: (2, 4, 4)}[ndim], dtype=dtype)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("module", RESIZES, ids=repr)
def test_forward_matches_torch(module, dtype):
    assert_forward_matches(module, _input(module, dtype))


@pytest.mark.slow
def test_kernels_of_conv_then_resize_are_exact():
    """A conv followed by a resize is linear in its weights: its NTK is torch.func's at any width,
    and with torch's init its NNGP is that NTK / (3 fan_in); the nearest modes in both layouts."""
    cases = {}
    for module in RESIZES:
        x1 = _input(module)
        conv = getattr(nn, f"Conv{x1.ndim - 2}d")(4, 4, 1)  # 4: PixelShuffle(2)
        model = nn.Sequential(conv, module).double()
        x2 = _input(module, n=2)
        cases[repr(module)] = model, x1, x2, linear_kernels(model, x1, x2)
    networks = assert_kernels(cases)  # all of them in one compiled program
    for module in RESIZES:
        nearest = getattr(module, "mode", "nearest").startswith("nearest")
        assert networks[repr(module)].full_spatial == (not nearest), repr(module)


# ---------------------------------------------------------------- Monte-Carlo over random inits

def _net(resize, channels, spatial, out_spatial, pre=nn.ReLU, post=nn.Identity):
    """Conv (wide) -> ``pre`` -> ``resize`` -> ``post`` -> Conv -> Flatten -> Linear."""
    first = 128 * (4 if isinstance(resize, nn.PixelShuffle) else 1)
    mid = 128 * (4 if isinstance(resize, nn.PixelUnshuffle) else 1)
    return lambda: (nn.Sequential(
        nn.Conv2d(channels, first, 2, padding=1), pre(), resize, post(), nn.Conv2d(mid, 32, 2),
        nn.Flatten(), nn.Linear(32 * out_spatial, 128)), (channels, *spatial))


MONTE_CARLO = {
    "bilinear": _net(nn.Upsample(scale_factor=1.5, mode="bilinear"), 2, (2, 2), 3 * 3),
    "bicubic-corners": _net(nn.Upsample(size=(5, 3), mode="bicubic", align_corners=True), 2,
                            (2, 2), 4 * 2),
    "nearest-exact": _net(nn.Upsample(scale_factor=(2, 1.5), mode="nearest-exact"), 2, (2, 2),
                          5 * 3),
    "area": _net(nn.Upsample(size=2, mode="area"), 2, (3, 3), 1),
    "shuffle": _net(nn.PixelShuffle(2), 2, (1, 1), 3 * 3, pre=nn.Identity, post=nn.ReLU),
    "unshuffle": _net(nn.PixelUnshuffle(2), 2, (3, 3), 1),
}


@pytest.mark.slow
@pytest.mark.parametrize("parameterization", ["standard", "ntk"])
@pytest.mark.parametrize("name", MONTE_CARLO)
def test_resize_kernels_match_monte_carlo(name, parameterization):
    check_architecture(MONTE_CARLO[name], parameterization)


# ---------------------------------------------------------------- forms, layouts, refusals

class Functional(nn.Module):
    def __init__(self, fn):
        super().__init__()
        torch.manual_seed(0)
        self.conv, self.fn = nn.Conv2d(3, 8, 2), fn

    def forward(self, x):
        return self.fn(self.conv(x)).flatten(1)


@pytest.mark.slow
@pytest.mark.parametrize("form, module", [
    (lambda h: F.interpolate(h, scale_factor=2, mode="bilinear"),
     nn.Upsample(scale_factor=2, mode="bilinear")),
    (lambda h: F.interpolate(h, (5, 4), None, "bicubic", True),
     nn.Upsample((5, 4), None, "bicubic", True)),
    (lambda h: F.upsample(h, size=6), nn.Upsample(size=6)),
    (lambda h: F.upsample_nearest(h, scale_factor=2), nn.Upsample(scale_factor=2)),
    (lambda h: F.upsample_bilinear(h, size=(4, 5)),  # the module's repr omits align_corners
     nn.Upsample((4, 5), mode="bilinear", align_corners=True)),
    (lambda h: F.pixel_shuffle(h, 2), nn.PixelShuffle(2)),
    (lambda h: torch.pixel_unshuffle(h, 2), nn.PixelUnshuffle(2)),
], ids=range(7))
def test_functional_forms_convert_as_the_module(form, module):
    x = torch.randn(3, 3, 5, 5, dtype=torch.float64)
    a, b = Functional(form).double(), Functional(module).double()
    (got, _), (expected, _) = (ntbridge.convert(m).layers[1:] for m in (a, b))
    assert (repr(got.module), got.hyper) == (repr(expected.module), expected.hyper)
    expected, got = ntbridge.kernel(b, x), ntbridge.kernel(a, x)
    assert torch.equal(got.nngp, expected.nngp) and torch.equal(got.ntk, expected.ntk)


def test_nearest_layouts_agree():
    model = nn.Sequential(nn.Conv2d(3, 8, 2), nn.ReLU(), nn.Upsample(scale_factor=(2, 3)),
                          nn.Conv2d(8, 8, 3, stride=2), nn.ReLU(), nn.PixelUnshuffle(2),
                          nn.Conv2d(32, 4, 1), nn.PixelShuffle(2), nn.ReLU(), nn.Flatten(),
                          nn.Linear(1 * 4 * 4, 2)).double()
    network, _ = assert_layouts_agree(model, torch.randn(4, 3, 6, 4, dtype=torch.float64))
    assert not network.full_spatial


def test_refusals_name_the_module_and_the_option():
    x = torch.randn(2, 4, 4, 4)
    with pytest.raises(errors.UnsupportedLayerError,
                       match=r"module 0 '0' \(PixelShuffle\): PixelShuffle's kernel rule needs "
                             r"independent.*ntbridge.empirical_ntk"):
        ntbridge.ntk(nn.Sequential(nn.PixelShuffle(2), nn.Conv2d(1, 2, 1)), x)
    with pytest.raises(errors.UnsupportedLayerError,
                       match=r"interpolate in Functional.forward: antialias=True "
                             r"\(mode='bilinear'\)"):
        ntbridge.convert(Functional(lambda h: F.interpolate(h, size=3, mode="bilinear",
                                                            antialias=True)))
    with pytest.raises(errors.ShapeError, match=r"module 1 '1' \(Upsample\): expects inputs of "
                                                r"shape \(N, C, L\)"):
        ntbridge.ntk(nn.Sequential(nn.Conv2d(4, 4, 1), nn.Upsample(size=3, mode="linear")), x)
    with pytest.raises(errors.ShapeError, match=r"PixelUnshuffle\(3\) expects .* H and W "
                                                r"divisible by 3"):
        ntbridge.ntk(nn.Sequential(nn.Conv2d(4, 4, 1), nn.PixelUnshuffle(3)), x)


def test_options_the_repr_omits_still_key_the_programs():
    """nn.Upsample's repr omits align_corners: the conversion's signature must not."""
    x = torch.randn(3, 2, 3, 3, dtype=torch.float64)
    kernels = [ntbridge.nngp(nn.Sequential(nn.Conv2d(2, 4, 2), nn.Upsample(
        size=5, mode="bilinear", align_corners=corners), nn.Flatten(), nn.Linear(100, 1)), x)
        for corners in (False, True)]
    assert not torch.allclose(*kernels, rtol=1e-3)
