"""Models that are not ``nn.Sequential``: torch.fx traces ``forward`` into a DAG of nodes.

Leaf modules (registered types, torch's own) stay ``call_module`` nodes, converted by the registry.
Chains of elementwise functions without a module (``torch.exp(-h ** 2)``) become one
:class:`~.elementwise.Elementwise` module. Other functional calls become the equivalent module
instance (``F.gelu(x, approximate=a)`` -> ``nn.GELU(a)`` as every activation's functional and
method forms, :mod:`.functional`;
``x.view(x.size(0), -1)`` -> ``nn.Flatten()``, ``F.interpolate`` -> ``nn.Upsample``...), so that
each module type has one converter; ``+``/``torch.add`` become :class:`~.combinators.Add`,
``torch.cat`` :class:`~.combinators.Concat`, multiplication or division by a constant
:class:`~.combinators.Scale`, the product of two tensors :class:`~.products.Multiply`; indexing,
reductions and stacks are :mod:`.indexing`'s, ``h @ M`` with a buffer ``M`` :mod:`.graph_ops`'
(values computed from the model's buffers alone, ``self.adjacency.T``, are computed once here).

The kernel of a sum (of a concatenation along positions) is exact only when the branches are
uncorrelated, that of a product when the factors are independent; :mod:`.independence` works out
from the graph when that is not so (``h + relu(h)``, ``h * h``), and the rule then refuses to run
(the forward pass and empirical kernels still work).
"""

from __future__ import annotations

import operator
from typing import Callable

import torch
import torch.nn.functional as F
from torch import fx, nn

from ..errors import ConversionError, UnsupportedLayerError
from ..stax import INPUT
from . import graph_ops, indexing
from .calls import (ATTENTION_MODULES, PaddingIds, attention_call, attention_output,
                    is_positions, padding_ids, positions)
from .combinators import Add, Concat, Scale
from .elementwise import Elementwise, step_of
from .functional import FUNCTIONS, METHOD_FORMS, module_of
from .graph import Node, make_node
from .independence import correlated, dependent
from .indexing import Stack
from .layout import batch_first_form, swapped
from .products import Multiply
from .registry import Options
from .tracing import constant, describe, trace


# ------------------------------------------------------------ functional calls -> module instances

def _flatten(x, start_dim=0, end_dim=-1) -> nn.Module:
    if start_dim == 0:
        raise UnsupportedLayerError("flattening from axis 0 mixes the examples of the batch; "
                                    "flatten from axis 1: torch.flatten(x, 1).")
    return nn.Flatten(start_dim, end_dim)


def _is_shape(a) -> bool:
    """Whether fx node ``a`` computes a shape or size (an int), not a tensor."""
    if not isinstance(a, fx.Node):
        return False
    return ((a.op == "call_method" and a.target == "size")
            or (a.op == "call_function" and a.target is getattr and a.args[1] == "shape")
            or (a.op == "call_function" and a.target is operator.getitem and _is_shape(a.args[0])))


def _is_batch_size(a) -> bool:
    """Whether fx node ``a`` is ``t.size(0)``, ``t.shape[0]`` or ``t.size()[0]``."""
    if not isinstance(a, fx.Node):
        return False
    if a.op == "call_method" and a.target == "size":
        return (a.args[1:] or (a.kwargs.get("dim"),)) == (0,)
    return a.target is operator.getitem and _is_shape(a.args[0]) and a.args[1] == 0


def _view(x, *shape) -> nn.Module:
    shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
    if len(shape) == 2 and _is_batch_size(shape[0]) and shape[1] == -1:
        return nn.Flatten()
    raise UnsupportedLayerError(
        "only reshapes that flatten each example are supported: x.view(x.size(0), -1), "
        "x.reshape(x.shape[0], -1), x.flatten(1) or torch.flatten(x, 1).")


def _avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None) -> nn.Module:
    return nn.AvgPool2d(kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override)


def _interpolate(x, size=None, scale_factor=None, mode="nearest", align_corners=None,
                 recompute_scale_factor=None, antialias=False) -> nn.Module:
    """``F.interpolate`` as the ``nn.Upsample`` it equals (the deprecated ``F.upsample``,
    ``F.upsample_nearest`` and ``F.upsample_bilinear`` call it: fx records it)."""
    if antialias:
        raise UnsupportedLayerError(
            f"antialias=True (mode={mode!r}) has no kernel rule in ntbridge, nor a translation "
            f"for its empirical kernels; with antialias=False every mode's kernel is exact.")
    return nn.Upsample(size, scale_factor, mode, align_corners, recompute_scale_factor)


def _scale(x, c, divide: bool = False) -> nn.Module:
    if isinstance(x, fx.Node) and isinstance(c, fx.Node):
        if divide:
            raise UnsupportedLayerError("the quotient of two tensors has no kernel rule; only "
                                        "division by a constant number is supported.")
        return Multiply()
    c = c if isinstance(x, fx.Node) else x
    if not isinstance(c, (int, float)) or isinstance(c, bool):
        what = f"a constant tensor of shape {tuple(c.shape)}" if isinstance(c, torch.Tensor) else repr(c)
        raise UnsupportedLayerError(f"multiplication by {what}: only constant numbers (or another "
                                    f"tensor computed by the model) are supported.")
    return Scale(1 / c if divide else float(c))


def _add(x, y, *, alpha=1) -> nn.Module:
    if not (isinstance(x, fx.Node) and isinstance(y, fx.Node)) or alpha != 1:
        raise UnsupportedLayerError("only sums of two tensors (x + y, torch.add(x, y)) are "
                                    "supported, not the addition of constants or alpha != 1.")
    return Add()


UNARY: dict = {
    F.avg_pool2d: _avg_pool2d,
    F.adaptive_avg_pool2d: lambda x, output_size: nn.AdaptiveAvgPool2d(output_size),
    torch.flatten: _flatten,
    F.interpolate: _interpolate,  # F.upsample* trace to it
    F.pixel_shuffle: lambda x, upscale_factor: nn.PixelShuffle(upscale_factor),
    F.pixel_unshuffle: lambda x, downscale_factor: nn.PixelUnshuffle(downscale_factor),
    operator.mul: _scale, torch.mul: _scale,
    operator.truediv: lambda x, c: _scale(x, c, divide=True),
}
BINARY: dict = {operator.add: _add, torch.add: _add}
METHODS: dict = {
    "flatten": _flatten, "view": _view, "reshape": _view,
    "div": lambda x, c: _scale(x, c, divide=True),
}
BINARY_METHODS: dict = {"add": _add, "mul": _scale}
OTHER_FUNCTIONS = {**indexing.FUNCTIONS, **graph_ops.FUNCTIONS}  # -> (module, input nodes)
OTHER_METHODS = {**indexing.METHODS, **graph_ops.METHODS}

CONCATS = (torch.cat, torch.concat, torch.concatenate)


def _concat(tensors, dim=0, *, axis=None) -> nn.Module:
    return Concat(dim if axis is None else axis)


def equivalent(node: fx.Node, constants: dict | None = None) -> tuple[nn.Module, list]:
    """The module instance computing fx node ``node``, and the fx nodes it takes as inputs;
    ``constants``: the values of the nodes computed from the model's buffers alone."""
    constants = constants or {}
    args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda a: constants.get(a, a))
    other = (OTHER_FUNCTIONS if node.op == "call_function" else OTHER_METHODS).get(node.target)
    if other is not None:
        return other(*args, **kwargs)
    if ((node.op == "call_function" and node.target in FUNCTIONS)
            or (node.op == "call_method" and node.target in METHOD_FORMS)):
        module, x = module_of(node.target, args, kwargs)
        return module, [x]
    if node.op == "call_method" and node.target in BINARY_METHODS:
        module = BINARY_METHODS[node.target](*args, **kwargs)
        return module, [a for a in args if isinstance(a, fx.Node)]
    if node.op == "call_method" and node.target in METHODS:
        return METHODS[node.target](*args, **kwargs), [args[0]]
    if node.op == "call_function" and node.target in BINARY:
        return BINARY[node.target](*args, **kwargs), list(args)
    if node.op == "call_function" and node.target in CONCATS:
        return _concat(*args, **kwargs), list(args[0])
    if node.op == "call_function" and node.target in UNARY:
        module = UNARY[node.target](*args, **kwargs)
        return module, [a for a in args if isinstance(a, fx.Node)]
    what = getattr(node.target, "__name__", node.target)
    functions = (*UNARY, *BINARY, *CONCATS, *FUNCTIONS, *OTHER_FUNCTIONS)
    raise UnsupportedLayerError(
        f"{node.op} '{what}' has no equivalent module here. Supported: the registered modules, "
        f"{sorted({getattr(f, '__name__', f) for f in functions})} and the tensor methods "
        f"{sorted({*METHODS, *METHOD_FORMS, *BINARY_METHODS, *OTHER_METHODS})}. Use a module, "
        f"or register a converter for "
        f"a module wrapping this computation (ntbridge.register_converter).")


# ------------------------------------------------------------ conversion of the traced nodes

def fx_nodes(model: nn.Module, options: Options) -> list[Node]:
    """The converted nodes of ``model``'s traced ``forward``, in execution order.

    Example:
        >>> [n.name for n in fx_nodes(ResBlock(), Options())]
        ['fc1', 'relu', 'fc2', 'add']
    """
    nodes: list[Node] = []
    index: dict[fx.Node, int] = {}
    chains: dict[fx.Node, tuple[fx.Node, tuple]] = {}  # node -> (tensor the chain starts from, steps)
    constants: dict[fx.Node, object] = {}  # nodes computed from the model's buffers alone
    attrs: dict[fx.Node, torch.Tensor] = {}  # get_attr nodes: the model's tensors
    paddings: dict[fx.Node, PaddingIds] = {}  # input ids == pad: key padding masks
    time_major: set[fx.Node] = set()  # sequences (T, N, d), computed batch-first (.layout)
    params, attention_calls = dict(model.named_parameters()), set()
    for node in trace(model).nodes:
        if (value := constant(model, node, constants)) is not None:
            constants[node] = value
            continue
        if (value := padding_ids(node)) is not None:  # for attention calls only
            paddings[node] = value
            continue
        if (found := step_of(node, chains)) is not None:
            source, steps = chains.get(found[0], (found[0], ()))
            chains[node] = (source, (*steps, found[1]))
            continue
        for a in node.all_input_nodes:  # a chain this node takes: now one module
            if a in chains and a not in index:
                source, steps = chains[a]
                index[a] = len(nodes)
                nodes.append(make_node(len(nodes), a.name, Elementwise(steps),
                                       (_source(source, index, describe(a)),), options,
                                       describe(a)))
        if node.op == "placeholder":
            if index:
                raise ConversionError(f"{type(model).__name__}.forward takes several inputs; "
                                      f"ntbridge models take one tensor, forward(x).")
            index[node] = INPUT
        elif node.op == "get_attr":
            tensors = params if node.target in params else dict(model.named_buffers())
            attrs[node] = tensors[node.target]
        elif (found := attention_output(node, attention_calls)) is not None:
            index[node] = index[found]
            if found in time_major:
                time_major.add(node)
        elif (source := swapped(node)) is not None:  # (N, T, d) <-> (T, N, d): the same kernel
            index[node] = _source(source, index, describe(node))
            if source not in time_major:
                time_major.add(node)
        elif is_positions(node, attrs, params):
            owner, module, x = positions(node, attrs)
            index[node] = len(nodes)
            nodes.append(make_node(len(nodes), owner, module, (_source(x, index, describe(node)),),
                                   options, describe(node)))
        elif node.op == "output":
            if node.args[0] in time_major:
                raise ConversionError("forward returns a time-major sequence (T, N, d); "
                                      "ntbridge's outputs are batch-first: transpose it back.")
            nodes += _output(node, index, nodes, options)
        elif not _is_shape(node):
            call = None
            if node.op == "call_module":
                module, sources = model.get_submodule(node.target), [*node.args, *node.kwargs.values()]
                origin = f"module {len(nodes)} '{node.target}' ({type(module).__name__})"
                if isinstance(module, ATTENTION_MODULES):
                    given = {**attrs, **constants, **paddings}  # what its arguments may be
                    sources, call = attention_call(module, node, given, origin)
                    if isinstance(module, nn.MultiheadAttention):  # returns (output, weights)
                        attention_calls.add(node)
                elif len(sources) != 1:
                    raise ConversionError(f"{origin} is called with {len(sources)} arguments; "
                                          f"modules take one tensor.")
            else:
                origin = describe(node)
                for a in node.all_input_nodes:  # the model's own tensors: refused by name
                    if a.op == "get_attr" and a not in constants:
                        _source(a, index, origin)
                module, sources = _located(equivalent, origin)(node, constants)
            if any(a in time_major for a in sources):
                module, stays = batch_first_form(module, origin)
                if stays:
                    time_major.add(node)
            if call is not None:
                call["time_major"] = node in time_major
            inputs = tuple(_source(a, index, origin) for a in sources)
            if isinstance(module, (Add, Concat, Stack)):
                module.correlated = correlated(nodes, inputs)
            elif isinstance(module, Multiply):
                module.dependent = dependent(nodes, inputs)
            name = node.target if node.op == "call_module" else node.name
            index[node] = len(nodes)
            nodes.append(make_node(len(nodes), name, module, inputs, options,
                                   "" if node.op == "call_module" else origin, call))
    return nodes


def _located(fn: Callable, where: str) -> Callable:
    def located(*args):
        try:
            return fn(*args)
        except UnsupportedLayerError as e:
            raise UnsupportedLayerError(f"{where}: {e}") from None
        except TypeError as e:  # arguments the equivalent module does not take
            raise UnsupportedLayerError(f"{where}: unsupported arguments ({e}).") from None
    return located


def _source(a, index: dict, where: str) -> int:
    if isinstance(a, fx.Node) and a.op == "get_attr":
        raise UnsupportedLayerError(
            f"{where} uses the tensor '{a.target}' directly; only a learned positional embedding "
            f"added to a sequence (x + self.pos) is supported. Wrap the computation in a module "
            f"and register a converter for it.")
    if not isinstance(a, fx.Node) or a not in index:
        raise ConversionError(f"{where} takes {a!r} as an input, which is not a tensor computed "
                              f"by the model; only tensor inputs are supported.")
    return index[a]


def _output(node: fx.Node, index: dict, nodes: list[Node], options: Options) -> list[Node]:
    """Nothing, or an Identity node when forward returns its input; the result must be one tensor."""
    result = node.args[0]
    if not isinstance(result, fx.Node) or result not in index:
        raise ConversionError(f"forward returns {result!r}; ntbridge models return one tensor.")
    if index[result] == INPUT:
        return [make_node(len(nodes), "output", nn.Identity(), (INPUT,), options)]
    if index[result] != len(nodes) - 1:
        raise ConversionError(f"forward computes '{nodes[-1].name}' after its result "
                              f"'{nodes[index[result]].name}'; remove that computation.")
    return []
