"""Which branches of a traced forward are uncorrelated, or independent, in the infinite-width limit:
the kernels of sums, of concatenations along positions and of products depend on it.
"""

from __future__ import annotations

from torch import nn

from ...stax import INPUT
from ..aggregation import Aggregate, InputAggregate
from ..combinators import Add, Concat, Scale
from ..elementwise import Elementwise
from ..export.standins import ExportedAffine, ExportedAttention
from ..families import AVG_POOLS, CONVS, DROPOUTS, RESIZES
from ..functional import FORMS
from ..geometric import GlobalPool, ends_affine
from ..graph import Node
from ..indexing import Chunk, Index, Reduce, Stack, Unsqueeze
from ..positions import AddPositions, LearnedToken
from ..products import Multiply
from ..structure import SwapLast

# fresh zero-mean weights: output zero-mean given input (attention ends in its out_proj; a
# learned token is such a weight itself)
AFFINE = (nn.Linear, *CONVS, nn.Embedding, nn.MultiheadAttention, LearnedToken, ExportedAffine,
          ExportedAttention)
LINEAR = (nn.Identity, nn.Flatten, nn.Unflatten, *AVG_POOLS, *RESIZES, *DROPOUTS, Add, Concat,
          Scale, Index, Reduce, Unsqueeze, Stack, Aggregate, InputAggregate, nn.LPPool1d,
          nn.LPPool2d, nn.LPPool3d, AddPositions, SwapLast, GlobalPool)
# per-channel affine maps of their input (eval-mode BatchNorm): a branch through one keeps its
# terms' independence, though not their zero mean (the kernel of a sum then needs the sources'
# rule, ``stax.sources``, which the sum's kernel rule uses where a branch is not centred)
CHANNEL_MAPS = (nn.modules.batchnorm._BatchNorm,)
# modules after which every channel has the same kernel when every channel of their inputs has
# (elementwise or the same map of positions for every channel; a sum or product of such inputs)
SAME_PER_CHANNEL = (*FORMS, Elementwise, nn.Identity, *DROPOUTS, *AVG_POOLS, nn.Upsample,
                    nn.PixelShuffle, Add, Scale, Unsqueeze, Stack, Aggregate, InputAggregate,
                    Multiply, GlobalPool)


def _random_inputs(n: Node) -> tuple[int, ...]:
    """The inputs of ``n`` whose values are random at initialisation: all but the adjacency an
    aggregation (a pooling of graphs) takes from the model's input (data, like the input itself)."""
    return n.inputs[:1] if isinstance(n.module, (InputAggregate, GlobalPool)) else n.inputs


def correlated(nodes: list[Node], inputs: tuple[int, ...]) -> str:
    """Why the values of ``inputs`` (indices into ``nodes``) may be correlated, or ``""``.

    A value that is a linear function of the outputs of affine layers ``T`` (its *terms*) is
    uncorrelated with any value not depending on ``T`` nor on their weights (a module called
    twice shares them): each term is ``W u + b`` with ``W``, ``b``
    zero-mean and independent of everything but the term's descendants, for the NNGP as for the
    NTK (whose cross terms are linear in ``W`` too). Branches for which no such term exists on
    either side (``h + relu(h)``) may be correlated. An eval-mode BatchNorm after a term keeps it
    independent of the rest (``h + bn(conv(relu(h)))``), not zero-mean: the sum's rule takes it.
    """
    terms, ancestors = {INPUT: None}, {INPUT: frozenset({INPUT})}
    for n in nodes:
        ancestors[n.index] = frozenset({n.index}).union(*(ancestors[i] for i in n.inputs))
        if isinstance(n.module, AFFINE) or ends_affine(n.module):
            terms[n.index] = frozenset({n.index})
        elif (isinstance(n.module, (*LINEAR, *CHANNEL_MAPS))
              and all(terms[i] is not None for i in _random_inputs(n))):
            terms[n.index] = frozenset().union(*(terms[i] for i in _random_inputs(n)))
        else:
            terms[n.index] = None
    for position, a in enumerate(inputs):
        for b in inputs[position + 1:]:
            if not any(terms[i] is not None and not _modules(nodes, terms[i])
                       & _modules(nodes, ancestors[j]) for i, j in ((a, b), (b, a))):
                return f"the branches {_name(nodes, a)} and {_name(nodes, b)} may be correlated"
    return ""


def _modules(nodes: list[Node], indices) -> set[int]:
    """The identities of the modules of nodes ``indices`` (a module called twice has two nodes)."""
    return {id(nodes[i].module) for i in indices if i != INPUT}


def _name(nodes: list[Node], i: int) -> str:
    return "the model's input" if i == INPUT else f"'{nodes[i].name}'"


def dependent(nodes: list[Node], inputs: tuple[int, ...]) -> str:
    """Why the factors ``inputs`` (indices into ``nodes``) of a product may not be independent
    processes with the same kernel in every channel, or ``""``.

    Factors are independent in the infinite-width limit when neither is computed from another,
    and every path from the nodes they share into either factor enters a weight layer (Linear,
    Conv) first, or a chunk of a weight layer's features that no other path takes
    (``a, b = fc(x).chunk(2, -1)``: disjoint sets of units, :func:`_own_chunk`): given the shared values, the factors then depend on disjoint sets of fresh
    zero-mean weights, and the shared values' kernels concentrate as the widths grow. So
    ``fc1(x) * fc2(x)`` and ``F.silu(fc1(h)) * fc2(h)`` are independent, ``h * h``, ``fc(x) *
    relu(fc(x))`` and ``relu(h) * fc(h)`` (``relu(h)`` shares ``h`` directly) are not. A factor's
    channels have the same kernel when it comes from a weight layer through modules of
    :data:`SAME_PER_CHANNEL` (not from the model's input, a concatenation or a normalization).
    """
    ancestors, same = {INPUT: frozenset({INPUT})}, {INPUT: False}
    for n in nodes:
        ancestors[n.index] = frozenset({n.index}).union(*(ancestors[i] for i in n.inputs))
        same[n.index] = isinstance(n.module, AFFINE) or (isinstance(n.module, Chunk)
                                                         and same[n.inputs[0]]) or (
            isinstance(n.module, SAME_PER_CHANNEL) and all(same[i] for i in _random_inputs(n)))
    for position, a in enumerate(inputs):
        for b in inputs[position + 1:]:
            if a in ancestors[b] or b in ancestors[a]:
                return (f"the factors {_name(nodes, a)} and {_name(nodes, b)} are not independent: "
                        f"{'they are the same tensor' if a == b else 'one is computed from the other'}")
            shared = ancestors[a] & ancestors[b]
            own_a, own_b = (_modules(nodes, ancestors[i] - shared) for i in (a, b))
            if own_a & own_b:
                return (f"the factors {_name(nodes, a)} and {_name(nodes, b)} are not independent: "
                        f"they are computed by the same module (its weights are shared)")
            for n in (ancestors[a] | ancestors[b]) - shared:
                if not isinstance(nodes[n].module, AFFINE) and shared & set(nodes[n].inputs) and (
                        not _own_chunk(nodes, n, (ancestors[a] | ancestors[b]) - shared)):
                    common = _name(nodes, max(shared & set(nodes[n].inputs)))
                    return (f"the factors {_name(nodes, a)} and {_name(nodes, b)} may be dependent: "
                            f"{_name(nodes, n)} takes their common input {common} without a "
                            f"Linear/Conv layer of its own in between")
    for a in inputs:
        if not same[a]:
            return (f"the channels of the factor {_name(nodes, a)} may differ in distribution "
                    f"(it comes from the model's input, a concatenation or a normalization), "
                    f"and the kernel is their average")
    return ""


def _own_chunk(nodes: list[Node], n: int, own: set[int]) -> bool:
    """Whether node ``n`` is a chunk of a weight layer's features (``stax.Chunk`` refuses other
    axes) and every other node of ``own`` (the factors' nodes after what they share) that takes
    that layer's output is a different chunk of the same split: disjoint units, independent."""
    node = nodes[n]
    if not isinstance(node.module, Chunk) or node.inputs[0] == INPUT or not isinstance(
            nodes[node.inputs[0]].module, AFFINE):
        return False
    split = lambda m: (m.chunks, m.dim)
    takers = [nodes[i] for i in own if i != n and node.inputs[0] in nodes[i].inputs]
    return all(isinstance(m.module, Chunk) and split(m.module) == split(node.module)
               and m.module.index != node.module.index for m in takers)
