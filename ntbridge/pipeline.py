"""The one path of every request: validate -> convert -> plan -> compile -> run tiles -> hand back.

Every entry point (``ntk``, ``nngp``, ``kernel``, the empirical kernels, ``monte_carlo``, the width
analysis, the command line) builds a :class:`Request` and calls :func:`run`:

1. validate the inputs (torch tensors: dtype, shape, device, finiteness) and fix the precision;
2. convert the model to a :class:`~ntbridge.Graph` (under the inputs' precision) and check that
   the inputs fit it; an empirical request takes the translated ``torch.export`` graph of a model
   the layer registry does not cover (:mod:`ntbridge.converters.translated`), and accepts integer
   inputs (token ids);
3. the request's ``task`` builds the :class:`~ntbridge.tiling.Task` to compute (what kernel, with
   which strategy);
4. :func:`ntbridge.tiling.compute` plans the tiles from XLA's memory analysis of the one program it
   compiles (or finds in :mod:`ntbridge.programs`), runs them and assembles torch tensors; when
   the inputs or the model's parameters require grad, as a node of torch's autograd graph
   (:mod:`ntbridge.gradients`).

Example:
    >>> result, info, graph = run(Request(model, x1, None, task=lambda g, x1, x2: (task, None)))
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
from torch import nn

from . import gradients
from .converters import Graph, convert
from .converters.translated import TranslatedGraph, empirical_graph
from .devices import platform_of
from .dlpack import all_finite, check_device, kernel_dtype, model_dtype, precision
from .errors import InputError, InputTypeError, ShapeError
from .tiling import Batching, Task

TaskBuilder = Callable[[Graph, torch.Tensor, "torch.Tensor | None"], tuple[Task, Any]]
_INDEX_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


@dataclasses.dataclass(frozen=True)
class Request:
    """One kernel computation asked for by a user.

    Attributes:
      model: the torch model.
      x1, x2: ``(N1, ...)`` and ``(N2, ...)`` inputs (x2 None for x2 = x1), as the user gave them.
      task: ``task(graph, x1, x2) -> (Task, info)``: what to compute on the converted model.
      batching: tiles, devices, storage (see :class:`~ntbridge.tiling.Batching`).
      conversion: keyword options of :func:`ntbridge.convert`.
      empirical: an empirical kernel (forward passes only): models without a converter are
        translated, integer inputs accepted (see the module doc).
      weights: a model of the same architecture whose weights to use instead of ``model``'s.
    """

    model: nn.Module
    x1: torch.Tensor
    x2: torch.Tensor | None
    task: TaskBuilder
    batching: Batching = Batching()
    conversion: dict = dataclasses.field(default_factory=dict)
    empirical: bool = False
    weights: nn.Module | None = None


def _input_dtype(x: torch.Tensor, name: str, indices: bool) -> torch.dtype:
    """The dtype ``x`` is passed on in: the kernel's (float32 or float64), or, with ``indices``,
    an integer dtype as it is (token ids)."""
    if indices and isinstance(x, torch.Tensor) and x.dtype in _INDEX_DTYPES:
        return x.dtype
    return kernel_dtype(x, name)


def validate(x1: torch.Tensor, x2: torch.Tensor | None,
             indices: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x1 and x2 checked and detached, in the kernel's dtype (float32 or float64; x2 in x1's);
    with ``indices``, integer inputs are kept as they are (x1 and x2 both integer)."""
    dtype = _input_dtype(x1, "x1", indices)
    if x2 is not None and isinstance(x2, torch.Tensor) and x2.device != x1.device:
        raise InputError(f"x1 is on {x1.device} and x2 on {x2.device}; move them to one device.")
    for name, x in (("x1", x1), ("x2", x2)):
        if x is None:
            continue
        if _input_dtype(x, name, indices).is_floating_point != dtype.is_floating_point:
            raise InputTypeError(f"x1 has dtype {x1.dtype} and x2 {x2.dtype}: pass both as "
                                 f"token ids (integers) or both as floating-point inputs.")
        check_device(x, name)
        if x.ndim < 2:
            raise ShapeError(f"{name} has shape {tuple(x.shape)}; inputs are batched, (N, ...): "
                             f"for a single example pass {name}[None].")
        if x.shape[0] == 0:
            raise InputError(f"{name} is an empty batch (shape {tuple(x.shape)}); pass at least one "
                             f"example.")
        if x.numel() == 0:
            raise ShapeError(f"{name} has zero-size examples (shape {tuple(x.shape)}); every "
                             f"example needs at least one entry.")
        if not all_finite(x):
            raise InputError(f"{name} contains NaN or Inf; kernels of non-finite inputs are "
                             f"undefined. Clean the data first (e.g. torch.nan_to_num, or drop those "
                             f"examples).")
    if x2 is not None:
        if x2.shape[1:] != x1.shape[1:]:
            raise ShapeError(f"x1 and x2 must have the same shape per example, got x1 "
                             f"{tuple(x1.shape)} and x2 {tuple(x2.shape)}.")
        x2 = x2.detach().to(dtype)
    return x1.detach().to(dtype), x2


def model_graph(request: Request, x1: torch.Tensor) -> Graph | TranslatedGraph:
    """The converted model (empirical requests: converted or translated, see the module doc)."""
    if request.empirical:
        return empirical_graph(request.model, x1, request.conversion, request.weights)
    return convert(request.model if request.weights is None else request.weights,
                   **request.conversion)


def check_fits(graph: Graph, x1: torch.Tensor, x2: torch.Tensor | None) -> None:
    """ShapeError unless the model accepts inputs of x1's (and x2's) shape."""
    for name, x in (("x1", x1), ("x2", x2)):
        if x is None:
            continue
        try:
            graph.output_shape(tuple(x.shape))
        except ShapeError as e:
            raise ShapeError(f"{name} of shape {tuple(x.shape)} does not fit the model: {e}") from None


def _precision(request: Request, x1: torch.Tensor):
    """The precision of the request's JAX work: x1's, or the model's for integer inputs."""
    return precision(x1.dtype if x1.is_floating_point() else model_dtype(request.model))


def route(request: Request) -> str:
    """The path an empirical request takes: ``"layers"`` (the layer registry) or
    ``"torch.export"`` (the translated graph); see the module doc."""
    x1, _ = validate(request.x1, request.x2, indices=request.empirical)
    with _precision(request, x1):
        return model_graph(request, x1).path


def run(request: Request) -> tuple[Any, Any, Graph | TranslatedGraph]:
    """``(result, info, graph)``: the request's kernel as a pytree of torch tensors, what its task
    reports (e.g. the empirical strategy chosen), and the converted model."""
    x1, x2 = validate(request.x1, request.x2, indices=request.empirical)
    batching = dataclasses.replace(request.batching, platform=platform_of(x1))
    with _precision(request, x1):
        graph = model_graph(request, x1)
        check_fits(graph, x1, x2)
        task, info = request.task(graph, x1, x2)
        result = gradients.compute(task, (request.x1, request.x2), x1, x2, batching, graph)
    return result, info, graph
