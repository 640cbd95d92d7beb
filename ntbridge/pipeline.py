"""The one path of every request: validate -> convert -> plan -> compile -> run tiles -> hand back.

Every entry point (``ntk``, ``nngp``, ``kernel``, the empirical kernels, ``monte_carlo``, the width
analysis, the command line) builds a :class:`Request` and calls :func:`run`:

1. validate the inputs (torch tensors: dtype, shape, device, finiteness) and fix the precision;
2. convert the model to a :class:`~ntbridge.Graph` (under the inputs' precision) and check that
   the inputs fit it;
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
from .dlpack import check_device, kernel_dtype, precision
from .errors import InputError, ShapeError
from .tiling import Batching, Task

TaskBuilder = Callable[[Graph, torch.Tensor, "torch.Tensor | None"], tuple[Task, Any]]


@dataclasses.dataclass(frozen=True)
class Request:
    """One kernel computation asked for by a user.

    Attributes:
      model: the torch model.
      x1, x2: ``(N1, ...)`` and ``(N2, ...)`` inputs (x2 None for x2 = x1), as the user gave them.
      task: ``task(graph, x1, x2) -> (Task, info)``: what to compute on the converted model.
      batching: tiles, devices, storage (see :class:`~ntbridge.tiling.Batching`).
      conversion: keyword options of :func:`ntbridge.convert`.
    """

    model: nn.Module
    x1: torch.Tensor
    x2: torch.Tensor | None
    task: TaskBuilder
    batching: Batching = Batching()
    conversion: dict = dataclasses.field(default_factory=dict)


def validate(x1: torch.Tensor, x2: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x1 and x2 checked and detached, in the kernel's dtype (float32 or float64; x2 in x1's)."""
    dtype = kernel_dtype(x1, "x1")
    if x2 is not None and isinstance(x2, torch.Tensor) and x2.device != x1.device:
        raise InputError(f"x1 is on {x1.device} and x2 on {x2.device}; move them to one device.")
    for name, x in (("x1", x1), ("x2", x2)):
        if x is None:
            continue
        kernel_dtype(x, name)
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
        if not bool(torch.isfinite(x).all()):
            raise InputError(f"{name} contains NaN or Inf; kernels of non-finite inputs are "
                             f"undefined. Clean the data first (e.g. torch.nan_to_num, or drop those "
                             f"examples).")
    if x2 is not None:
        if x2.shape[1:] != x1.shape[1:]:
            raise ShapeError(f"x1 and x2 must have the same shape per example, got x1 "
                             f"{tuple(x1.shape)} and x2 {tuple(x2.shape)}.")
        x2 = x2.detach().to(dtype)
    return x1.detach().to(dtype), x2


def check_fits(graph: Graph, x1: torch.Tensor, x2: torch.Tensor | None) -> None:
    """ShapeError unless the model accepts inputs of x1's (and x2's) shape."""
    for name, x in (("x1", x1), ("x2", x2)):
        if x is None:
            continue
        try:
            graph.output_shape(tuple(x.shape))
        except ShapeError as e:
            raise ShapeError(f"{name} of shape {tuple(x.shape)} does not fit the model: {e}") from None


def platform(x: torch.Tensor) -> str:
    """The JAX platform of a torch tensor's device."""
    return "gpu" if x.device.type == "cuda" else "cpu"


def run(request: Request) -> tuple[Any, Any, Graph]:
    """``(result, info, graph)``: the request's kernel as a pytree of torch tensors, what its task
    reports (e.g. the empirical strategy chosen), and the converted model."""
    x1, x2 = validate(request.x1, request.x2)
    batching = dataclasses.replace(request.batching, platform=platform(x1))
    with precision(x1.dtype):
        graph = convert(request.model, **request.conversion)
        check_fits(graph, x1, x2)
        task, info = request.task(graph, x1, x2)
        result = gradients.compute(task, (request.x1, request.x2), x1, x2, batching, graph)
    return result, info, graph
