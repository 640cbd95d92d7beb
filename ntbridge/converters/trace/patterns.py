"""The node patterns of a traced ``forward``, in the order they are tried (:mod:`.nodes`).

The first patterns record values that other nodes read (constants, the adjacency, padding masks,
positions, ``torch.arange``) and fold elementwise functions into chains; the rest append converted
nodes: ``forward``'s inputs, attention outputs, transposes to time-major, positions and learned
tokens, the output, and last the calls of modules and functions.
"""

from __future__ import annotations

from torch import fx, nn

from ...errors import ConversionError
from ...stax import INPUT
from ..aggregation import NodeFeatures
from ..combinators import Add, Concat
from ..elementwise import step_of
from ..geometric import GeometricFeatures
from ..indexing import Stack
from ..products import Multiply
from ..sequence_pair import PairPart
from .adjacency import adjacency_view, input_aggregation
from .calls import ATTENTION_MODULES, attention_call, attention_output, padding_ids
from .equivalents import equivalent, is_shape, located
from .geometric import geometric_call, is_geometric
from .independence import correlated, dependent
from .nodes import Trace, direct_use, pattern
from .chunks import chunk_pattern  # noqa: F401 (registered first, as the next: whole forms)
from .norms import channel_scale_pattern, rms_norm_pattern  # noqa: F401
from .positions import (is_arange, is_arange_value, is_positions, learned_token, position_view,
                        positions)
from .time_major import batch_first_form, swapped
from .tracer import constant, describe


@pattern
def _constant(node: fx.Node, t: Trace) -> bool:
    """A value computed from the model's buffers alone (``self.adjacency.T``), computed once here;
    ``torch.arange(T)`` of an int T, which the trace computes, among them."""
    if (value := constant(t.model, node, t.constants)) is None:
        return False
    t.constants[node] = value
    if is_arange_value(value):
        t.aranges.add(node)
    return True


@pattern
def _adjacency_view(node: fx.Node, t: Trace) -> bool:
    """A transpose of the adjacency given to ``forward(x, adjacency)`` (``adjacency.mT``)."""
    if (view := adjacency_view(node, t.adjacencies)) is None:
        return False
    t.adjacencies[node] = view
    return True


@pattern
def _input_aggregation(node: fx.Node, t: Trace) -> bool:
    """``h @ adjacency.mT`` of ``forward(x, adjacency)``: an aggregation fed by ``h`` and the
    model's (packed) input; any other use of the adjacency is refused."""
    if (found := input_aggregation(node, t.adjacencies)) is None:
        return False
    t.convert_chains(node)
    module, h = found
    where = describe(node)
    t.add(node, node.name, module, (t.source(h, where), INPUT), where)
    return True


@pattern
def _padding_ids(node: fx.Node, t: Trace) -> bool:
    """``ids == pad`` of the model's token ids: a key padding mask, for attention calls only."""
    if (value := padding_ids(node)) is None:
        return False
    t.paddings[node] = value
    return True


@pattern
def _position_view(node: fx.Node, t: Trace) -> bool:
    """``self.pos[:T]``, ``self.pos[None]``, an ``nn.Embedding`` of ``torch.arange(T)``:
    positions, for a sum with a sequence only."""
    if (view := position_view(node, t.attrs, t.model, t.aranges)) is None:
        return False
    t.views[node] = view
    return True


@pattern
def _arange(node: fx.Node, t: Trace) -> bool:
    """``torch.arange(T)`` of an input's size (or ``[None]`` of one): the positions an
    ``nn.Embedding`` embeds."""
    if not is_arange(node, t.aranges):
        return False
    t.aranges.add(node)
    return True


@pattern
def _elementwise_step(node: fx.Node, t: Trace) -> bool:
    """An elementwise function of one tensor without a module (``torch.exp(-h ** 2)``): one more
    step of the chain from that tensor."""
    if (found := step_of(node, t.chains)) is None:
        return False
    source, steps = t.chains.get(found[0], (found[0], ()))
    t.chains[node] = (source, (*steps, found[1]))
    return True


@pattern
def _chains_taken(node: fx.Node, t: Trace) -> bool:
    """Claims no node: the chains ``node`` takes become their nodes, before ``node``'s own (the
    patterns after this one find them converted)."""
    t.convert_chains(node)
    return False


@pattern
def _placeholder(node: fx.Node, t: Trace) -> bool:
    """``forward``'s input; for ``forward(x, adjacency)`` (or PyG's ``(x, edge_index, ...)``),
    the node features ``x`` read from the packed input, and the graph inputs, read through
    products (:func:`_input_aggregation`) or PyG's calls (:func:`_geometric_call`) alone; for
    ``forward(x, memory)``, each sequence read from the packed pair."""
    if node.op != "placeholder":
        return False
    name = f"{type(t.model).__name__}.forward"
    if is_geometric(t.placeholders):
        if node is not t.placeholders[0]:
            t.geometric[node] = node.target
        else:
            t.add(node, "x", GeometricFeatures(), (INPUT,), f"the node features x of {name}")
    elif len(t.placeholders) != 2:
        t.index[node] = INPUT
    elif t.pair is not None:
        index = t.placeholders.index(node)
        t.add(node, f"~{node.target}", PairPart(index, t.pair), (INPUT,),
              f"the sequence {node.target} of {name}")
    elif node is t.placeholders[1]:
        t.adjacencies[node] = False
    else:
        t.add(node, "x", NodeFeatures(t.nodes_first), (INPUT,), f"the node features x of {name}")
    return True


@pattern
def _get_attr(node: fx.Node, t: Trace) -> bool:
    """A tensor of the model that is no constant, a parameter (``self.pos``, ``self.cls``), for
    the patterns reading one."""
    if node.op != "get_attr":
        return False
    tensors = t.params if node.target in t.params else dict(t.model.named_buffers())
    t.attrs[node] = tensors[node.target]
    return True


@pattern
def _attention_output(node: fx.Node, t: Trace) -> bool:
    """``out[0]`` of an ``nn.MultiheadAttention`` call, which returns ``(output, weights)``."""
    if (found := attention_output(node, t.attention_calls)) is None:
        return False
    t.index[node] = t.index[found]
    if found in t.time_major:
        t.time_major.add(node)
    return True


@pattern
def _time_major(node: fx.Node, t: Trace) -> bool:
    """``x.transpose(0, 1)``: ``(N, T, d)`` <-> ``(T, N, d)``, the same kernel; the result is
    time-major unless ``x`` was (:mod:`.time_major`)."""
    if (source := swapped(node)) is None:
        return False
    t.index[node] = t.source(source, describe(node))
    if source not in t.time_major:
        t.time_major.add(node)
    return True


@pattern
def _positions(node: fx.Node, t: Trace) -> bool:
    """``x + P`` of a parameter of positions ``P`` (or a view of it), named as ``P``'s owner."""
    if not is_positions(node, t.attrs, t.params, t.views):
        return False
    owner, module, x = positions(node, t.attrs, t.views)
    t.add(node, owner, module, (t.source(x, describe(node)),), describe(node))
    return True


@pattern
def _learned_token(node: fx.Node, t: Trace) -> bool:
    """``self.cls.expand(N, -1, -1)``: a learned token's copies for the batch."""
    if (token := learned_token(node, t.attrs, t.params)) is None:
        return False
    owner, module = token
    t.add(node, owner, module, (INPUT,), describe(node))
    return True


@pattern
def _output(node: fx.Node, t: Trace) -> bool:
    """``return h``: one batch-first tensor, the last one computed (an Identity node when it is the
    input itself)."""
    if node.op != "output":
        return False
    result = node.args[0]
    if result in t.time_major:
        raise ConversionError("forward returns a time-major sequence (T, N, d); "
                              "ntbridge's outputs are batch-first: transpose it back.")
    if not isinstance(result, fx.Node) or result not in t.index:
        raise ConversionError(f"forward returns {result!r}; ntbridge models return one tensor.")
    if t.index[result] == INPUT:
        t.add(node, "output", nn.Identity(), (INPUT,))
    elif t.index[result] != len(t.nodes) - 1:
        raise ConversionError(f"forward computes '{t.nodes[-1].name}' after its result "
                              f"'{t.nodes[t.index[result]].name}'; remove that computation.")
    return True


@pattern
def _shape(node: fx.Node, t: Trace) -> bool:
    """A size, shape, device or dtype (``x.size(0)``), read by the nodes that take it."""
    return is_shape(node)


@pattern
def _geometric_call(node: fx.Node, t: Trace) -> bool:
    """``conv(h, edge_index)`` of a PyG layer, ``global_mean_pool(h, batch)`` (:mod:`.geometric`)."""
    if (found := geometric_call(node, t.model, t.geometric, len(t.nodes))) is None:
        return False
    name, module, h, origin, call = found
    t.add(node, name, module, (t.source(h, origin), INPUT), "" if call else origin, call)
    return True


@pattern
def _attention_call(node: fx.Node, t: Trace) -> bool:
    """``attn(x, x, x, attn_mask=self.mask)`` of an attention module or encoder: one node fed by
    ``x`` (and the token ids of a key padding mask), its other arguments handed to the converter
    (:mod:`.calls`)."""
    if node.op != "call_module" or not isinstance(
            module := t.model.get_submodule(node.target), ATTENTION_MODULES):
        return False
    origin = f"module {len(t.nodes)} '{node.target}' ({type(module).__name__})"
    given = {**t.attrs, **t.constants, **t.paddings}  # what its arguments may be
    sources, call = attention_call(module, node, given, origin)
    if isinstance(module, nn.MultiheadAttention):  # returns (output, weights)
        t.attention_calls.add(node)
    _add_call(node, t, module, sources, origin, call)
    return True


@pattern
def _module_call(node: fx.Node, t: Trace) -> bool:
    """A call of a leaf module on one tensor, converted by the registry."""
    if node.op != "call_module":
        return False
    module, sources = t.model.get_submodule(node.target), [*node.args, *node.kwargs.values()]
    origin = f"module {len(t.nodes)} '{node.target}' ({type(module).__name__})"
    if len(sources) != 1:
        raise ConversionError(f"{origin} is called with {len(sources)} arguments; "
                              f"modules take one tensor.")
    _add_call(node, t, module, sources, origin)
    return True


@pattern
def _function_call(node: fx.Node, t: Trace) -> bool:
    """Any other call: a function's or method's equivalent module (:mod:`.equivalents`); the
    model's own tensors used directly are refused. Claims every node left."""
    origin = describe(node)
    for a in node.all_input_nodes:
        if a in t.views or (a.op == "get_attr" and a not in t.constants):
            raise direct_use(t.views[a].name if a in t.views else a.target, origin)
    module, sources = located(equivalent, origin)(node, t.constants)
    _add_call(node, t, module, sources, origin)
    return True


def _add_call(node: fx.Node, t: Trace, module: nn.Module, sources: list, origin: str,
              call: dict | None = None) -> None:
    """Append the node of a call of ``module`` on ``sources``: in its batch-first form after a
    time-major input, and told whether its branches are correlated (sums, concatenations,
    stacks) or its factors dependent (products)."""
    if any(a in t.time_major for a in sources):
        module, stays = batch_first_form(module, origin)
        if stays:
            t.time_major.add(node)
    if call is not None:
        call["time_major"] = node in t.time_major
    inputs = tuple(t.source(a, origin) for a in sources)
    if isinstance(module, (Add, Concat, Stack)):
        module.correlated = correlated(t.nodes, inputs)
    elif isinstance(module, Multiply):
        module.dependent = dependent(t.nodes, inputs)
    by_module = node.op == "call_module"
    t.add(node, node.target if by_module else node.name, module, inputs,
          "" if by_module else origin, call)
