"""Random features of the analytic kernels: ``phi(x)`` with ``phi(x) @ phi(y).T ~ K(x, y)``.

Kernel regression on N examples costs O(N^2) memory and O(N^3) time with the kernel itself; with F
features it is a linear model, O(N F) memory and O(N F^2) time: the route past ~50k examples.

How. The model is converted to its stax layers (:func:`ntbridge.convert`), and each layer's
feature map (``Layer.features``, written beside its kernel rule, see :mod:`ntbridge.stax.features`)
turns F random channels of its inputs into F random channels of its output, NNGP and NTK alike;
the network's last channels, scaled by ``1/sqrt(F)``, are the features. A layer without a feature
map is refused, by name.

A network of one hidden layer gives unbiased kernels; deeper ones converge as F grows (each
entry's error ~ ``sqrt(depth / F)``, measured in ``benchmarks/features.py``). Covered: Linear,
Conv1d/2d/3d (zero padding), every elementwise activation the analytic kernels know, average
pooling, Flatten, means and sums over positions, residual sums, Dropout (eval), Identity.
"""

from __future__ import annotations

import functools
import math

import jax
import numpy as np
import torch
from torch import nn

from ..converters import Graph, convert
from ..dlpack import check_has_data, precision, to_jax, to_torch
from ..errors import (AccuracyWarning, InputError, NtbridgeError, ShapeError,
                      UnsupportedLayerError, warn)
from ..pipeline import validate
from ..results import Kernels
from ..specs import KERNEL_NAMES
from ..stax import INPUT
from ..stax.features import Channels, Sampler


class _Draws:
    """Standard normal weights, drawn once per (layer, role) from ``seed`` (in float64 by torch,
    then in the dtype and on the device of ``like``): the same for every chunk of examples,
    independent of the order layers ask for them."""

    def __init__(self, seed: int, like: torch.Tensor):
        self.seed, self.like, self.drawn = seed, like, {}

    def __call__(self, index: int, role: str, shape: tuple[int, ...]) -> jax.Array:
        key = (index, role)
        if key not in self.drawn:
            entropy = [self.seed, index + 1, *role.encode()]
            gen = torch.Generator().manual_seed(int(np.random.SeedSequence(entropy).generate_state(1)[0]))
            w = torch.randn(shape, generator=gen, dtype=torch.float64)
            self.drawn[key] = to_jax(w.to(self.like.device, self.like.dtype), "weights")
        return self.drawn[key]


def _chunk(graph: Graph, x: jax.Array, draws: _Draws, width: int, ntk: bool) -> Channels:
    """The channels of the network's output for the examples ``x`` ``(N, *input_shape)``: each
    layer's feature map applied to its inputs' channels, in the graph's order."""
    channels = {INPUT: Channels(x, None, False)}
    for node in graph.layers:
        if node.layer.features is None:
            raise UnsupportedLayerError(
                f"{node.where} has no random-features rule. Features cover Linear, Conv1d/2d/3d, "
                f"elementwise activations, average pooling, Flatten, means and sums over "
                f"positions and residual sums; use ntbridge.kernel for this model's exact kernel.")
        inputs = tuple(channels[i] for i in node.inputs)
        sampler = Sampler(functools.partial(draws, node.index), width, ntk)
        try:
            channels[node.index] = node.layer.features(
                inputs[0] if len(inputs) == 1 else inputs, sampler)
        except NtbridgeError as e:  # name the module the refusal comes from
            raise type(e)(f"{node.where}: {e}") from None
    return channels[graph.layers[-1].index]


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
    draws, values = _Draws(seed, x), {}
    with precision(x.dtype):
        for start in range(0, len(x), batch_size):  # each chunk's channels go straight to the result
            out = _chunk(graph, to_jax(x[start:start + batch_size], "x"), draws, n_features,
                         "ntk" in names)
            if out.z.ndim != 2:
                raise ShapeError(f"the model's output has shape {tuple(out.z.shape[1:])} per "
                                 f"example; features need (N, F): end the model in a Linear or a "
                                 f"pooling and Flatten.")
            for name in names:
                channels = to_torch(out.z if name == "nngp" else out.t)
                phi = values.setdefault(name, x.new_empty((len(x), channels.shape[1])))
                phi[start:start + len(channels)] = channels / math.sqrt(channels.shape[1])
    for name in names:
        if rtol is not None and (error := sampling_error(values[name])) > rtol:
            warn(AccuracyWarning(f"the {name} features' sampling error is {error:.2g} (relative, at "
                                 f"least: earlier layers add to it) > rtol={rtol:g}; it falls as "
                                 f"1/sqrt(n_features): about {math.ceil(n_features * (error / rtol) ** 2)} "
                                 f"features would reach rtol."))
    return Kernels.pick(values, get)
