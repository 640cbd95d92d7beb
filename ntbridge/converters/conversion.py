""":func:`convert`: a torch model -> a :class:`~.graph.Graph`, module by module through the registry.

``nn.Sequential`` models (nested to any depth) are read module by module; other models are traced
with torch.fx (:mod:`.trace`), which also handles residual sums, concatenations and functional
calls. Importing this module registers the converters of every family.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import torch
from torch import nn

from ..dlpack import check_module, model_dtype
from ..errors import ConversionError, InputError, UnsupportedLayerError
from ..stax.combinators import INPUT
from ..stax.description import describe
from ..stax.sources import SAMPLING
from . import (activations, aggregation, attention, conv, decoder, embedding,  # noqa: F401
               encoder, indexing, linear, normalization, pooling, positions, products,  # (converters)
               resize, structure)
from .sequence_pair import PairPart, pair_features
from .export.analytic import export_nodes
from .graph import Graph, Node, make_node
from .huggingface import library_inits
from .registry import (ATTENTION_POINTS, EXPECTATION_POINTS, Options, StdOption, as_float,
                       find_converter, overrides_forward)
from .reuse import check_reuse, children
from .trace import fx_nodes
from .trace.calls import ATTENTION_MODULES


def _leaves(module: nn.Module, prefix: str = "") -> Iterator[tuple[str, nn.Module]]:
    """The leaf modules of nested ``nn.Sequential`` containers, with their qualified names."""
    if isinstance(module, nn.Sequential):
        for name, child in children(module):
            yield from _leaves(child, f"{prefix}.{name}" if prefix else name)
    else:
        yield prefix, module


def _is_user_container(module: nn.Module) -> bool:
    """A user's module with no converter, or overriding its converter's ``forward``: its forward
    must be traced."""
    if find_converter(module) is not None:
        return overrides_forward(module)
    return not type(module).__module__.startswith("torch.")


def _check_uniform(model: nn.Module) -> None:
    """All floating parameters and buffers share one dtype and device."""
    kinds: dict[tuple, str] = {}
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if t.is_floating_point():
            kinds.setdefault((str(t.dtype), str(t.device)), name)
    if len(kinds) > 1:
        found = ", ".join(f"'{name}' is {dtype} on {device}" for (dtype, device), name in kinds.items())
        raise InputError(f"the model's parameters have several dtypes/devices ({found}); move them "
                         f"to one, e.g. model.to(torch.float32) or model.to('cpu').")


def convert(model: nn.Module, *, parameterization: str = "standard", init: str = "torch",
            W_std: StdOption = None, b_std: StdOption = None, attention: str = "softmax",
            attention_points: int = ATTENTION_POINTS, shared_weights: str = "auto",
            expectation_points: int = EXPECTATION_POINTS,
            example: torch.Tensor | None = None) -> Graph:
    """Translate ``model`` into a :class:`Graph` (``init_fn``, ``apply_fn``, ``kernel_fn``, ``params``).

    Args:
      model: an ``nn.Sequential`` (nested to any depth) of supported modules, one such module, or
        any model torch.fx can trace whose leaf modules and functional calls are supported
        (residual sums ``h + f(h)``, ``torch.cat(..., dim=1)``, ``F.relu``, ``x.flatten(1)``...).
      parameterization: ``"standard"`` (torch's; the NTK uses the model's actual widths) or
        ``"ntk"`` (the width-independent NTK limit).
      init: ``"torch"`` (the variance of torch's default init of each module; the analytic kernel
        warns with ``InitMismatchWarning`` if the weights clearly do not follow it; a Hugging Face
        model's modules, the model given or one a module of it wraps, as the library initialises
        them, ``N(0, initializer_range**2)`` weights and zero biases, or read from the values
        where the model has its own ``_init_weights``;
        an ``nn.Transformer``'s weight matrices as its ``xavier_uniform_``)
        or ``"infer"`` (read from the current weights).
      W_std, b_std: explicit standard deviations, a float for every layer or a mapping from
        qualified module names (as in ``model.named_modules()``) to floats; scalar torch tensors
        work as floats, and the analytic kernels are differentiable in those that require grad.
      attention: ``"softmax"`` (torch's attention, logits ``q k / sqrt(d)``: the kernel's
        expectation is computed numerically, ``ntbridge.stax.attention_rule``) or ``"linear"``
        (Neural Tangents' closed-form variant: keys tied to queries, logits ``q q / d``).
      attention_points: the points of each of the 8 replicates of softmax attention's numerical
        expectation (a power of 2): its error falls about as ``points**-1/2`` and its time grows
        as ``points`` (``ntbridge.expectation_error`` reports the error).
      expectation_points: the points of each of the 8 replicates of the numerical expectations of
        non-Gaussian inputs (BatchNorm with shifts before a nonlinearity, nonlinearities after
        residual sums, MaxPool: ``ntbridge.stax.sources``), a power of 2; the same trade-off.
      shared_weights: ``"auto"`` (the kernel of the model as torch initialises it: an
        ``nn.TransformerEncoder`` whose layers hold equal weights, torch's deep copies of one
        layer, gets the kernel of layers sharing one set of weights, ``ntbridge.stax.tied``;
        other reuse of weights is refused) or ``"independent"`` (every module's weights drawn
        independently: the kernel of re-initialised layers).
      example: inputs ``(N, ...)`` like those the kernels will take; with it, a model that
        torch.fx cannot trace (or whose traced spellings are not recognised: Hugging Face models,
        hand-written attention) is converted from its ``torch.export`` graph instead
        (:mod:`.export.analytic`), for inputs of that shape.

    Example:
        >>> g = ntbridge.convert(nn.Sequential(nn.Linear(3, 64), nn.ReLU(), nn.Linear(64, 1)))
        >>> [n.name for n in g.layers]
        ['0', '1', '2']
    """
    check_module(model)
    _check_uniform(model)
    library = library_inits(model) if init == "torch" else ()
    if library is None:
        init, library = "infer", ()  # a Hugging Face model initialised its own way: read values
    xavier = tuple(name for name, m in model.named_modules() if isinstance(m, nn.Transformer))
    options = Options(parameterization, init, W_std, b_std, attention, attention_points,
                      shared_weights, expectation_points, library, xavier)
    leaves = list(_leaves(model))
    if any(_is_user_container(module) for _, module in leaves):
        nodes = _traced(model, options, example)
    elif (features := pair_features(model)) is not None:  # forward(x, memory)
        parts = [make_node(i, f"~{name}", PairPart(i, features), (INPUT,), options)
                 for i, name in enumerate(("x", "memory"))]
        nodes = [*parts, make_node(2, "", model, (0, 1), options)]
    else:
        nodes = [make_node(i, name, module, (i - 1,), options)
                 for i, (name, module) in enumerate(leaves)]
    options.check_names([n.name for n in nodes if "W_std" in n.hyper])
    if options.shared_weights == "auto":
        check_reuse(nodes)
    return Graph(nodes, model_dtype(model), _signature(options, nodes, True),
                 _signature(options, nodes, False),
                 SAMPLING._replace(points=options.expectation_points))


def _traced(model: nn.Module, options: Options, example: torch.Tensor | None) -> list[Node]:
    """The nodes of ``model``'s forward: traced by torch.fx, or, where that fails and an
    ``example`` input is given, read from its ``torch.export`` graph. When both fail, the error
    shown is torch.fx's, unless torch.fx could not trace a model that exports, or the export route
    refuses the spelling of a hand-written attention (no torch attention module in the model):
    then the export route's (what it does not recognise)."""
    try:
        return fx_nodes(model, options)
    except (ConversionError, UnsupportedLayerError) as fx_error:
        if example is None:
            raise
        try:
            return export_nodes(model, example, dataclasses.replace(options, used_names=set()))
        except UnsupportedLayerError as e:
            hand_written = not any(isinstance(m, ATTENTION_MODULES) for m in model.modules())
            shown = isinstance(fx_error, ConversionError) or (
                getattr(e, "attention", False) and hand_written)
            raise (e if shown else fx_error) from None
        except ConversionError as e:
            raise type(fx_error)(f"{fx_error} The route over torch.export failed too: {e}",
                                 *fx_error.args[1:]) from None


def _signature(options: Options, nodes: list[Node], values: bool) -> tuple:
    """What fixes the converted model (see :class:`Graph`): each layer's whole description
    (:func:`~ntbridge.stax.description.describe`, with or without the ``values`` of its declared
    hyper-parameters), its parameters' names and its inputs."""
    hyper = lambda n: tuple(sorted((k, as_float(v) if isinstance(v, torch.Tensor) else v)
                                   for k, v in n.hyper.items() if values or k not in n.layer.hyper))
    return options.parameterization, options.attention, options.attention_points, \
        options.expectation_points, tuple(
        (n.name, describe(n.layer, values), hyper(n), n.param_names, n.inputs) for n in nodes)
