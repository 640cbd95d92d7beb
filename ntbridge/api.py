"""The torch-facing entry points: torch model and tensors in, torch tensors out.

Conventions (see each function):

* Results are on the device of ``x1`` and in its dtype: float64 inputs give float64 kernels
  (computed with JAX's x64 mode on for the call only); float16/bfloat16 inputs are computed and
  returned in float32. ``x2`` is converted to the dtype of ``x1``.
* ``x2=None`` means ``x2 = x1`` and the result is exactly symmetric.
* Kernels are returned without autograd history (inputs that require grad are detached).
"""

from __future__ import annotations

from typing import Sequence

import jax
import torch
from torch import nn

from .converters import Graph, Kernels, convert
from .converters.graph import compiled
from .converters.registry import StdOption
from .dlpack import kernel_dtype, precision, to_jax, to_torch
from .empirical import IMPLEMENTATIONS, empirical_nngp_fn, empirical_ntk_fn
from .errors import InputError, InputTypeError, ShapeError


def _check_inputs(x1: torch.Tensor, x2: torch.Tensor | None) -> tuple[torch.dtype, torch.Tensor | None]:
    """Validate x1 and x2; return the kernel dtype and x2 in that dtype."""
    dtype = kernel_dtype(x1, "x1")
    for name, x in (("x1", x1), ("x2", x2)):
        if x is None:
            continue
        kernel_dtype(x, name)
        if x.ndim < 2:
            raise ShapeError(f"{name} has shape {tuple(x.shape)}; inputs are batched, (N, ...): "
                             f"for a single example pass {name}[None].")
        if x.shape[0] == 0:
            raise InputError(f"{name} is an empty batch (shape {tuple(x.shape)}); pass at least one "
                             f"example.")
    if x2 is not None:
        if x2.shape[1:] != x1.shape[1:]:
            raise ShapeError(f"x1 and x2 must have the same shape per example, got x1 "
                             f"{tuple(x1.shape)} and x2 {tuple(x2.shape)}.")
        if x2.device != x1.device:
            raise InputError(f"x1 is on {x1.device} and x2 on {x2.device}; move them to one device.")
        x2 = x2.to(dtype) if x2.dtype != x1.dtype else x2
    return dtype, x2


def _inputs(graph: Graph, x1: torch.Tensor, x2: torch.Tensor | None):
    """x1, x2 as JAX arrays, after checking they fit the model."""
    arrays = []
    for name, x in (("x1", x1), ("x2", x2)):
        if x is None:
            arrays.append(None)
            continue
        a = to_jax(x, name)
        try:
            graph.output_shape(a.shape)
        except ShapeError as e:
            raise ShapeError(f"{name} of shape {tuple(x.shape)} does not fit the model: {e}") from None
        arrays.append(a)
    return arrays


def kernel(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor | None = None,
           get: str | Sequence[str] = ("nngp", "ntk"), *, parameterization: str = "standard",
           init: str = "torch", W_std: StdOption = None, b_std: StdOption = None):
    """Infinite-width NNGP and/or NTK of ``model``'s architecture, in closed form.

    Args:
      model: an ``nn.Sequential`` of supported modules (see ``ntbridge.convert``).
      x1: ``(N1, *input_shape)`` floating tensor.
      x2: ``(N2, *input_shape)``, or None for x2 = x1 (the result is then exactly symmetric).
      get: ``"nngp"``, ``"ntk"`` (returns a tensor) or a sequence of them (returns a named tuple
        ``Kernels(nngp, ntk)``, entries not asked for being None).
      parameterization, init, W_std, b_std: see ``ntbridge.convert``.

    Returns:
      ``(N1, N2)`` kernels per output unit (the full kernel is ``K ⊗ I``), on x1's device.

    Example:
        >>> model = nn.Sequential(nn.Linear(3, 512), nn.ReLU(), nn.Linear(512, 1))
        >>> k = ntbridge.kernel(model, torch.randn(5, 3))
        >>> k.ntk.shape, k.nngp.shape
        (torch.Size([5, 5]), torch.Size([5, 5]))
    """
    names = (get,) if isinstance(get, str) else tuple(get)
    if not names or any(n not in ("nngp", "ntk") for n in names):
        raise InputError(f"get must be 'nngp', 'ntk' or a sequence of them, got {get!r}.")
    dtype, x2 = _check_inputs(x1, x2)
    with precision(dtype):
        graph = convert(model, parameterization=parameterization, init=init, W_std=W_std,
                        b_std=b_std)
        a1, a2 = _inputs(graph, x1, x2)
        out = graph.kernel_fn(a1, a2, get=get if isinstance(get, str) else names)
    if isinstance(get, str):
        return to_torch(out)
    return Kernels(*(None if v is None else to_torch(v) for v in out))


def ntk(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor | None = None, **opts) -> torch.Tensor:
    """Infinite-width NTK ``(N1, N2)`` of ``model``'s architecture; options as :func:`kernel`.

    Example:
        >>> ntbridge.ntk(nn.Sequential(nn.Linear(3, 64), nn.ReLU(), nn.Linear(64, 1)), x)
    """
    return kernel(model, x1, x2, "ntk", **opts)


def nngp(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor | None = None, **opts) -> torch.Tensor:
    """Infinite-width NNGP ``(N1, N2)`` of ``model``'s architecture; options as :func:`kernel`.

    Example:
        >>> ntbridge.nngp(nn.Sequential(nn.Linear(3, 64), nn.ReLU(), nn.Linear(64, 1)), x)
    """
    return kernel(model, x1, x2, "nngp", **opts)


def _batch_statistics(graph: Graph) -> list[str]:
    """The modules whose output for one example depends on the others in the batch."""
    return [n.where for n in graph.layers
            if isinstance(n.module, nn.modules.batchnorm._BatchNorm)
            and (n.module.training or n.module.running_mean is None)]


def _empirical(which: str, model: nn.Module, x1, x2, trace_axes, diagonal_axes,
               implementation: str = "auto", by_layer: bool = False, return_info: bool = False):
    if implementation not in IMPLEMENTATIONS:
        raise InputError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}.")
    dtype, x2 = _check_inputs(x1, x2)
    with precision(dtype):
        graph = convert(model)
        trainable = {n.key(p) for n in graph.layers for p, _ in n.module.named_parameters(recurse=False)}
        params = {k: v for k, v in graph.params.items() if k in trainable}
        state = {k: v for k, v in graph.params.items() if k not in trainable}
        if which == "ntk" and not params:
            raise InputError("the model has no parameters, so its empirical NTK is undefined; "
                             "use ntbridge.empirical_nngp, or the analytic ntbridge.ntk.")
        model_dtype = {p.dtype for p in params.values()}
        if model_dtype and model_dtype != {jax.numpy.dtype(str(dtype).removeprefix("torch."))}:
            raise InputTypeError(f"the model's parameters are {model_dtype.pop()} but x1 is "
                                 f"{x1.dtype}; convert one to the other, e.g. model.to({x1.dtype}).")
        a1, a2 = _inputs(graph, x1, x2)
        interact = bool(_batch_statistics(graph))
        if which == "ntk":
            fn = compiled(("empirical_ntk", implementation, interact, graph.signature),
                          lambda: empirical_ntk_fn(graph, implementation, examples_interact=interact))
            out = fn(params, a1, a2, trace_axes=tuple(trace_axes), diagonal_axes=tuple(diagonal_axes),
                     by_layer=by_layer, return_info=True, state=state)
        else:
            fn = compiled(("empirical_nngp", interact, graph.signature),
                          lambda: empirical_nngp_fn(graph.apply_fn, examples_interact=interact))
            out = fn(graph.params, a1, a2, trace_axes=tuple(trace_axes),
                     diagonal_axes=tuple(diagonal_axes)), None
    k, info = out
    k = {name: to_torch(v) for name, v in k.items()} if by_layer else to_torch(k)
    return (k, info) if return_info else k


def empirical_ntk(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor | None = None, *,
                  implementation: str = "auto", trace_axes: Sequence[int] = (-1,),
                  diagonal_axes: Sequence[int] = (), by_layer: bool = False,
                  return_info: bool = False):
    """The finite-width NTK of ``model`` at its current weights (w.r.t. all its parameters).

    Equals what ``torch.func`` computes on the same model (jacobian contraction). Axes follow
    Neural Tangents (see ``ntbridge.empirical``): the default ``trace_axes=(-1,)`` averages over the
    output units, giving ``(N1, N2)`` comparable to :func:`ntk`; ``trace_axes=()`` gives
    ``(N1, N2, O, O)``; ``diagonal_axes=(-1,)`` (with ``trace_axes=()``) ``(N1, N2, O)``.

    Models with BatchNorm using batch statistics (train mode): an example's output depends on the
    whole batch, so the kernel is that of the joint batch ``X = cat(x1, x2)`` (``x1`` alone when x2
    is None), as ``torch.func.jacrev`` of ``model(X)`` gives it: ``J(X)[:N1] J(X)[N1:]^T``.

    Args:
      model: a supported model; its dtype must match x1's.
      x1, x2: as in :func:`kernel`.
      implementation: ``"auto"`` (chooses by XLA's cost estimate, once per shape signature),
        ``"jacobian"``, ``"ntvp"`` (NTK-vector products) or ``"structured"`` (layer derivative
        structure); see ``ntbridge.empirical``.
      trace_axes, diagonal_axes: output axes to average over / to keep the diagonal of.
      by_layer: return a dict from each module's qualified name (modules with parameters) to its
        contribution; the contributions sum to the kernel.
      return_info: also return a ``StrategyInfo`` (chosen strategy, candidates' costs, reason).

    Example:
        >>> ntbridge.empirical_ntk(model, x1, x2).shape
        torch.Size([20, 5])
        >>> k, info = ntbridge.empirical_ntk(model, x1, return_info=True)
        >>> info.implementation
        'structured'
    """
    return _empirical("ntk", model, x1, x2, trace_axes, diagonal_axes, implementation, by_layer,
                      return_info)


def empirical_nngp(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor | None = None, *,
                   trace_axes: Sequence[int] = (-1,), diagonal_axes: Sequence[int] = ()
                   ) -> torch.Tensor:
    """The outputs' products ``f(x1) f(x2)`` of ``model`` at its current weights, axes as
    :func:`empirical_ntk` (with ``trace_axes=(-1,)``, the mean over output units; BatchNorm using
    batch statistics: the outputs of the joint batch).

    Example:
        >>> ntbridge.empirical_nngp(model, x1).shape
        torch.Size([20, 20])
    """
    return _empirical("nngp", model, x1, x2, trace_axes, diagonal_axes)
