"""A model's two sequences, ``forward(x, memory)``, as the kernels take them: the pair packed into
one tensor (:func:`pack_sequences`), the stand-in modules reading each sequence back
(:class:`PairPart`; the layout is :mod:`ntbridge.stax.sequence_pair`'s), and which models take
a pair (:func:`pair_features` of torch modules, :func:`sequence_features` of converted
models)."""

from __future__ import annotations

import torch
from torch import nn

from .. import stax
from ..errors import InputError, ShapeError
from .registry import Context, register


def pair_features(model: nn.Module) -> tuple[int, int] | None:
    """The features of the two sequences a torch module reading a pair takes (a decoder's, or
    ``nn.Transformer``'s); None for other modules."""
    if isinstance(model, nn.Transformer):
        return model.d_model, model.d_model
    if isinstance(model, nn.TransformerDecoder):
        model = model.layers[0]
    if isinstance(model, nn.TransformerDecoderLayer):
        return model.self_attn.embed_dim, model.multihead_attn.embed_dim
    return None


class PairPart(nn.Module):
    """Entry ``index`` of a model's two sequences ``(x, memory)`` of ``features = (E, F)``, from
    their packed tensor (:func:`pack_sequences`)."""

    def __init__(self, index: int, features: tuple[int, int]):
        super().__init__()
        self.index, self.features = index, tuple(features)

    def forward(self, packed: torch.Tensor) -> torch.Tensor:
        t = packed.shape[-1] - max(self.features)
        rows = packed[:, :t] if self.index == 0 else packed[:, t:]
        return rows[..., :self.features[self.index]]

    def extra_repr(self) -> str:
        return f"index={self.index}, features={self.features}"


def sequence_features(graph) -> tuple[int, int] | None:
    """The features of the two sequences a converted model (a :class:`~.graph.Graph`) reads from
    their packed pair (its :class:`PairPart` stand-ins); None for a model of one input."""
    return next((n.module.features for n in graph.layers if isinstance(n.module, PairPart)),
                None)


@register(PairPart)
def _pair_part(module: PairPart, ctx: Context) -> stax.Layer:
    return stax.SequencePair(module.features, module.index)


def pack_sequences(inputs, name: str, features: tuple[int, int]) -> torch.Tensor:
    """A model's two sequences ``(x (N, T, E), memory (N, S, F))``, ``features = (E, F)``, as one
    tensor ``(N, T + S, max(E, F) + T)`` (the layout :mod:`ntbridge.stax.sequence_pair` reads),
    differentiable in both.

    Example:
        >>> pack_sequences((torch.randn(8, 3, 16), torch.randn(8, 5, 16)), "x1", (16, 16)).shape
        torch.Size([8, 8, 19])
    """
    e, f = features
    if not (isinstance(inputs, (tuple, list)) and len(inputs) == 2
            and all(isinstance(t, torch.Tensor) for t in inputs)):
        raise InputError(f"{name} is {type(inputs).__name__}; the model's forward takes two "
                         f"sequences: pass {name}=(x, memory), two tensors (N, T, {e}) and "
                         f"(N, S, {f}), for x1 and x2 alike.")
    x, m = inputs
    if x.ndim != 3 or m.ndim != 3 or x.shape[0] != m.shape[0] or (x.shape[2], m.shape[2]) != (
            e, f):
        raise ShapeError(f"{name}=(x, memory) needs two sequences (N, T, {e}) and (N, S, {f}) of "
                         f"as many examples, batch first, got {tuple(x.shape)} and "
                         f"{tuple(m.shape)}.")
    if x.device != m.device or x.dtype != m.dtype or not x.is_floating_point():
        raise InputError(f"{name}: the two sequences are {x.dtype} on {x.device} and {m.dtype} on "
                         f"{m.device}; give them one floating-point dtype and one device.")
    t, width = x.shape[1], max(features)
    widen = lambda a: nn.functional.pad(a, (0, width - a.shape[2] + t))
    return torch.cat((widen(x), widen(m)), 1)
