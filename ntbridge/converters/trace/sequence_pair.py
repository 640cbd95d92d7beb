"""``forward(x, memory)``: a traced model taking two sequences (a decoder's target and memory)
rather than node features and each example's graph, ``forward(x, adjacency)``; and how many
features each sequence has, read from the modules that take it."""

from __future__ import annotations

from torch import fx, nn

from ...errors import ConversionError
from ..sequence_pair import pair_features


def _features(module: nn.Module) -> int | None:
    """The features of the sequences ``module`` reads (None: not known from the module)."""
    if isinstance(module, nn.Linear):
        return module.in_features
    if isinstance(module, nn.LayerNorm):
        return module.normalized_shape[-1]
    if isinstance(module, nn.MultiheadAttention):
        return module.embed_dim
    if isinstance(module, nn.TransformerEncoderLayer):
        return module.self_attn.embed_dim
    if isinstance(module, nn.TransformerEncoder):
        return module.layers[0].self_attn.embed_dim
    pair = pair_features(module)
    return None if pair is None else pair[0]


def _modules_reading(model: nn.Module, node: fx.Node) -> list[nn.Module]:
    return [model.get_submodule(u.target) for u in node.users if u.op == "call_module"]


def sequence_pair(model: nn.Module, placeholders: list[fx.Node]) -> tuple[int, int] | None:
    """The features ``(E, F)`` of ``forward(x, memory)``'s sequences when a module reads the
    second input (an adjacency is read by products only); None otherwise.

    Example:
        >>> sequence_pair(Seq2Seq(), placeholders)      # forward(x, memory): Linear(8, ...) each
        (8, 8)
    """
    if not _modules_reading(model, placeholders[1]):
        return None
    found = []
    for p in placeholders:
        known = [f for m in _modules_reading(model, p) if (f := _features(m)) is not None]
        if not known:
            raise ConversionError(
                f"{type(model).__name__}.forward({', '.join(q.target for q in placeholders)}): "
                f"its input '{p.target}' is a sequence whose feature count no module taking it "
                f"states; let a Linear, LayerNorm or transformer module read it first.")
        found.append(known[0])
    return found[0], found[1]
