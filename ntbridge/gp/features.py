"""Random features of the analytic kernels: ``phi(x)`` with ``phi(x) @ phi(y).T ~ K(x, y)``.

Kernel regression on N examples costs O(N^2) memory and O(N^3) time with the kernel itself; with F
features it is a linear model, O(N F) memory and O(N F^2) time: the route past ~50k examples.

How. Each channel of an infinite-width network's layer is an independent sample of one Gaussian
process, so F samples of it, scaled by ``1/sqrt(F)``, are features of its kernel. Layer by layer
(kernels as the mean over channels of ``z_j(x) z_j(y)``, as :func:`ntbridge.stax.input_kernel`
does for the inputs):

* an affine layer (Linear, Conv) draws ``z_j = W_std * g_j . h / sqrt(fan_in) + b_std * c_j`` (``g``,
  ``c`` standard normal, ``h`` its input's channels): given ``h``, a Gaussian whose covariance is the
  layer's NNGP rule applied to ``h``'s kernel. F such channels are a random layer of width F;
* an elementwise activation acts on each channel;
* linear maps of positions (pooling, flattening, means, sums of branches) act on each channel.

The NTK has its own channels ``t``, Gaussian with the NTK as covariance and independent of ``z``
channel by channel (the recursion of Zandieh et al. 2021, "Scaling neural tangent kernels via
sketching and random features", with Gaussian projections as the sketches): an affine layer adds
a fresh sample of its own contribution (its NNGP in the NTK parameterization, ``sqrt(fan_in) g . h
/ sqrt(fan_in) + c`` in the standard one) to ``W_std`` times a fresh projection of ``t``; an
activation multiplies ``t`` by ``f'(z)`` entrywise, so that ``E[t t' f'(z) f'(z')] = NTK *
E[f'(z) f'(z')]``, the analytic rule.

A network of one hidden layer gives unbiased kernels; deeper ones converge as F grows (each
entry's error ~ ``sqrt(depth / F)``, measured in ``benchmarks/features.py``). Covered: Linear,
Conv1d/2d/3d (zero padding), every elementwise activation the analytic kernels know, average
pooling, Flatten, means and sums over positions, residual sums, Dropout (eval), Identity.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..converters import convert
from ..converters.activations import TWINS
from ..converters.combinators import Add, Scale
from ..converters.elementwise import Elementwise
from ..converters.families import AVG_POOLS, DROPOUTS
from ..converters.graph import Node
from ..converters.indexing import Reduce
from ..converters.registry import as_float
from ..dlpack import check_has_data
from ..errors import AccuracyWarning, InputError, ShapeError, UnsupportedLayerError, warn
from ..pipeline import validate
from ..results import Kernels
from ..specs import KERNEL_NAMES
from ..stax import INPUT

ACTIVATIONS = (nn.ReLU, nn.LeakyReLU, nn.RReLU, nn.GELU, Elementwise, *TWINS)
POSITION_MAPS = (nn.Flatten, nn.Identity, Reduce, Scale, Add, *AVG_POOLS, *DROPOUTS)
CONV_FUNCTIONS = {nn.Conv1d: F.conv1d, nn.Conv2d: F.conv2d, nn.Conv3d: F.conv3d}


class _State(NamedTuple):
    """The channels of one layer's output, channels first: ``z`` for the NNGP, ``t`` for the NTK
    (None before the first layer with parameters, or when the NTK is not asked for), both
    ``(N, C, *positions)``; ``gaussian``: the channels are Gaussian (an activation needs it)."""

    z: torch.Tensor
    t: torch.Tensor | None
    gaussian: bool


class _Draws:
    """Standard normal weights, drawn once per (layer, role) from ``seed``: the same for every
    chunk of examples, independent of the order layers ask for them."""

    def __init__(self, seed: int, like: torch.Tensor):
        self.seed, self.like, self.drawn = seed, like, {}

    def __call__(self, index: int, role: str, shape: tuple[int, ...]) -> torch.Tensor:
        key = (index, role)
        if key not in self.drawn:
            entropy = [self.seed, index + 1, *role.encode()]
            gen = torch.Generator().manual_seed(int(np.random.SeedSequence(entropy).generate_state(1)[0]))
            w = torch.randn(shape, generator=gen, dtype=torch.float64)
            self.drawn[key] = w.to(self.like.device, self.like.dtype)
        return self.drawn[key]


class _Run(NamedTuple):
    """What every layer of one call shares: the weights' draws, F, whether the NTK is wanted, the
    parameterization."""

    draws: _Draws
    n_features: int
    ntk: bool
    parameterization: str


def _projection(module: nn.Module, where: str) -> tuple[Callable, tuple[int, ...], int]:
    """``(project, window, fan_in)`` of an affine module: ``project(h, g)`` maps channels ``h``
    ``(N, C, *positions)`` through weights ``g`` (``(F, C, *window)``, standard normal) scaled to
    unit variance per input, as the module maps its input (stride, padding, dilation)."""
    if isinstance(module, nn.Linear):
        return (lambda h, g: h @ g.T / math.sqrt(h.shape[1])), (), module.in_features
    conv = CONV_FUNCTIONS.get(type(module))
    if conv is None or module.padding_mode != "zeros":
        raise UnsupportedLayerError(f"{where}: no random-features rule (features cover Linear and "
                                    f"Conv1d/2d/3d with zero padding); use ntbridge.kernel.")
    size = math.prod(module.kernel_size)
    fan_in = module.in_channels // module.groups * size

    def project(h, g):
        return conv(h, g / math.sqrt(h.shape[1] * size), stride=module.stride,
                    padding=module.padding, dilation=module.dilation)

    return project, tuple(module.kernel_size), fan_in


def _affine(node: Node, hyper: dict, s: _State, run: _Run) -> _State:
    """A Linear or Conv layer: F random channels of its NNGP (and of its NTK, see the module doc)."""
    project, window, fan_in = _projection(node.module, node.where)
    if isinstance(node.module, nn.Linear) and s.z.ndim != 2:
        raise UnsupportedLayerError(f"{node.where}: features need Linear on (N, features) inputs; "
                                    f"add nn.Flatten() before it.")
    shape = (s.z.shape[1], *window)
    W, b = as_float(hyper["W_std"]), hyper.get("b_std")
    b = None if b is None else as_float(b)
    spatial = (1,) * (s.z.ndim - 2)

    def sample(h, role, scale, shift):
        y = scale * project(h, run.draws(node.index, role, (run.n_features, *shape)))
        if shift is None:
            return y
        return y + shift * run.draws(node.index, role + " bias", (run.n_features,)).reshape(-1, *spatial)

    z = sample(s.z, "nngp", W, b)
    t = None
    if run.ntk:
        own = (sample(s.z, "ntk own", W, b)
               if run.parameterization == "ntk" else
               sample(s.z, "ntk own", math.sqrt(fan_in), None if b is None else 1.0))
        t = own if s.t is None else own + sample(s.t, "ntk carried", W, None)
    return _State(z, t, True)


def _slope(module: nn.Module, z: torch.Tensor) -> torch.Tensor:
    """``f'(z)`` entrywise for an elementwise module ``f`` (as autodiff sees it: 0 where ``f`` is
    piecewise constant, as the analytic rules)."""
    with torch.enable_grad():
        z = z.detach().requires_grad_()
        return torch.autograd.grad(module(z).sum(), z)[0]


def _activation(node: Node, s: _State) -> _State:
    if not s.gaussian:
        raise UnsupportedLayerError(
            f"{node.where}: an activation needs Gaussian inputs (the output of a Linear/Conv "
            f"layer, possibly pooled), as its analytic kernel does; put an affine layer before it.")
    t = None if s.t is None else s.t * _slope(node.module, s.z)
    z = s.z.clone() if getattr(node.module, "inplace", False) else s.z  # another layer may read s.z
    return _State(node.module(z), t, False)


def _position_map(node: Node, states: list[_State]) -> _State:
    """A map acting on each channel alike (pooling, flattening, sums): applied to z and t."""
    module = node.module
    if isinstance(module, Reduce) and any(d % states[0].z.ndim in (0, 1) for d in module.dims):
        raise UnsupportedLayerError(f"{node.where}: a mean or sum over channels has no "
                                    f"random-features rule; use ntbridge.kernel.")
    if isinstance(module, Add) and module.correlated:
        raise UnsupportedLayerError(f"{node.where}: {module.correlated}")
    if isinstance(module, DROPOUTS) and module.training:
        raise UnsupportedLayerError(f"{node.where}: dropout in training mode; call model.eval().")
    z = module(*(s.z for s in states))
    ts = [s.t for s in states]
    t = None if all(v is None for v in ts) else module(
        *(torch.zeros_like(s.z) if s.t is None else s.t for s in states))
    merged = isinstance(module, nn.Flatten) and states[0].z[0, 0].numel() > 1
    return _State(z, t, all(s.gaussian for s in states) and not merged)


def _layer(node: Node, hyper: dict, states: list[_State], run: _Run) -> _State:
    module = node.module
    if isinstance(module, (nn.Linear, *CONV_FUNCTIONS)):
        return _affine(node, hyper, states[0], run)
    if isinstance(module, ACTIVATIONS):
        return _activation(node, states[0])
    if isinstance(module, POSITION_MAPS):
        return _position_map(node, states)
    raise UnsupportedLayerError(
        f"{node.where} has no random-features rule. Features cover Linear, Conv1d/2d/3d, "
        f"elementwise activations, average pooling, Flatten, means and sums over positions and "
        f"residual sums; use ntbridge.kernel for this model's exact kernel.")


def _chunk(graph, x: torch.Tensor, run: _Run) -> _State:
    """The channels of the network's output for the examples ``x``."""
    states = {INPUT: _State(x, None, False)}
    for node, hyper in zip(graph.layers, graph.hyper):
        states[node.index] = _layer(node, hyper, [states[i] for i in node.inputs], run)
    return states[graph.layers[-1].index]


def sampling_error(phi: torch.Tensor, rows: int = 64) -> float:
    """The relative standard error of ``phi @ phi.T`` from ``phi``'s own columns taken as
    independent samples (the last layer's sampling error, on the first ``rows`` examples): a lower
    bound of the features' error, to which the earlier layers add."""
    p = phi[:rows].double() * math.sqrt(phi.shape[1])
    products = p[:, None, :] * p[None, :, :]
    k, se = products.mean(-1), products.std(-1) / math.sqrt(phi.shape[1])
    return float(se.norm() / k.norm())


def features(model: nn.Module, x: torch.Tensor, n_features: int, *,
             get: str | tuple[str, ...] = "nngp", seed: int = 0, parameterization: str = "standard",
             batch_size: int = 8192, rtol: float | None = None, **convert_options):
    """Random features ``phi (N, n_features)`` of ``model``'s analytic kernels: ``phi(x) @
    phi(y).T`` approximates ``ntbridge.nngp(model, x, y)`` (``get="ntk"``: ``ntbridge.ntk``), each
    entry with a relative error ~ ``sqrt(depth / n_features)``.

    Args:
      model: Linear, Conv1d/2d/3d, elementwise activations, average pooling, Flatten, means over
        positions and residual sums (see the module doc); it should end in a Linear (or a map of
        positions to ``(N, F)``): ``phi`` has one column per random channel of the last layer.
      x: ``(N, *input_shape)``, finite, floating (``phi`` takes its device and dtype: float64 for
        float64 inputs, else float32, as the kernels).
      n_features: F, the width of the random layers and the number of columns of ``phi``.
      get: ``"nngp"``, ``"ntk"``, or a tuple of both (then a :class:`~ntbridge.Kernels` record).
      seed: the random weights' seed; features of different inputs computed with the same seed
        (and model) belong to one kernel, so compute train and test features with one seed.
      parameterization, convert_options (``init``, ``W_std``, ``b_std``): as :func:`ntbridge.kernel`.
      batch_size: examples computed at once (memory ~ batch_size * F * positions); the result does
        not depend on it (up to rounding).
      rtol: if given, warns with :class:`~ntbridge.errors.AccuracyWarning` when the features'
        sampling error (:func:`sampling_error`, a lower bound of their error) exceeds it.

    Example:
        >>> model = nn.Sequential(nn.Linear(16, 512), nn.ReLU(), nn.Linear(512, 1))
        >>> phi = ntbridge.features(model, torch.randn(100_000, 16), 2048)   # (100000, 2048)
        >>> w = torch.linalg.solve(phi.T @ phi + 1e-3 * torch.eye(2048), phi.T @ y)  # ridge regression
    """
    names = (get,) if isinstance(get, str) else tuple(get)
    if not names or any(n not in KERNEL_NAMES for n in names):
        raise InputError(f"get must be 'nngp', 'ntk' or a tuple of them, got {get!r}.")
    if not isinstance(n_features, int) or isinstance(n_features, bool) or n_features < 1:
        raise InputError(f"n_features must be a positive integer, got {n_features!r}.")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size must be a positive integer, got {batch_size!r}.")
    x, _ = validate(x, None, names=("x", "x2"))
    graph = convert(model, parameterization=parameterization, **convert_options)
    check_has_data(graph.tensors)
    weight = next(model.parameters(), x)  # only x's shape is checked, on the model's device and dtype
    try:
        with torch.no_grad():
            model(x[:1].to(weight.device, weight.dtype))
    except RuntimeError as e:
        raise ShapeError(f"x of shape {tuple(x.shape)} does not fit the model: {e}") from None
    run = _Run(_Draws(seed, x), n_features, "ntk" in names, parameterization)
    values = {}
    for start in range(0, len(x), batch_size):  # each chunk's channels go straight to the result
        out = _chunk(graph, x[start:start + batch_size].detach(), run)
        if out.z.ndim != 2:
            raise ShapeError(f"the model's output has shape {tuple(out.z.shape[1:])} per "
                             f"example; features need (N, F): end the model in a Linear or a "
                             f"pooling and Flatten.")
        for name in names:
            channels = out.z if name == "nngp" else out.t
            phi = values.setdefault(name, x.new_empty((len(x), channels.shape[1])))
            phi[start:start + len(channels)] = channels / math.sqrt(channels.shape[1])
    for name in names:
        if rtol is not None and (error := sampling_error(values[name])) > rtol:
            warn(AccuracyWarning(f"the {name} features' sampling error is {error:.2g} (relative, at "
                                 f"least: earlier layers add to it) > rtol={rtol:g}; it falls as "
                                 f"1/sqrt(n_features): about {math.ceil(n_features * (error / rtol) ** 2)} "
                                 f"features would reach rtol."))
    return Kernels.pick(values, get)
