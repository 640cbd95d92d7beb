"""Models that are not ``nn.Sequential``: torch.fx traces ``forward`` into a DAG of nodes.

Leaf modules (registered types, torch's own) stay ``call_module`` nodes, converted by the registry.
Chains of elementwise functions without a module (``torch.exp(-h ** 2)``) become one
:class:`~.elementwise.Elementwise` module. Other functional calls become the equivalent module
instance (:mod:`.equivalents`), so that each module type has one converter (values computed from
the model's buffers alone, ``self.adjacency.T``, are computed once here). Attention calls are
:mod:`.calls`', positional embeddings :mod:`.sequence`'s, time-major stretches :mod:`.layout`'s.
A ``forward(x, adjacency)`` of node features and each example's graph is :mod:`.graph_ops`':
``x`` becomes a :class:`~.graph_ops.GraphFeatures` node and each ``h @ adjacency.mT`` an
aggregation fed by ``h`` and the model's (packed) input.

The kernel of a sum (of a concatenation along positions) is exact only when the branches are
uncorrelated, that of a product when the factors are independent; :mod:`.independence` works out
from the graph when that is not so (``h + relu(h)``, ``h * h``), and the rule then refuses to run
(the forward pass and empirical kernels still work).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import fx, nn

from ...errors import ConversionError, UnsupportedLayerError
from ...stax import INPUT
from ..aggregation import NodeFeatures
from ..attention import PaddingIds
from ..combinators import Add, Concat
from ..elementwise import Elementwise, step_of
from ..graph import Node, make_node
from ..indexing import Stack
from ..products import Multiply
from ..registry import Options
from .adjacency import adjacency_view, input_aggregation
from .calls import ATTENTION_MODULES, attention_call, attention_output, padding_ids
from .equivalents import equivalent, is_shape
from .independence import correlated, dependent
from .positions import (PositionsView, is_arange, is_arange_value, is_positions, learned_token,
                        position_view, positions)
from .time_major import batch_first_form, swapped
from .tracer import constant, describe, trace


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
    views: dict[fx.Node, PositionsView] = {}  # self.pos[:T]: positions added to a sequence
    aranges: set[fx.Node] = set()  # torch.arange(T): the positions an nn.Embedding embeds
    time_major: set[fx.Node] = set()  # sequences (T, N, d), computed batch-first (.layout)
    adjacencies: dict[fx.Node, bool] = {}  # forward(x, adjacency): it, transposed or not
    params, attention_calls = dict(model.named_parameters()), set()
    graph = trace(model)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if len(placeholders) > 2:
        raise ConversionError(f"{type(model).__name__}.forward takes {len(placeholders)} inputs; "
                              f"ntbridge models take one tensor, forward(x), or node features and "
                              f"each example's graph, forward(x, adjacency).")
    for node in graph.nodes:
        if (value := constant(model, node, constants)) is not None:
            constants[node] = value
            if is_arange_value(value):  # torch.arange(T) of an int T, computed by the trace
                aranges.add(node)
            continue
        if (view := adjacency_view(node, adjacencies)) is not None:
            adjacencies[node] = view
            continue
        aggregation = input_aggregation(node, adjacencies)  # other uses of it are refused
        if (value := padding_ids(node)) is not None:  # for attention calls only
            paddings[node] = value
            continue
        if (view := position_view(node, attrs, model, aranges)) is not None:  # positions only
            views[node] = view
            continue
        if is_arange(node, aranges):
            aranges.add(node)
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
        if node.op == "placeholder" and len(placeholders) == 2:  # graph inputs (.graph_ops)
            if node is placeholders[1]:
                adjacencies[node] = False
                continue
            index[node] = len(nodes)
            nodes.append(make_node(len(nodes), "x", NodeFeatures(), (INPUT,), options,
                                   f"the node features x of {type(model).__name__}.forward"))
        elif node.op == "placeholder":
            index[node] = INPUT
        elif aggregation is not None:
            module, h = aggregation
            where = describe(node)
            index[node] = len(nodes)
            nodes.append(make_node(len(nodes), node.name, module,
                                   (_source(h, index, where), INPUT), options, where))
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
        elif is_positions(node, attrs, params, views):
            owner, module, x = positions(node, attrs, views)
            index[node] = len(nodes)
            nodes.append(make_node(len(nodes), owner, module, (_source(x, index, describe(node)),),
                                   options, describe(node)))
        elif (token := learned_token(node, attrs, params)) is not None:  # the batch's copies
            owner, module = token
            index[node] = len(nodes)
            nodes.append(make_node(len(nodes), owner, module, (INPUT,), options, describe(node)))
        elif node.op == "output":
            if node.args[0] in time_major:
                raise ConversionError("forward returns a time-major sequence (T, N, d); "
                                      "ntbridge's outputs are batch-first: transpose it back.")
            nodes += _output(node, index, nodes, options)
        elif not is_shape(node):
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
                    if a in views or (a.op == "get_attr" and a not in constants):
                        raise _direct_use(views[a].name if a in views else a.target, origin)
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


def _direct_use(name: str, where: str) -> UnsupportedLayerError:
    return UnsupportedLayerError(
        f"{where} uses the tensor '{name}' directly; only a learned positional embedding added to "
        f"a sequence (x + self.pos) and a class token expanded to the batch (self.cls.expand(N, "
        f"-1, -1)) are supported. Wrap the computation in a module and register a converter for "
        f"it.")


def _source(a, index: dict, where: str) -> int:
    if isinstance(a, fx.Node) and a.op == "get_attr":
        raise _direct_use(a.target, where)
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
