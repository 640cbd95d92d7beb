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
from ..normalization import ChannelScale
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
MIXING = "a Linear/Conv layer mixing all channels"  # (a grouped convolution mixes its groups')
# per-channel affine maps of their input (eval-mode BatchNorm): a branch through one keeps its
# terms' independence, though not their zero mean (the kernel of a sum then needs the sources'
# rule, ``stax.sources``, which the sum's kernel rule uses where a branch is not centred)
CHANNEL_MAPS = (nn.modules.batchnorm._BatchNorm, ChannelScale)
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

    In the infinite-width limit, channel ``c`` of a weight layer's output (Linear, Conv) is a sum
    over all its input's units with fresh zero-mean weights: given its input, it is independent of
    any finitely many units computed without those weights, and its kernel concentrates. So two
    factors are independent when the units their channel ``c`` reads without a weight layer
    mixing all channels in between (:func:`_units`) come from different weight layers, or from different chunks of one
    layer's features (``a, b = fc(x).chunk(2, -1)``: disjoint sets of units), whatever they share
    before those layers. ``fc1(x) * fc2(x)``, ``F.silu(fc1(h)) * fc2(h)``, ``relu(h) * fc(h)`` and
    a squeeze-and-excitation gate ``h * sigmoid(fc2(relu(fc1(pool(h)))))`` are independent;
    ``h * h``, ``h * relu(h)`` and ``relu(h) * tanh(h)`` are not. The NTK's cross terms vanish
    likewise: they sum over a layer's units the products of its fresh weights with gradients
    that do not involve them. A kernel is a channel average, and the average of the factors'
    per-channel products is the product of their averages when all factors but one have the same
    kernel in every channel: those that come from a weight layer through modules of
    :data:`SAME_PER_CHANNEL` (not from the model's input, a concatenation or a normalization).
    """
    ancestors, same = {INPUT: frozenset({INPUT})}, {INPUT: False}
    for n in nodes:
        ancestors[n.index] = frozenset({n.index}).union(*(ancestors[i] for i in n.inputs))
        same[n.index] = isinstance(n.module, AFFINE) or (isinstance(n.module, Chunk)
                                                         and same[n.inputs[0]]) or (
            isinstance(n.module, SAME_PER_CHANNEL) and all(same[i] for i in _random_inputs(n)))
    units = _units(nodes)
    for position, a in enumerate(inputs):
        for b in inputs[position + 1:]:
            common = [u for u in units[a] if any(_overlap(u, v) for v in units[b])]
            if not common:
                continue
            why = ("they are the same tensor" if a == b else
                   f"one is computed from the other without {MIXING} in between"
                   if a in ancestors[b] or b in ancestors[a] else
                   f"both read the units of {_name(nodes, common[0][0])} without {MIXING} of "
                   f"their own in between")
            return f"the factors {_name(nodes, a)} and {_name(nodes, b)} are not independent: {why}"
    for a in inputs:
        if (INPUT, None) in units[a]:
            return (f"the factor {_name(nodes, a)} reads the model's input without {MIXING} in "
                    f"between: its channels are the input's own, finitely many, which no "
                    f"infinite width averages")
    differing = [a for a in inputs if not same[a]]
    if len(differing) > 1:
        return (f"the channels of the factors {_name(nodes, differing[0])} and "
                f"{_name(nodes, differing[1])} may differ in distribution (they come from a "
                f"concatenation or a normalization), and their kernels are channel averages")
    return ""


def _units(nodes: list[Node]) -> dict[int, frozenset]:
    """For each node, where the units its channel ``c`` reads without a weight layer mixing all
    channels in between come from: ``(index, part)`` of the weight layer's first node (its
    module's; a module called twice has the same weights) and ``part`` None for all its features
    or ``(chunks, dim, index)`` for a chunk of them, or ``(INPUT, None)`` for the model's input. A
    grouped convolution mixes only its group's channels (a depthwise one, channel ``c`` alone):
    its channel ``c`` also reads what its input's does."""
    first = {}
    mixes = lambda i: i != INPUT and isinstance(nodes[i].module, AFFINE) and getattr(
        nodes[i].module, "groups", 1) == 1
    units = {INPUT: frozenset({(INPUT, None)})}
    for n in nodes:
        own = frozenset({(first.setdefault(id(n.module), n.index), None)})
        if mixes(n.index):
            units[n.index] = own
        elif isinstance(n.module, Chunk) and mixes(n.inputs[0]):
            (layer, _), = units[n.inputs[0]]
            units[n.index] = frozenset({(layer, (n.module.chunks, n.module.dim, n.module.index))})
        else:  # a grouped (depthwise) convolution's channel reads its own group's too
            units[n.index] = frozenset().union(*(units[i] for i in _random_inputs(n)),
                                               own if isinstance(n.module, AFFINE) else ())
    return units


def _overlap(u: tuple, v: tuple) -> bool:
    """Whether two entries of :func:`_units` may share units: the same layer, and not two
    different chunks of one split of its features."""
    (layer, part), (other, other_part) = u, v
    return layer == other and (part is None or other_part is None or part == other_part
                               or part[:2] != other_part[:2])
