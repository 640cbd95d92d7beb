"""The functional and method forms of the activation modules ntbridge converts, as module instances.

``FORMS`` maps each activation module type to the torch functions (``torch.nn.functional.*``,
``torch.*``, in-place variants included) and ``Tensor`` method names computing it. A call's
arguments after the input are the module's constructor arguments, in the same order and with the
same keywords (``F.leaky_relu(h, 0.2)`` is ``nn.LeakyReLU(0.2)``, ``F.hardtanh(h, min_val=-2.)``
is ``nn.Hardtanh(min_val=-2.)``), except for ``F.rrelu``'s ``training`` (the module's mode) and
the ``dtype`` of softmax (refused unless None). In-place forms (``F.relu_``, ``inplace=True``) give
the module out of place: the same function, and the same programs. The traced call then converts
exactly as the module does: one converter per module type.

Example:
    >>> module_of(F.leaky_relu, (h, 0.2), {})
    (LeakyReLU(negative_slope=0.2), h)
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UnsupportedLayerError

FORMS: dict[type, tuple[tuple[Callable, ...], tuple[str, ...]]] = {
    nn.ReLU: ((F.relu, F.relu_, torch.relu, torch.relu_), ("relu", "relu_")),
    nn.LeakyReLU: ((F.leaky_relu, F.leaky_relu_), ()),
    nn.RReLU: ((F.rrelu, F.rrelu_), ()),
    nn.GELU: ((F.gelu,), ()),
    nn.Tanh: ((F.tanh, torch.tanh, torch.tanh_), ("tanh", "tanh_")),
    nn.Sigmoid: ((F.sigmoid, torch.sigmoid, torch.sigmoid_), ("sigmoid", "sigmoid_")),
    nn.SiLU: ((F.silu,), ()),
    nn.ELU: ((F.elu, F.elu_), ()),
    nn.CELU: ((F.celu, F.celu_), ()),
    nn.SELU: ((F.selu, F.selu_, torch.selu, torch.selu_), ()),
    nn.Softplus: ((F.softplus,), ()),
    nn.Mish: ((F.mish,), ()),
    nn.Hardtanh: ((F.hardtanh, F.hardtanh_), ()),
    nn.ReLU6: ((F.relu6,), ()),
    nn.Hardswish: ((F.hardswish,), ()),
    nn.Hardsigmoid: ((F.hardsigmoid,), ()),
    nn.LogSigmoid: ((F.logsigmoid,), ()),
    nn.Softsign: ((F.softsign,), ()),
    nn.Tanhshrink: ((F.tanhshrink,), ()),
    nn.Softshrink: ((F.softshrink,), ()),
    nn.Hardshrink: ((F.hardshrink,), ("hardshrink",)),
    nn.Threshold: ((F.threshold, F.threshold_), ()),
    nn.Softmax: ((F.softmax, torch.softmax), ("softmax",)),
    nn.LogSoftmax: ((F.log_softmax, torch.log_softmax), ("log_softmax",)),
}
FUNCTIONS = {fn: cls for cls, (fns, _) in FORMS.items() for fn in fns}
METHOD_FORMS = {name: cls for cls, (_, names) in FORMS.items() for name in names}


def _rrelu(lower=1.0 / 8, upper=1.0 / 3, training=False, inplace=False) -> nn.Module:
    return nn.RReLU(lower, upper, inplace).train(training)


def _softmax(cls: type) -> Callable[..., nn.Module]:
    def make(dim=None, _stacklevel=3, dtype=None) -> nn.Module:
        if dtype is not None:
            raise UnsupportedLayerError(f"{cls.__name__.lower()} with dtype={dtype}: cast the "
                                        f"input instead (x.to(dtype)), or drop dtype.")
        return cls(dim)
    return make


_SPECIAL = {nn.RReLU: _rrelu, nn.Softmax: _softmax(nn.Softmax),
            nn.LogSoftmax: _softmax(nn.LogSoftmax)}


def module_of(target: Callable | str, args: tuple, kwargs: dict) -> tuple[nn.Module, Any]:
    """``(module, input)``: the module computing ``target(*args, **kwargs)``, a function of
    :data:`FUNCTIONS` or a method name of :data:`METHOD_FORMS`, and its input (the first argument,
    or the keyword ``input``)."""
    cls = METHOD_FORMS[target] if isinstance(target, str) else FUNCTIONS[target]
    kwargs = dict(kwargs)
    x, args = (args[0], args[1:]) if args else (kwargs.pop("input"), ())
    module = _SPECIAL.get(cls, cls)(*args, **kwargs)
    if getattr(module, "inplace", False):  # the same function: built as the module form is
        module.inplace = False
    return module, x
