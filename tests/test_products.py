"""Products of branches (GLU/SwiGLU gates): the kernel of two independent Linear layers' product
against its closed form computed by hand, Monte-Carlo of wide gated networks, the forms of the
product, and the refusals of dependent factors by name."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ntbridge
from ntbridge import errors

from helpers import assert_forward_matches
from montecarlo import check_architecture


class Gated(nn.Module):
    """``out(gate(fc1(h)) * fc2(h))`` with ``h = x`` or a wide ReLU layer of it."""

    def __init__(self, d_in=3, width=16, hidden=0, gate=F.silu, product=lambda a, b: a * b):
        super().__init__()
        torch.manual_seed(0)
        self.hidden = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU()) if hidden else None
        d = hidden or d_in
        self.fc1, self.fc2, self.out = nn.Linear(d, width), nn.Linear(d, width), nn.Linear(width, 256)
        self.gate, self.product = gate, product

    def forward(self, x):
        h = self.hidden(x) if self.hidden is not None else x
        return self.out(self.product(self.gate(self.fc1(h)), self.fc2(h)))


def test_product_of_two_linear_layers_is_the_product_of_their_kernels():
    """fc1(x) * fc2(x), torch's init: each factor has NNGP ``x.x'/(3d) + 1/(3d)`` and NTK
    ``x.x' + 1``; the product's NNGP is the square of the NNGP, its NTK ``2 NNGP (x.x' + 1)``."""
    class Product(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(5, 7), nn.Linear(5, 7)

        def forward(self, x):
            return self.fc1(x) * self.fc2(x)

    x1, x2 = torch.randn(4, 5, dtype=torch.float64), torch.randn(3, 5, dtype=torch.float64)
    dot = x1 @ x2.T
    factor_nngp, factor_ntk = (dot + 1) / 15, dot + 1
    k = ntbridge.kernel(Product().double(), x1, x2)
    np.testing.assert_allclose(k.nngp, factor_nngp ** 2, rtol=1e-12)
    np.testing.assert_allclose(k.ntk, 2 * factor_nngp * factor_ntk, rtol=1e-12)
    k = ntbridge.kernel(Product().double(), x1, x2, parameterization="ntk")
    np.testing.assert_allclose(k.ntk, 2 * factor_nngp * factor_nngp, rtol=1e-12)


MONTE_CARLO = {
    "swiglu of the input": lambda: (Gated(width=256), (3,)),
    "swiglu of a wide layer": lambda: (Gated(width=256, hidden=256), (3,)),
    "relu gate, three factors": lambda: (Gated(width=256, gate=torch.relu, product=lambda a, b: (
        a * b * (b + 0))), (3,)),
}


@pytest.mark.slow
@pytest.mark.parametrize("parameterization", ["standard", "ntk"])
@pytest.mark.parametrize("name", ["swiglu of the input", "swiglu of a wide layer"])
def test_gates_match_monte_carlo(name, parameterization):
    check_architecture(MONTE_CARLO[name], parameterization)


class ConvGate(nn.Module):
    """A convolutional GLU: ``conv(tanh(c1(x)) * c2(x))``, flattened to a Linear readout."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(2, 128, 2), nn.Conv2d(2, 128, 2)
        self.conv, self.fc = nn.Conv2d(128, 16, 2), nn.Linear(16 * 2 * 2, 256)

    def forward(self, x):
        return self.fc(self.conv(torch.tanh(self.c1(x)) * self.c2(x)).flatten(1))


@pytest.mark.slow
def test_convolutional_gate_matches_monte_carlo():
    check_architecture(lambda: (ConvGate(), (2, 4, 4)), "standard")


class SqueezeExcite(nn.Module):
    """Squeeze-and-excitation (SENet, MobileNetV3, EfficientNet): ``h`` times a gate per channel,
    ``sigmoid(fc2(relu(fc1(mean of h over positions))))``, broadcast over the positions; here
    ``h = relu(conv(x))`` (with ``norm``, ``relu(bn(conv(x)))``, an eval-mode BatchNorm whose
    channels differ), then a Linear readout of the flattened product."""

    def __init__(self, width=8, hidden=4, gate=torch.sigmoid, norm=False):
        super().__init__()
        self.conv = nn.Conv2d(2, width, 2)
        self.fc1, self.fc2 = nn.Conv2d(width, hidden, 1), nn.Conv2d(hidden, width, 1)
        self.out, self.gate = nn.Linear(width * 3 * 3, 256), gate
        self.norm = nn.BatchNorm2d(width).eval() if norm else nn.Identity()
        if norm:  # as trained: channels of different scales and means, the same in every draw
            g = torch.Generator().manual_seed(1)
            for t, lo, hi in ((self.norm.running_mean, -1, 1), (self.norm.running_var, 0.3, 3),
                              (self.norm.weight, 0.5, 2), (self.norm.bias, -1, 1)):
                t.data.uniform_(lo, hi, generator=g)

    def forward(self, x):
        h = torch.relu(self.norm(self.conv(x)))
        scale = self.gate(self.fc2(torch.relu(self.fc1(F.adaptive_avg_pool2d(h, 1)))))
        return self.out((scale * h).flatten(1))


def test_a_gate_per_channel_is_broadcast_over_positions():
    x = torch.randn(3, 2, 4, 4, dtype=torch.float64)
    assert_forward_matches(SqueezeExcite(gate=nn.Hardsigmoid()), x)
    assert not ntbridge.convert(SqueezeExcite()).layers[-3].module.dependent


class ReluTimesLinear(nn.Module):
    """``out(relu(h) * fc(h))``, ``h`` a wide Linear layer: the factors share ``h``, but ``fc``'s
    fresh weights make its units independent of ``relu(h)``'s in the limit."""

    def __init__(self, width=256):
        super().__init__()
        self.h, self.fc = nn.Linear(3, width), nn.Linear(width, width)
        self.out = nn.Linear(width, 256)

    def forward(self, x):
        h = self.h(x)
        return self.out(torch.relu(h) * self.fc(h))


@pytest.mark.slow
@pytest.mark.parametrize("parameterization", ["standard", "ntk"])
@pytest.mark.parametrize("build", [lambda: (SqueezeExcite(256, 128), (2, 4, 4)),
                                   lambda: (SqueezeExcite(256, 128, norm=True), (2, 4, 4)),
                                   lambda: (ReluTimesLinear(), (3,))],
                         ids=["squeeze-excitation", "after a trained BatchNorm", "relu(h) * fc(h)"])
def test_factors_independent_through_fresh_weights_match_monte_carlo(build, parameterization):
    # measured max |z| (NNGP, NTK): squeeze-excitation 0.86, 0.92 (standard) and 0.86, 1.09
    # (ntk), standard errors 1% of the kernel; after a trained BatchNorm (the factor's channels
    # differ, the gate's do not) 1.31, 0.70 and 1.31, 1.41 (1.2%); relu(h) * fc(h) 1.97, 1.83 and
    # 1.97, 1.75 (2.7%)
    check_architecture(build, parameterization)


def test_a_gate_shared_by_every_channel_is_refused():
    class SpatialGate(nn.Module):  # one gate map for all channels (as CBAM's spatial attention)
        def __init__(self):
            super().__init__()
            self.conv, self.gate = nn.Conv2d(2, 8, 1), nn.Conv2d(2, 1, 1)

        def forward(self, x):
            return self.conv(x) * torch.sigmoid(self.gate(x))

    with pytest.raises(errors.ShapeError, match=r"broadcast over the channels \(axis 1\)"):
        ntbridge.nngp(SpatialGate(), torch.randn(2, 2, 3, 3))


@pytest.mark.parametrize("product", [torch.mul, lambda a, b: a.mul(b), lambda a, b: b * a])
def test_forms_of_the_product_convert_as_the_operator(product):
    x = torch.randn(3, 3, dtype=torch.float64)
    got = ntbridge.kernel(Gated(product=product).double(), x)
    expected = ntbridge.kernel(Gated().double(), x)
    assert torch.equal(got.nngp, expected.nngp) and torch.equal(got.ntk, expected.ntk)


class Dependent(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fc, self.fc2, self.fc3 = nn.Linear(3, 8), nn.Linear(3, 8), nn.Linear(8, 8)
        self.out, self.fn = nn.Linear(8, 1), fn

    def forward(self, x):
        return self.out(self.fn(self, x))


@pytest.mark.parametrize("fn, says", [
    (lambda m, x: m.fc(x) * m.fc(x), "uses the weights of .*'fc' .*the same module, called "
                                     "twice"),
    (lambda m, x: (lambda h: h * h)(m.fc(x)), "'fc' and 'fc' are not independent: they are the "
                                              "same tensor"),
    (lambda m, x: (lambda h: h * torch.relu(h))(m.fc(x)), "one is computed from the other"),
    (lambda m, x: (lambda h: torch.relu(h) * torch.tanh(h))(m.fc(x)),
     "both read the units of 'fc' without a Linear/Conv layer mixing all channels of their own"),
    (lambda m, x: torch.cat([m.fc(x), x], 1)[:, :8] * m.fc2(x), "getitem|channels"),
    (lambda m, x: nn.functional.pad(x, (0, 5)) * m.fc2(x), "pad"),
])
def test_dependent_factors_are_refused_by_name(fn, says):
    model, x = Dependent(fn), torch.randn(2, 3)
    ntbridge.empirical_ntk(model, x) if "pad" not in says else None
    with pytest.raises(errors.UnsupportedLayerError, match=says):
        ntbridge.ntk(model, x)


def test_a_factor_of_the_inputs_own_channels_is_refused():
    class InputTimesLinear(nn.Module):  # x * fc(x): fc's width is the input's, finite
        def __init__(self):
            super().__init__()
            self.fc, self.out = nn.Linear(3, 3), nn.Linear(3, 1)

        def forward(self, x):
            return self.out(x * self.fc(x))

    with pytest.raises(errors.UnsupportedLayerError, match="reads the model's input"):
        ntbridge.ntk(InputTimesLinear(), torch.randn(2, 3))


@pytest.mark.parametrize("first, says", [
    (lambda m, h: h, "one is computed from the other without a Linear/Conv layer mixing"),
    (lambda m, h: m.dw2(h), "both read the units of 'conv' without a Linear/Conv layer mixing"),
])
def test_a_depthwise_convolution_keeps_its_channels_dependent(first, says):
    class Depthwise(nn.Module):  # dw(h)'s channel c is a sum over h's channel c alone
        def __init__(self):
            super().__init__()
            self.conv, self.dw = nn.Conv2d(2, 8, 1), nn.Conv2d(8, 8, 3, padding=1, groups=8)
            self.dw2, self.out = nn.Conv2d(8, 8, 1, groups=8), nn.Linear(8 * 9, 1)

        def forward(self, x):
            h = self.conv(x)
            return self.out((first(self, h) * self.dw(h)).flatten(1))

    with pytest.raises(errors.UnsupportedLayerError, match=says):
        ntbridge.ntk(Depthwise(), torch.randn(2, 2, 3, 3))


def test_refusal_says_what_to_do_instead():
    model = Dependent(lambda m, x: (lambda h: h * h)(m.fc(x)))
    with pytest.raises(errors.UnsupportedLayerError,
                       match=r"^operator\.mul in Dependent\.forward: the factors .*each start with "
                             r"a Linear/Conv layer of their own.*ntbridge\.empirical_ntk.*"
                             r"ntbridge\.monte_carlo"):
        ntbridge.ntk(model, torch.randn(2, 3))
    mixed = lambda h: torch.cat([h[:, :4], torch.relu(h)[:, :4]], 1)  # channels of two laws
    with pytest.raises(errors.UnsupportedLayerError, match="identically distributed"):
        ntbridge.ntk(Dependent(lambda m, x: mixed(m.fc(x)) * mixed(m.fc2(x))), torch.randn(2, 3))


def test_a_module_called_twice_shares_its_weights():
    """fc(x) + fc(x) is 2 fc(x), whose kernel is 4 K, not 2 K: the sum is refused, as the product;
    with shared_weights='independent' too, as the factors are one tensor."""
    for combine, says in ((lambda a, b: a + b, "may be correlated"),
                          (lambda a, b: a * b, "both read the units of 'fc'")):
        with pytest.raises(errors.UnsupportedLayerError, match="the same module, called twice"):
            ntbridge.nngp(Dependent(lambda m, x: combine(m.fc(x), m.fc(x))), torch.randn(2, 3))
        model = Dependent(lambda m, x: combine(m.fc(x), m.fc(x)))
        with pytest.raises(errors.UnsupportedLayerError, match=says):
            ntbridge.nngp(model, torch.randn(2, 3), shared_weights="independent")
