"""The converter framework: parameters shared with torch, uniform dtype/device, init checks,
init_fn's distributions, and users' own converters end to end."""

import math
import warnings

import jax
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ntbridge
from ntbridge import errors, stax
from ntbridge.converters.registry import INIT_Z_MAX, init_mismatch
from ntbridge.dlpack import precision, shares_memory, to_jax, to_torch

from montecarlo import assert_within_standard_error, sample_kernels
from reference import empirical_ntk


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 8), nn.Linear(8, 2)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


@pytest.mark.parametrize("model", [nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), Block()])
def test_params_share_memory_with_the_torch_weights(model):
    g = ntbridge.convert(model)
    tensors = dict(model.named_parameters())
    assert set(g.params) == set(tensors)
    for name, t in tensors.items():
        assert shares_memory(t, g.params[name]), name


def test_parameters_of_several_dtypes_or_devices_are_refused_by_name():
    model = Block()
    model.fc2.double()
    with pytest.raises(errors.InputError, match=r"'fc1.weight' is torch.float32.*'fc2.weight' is "
                                                r"torch.float64.*model.to\(torch.float32\)"):
        ntbridge.ntk(model, torch.randn(3, 4))
    model = Block()
    model.fc2.to("meta")
    with pytest.raises(errors.InputError, match=r"'fc2.weight' is torch.float32 on meta.*model.to"):
        ntbridge.convert(model)


# ------------------------------------------------------------ InitMismatchWarning

SHAPES = [(1, 1), (1, 3), (3, 1), (2, 2), (5, 7), (16, 16), (64, 32), (300, 200)]


def test_freshly_initialised_layers_never_look_mismatched():
    for seed in range(100):
        torch.manual_seed(seed)
        for d_in, d_out in SHAPES:
            layer = nn.Linear(d_in, d_out)
            for dtype in ((torch.float32, torch.bfloat16) if seed < 20 else (torch.float32,)):
                for t in (layer.weight, layer.bias):
                    assert init_mismatch(t.to(dtype), d_in) is None, (seed, d_in, d_out, dtype)


def test_a_model_drawn_in_float32_then_made_float64_keeps_its_bound():
    """An entry at the bound as float32 rounds it (above 1/sqrt(fan_in) in float64 for fan_in =
    4608, a ResNet's 3x3 convolution of 512 channels), after ``model.double()``."""
    w = nn.Linear(4608, 2).weight.detach()
    w[0, 0] = 4608 ** -0.5
    assert float(w[0, 0]) > 4608 ** -0.5
    assert init_mismatch(w.double(), 4608) is None


def test_kaiming_normal_and_rescaled_weights_always_look_mismatched():
    for seed in range(50):
        torch.manual_seed(seed)
        for d_in, d_out in [s for s in SHAPES if s[0] * s[1] >= 16]:
            w = nn.init.kaiming_normal_(torch.empty(d_out, d_in))
            assert init_mismatch(w, d_in) is not None, (seed, d_in, d_out)
    fresh = nn.Linear(64, 32).weight.detach()
    assert "above the bound 1/sqrt(fan_in) = 0.125" in init_mismatch(2 * fresh, 64)
    # half the scale: a variance 0.25x the default's, (0.25 - 1) / sqrt(4 / (5 * 2048)) = -38 s.e.
    assert "a variance 0.2" in init_mismatch(fresh / 2, 64)
    assert INIT_Z_MAX < 38


def test_analytic_kernel_warns_once_naming_modules_and_the_fix():
    model = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
    nn.init.kaiming_normal_(model[2].weight)
    x = torch.randn(3, 4)
    with pytest.warns(errors.InitMismatchWarning) as record:
        ntbridge.ntk(model, x)
    assert len(record) == 1
    message = str(record[0].message)
    assert "module 2 '2' (Linear): weight has" in message and "'0'" not in message
    assert "init='infer'" in message and "W_std=" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error", errors.InitMismatchWarning)
        ntbridge.ntk(model, x, init="infer")
        ntbridge.ntk(model, x, W_std={"2": 2 ** 0.5})
        ntbridge.empirical_ntk(model, x)  # the empirical kernel assumes no init


def test_fresh_models_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error", errors.InitMismatchWarning)
        for seed in range(5):
            torch.manual_seed(seed)
            ntbridge.nngp(Block(), torch.randn(2, 4))
            ntbridge.nngp(nn.Linear(1, 1), torch.randn(2, 1))
            ntbridge.nngp(nn.Sequential(nn.Linear(3, 64), nn.ReLU(), nn.Linear(64, 64, bias=False),
                                        nn.ReLU(), nn.Linear(64, 1)), torch.randn(2, 3))


# ------------------------------------------------------------ init_fn samples the init in use

def _sampled(model, **opts):
    g = ntbridge.convert(model, **opts)
    shape, params = g.init_fn(jax.random.key(3), (5, 200))
    assert shape == (5, 300)
    return {k: to_torch(v).double() for k, v in params.items()}


def _z(mean_square, var, fourth_moment, n):
    """Standard errors between the sample mean square and ``var``, for known E[w**4]."""
    return (mean_square - var) / math.sqrt((fourth_moment - var ** 2) / n)


def test_init_fn_samples_torch_uniform_init():
    p = _sampled(nn.Linear(200, 300))
    a = 200 ** -0.5
    for name, n in (("weight", 60000), ("bias", 300)):
        w = p[name]
        assert w.abs().max() <= a * (1 + 1e-6)
        assert w.abs().max() > 0.99 * a  # fills the support, as a uniform does
        assert abs(_z(w.pow(2).mean().item(), a * a / 3, a ** 4 / 5, n)) < 5, name


@pytest.mark.parametrize("opts,std", [({"init": "infer"}, 2.0 / 200 ** 0.5),
                                      ({"W_std": 1.5, "b_std": 0.3}, 1.5 / 200 ** 0.5)])
def test_init_fn_samples_gaussians_for_inferred_or_explicit_stds(opts, std):
    model = nn.Linear(200, 300)
    with torch.no_grad():
        model.weight.normal_(0, 2.0 / 200 ** 0.5)
    w = _sampled(model, **opts)["weight"]
    assert abs(_z(w.pow(2).mean().item(), std ** 2, 3 * std ** 4, w.numel())) < 5
    beyond = (w.abs() > 3 ** 0.5 * std).double().mean().item()  # 0 for a uniform, 8.3% Gaussian
    assert abs(beyond - 0.0833) < 5 * (0.0833 * 0.9167 / w.numel()) ** 0.5


# ------------------------------------------------------------ a user's converter, end to end

def test_user_registered_converter_end_to_end():
    class Abs(nn.Module):
        def forward(self, x):
            return torch.where(x > 0, x, -x)

    class Net(nn.Module):
        def __init__(self, width=64, d_out=128):
            super().__init__()
            self.fc1, self.act, self.fc2 = nn.Linear(4, width), Abs(), nn.Linear(width, d_out)

        def forward(self, x):
            return self.fc2(self.act(self.fc1(x)))

    model = Net().double()
    x = torch.randn(5, 4, dtype=torch.float64)
    with pytest.raises(errors.UnsupportedLayerError, match=r"'gt' has no equivalent.*register"):
        ntbridge.ntk(model, x)

    @ntbridge.register_converter(Abs)
    def _abs(module, ctx):
        return stax.ABRelu(-1.0, 1.0, "Abs")

    assert [n.name for n in ntbridge.convert(model).layers] == ["fc1", "act", "fc2"]
    with precision(torch.float64):
        g = ntbridge.convert(model)
        out = to_torch(g.apply_fn(g.params, to_jax(x)))
    torch.testing.assert_close(out, model(x).detach(), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(ntbridge.empirical_ntk(model, x), empirical_ntk(model, x, x),
                               rtol=1e-12, atol=0)
    # one hidden layer: the expected empirical kernels equal the analytic ones at any width
    nngp_samples, ntk_samples = sample_kernels(model, x, 200)
    k = ntbridge.kernel(model, x)
    assert_within_standard_error(nngp_samples, k.nngp, "NNGP")
    assert_within_standard_error(ntk_samples, k.ntk, "NTK")


def test_a_subclass_overriding_forward_is_not_converted_as_its_base():
    # a convolution standardizing its weights in forward computes another layer than nn.Conv2d:
    # its forward is traced (and refused here), not converted by nn.Conv2d's rule; a subclass
    # keeping the base's forward converts as the base
    class StandardizedConv(nn.Conv2d):
        def forward(self, x):
            w = self.weight
            w = (w - w.mean((1, 2, 3), keepdim=True)) / w.std((1, 2, 3), keepdim=True)
            return F.conv2d(x, w, self.bias)

    class NamedConv(nn.Conv2d):
        pass

    x = torch.randn(2, 2, 3, 3, dtype=torch.float64)
    net = lambda conv: nn.Sequential(conv(2, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8, 1))
    with pytest.raises(errors.UnsupportedLayerError, match=r"module '0' \(StandardizedConv\)"):
        ntbridge.nngp(net(StandardizedConv), x)
    torch.manual_seed(0)
    named = ntbridge.kernel(net(NamedConv).double(), x)
    torch.manual_seed(0)
    plain = ntbridge.kernel(net(nn.Conv2d).double(), x)
    assert torch.equal(named.nngp, plain.nngp) and torch.equal(named.ntk, plain.ntk)
