"""The one path of every request: validate -> convert -> plan -> compile -> run tiles -> hand back.

Every entry point (``ntk``, ``nngp``, ``kernel``, the empirical kernels, ``monte_carlo``, the width
analysis, the command line) builds a :class:`Request`, whose spec (:mod:`ntbridge.specs`) says
what to compute, and calls :func:`run`:

1. :func:`prepare`: validate the inputs (torch tensors: dtype, shape, device, finiteness), fix the
   precision, convert the model to a :class:`~ntbridge.Graph` (its tensors holding data: none on
   the ``meta`` device) and check that the inputs fit it; an empirical spec takes the translated
   ``torch.export`` graph of a model the layer registry does not cover
   (:mod:`ntbridge.converters.translated`); integer inputs (token ids) go to empirical
   kernels, and to analytic ones of models reading them with an ``nn.Embedding``; a graph model's
   inputs, pairs ``(x, adjacency)`` or PyTorch Geometric's ``Data``, are packed into one tensor
   (:func:`ntbridge.converters.packed_inputs`) that the converted model reads (of ``Data``, x1 and
   x2 as one graph, whose kernel's block of x1 against x2 :func:`run` and :func:`sample` return);
2. :func:`execute`: the builder of the spec's type (:data:`BUILDERS`: :mod:`ntbridge.analytic`,
   :mod:`ntbridge.empirical`) makes the :class:`~ntbridge.tiling.Task`; :func:`ntbridge.tiling.compute`
   plans its tiles from XLA's memory analysis of the one program it compiles (or finds in
   :mod:`ntbridge.programs`), runs them and assembles torch tensors; when the inputs or the
   model's parameters require grad, as a node of torch's autograd graph (:mod:`ntbridge.autograd`).

Beside :func:`run`, two paths share steps 1 and 2: :func:`sample` (Monte-Carlo estimates: many
executions of one prepared request, or, for models without a converter, one empirical request per
torch-side re-initialisation) and :func:`expectation_error` (a prepared analytic request evaluated
once per replicate of its numerical rules, in one piece).

Example:
    >>> outcome = run(Request(model, x1, None, Analytic("ntk")))
    >>> outcome.result.shape, outcome.tiling.tiles
    (torch.Size([20, 20]), 1)
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any, Iterable, Iterator, NamedTuple, Sequence

import jax
import torch
from torch import nn

from . import analytic, autograd, programs
from .converters import (Graph, Selection, Translation, batch_statistics, check_ids,
                         check_input_kind, convert, empirical_graph, packed_inputs)
from .devices import platform_of, small_program
from .dlpack import (abstract, all_finite, check_device, check_has_data, check_module,
                     model_dtype, precision, to_jax, torch_kernel_dtype)
from .empirical import Moments, nngp_task, ntk_task, running, sample_counts, sample_task
from .empirical.reinit import check_resettable, reinitialise
from .errors import InputError, InputTypeError, ShapeError, UnsupportedLayerError
from .results import Estimate
from .specs import Analytic, EmpiricalNNGP, EmpiricalNTK, MonteCarlo, Spec
from .stax.covariances import evaluate_error, replicate_fn
from .tiling import Batching, TilingInfo

# spec type -> builder(spec, graph, x1, x2, platform) -> (Task, info); x1, x2 shapes and dtypes
BUILDERS = {Analytic: analytic.task, EmpiricalNTK: ntk_task, EmpiricalNNGP: nngp_task,
            MonteCarlo: sample_task}
_INDEX_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


@dataclasses.dataclass(frozen=True)
class Request:
    """One kernel computation asked for by a user.

    Attributes:
      model: the torch model.
      x1, x2: ``(N1, ...)`` and ``(N2, ...)`` inputs (x2 None for x2 = x1), as the user gave them;
        for a model of ``forward(x, adjacency)``, pairs of tensors ``(x, adjacency)``.
      spec: what to compute (:mod:`ntbridge.specs`); an empirical one (forward passes only)
        translates models without a converter and accepts integer inputs (see the module doc).
      batching: tiles, devices, storage (see :class:`~ntbridge.tiling.Batching`).
      conversion: keyword options of :func:`ntbridge.convert`.
      weights: a model of the same architecture whose weights to use instead of ``model``'s.
    """

    model: nn.Module
    x1: torch.Tensor | tuple[torch.Tensor, torch.Tensor]
    x2: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None
    spec: Spec
    batching: Batching = Batching()
    conversion: dict = dataclasses.field(default_factory=dict)
    weights: nn.Module | None = None

    def __post_init__(self):
        check_module(self.model)


class Prepared(NamedTuple):
    """A request with its inputs validated (:func:`validate`) and its model converted."""

    request: Request
    x1: torch.Tensor
    x2: torch.Tensor | None
    graph: Graph | Translation
    selection: Selection | None = None  # PyG inputs: where x1 and x2 lie in the packed union


class Outcome(NamedTuple):
    """What a request computed: the result (a pytree of torch tensors), what its builder reports
    (e.g. the empirical strategy chosen), the converted model, and how it was tiled."""

    result: Any
    info: Any
    graph: Graph | Translation
    tiling: TilingInfo


def _input_dtype(x: torch.Tensor, name: str, indices: bool) -> torch.dtype:
    """The dtype ``x`` is passed on in: the kernel's (float32 or float64), or, with ``indices``,
    an integer dtype as it is (token ids)."""
    if indices and isinstance(x, torch.Tensor) and x.dtype in _INDEX_DTYPES:
        return x.dtype
    return torch_kernel_dtype(x, name)


def validate(x1: torch.Tensor, x2: torch.Tensor | None, indices: bool = False,
             names: tuple[str, str] = ("x1", "x2")) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x1 and x2 checked and detached, in the kernel's dtype (float32 or float64; x2 in x1's);
    with ``indices``, integer inputs are kept as they are (x1 and x2 both integer). ``names``: how
    messages call them (e.g. ``("x", "landmarks")``)."""
    n1, n2 = names
    dtype = _input_dtype(x1, n1, indices)
    if x2 is not None and isinstance(x2, torch.Tensor) and x2.device != x1.device:
        raise InputError(f"{n1} is on {x1.device} and {n2} on {x2.device}; move them to one "
                         f"device.")
    for name, x in ((n1, x1), (n2, x2)):
        if x is None:
            continue
        if _input_dtype(x, name, indices).is_floating_point != dtype.is_floating_point:
            raise InputTypeError(f"{n1} has dtype {x1.dtype} and {n2} {x2.dtype}: pass both as "
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
            lengths = x1.ndim == x2.ndim in (2, 3) and x1.shape[2:] == x2.shape[2:]
            hint = (" If these are sequences of different lengths, pad them to one length and "
                    "mask the padding in the model (key_padding_mask=(ids == pad_id)), or "
                    "compute each length apart." if lengths else "")
            raise ShapeError(f"{n1} and {n2} must have the same shape per example, got {n1} "
                             f"{tuple(x1.shape)} and {n2} {tuple(x2.shape)}.{hint}")
        x2 = x2.detach().to(dtype)
    return x1.detach().to(dtype), x2


def model_graph(request: Request, x1: torch.Tensor,
                pair_inputs: bool = False) -> Graph | Translation:
    """The converted model (empirical requests: converted or translated, see the module doc; with
    ``pair_inputs``, converted)."""
    if request.spec.empirical and not pair_inputs:
        return empirical_graph(request.model, x1, request.conversion, request.weights)
    return convert(request.model if request.weights is None else request.weights,
                   example=x1, **request.conversion)


def check_fits(graph: Graph, x1: torch.Tensor, x2: torch.Tensor | None) -> None:
    """ShapeError unless the model accepts inputs of x1's (and x2's) shape."""
    for name, x in (("x1", x1), ("x2", x2)):
        if x is None:
            continue
        try:
            graph.output_shape(tuple(x.shape))
        except ShapeError as e:
            raise ShapeError(f"{name} of shape {tuple(x.shape)} does not fit the model: {e}") from None


def precision_of(request: Request, x1: torch.Tensor):
    """The precision of the request's JAX work: x1's, or the model's for integer inputs."""
    return precision(x1.dtype if x1.is_floating_point() else model_dtype(request.model))


def prepare(request: Request) -> Prepared:
    """The request's inputs validated and its model converted (steps 1 of the module doc)."""
    x1, x2, pairs, selection = packed_inputs(request.x1, request.x2,
                                             lambda: model_graph(request, None, True))
    request = dataclasses.replace(request, x1=x1, x2=x2)
    x1, x2 = validate(request.x1, request.x2, indices=True)
    with precision_of(request, x1):
        graph = model_graph(request, x1, pairs or selection is not None)
        check_has_data(graph.tensors)
        check_input_kind(graph, pairs, selection)
        check_fits(graph, x1, x2)
        if not x1.is_floating_point():
            check_ids(graph, x1, x2, request.spec.empirical)
    return Prepared(request, x1, x2, graph, selection)


def execute(prepared: Prepared, spec: Spec | None = None) -> Outcome:
    """The kernel of ``spec`` (default: the request's; the same kind of spec, e.g. another range of
    Monte-Carlo samples) on the prepared request (step 2 of the module doc)."""
    request, x1, x2, graph, _ = prepared
    spec = request.spec if spec is None else spec
    batching = dataclasses.replace(request.batching, platform=platform_of(x1))
    with precision_of(request, x1):
        task, info = BUILDERS[type(spec)](spec, graph, abstract(x1),
                                          None if x2 is None else abstract(x2), batching.platform)
        result, tiling = autograd.compute(task, (request.x1, request.x2), x1, x2, batching, graph)
    return Outcome(result, info, graph, tiling)


def run(request: Request) -> Outcome:
    """The request's kernel: :func:`execute` of :func:`prepare` (of PyG inputs, the block of x1
    against x2)."""
    prepared = prepare(request)
    outcome = execute(prepared)
    if prepared.selection is None:
        return outcome
    return outcome._replace(result=prepared.selection.block(outcome.result, prepared.graph.pooled))


def expectation_error(request: Request) -> float:
    """The estimated relative error of the request's analytic kernels (``Analytic`` spec) where
    their rules are numerical expectations (``ntbridge.expectation_error``): the prepared request
    evaluated once per replicate of the rule, in one piece (no tiling), by one program per
    model and inputs' shapes (an entry of the program cache); exact rules compile nothing."""
    _, x1, x2, graph, _ = prepared = prepare(request)
    names = (request.spec.get,) if isinstance(request.spec.get, str) else tuple(request.spec.get)
    with precision_of(prepared.request, x1):
        a1, a2 = (None if x is None else to_jax(x) for x in (x1, x2))
        key = programs.ProgramKey.of("expectation error", (graph.signature, names), (a1, a2))
        pairs = len(a1) * len(a1 if a2 is None else a2)
        kind = "small" if small_program(pairs, math.prod(a1.shape[1:])) else "default"
        devices = list(a1.devices())
        compiled = lambda: programs.cached(key, lambda: programs.compile(
            key, lambda: jax.jit(replicate_fn(graph.network, names)).lower(a1, a2, 0), devices,
            kind))
        return evaluate_error(graph.network, a1, a2, names, compiled)  # exact rules: no program


def sample(request: Request, n_samples: int | Sequence[int]) -> Iterator[Estimate]:
    """The running Monte-Carlo estimates of a request of a :class:`MonteCarlo` spec (its first
    count of samples), one at each count of ``n_samples`` (``ntbridge.monte_carlo``): converted
    models draw their samples with their ``init_fn`` in the spec's programs, models without a
    converter re-initialise a copy of themselves torch-side, one empirical kernel per sample."""
    if modules := batch_statistics(request.model):
        raise UnsupportedLayerError(
            f"{', '.join(modules)} normalises with the batch's own statistics, so a sample's "
            f"kernel would depend on which other examples are in the call; monte_carlo estimates "
            f"the kernel of each pair of examples. Call model.eval() (BatchNorm with running "
            f"statistics, track_running_stats=True): each sample's BatchNorm then normalises with "
            f"a fresh module's running statistics, mean 0 and variance 1.")
    counts, spec = sample_counts(n_samples), request.spec
    prepared = prepare(request)
    if prepared.graph.path == "layers":
        draw = lambda start, stop: [Moments(stop - start, *execute(prepared, dataclasses.replace(
            spec, start=start, count=stop - start)).result)]
    else:
        init = tuple(request.conversion.get(k) for k in ("init", "W_std", "b_std"))
        if init not in (("torch", None, None), (None, None, None)):
            raise InputError("init, W_std and b_std choose the init of converted models; this model "
                             "has no converter, so monte_carlo draws its initialisations with its "
                             "modules' own reset_parameters(): drop init, W_std and b_std.")
        draw = _reset_draws(prepared, spec)
    if prepared.selection is None:
        return running(counts, draw)
    return (prepared.selection.block(e, prepared.graph.pooled) for e in running(counts, draw))


def _reset_draws(prepared: Prepared, spec: MonteCarlo):
    """``draw(start, stop)``: the moments of each sample ``start <= s < stop`` of a model without a
    converter, re-initialised torch-side (see :func:`sample`), one empirical kernel each."""
    request = prepared.request
    check_resettable(request.model)
    fresh = copy.deepcopy(request.model).requires_grad_(False)  # the user's model keeps its weights
    axes = (spec.trace_axes, spec.diagonal_axes)
    kernel = EmpiricalNTK("auto", *axes) if spec.get == "ntk" else EmpiricalNNGP(*axes)

    def draw(start: int, stop: int) -> Iterable[Moments]:
        for s in range(start, stop):
            reinitialise(fresh, spec.seed, s)
            k = run(dataclasses.replace(request, spec=kernel, conversion={}, weights=fresh)).result
            yield Moments(1, k, torch.zeros_like(k))

    return draw
