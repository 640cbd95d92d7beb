"""The converter registry: one small function per torch module type, returning a stax ``Layer``."""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Callable, Mapping

import numpy as np
import torch
from torch import nn

from ..errors import InputError, InputTypeError
from ..stax import PARAMETERIZATIONS, Layer, Rule
from ..stax.sources import SAMPLING

Converter = Callable[[nn.Module, "Context"], Layer]
CONVERTERS: dict[type, Converter] = {}
CONVERTERS_BY_NAME: dict[str, Converter] = {}  # "package.module.Class" -> converter
INITS = ("torch", "infer")
ATTENTIONS = ("softmax", "linear")  # torch's 1/sqrt(d) attention, or the tied 1/d variant
SHARED_WEIGHTS = ("auto", "independent")  # layers holding one set of weights: tied, or not
ATTENTION_POINTS = Rule().points  # the default of attention_points: the rule's own
EXPECTATION_POINTS = SAMPLING.points  # the default of expectation_points: the sources' rule's


def register(module_type: type) -> Callable[[Converter], Converter]:
    """Register ``fn(module, ctx) -> Layer`` as the converter of ``module_type`` (and subclasses).

    Example:
        >>> @ntbridge.register_converter(MyScale)
        ... def _(module, ctx):
        ...     return ntbridge.stax.elementwise(lambda x: module.c * x, my_rule, "MyScale")
    """
    if not (isinstance(module_type, type) and issubclass(module_type, nn.Module)):
        raise InputTypeError(f"register_converter expects an nn.Module subclass, "
                             f"got {module_type!r}.")

    def decorator(fn: Converter) -> Converter:
        CONVERTERS[module_type] = fn
        return fn

    return decorator


def register_by_name(qualified_name: str) -> Callable[[Converter], Converter]:
    """Register ``fn(module, ctx) -> Layer`` as the converter of the module type of
    ``qualified_name`` (``"package.module.Class"``) and its subclasses, without importing it: the
    converters of a library's modules (PyTorch Geometric's) load with ntbridge, the library when
    its user imports it."""

    def decorator(fn: Converter) -> Converter:
        CONVERTERS_BY_NAME[qualified_name] = fn
        return fn

    return decorator


def find_converter(module: nn.Module) -> Converter | None:
    """The converter registered for ``type(module)`` or its nearest registered base class."""
    for cls in type(module).__mro__:
        if cls in CONVERTERS:
            return CONVERTERS[cls]
        if (name := f"{cls.__module__}.{cls.__qualname__}") in CONVERTERS_BY_NAME:
            return CONVERTERS_BY_NAME[name]
    return None


def overrides_forward(module: nn.Module) -> bool:
    """Whether ``module``'s class defines its own ``forward`` below the class registered by type
    whose converter :func:`find_converter` gives (a subclass computing something else, e.g. a
    convolution standardizing its weights): that converter does not describe it. Classes
    registered by name are a library's families, whose converters read their subclasses (each
    PyTorch Geometric layer defines its ``forward``)."""
    mro = type(module).__mro__
    for i, cls in enumerate(mro):
        if cls in CONVERTERS:
            return any("forward" in c.__dict__ for c in mro[:i])
        if f"{cls.__module__}.{cls.__qualname__}" in CONVERTERS_BY_NAME:
            return False
    return False


def supported_types() -> tuple[str, ...]:
    """The names of the torch module types (and users' registered ones) that convert; ntbridge's
    internal stand-ins for functional calls are not listed."""
    return tuple(sorted(cls.__name__ for cls in CONVERTERS
                        if not cls.__module__.startswith("ntbridge.")))


Std = float | torch.Tensor  # a scalar tensor may require grad: the analytic kernels carry it
StdOption = Std | Mapping[str, Std] | None


def as_float(v: Std) -> float:
    """A standard deviation's value (a tensor's detached)."""
    return float(v.detach() if isinstance(v, torch.Tensor) else v)


def _check_std(value: StdOption, arg: str) -> None:
    """InputTypeError unless every value is a real number or a one-element floating tensor,
    InputError unless it is finite and non-negative."""
    items = value.items() if isinstance(value, Mapping) else [(None, value)]
    for name, v in items:
        where = arg if name is None else f"{arg}[{name!r}]"
        if isinstance(v, torch.Tensor) and (v.numel() != 1 or not v.dtype.is_floating_point):
            raise InputTypeError(f"{where} is a tensor of shape {tuple(v.shape)} and dtype "
                                 f"{v.dtype}; pass a floating-point scalar, e.g. "
                                 f"torch.tensor(1.0, requires_grad=True).")
        if not isinstance(v, (torch.Tensor, numbers.Real, type(None))) or isinstance(v, bool):
            raise InputTypeError(f"{arg} must be a non-negative float or scalar tensor, or a "
                                 f"mapping from qualified module names to those, all finite, got "
                                 f"{value!r}.")
        if v is not None and not 0 <= as_float(v) < math.inf:
            raise InputError(f"{where} must be finite and non-negative (a standard deviation), "
                             f"got {as_float(v)}; to fit it, optimise an unconstrained value "
                             f"mapped through e.g. torch.nn.functional.softplus or exp.")


@dataclasses.dataclass
class Options:
    """The hyper-parameter options of a conversion (see ``ntbridge.convert``)."""

    parameterization: str = "standard"
    init: str = "torch"
    W_std: StdOption = None
    b_std: StdOption = None
    attention: str = "softmax"
    attention_points: int = ATTENTION_POINTS
    shared_weights: str = "auto"
    expectation_points: int = EXPECTATION_POINTS
    library: tuple[tuple[str, float], ...] = ()  # (module, std): a library's N(0, std**2) init
    xavier: tuple[str, ...] = ()  # nn.Transformer modules, whose matrices are xavier_uniform_
    used_names: set = dataclasses.field(default_factory=set)

    def __post_init__(self):
        if self.attention not in ATTENTIONS:
            raise InputError(f"attention must be one of {ATTENTIONS}, got {self.attention!r}.")
        for name, default in (("attention_points", ATTENTION_POINTS),
                              ("expectation_points", EXPECTATION_POINTS)):
            points = getattr(self, name)
            if isinstance(points, bool) or not isinstance(points, int) or points < 2 or points & (
                    points - 1):
                raise InputError(f"{name} must be a power of 2 (scrambled Sobol points come "
                                 f"balanced in those), at least 2, got {points!r}; e.g. "
                                 f"{default} (the default) or 128.")
        if self.parameterization not in PARAMETERIZATIONS:
            raise InputError(f"parameterization must be one of {PARAMETERIZATIONS}, "
                             f"got {self.parameterization!r}.")
        if self.shared_weights not in SHARED_WEIGHTS:
            raise InputError(f"shared_weights must be one of {SHARED_WEIGHTS}, got "
                             f"{self.shared_weights!r}.")
        if self.init not in INITS:
            raise InputError(f"init must be one of {INITS}, got {self.init!r}.")
        _check_std(self.W_std, "W_std")
        _check_std(self.b_std, "b_std")

    def explicit(self, option: StdOption, name: str) -> Std | None:
        if isinstance(option, Mapping):
            if name in option:
                self.used_names.add(name)
            return option.get(name)
        return option

    def check_names(self, names: list[str]) -> None:
        """Every qualified name in a W_std/b_std mapping must be a module that has weights."""
        for arg, option in (("W_std", self.W_std), ("b_std", self.b_std)):
            unknown = set(option) - self.used_names if isinstance(option, Mapping) else set()
            if unknown:
                raise InputError(f"{arg} names {sorted(unknown)}, which are not modules with "
                                 f"weights in this model; valid names: {names}.")


@dataclasses.dataclass
class Context:
    """What a converter may know besides its module: where it sits and the conversion options."""

    name: str
    index: int
    options: Options
    hyper: dict = dataclasses.field(default_factory=dict)
    init_checks: tuple = ()  # (label, tensor, fan_in) assumed to follow torch's default init
    call: dict | None = None  # a traced call's other arguments (masks), by keyword

    @property
    def parameterization(self) -> str:
        return self.options.parameterization

    @property
    def in_transformer(self) -> bool:
        """Whether the module is part of an ``nn.Transformer``, which re-draws every weight
        matrix of its layers from ``xavier_uniform_`` (``init="torch"`` reads them so)."""
        return any(self._inside(p) for p in self.options.xavier)

    @property
    def library_std(self) -> float | None:
        """With ``init="torch"``, the standard deviation of the normal distribution the library
        model holding this module draws its weights from (Hugging Face's ``initializer_range``,
        :data:`Options.library`); None outside such a model, or with another ``init``."""
        inside = (std for p, std in self.options.library if self._inside(p))
        return next(inside, None) if self.options.init == "torch" else None

    def _inside(self, prefix: str) -> bool:
        """Whether this module is the model's module ``prefix`` or one of its submodules."""
        return prefix in ("", self.name) or self.name.startswith(prefix + ".")

    def affine(self, fan_in: int, weight: torch.Tensor, bias: torch.Tensor | None) -> dict:
        """Keyword arguments ``W_std, b_std, distribution, parameterization`` of an affine layer.

        ``init="torch"``: torch's default init of Linear/ConvNd, ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``
        for weight and bias, i.e. ``W_std = 1/sqrt(3)``, ``b_std = 1/sqrt(3 fan_in)``; in a model
        of a library that draws ``N(0, library_std**2)`` weights and zero biases (Hugging Face's),
        ``W_std = library_std sqrt(fan_in)``, ``b_std = 0``; in an ``nn.Transformer``,
        ``xavier_uniform_`` weights, ``W_std**2 = 2 fan_in / (fan_in + fan_out)``.
        ``init="infer"``: ``W_std**2 = fan_in * mean(W**2)``, ``b_std**2 = mean(b**2)``.
        Explicit ``W_std``/``b_std`` override either; parameters are then drawn Gaussian. An
        explicit torch tensor is kept in ``hyper`` as it is (the analytic kernels take it as an
        argument of their program and differentiate it); the layer is built with its value.
        ``init_fn`` samples from the distribution stated by ``distribution``: torch's uniform for
        ``init="torch"``, a Gaussian of the inferred or explicit variances otherwise. With
        ``init="torch"``, the weights (and bias) not given explicitly are recorded for
        :func:`init_mismatch`.
        """
        o = self.options
        library_std = self.library_std
        library = library_std is not None
        xavier = o.init == "torch" and self.in_transformer
        if library:  # e.g. Hugging Face's normal(0, initializer_range), zero biases
            W_std, b_std = library_std * fan_in ** 0.5, 0.0
        elif o.init == "torch":
            W_std, b_std = 3 ** -0.5, (3 * fan_in) ** -0.5
            if xavier:  # U(-a, a), a**2 = 6 / (fan_in + fan_out); biases as torch's default
                W_std = (2 * fan_in / (fan_in + weight.numel() // fan_in)) ** 0.5
        else:
            W_std = (fan_in * weight.detach().double().pow(2).mean()).sqrt().item()
            b_std = None if bias is None else rms(bias)
        W_exp, b_exp = o.explicit(o.W_std, self.name), o.explicit(o.b_std, self.name)
        W_std = W_std if W_exp is None else W_exp
        b_std = None if bias is None else (b_std if b_exp is None else b_exp)
        explicit = W_exp is not None or b_exp is not None
        if o.init == "torch" and not (library or xavier):
            self.init_checks = tuple((label, t, fan_in) for label, t, exp in
                                     (("weight", weight, W_exp), ("bias", bias, b_exp))
                                     if t is not None and exp is None)
        self.hyper = {"W_std": W_std, "b_std": b_std}
        number = lambda v: None if v is None else as_float(v)
        return dict(W_std=number(W_std), b_std=number(b_std), parameterization=o.parameterization,
                    distribution="uniform" if o.init == "torch" and not (explicit or library)
                    else "normal")


def rms(t: torch.Tensor) -> float:
    """The root mean square of the entries of ``t``, in float64: the standard deviation that
    ``init="infer"`` reads from a tensor of zero-mean draws.

    Example:
        >>> rms(torch.tensor([3.0, -4.0]))
        3.5355339059327378
    """
    return t.detach().double().pow(2).mean().sqrt().item()


# torch's default init of Linear/ConvNd draws weight and bias from U(-a, a) with a = 1/sqrt(fan_in).
# The mean square of n such entries has mean a**2/3 and standard deviation a**2 sqrt(4 / (45 n))
# (E[w**4] = a**4/5). A fresh model exceeds INIT_Z_MAX of them with probability below
# exp(-0.17 INIT_Z_MAX**2) ~ 2e-8 per tensor (Hoeffding: the squares lie in [0, a**2]), while
# kaiming_normal_ (6x the variance) sits 5.6 sqrt(n) of them away and mostly leaves the support.
INIT_Z_MAX = 10.0


def init_mismatch(tensor: torch.Tensor, fan_in: int) -> str | None:
    """Why ``tensor`` cannot come from torch's default init ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``,
    or None when it may.

    Example:
        >>> init_mismatch(nn.Linear(64, 64).weight, 64) is None
        True
        >>> init_mismatch(nn.init.kaiming_normal_(torch.empty(64, 64)), 64)
        'largest |entry| 0.6, above the bound 1/sqrt(fan_in) = 0.125'
    """
    t = tensor.detach().cpu()  # numpy's reductions: one thread (see ntbridge.dlpack.all_finite)
    t = (t.float() if t.dtype == torch.bfloat16 else t).numpy().astype(np.float64).ravel()
    if t.size == 0:
        return None
    bound = fan_in ** -0.5
    largest = float(np.abs(t).max())
    eps = max(torch.finfo(tensor.dtype).eps, torch.finfo(torch.float32).eps)  # drawn in float32
    if largest > bound * (1 + 4 * eps):  # (then, e.g., model.double())
        return f"largest |entry| {largest:.3g}, above the bound 1/sqrt(fan_in) = {bound:.3g}"
    ratio = float(np.mean(t * t)) / (bound ** 2 / 3)
    z = (ratio - 1) / (4 / (5 * t.size)) ** 0.5
    if abs(z) > INIT_Z_MAX:
        return f"a variance {ratio:.3g}x the default's ({z:+.0f} standard errors)"
    return None
