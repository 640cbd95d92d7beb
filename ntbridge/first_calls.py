"""The empirical NTK of a model without a converter, weighed before anything is exported or
compiled: torch-side (``torch.func``) while a compiled program cannot pay its compilation back,
the pipeline's program once it can (:mod:`ntbridge.empirical.payback`).

A request is weighed when it asks for ``implementation="auto"`` with default batching (no
``batch_size``, ``out`` or host storage), no ``by_layer``, independent examples, tensors (not
graph pairs) as inputs, and a model with a submodule that no converter covers (what the
``torch.export`` translation serves, e.g. a Hugging Face model). Every other request, and one whose
model does not run on one example of ``x1`` (the pipeline then says why) or that ``torch.func``
cannot differentiate per example (e.g. ``nn.GRU`` under ``vmap``), is the pipeline's
(:func:`ntbridge.pipeline.run`); a weighed model that cannot be exported or translated (e.g.
GPT-2's forward) stays torch-side, the pipeline's reason in ``info.reason``. A torch-side kernel that autograd needs (grad mode on and an
input or a parameter requiring grad) is one node of torch's graph whose backward is the
pipeline's VJP program (:func:`ntbridge.autograd.deferred`), compiled only if it is called.

Example:
    >>> outcome = run(Request(hf_model, ids, None, EmpiricalNTK()))
    >>> outcome.info.implementation, outcome.info.path
    ('torch.func', 'torch')
"""

from __future__ import annotations

import dataclasses
import time

import torch
from torch import nn

from . import pipeline
from .autograd import deferred
from .converters.export.translation import check_eval_mode
from .converters.registry import find_converter
from .devices import platform_of
from .dlpack import abstract
from .empirical import StrategyInfo, payback
from .empirical.axes import Axes
from .empirical.torch_func import output_ndim, torch_ntk
from .errors import ConversionError, UnsupportedLayerError
from .pipeline import Outcome, Request
from .specs import EmpiricalNTK
from .tiling import Batching, TilingInfo

_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def without_converter(model: nn.Module) -> bool:
    """Whether a submodule of ``model`` (not the model itself, whose forward torch.fx may trace)
    has no converter and is not a container."""
    return any(find_converter(m) is None and not isinstance(m, _CONTAINERS)
               for name, m in model.named_modules() if name)


def _eval_mode(model: nn.Module) -> bool:
    try:
        check_eval_mode(model)
    except UnsupportedLayerError:
        return False
    return True


def weighed(request: Request) -> bool:
    """Whether ``request`` is weighed (see the module doc)."""
    spec, batching = request.spec, request.batching
    return (isinstance(spec, EmpiricalNTK) and spec.implementation == "auto"
            and not (spec.by_layer or spec.interact) and request.weights is None
            and not request.conversion
            and dataclasses.replace(batching, progress=None, device_count=-1) == Batching()
            and all(x is None or isinstance(x, torch.Tensor) for x in (request.x1, request.x2))
            and any(True for _ in request.model.parameters())
            and without_converter(request.model) and _eval_mode(request.model))


def _axes(request: Request, x1: torch.Tensor, x2: torch.Tensor | None) -> Axes | None:
    """The output axes of the request's kernel, None where the model does not run torch-side on
    one example of x1 (or x2), or its parameters' dtype is not x1's."""
    dtypes = {p.dtype for p in request.model.parameters()}
    if x1.is_floating_point() and dtypes != {x1.dtype}:
        return None
    try:
        ndim = output_ndim(request.model, x1)
        if x2 is not None and output_ndim(request.model, x2) != ndim:
            return None
    except Exception:  # the pipeline's checks say what is wrong
        return None
    return Axes.of(ndim, request.spec.trace_axes, request.spec.diagonal_axes)


def _task(request: Request):
    """``(task, graph, x1, x2, batching)`` of the pipeline for ``request`` (for the VJP)."""
    prepared = pipeline.prepare(request)
    x1, x2, graph = prepared.x1, prepared.x2, prepared.graph
    batching = dataclasses.replace(request.batching, platform=platform_of(x1))
    with pipeline.precision_of(request, x1):
        task, _ = pipeline.BUILDERS[EmpiricalNTK](
            request.spec, graph, abstract(x1), None if x2 is None else abstract(x2),
            batching.platform)
    return task, graph, x1, x2, batching


def _torch_side(request: Request, x1: torch.Tensor, x2: torch.Tensor | None, axes: Axes,
                choice: payback.Choice) -> Outcome:
    compute = lambda: [torch_ntk(request.model, x1, x2, axes, known=choice.known)]
    (k,) = deferred(compute, lambda: _task(request), (request.x1, request.x2),
                    list(request.model.parameters()))
    info = StrategyInfo("torch.func", choice.costs, choice.reason, "torch")
    n2 = len(x1) if x2 is None else len(x2)
    return Outcome(k, info, None, TilingInfo(1, 1, (len(x1), n2), 0, 0.0))


def run(request: Request) -> Outcome:
    """The request's kernel: weighed (see the module doc), else :func:`ntbridge.pipeline.run`."""
    if not weighed(request):
        return pipeline.run(request)
    x1, x2 = pipeline.validate(request.x1, request.x2, indices=True)
    axes = _axes(request, x1, x2)
    if axes is None:
        return pipeline.run(request)
    try:
        choice = payback.weigh(request.model, x1, x2, axes)
    except Exception:  # torch.func cannot differentiate the model (e.g. nn.GRU under vmap)
        return pipeline.run(request)
    start = time.perf_counter()
    if choice.strategy == "torch.func":
        outcome = _torch_side(request, x1, x2, axes, choice)
    else:
        try:
            outcome = _compiled(request, choice)
        except (ConversionError, UnsupportedLayerError) as e:  # torch.func serves it
            payback.unavailable(request.model, x1, str(e).split(":")[0])
            return run(request)
    payback.ran(request.model, x1, x2, axes, choice.strategy, time.perf_counter() - start)
    return outcome


def _compiled(request: Request, choice: payback.Choice) -> Outcome:
    """The pipeline's kernel, its info saying why it was weighed so."""
    outcome = pipeline.run(request)
    info = outcome.info
    return outcome._replace(info=dataclasses.replace(
        info, costs={**info.costs, **choice.costs}, reason=f"{choice.reason}; {info.reason}"))
