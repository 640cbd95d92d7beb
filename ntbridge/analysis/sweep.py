"""The width sweep: fresh models of growing width, their finite-width kernels against the
analytic limits (see :mod:`ntbridge.analysis`).

Example:
    >>> build = lambda w: nn.Sequential(nn.Linear(8, w), nn.ReLU(), nn.Linear(w, 1))
    >>> width_sweep(build, [64, 256, 1024], torch.randn(6, 8), n_seeds=3).slope   # about -0.5
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

from ..api import empirical_ntk, kernel, sample_seed
from ..converters import Graph, convert
from ..errors import InputError, InputTypeError
from ..progress import Bar
from .report import SEED_SPREAD, WidthSweep


def _relative_error(estimate: torch.Tensor, exact: torch.Tensor) -> float:
    estimate, exact = estimate.double(), exact.double()
    return (torch.linalg.norm(estimate - exact) / torch.linalg.norm(exact)).item()


def analytic_ntk_by_layer(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor | None = None, *,
                          parameterization: str = "standard") -> dict[str, torch.Tensor]:
    """The analytic NTK's contribution of each module with parameters, ``{name: (N1, N2)}``.

    For a chain of modules (``nn.Sequential``); the contributions sum to ``ntbridge.ntk(model, ...)``
    (torch's default init assumed); :mod:`ntbridge.analytic` says how they are computed.

    Example:
        >>> parts = analytic_ntk_by_layer(model, x)
        >>> sum(parts.values())  # == ntbridge.ntk(model, x) up to rounding
    """
    parts = _analytic(model, x1, x2, parameterization)[2]
    if parts is None:
        raise InputError("analytic_ntk_by_layer needs a chain of modules (an nn.Sequential); "
                         "this model has residual sums or concatenations.")
    return parts


def _analytic(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor | None, parameterization: str):
    """``(nngp, ntk, {name: contribution} or None for graphs that are not chains, graph)``."""
    nngp, ntk = kernel(model, x1, x2, parameterization=parameterization, by_layer=True,
                       progress=False)  # the sweep's own bar shows progress
    graph = convert(model, parameterization=parameterization)
    if not isinstance(ntk, dict):
        return nngp, ntk, None, graph
    return nngp, sum(ntk.values()), ntk, graph


def _readout_nngp(model: nn.Module, graph: Graph, x1: torch.Tensor,
                  x2: torch.Tensor | None) -> torch.Tensor:
    """``W_std**2 h1 h2^T / fan_in + b_std**2``: the output covariance given the readout's inputs."""
    last = graph.layers[-1]  # graph: the architecture; model: this seed's weights
    readout = dict(model.named_modules())[last.name]
    if not isinstance(readout, nn.Linear):
        raise InputError(f"width_sweep needs a model whose output is a final nn.Linear (its readout); "
                         f"the last module is {last.where}.")
    features = []
    hook = readout.register_forward_hook(lambda m, inputs, out: features.append(inputs[0]))
    try:
        with torch.no_grad():
            for x in (x1, x2 if x2 is not None else x1):
                model(*x) if isinstance(x, (tuple, list)) else model(x)  # graph inputs: pairs
    finally:
        hook.remove()
    h1, h2 = (h.reshape(h.shape[0], -1).double() for h in features)
    W_std, b_std = last.hyper["W_std"], last.hyper["b_std"]
    return W_std ** 2 * (h1 @ h2.T) / readout.in_features + (b_std ** 2 if b_std else 0.0)


def _ntk_parameterization_factors(graph: Graph) -> dict[str, float]:
    """Per module, the factor turning its standard-parameterization NTK contribution into the NTK
    parameterization's: ``W_std**2 / fan_in`` for the weight and ``b_std**2`` for the bias, which
    must agree (they do for torch's default init: ``1 / (3 fan_in)``)."""
    factors = {}
    for n in graph.layers:
        if not n.param_names:
            continue
        if "W_std" not in n.hyper:
            raise InputError(f"parameterization='ntk' needs affine modules only; {n.where} is not.")
        w = n.hyper["W_std"] ** 2 / n.module.weight[0].numel()
        b = n.hyper.get("b_std")
        if b is not None and not math.isclose(w, b ** 2, rel_tol=1e-9):
            raise InputError(f"parameterization='ntk' rescales each module's NTK contribution, which "
                             f"needs W_std**2/fan_in == b_std**2 (torch's default init); {n.where} "
                             f"has {w:.3g} and {b ** 2:.3g}. Use parameterization='standard'.")
        factors[n.name] = w
    return factors


def width_sweep(build: Callable[[int], nn.Module], widths: Sequence[int], x1: torch.Tensor,
                x2: torch.Tensor | None = None, *, n_seeds: int = 3,
                parameterization: str = "standard", seed: int = 0,
                implementation: str = "auto", progress: bool | None = None) -> WidthSweep:
    """Finite-width kernels of freshly initialised models vs their infinite-width limits.

    Args:
      build: ``build(width) -> nn.Module``, a model with torch's default init whose output is a
        final ``nn.Linear`` (called once per width and seed, under ``torch.manual_seed``).
      widths: the widths to try (at least two distinct ones for a slope).
      x1: ``(N1, *input_shape)``; x2: ``(N2, ...)`` or None for x2 = x1 (graph models of
        ``forward(x, adjacency)``: pairs ``(x, adjacency)``, as for ``ntbridge.kernel``).
      n_seeds: models per width (>= 2 for a spread).
      parameterization: ``"standard"`` (torch's own; the analytic NTK uses the actual widths) or
        ``"ntk"`` (each module's empirical contribution rescaled to the NTK parameterization, whose
        limit is width-independent).
      seed: the model of width ``w`` and seed ``s`` is built after seeding torch with
        ``ntbridge.sample_seed(seed, w, s)`` (``numpy.random.SeedSequence([seed,
        w, s])``): independent draws across widths and seeds
        (the global RNG state is restored afterwards).
      implementation: of the empirical NTK (see ``ntbridge.empirical_ntk``).
      progress: a progress bar on stderr (None: on a terminal, once the sweep takes a while).

    Returns:
      A :class:`WidthSweep` (prints as a table; ``to_markdown``, ``to_csv``, ``plot``, ``fit``).

    Example:
        >>> sweep = width_sweep(lambda w: nn.Sequential(nn.Linear(8, w), nn.ReLU(), nn.Linear(w, 1)),
        ...                     [64, 256, 1024], torch.randn(6, 8), n_seeds=3)
        >>> round(sweep.slope, 1)
        -0.5
    """
    widths = check_widths(widths)
    if isinstance(n_seeds, bool) or not isinstance(n_seeds, int) or n_seeds < 1:
        raise InputError(f"n_seeds must be a positive int, got {n_seeds!r}.")
    if parameterization not in ("standard", "ntk"):
        raise InputError(f"parameterization must be 'standard' or 'ntk', got {parameterization!r}.")
    errors: dict[str, np.ndarray] = {}
    layer_reference = "analytic"
    with Bar(len(widths) * n_seeds, "width sweep", "model", progress, leave=False) as bar:
        for i, width in enumerate(widths):
            for s in range(n_seeds):
                model = seeded_model(build, width, sample_seed(seed, width, s))
                x = x1[0] if isinstance(x1, (tuple, list)) else x1
                model = model.to(x.dtype) if x.is_floating_point() else model
                if s == 0:
                    nngp, ntk, layers, graph = _analytic(model, x1, x2, parameterization)
                    if ntk.ndim != 2:
                        raise InputError(
                            f"width_sweep compares kernels of vector outputs (N, outputs); this "
                            f"model's kernel has shape {tuple(ntk.shape)} (outputs per position "
                            f"or token): pool them before the readout (e.g. x.mean(1), x[:, 0] "
                            f"or x.flatten(1)).")
                    factors = (_ntk_parameterization_factors(graph) if parameterization == "ntk"
                               else {n.name: 1.0 for n in graph.layers if n.param_names})
                    layer_reference = "analytic" if layers is not None else SEED_SPREAD
                    samples = []
                parts = {name: k * factors[name]
                         for name, k in empirical_ntk(model, x1, x2, by_layer=True,
                                                     implementation=implementation,
                                                     progress=False).items()}
                values = {"ntk": _relative_error(sum(parts.values()), ntk),
                          "nngp": _relative_error(_readout_nngp(model, graph, x1, x2), nngp)}
                if layers is not None:
                    values |= {f"ntk[{n}]": _relative_error(k, layers[n]) for n, k in parts.items()}
                samples.append((values, parts))
                bar.update()
            if layers is None:
                samples = _seed_spread(samples)
            for q in samples[0][0]:
                errors.setdefault(q, np.zeros((len(widths), n_seeds)))[i] = [v[q] for v, _ in samples]
    return WidthSweep(tuple(widths), errors, parameterization, layer_reference)


def _seed_spread(samples: list[tuple[dict, dict]]) -> list[tuple[dict, dict]]:
    """Add ``ntk[NAME]``: each seed's contribution's relative deviation from the mean over seeds."""
    if len(samples) < 2:
        return samples
    names = samples[0][1]
    means = {n: sum(p[n] for _, p in samples) / len(samples) for n in names}
    return [(values | {f"ntk[{n}]": _relative_error(parts[n], means[n]) for n in names}, parts)
            for values, parts in samples]


def seeded_model(build: Callable[[int], nn.Module], width: int, seed: int,
                 name: str = "build") -> nn.Module:
    """``build(width)`` under ``torch.manual_seed(seed)`` (the caller's generator left as it
    was), checked to be a module; ``name`` is the argument's in messages."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build(width)
    if not isinstance(model, nn.Module):
        raise InputTypeError(f"{name}({width}) must return a torch.nn.Module, got "
                             f"{type(model).__name__}.")
    return model


def check_widths(widths: Sequence[int]) -> list[int]:
    """``widths`` as a list of positive ints (the widths of a sweep), or a clear error."""
    try:
        widths = [int(w) for w in widths]
    except (TypeError, ValueError):
        raise InputTypeError(f"widths must be a sequence of ints, got {widths!r}.") from None
    if not widths or min(widths) < 1:
        raise InputError(f"widths must be positive ints, got {widths!r}.")
    return widths

