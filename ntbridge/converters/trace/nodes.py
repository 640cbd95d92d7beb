"""The walk over a traced ``forward``: node patterns, tried in order, turn it into converted nodes.

A node pattern is a small function ``fn(node, trace) -> bool`` registered with :func:`pattern`: it
recognises one spelling (an attention call, positions added to a sequence, a product with the
adjacency, a transpose to time-major...), records what it learned in the :class:`Trace` or appends
the node's converted :class:`~..graph.Node`, and returns True when it has claimed the node. The
patterns (:mod:`.patterns`) are tried in the order they are registered; the first that claims a
node ends its turn, and the last claims every node left (a functional call, as its equivalent
module). A new spelling is one more registered function.

The kernel of a sum (of a concatenation along positions) is exact only when the branches are
uncorrelated, that of a product when the factors are independent; :mod:`.independence` works out
from the nodes when that is not so (``h + relu(h)``, ``h * h``), and the rule then refuses to run
(the forward pass and empirical kernels still work).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
from torch import fx, nn

from ...errors import ConversionError, UnsupportedLayerError
from ..attention import PaddingIds
from ..elementwise import Elementwise, Step
from ..graph import Node, make_node
from ..registry import Options
from .adjacency import reads_nodes_first
from .geometric import check_inputs, is_geometric
from .sequence_pair import sequence_pair
from .positions import PositionsView
from .tracer import describe, trace

Pattern = Callable[[fx.Node, "Trace"], bool]
PATTERNS: list[Pattern] = []


def pattern(fn: Pattern) -> Pattern:
    """Register ``fn(node, trace) -> bool`` as the next node pattern (see the module doc)."""
    PATTERNS.append(fn)
    return fn


@dataclasses.dataclass
class Trace:
    """What the walk knows of a traced ``forward``: the converted nodes so far and, by fx node, the
    values and views the patterns recorded for the nodes that take them."""

    model: nn.Module
    options: Options
    placeholders: list[fx.Node]
    params: dict[str, nn.Parameter]
    nodes: list[Node] = dataclasses.field(default_factory=list)
    index: dict[fx.Node, int] = dataclasses.field(default_factory=dict)  # -> its converted node
    chains: dict[fx.Node, tuple[fx.Node, tuple[Step, ...]]] = dataclasses.field(
        default_factory=dict)  # node -> (tensor the chain starts from, elementwise steps)
    constants: dict[fx.Node, object] = dataclasses.field(default_factory=dict)  # buffers' alone
    attrs: dict[fx.Node, torch.Tensor] = dataclasses.field(default_factory=dict)  # get_attr
    paddings: dict[fx.Node, PaddingIds] = dataclasses.field(default_factory=dict)  # ids == pad
    views: dict[fx.Node, PositionsView] = dataclasses.field(default_factory=dict)  # self.pos[:T]
    aranges: set[fx.Node] = dataclasses.field(default_factory=set)  # torch.arange(T)
    time_major: set[fx.Node] = dataclasses.field(default_factory=set)  # (T, N, d) sequences
    adjacencies: dict[fx.Node, bool] = dataclasses.field(default_factory=dict)  # -> transposed
    attention_calls: set[fx.Node] = dataclasses.field(default_factory=set)  # (output, weights)
    geometric: dict[fx.Node, str] = dataclasses.field(default_factory=dict)  # PyG graph inputs
    nodes_first: bool = False  # forward(x, adjacency) computes adjacency @ h, x (N, V, C)
    pair: tuple[int, int] | None = None  # forward(x, memory): the sequences' features

    def add(self, node: fx.Node, name: str, module: nn.Module, inputs: tuple[int, ...],
            origin: str = "", call: dict | None = None) -> None:
        """Append the converted node of ``module`` computing fx ``node`` (see
        :func:`~..graph.make_node` for the other arguments)."""
        self.index[node] = len(self.nodes)
        self.nodes.append(make_node(len(self.nodes), name, module, inputs, self.options, origin,
                                    call))

    def source(self, a, where: str) -> int:
        """The converted node computing ``a``, an input of the node ``where`` names."""
        if isinstance(a, fx.Node) and a.op == "get_attr":
            raise direct_use(a.target, where)
        if not isinstance(a, fx.Node) or a not in self.index:
            raise ConversionError(f"{where} takes {a!r} as an input, which is not a tensor "
                                  f"computed by the model; only tensor inputs are supported.")
        return self.index[a]

    def convert_chains(self, node: fx.Node) -> None:
        """Each chain of elementwise steps that ``node`` takes, not yet converted, as one
        :class:`~..elementwise.Elementwise` node."""
        for a in node.all_input_nodes:
            if a in self.chains and a not in self.index:
                source, steps = self.chains[a]
                self.index[a] = len(self.nodes)
                self.nodes.append(make_node(len(self.nodes), a.name, Elementwise(steps),
                                            (self.source(source, describe(a)),), self.options,
                                            describe(a)))


def direct_use(name: str, where: str) -> UnsupportedLayerError:
    """The error of a tensor of the model used directly by a call."""
    return UnsupportedLayerError(
        f"{where} uses the tensor '{name}' directly; only a learned positional embedding added to "
        f"a sequence (x + self.pos) and a class token expanded to the batch (self.cls.expand(N, "
        f"-1, -1)) are supported. Wrap the computation in a module and register a converter for "
        f"it.")


def fx_nodes(model: nn.Module, options: Options) -> list[Node]:
    """The converted nodes of ``model``'s traced ``forward``, in execution order.

    Example:
        >>> [n.name for n in fx_nodes(ResBlock(), Options())]
        ['fc1', 'relu', 'fc2', 'add']
    """
    graph = trace(model)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if is_geometric(placeholders):
        check_inputs(placeholders, type(model).__name__)
    elif len(placeholders) > 2:
        raise ConversionError(f"{type(model).__name__}.forward takes {len(placeholders)} inputs; "
                              f"ntbridge models take one tensor, forward(x), node features and "
                              f"each example's graph, forward(x, adjacency), or two sequences, "
                              f"forward(x, memory).")
    state = Trace(model, options, placeholders, dict(model.named_parameters()))
    if len(placeholders) == 2 and not is_geometric(placeholders):
        state.pair = sequence_pair(model, placeholders)
        if state.pair is None:
            state.nodes_first = reads_nodes_first(graph, placeholders[1])
    for node in graph.nodes:
        any(fn(node, state) for fn in PATTERNS)  # the first pattern claiming it ends its turn
    return state.nodes
