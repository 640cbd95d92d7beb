"""Functional and method forms of every activation module: traced by fx, they convert to the same
module, so their forward passes and kernels are identical to the module form's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ntbridge
from ntbridge.converters import activations, registry
from ntbridge.converters.functional import FORMS
from ntbridge.errors import UnsupportedLayerError

# constructor arguments other than the defaults, where the module has some, as keywords
ARGS = {nn.LeakyReLU: dict(negative_slope=0.2), nn.RReLU: dict(lower=0.1, upper=0.3),
        nn.GELU: dict(approximate="tanh"), nn.ELU: dict(alpha=0.5), nn.CELU: dict(alpha=0.7),
        nn.Softplus: dict(beta=2.0, threshold=10.0), nn.Hardtanh: dict(min_val=-2.0, max_val=1.5),
        nn.Softshrink: dict(lambd=0.3), nn.Hardshrink: dict(lambd=0.4),
        nn.Threshold: dict(threshold=0.1, value=20.0), nn.Softmax: dict(dim=-1),
        nn.LogSoftmax: dict(dim=-1)}
POSITIONAL = [  # the same arguments given positionally, as users write them
    (nn.LeakyReLU, lambda h: F.leaky_relu(h, 0.2)), (nn.ELU, lambda h: F.elu(h, 0.5)),
    (nn.Hardtanh, lambda h: F.hardtanh(h, -2.0, 1.5)), (nn.Softplus, lambda h: F.softplus(h, 2.0, 10.0)),
    (nn.Threshold, lambda h: F.threshold(h, 0.1, 20.0)), (nn.RReLU, lambda h: F.rrelu(h, 0.1, 0.3)),
    (nn.Softmax, lambda h: h.softmax(-1)), (nn.Hardshrink, lambda h: h.hardshrink(0.4)),
    (nn.ReLU, lambda h: F.relu(input=h)), (nn.SiLU, lambda h: F.silu(h, inplace=True)),
]
NO_KERNEL = (nn.Softmax, nn.LogSoftmax)  # forward only: the analytic kernel refuses both forms


class Wrapped(nn.Module):
    """Linear -> ``act`` -> Linear, ``act`` a module or a function of the hidden tensor."""

    def __init__(self, act):
        super().__init__()
        torch.manual_seed(0)
        self.inp, self.out = nn.Linear(3, 8), nn.Linear(8, 2)
        self.act = act if isinstance(act, nn.Module) else None
        self.form = act

    def forward(self, x):
        h = self.inp(x)
        return self.out(self.act(h) if self.act is not None else self.form(h))


def _cases() -> list:
    return list(_forms())


def _forms():
    for cls, (functions, methods) in FORMS.items():
        kw = ARGS.get(cls, {})
        for fn in functions:
            yield pytest.param(cls, lambda h, fn=fn, kw=kw: fn(h, **kw),
                               id=f"{cls.__name__}-{fn.__module__}.{fn.__name__}")
        for name in methods:
            yield pytest.param(cls, lambda h, name=name, kw=kw: getattr(h, name)(**kw),
                               id=f"{cls.__name__}-Tensor.{name}")
    for n, (cls, form) in enumerate(POSITIONAL):
        yield pytest.param(cls, form, id=f"{cls.__name__}-positional-{n}")


def test_every_converted_activation_has_its_forms():
    """A new activation module cannot be added to the converters and forgotten here (or the
    reverse): the table of forms covers exactly the modules the activation converters register."""
    registered = {cls for cls, fn in registry.CONVERTERS.items()
                  if fn.__module__ == activations.__name__}
    assert set(FORMS) - {nn.ReLU6} == registered  # ReLU6 converts as the Hardtanh it subclasses
    assert all(registry.find_converter(cls(**ARGS.get(cls, {}))) for cls in FORMS)


@pytest.mark.slow
@pytest.mark.parametrize("cls, form", _cases())
def test_forms_convert_as_the_module(cls, form):
    x1, x2 = torch.randn(5, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
    module_model = Wrapped(cls(**ARGS.get(cls, {}))).double().eval()
    form_model = Wrapped(form).double().eval()
    module_graph, form_graph = ntbridge.convert(module_model), ntbridge.convert(form_model)
    assert [type(n.module) for n in form_graph.layers] == [type(n.module) for n in module_graph.layers]
    assert repr(form_graph.layers[1].module) == repr(module_graph.layers[1].module)
    torch.testing.assert_close(form_model(x1), module_model(x1), rtol=0, atol=0)
    if cls in NO_KERNEL:
        for model in (module_model, form_model):
            with pytest.raises(UnsupportedLayerError):
                ntbridge.ntk(model, x1, x2)
        return
    expected, got = ntbridge.kernel(module_model, x1, x2), ntbridge.kernel(form_model, x1, x2)
    assert torch.equal(got.nngp, expected.nngp) and torch.equal(got.ntk, expected.ntk)


@pytest.mark.parametrize("form, match", [
    (lambda h: F.rrelu(h, training=True), "RReLU in training mode"),
    (lambda h: F.softmax(h, -1, dtype=torch.float64), "softmax with dtype"),
])
def test_forms_the_module_cannot_take_are_refused_by_name(form, match):
    with pytest.raises(UnsupportedLayerError, match=match):
        ntbridge.convert(Wrapped(form))
