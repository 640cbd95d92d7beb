"""The module standing for a learned positional embedding added to a sequence in a traced
``forward`` (:mod:`.fx`), ``x + self.pos``, and its converter. (The heads ``x.mean(1)`` and
``x[:, i]`` are :mod:`.indexing`'s, whose rules read sequences too.)"""

from __future__ import annotations

import torch
from torch import nn

from .. import stax
from ..stax.embedding import Positions
from .registry import Context, register


class AddPositions(nn.Module):
    """``x + P`` for the model's parameter ``P`` ``(L, d)`` or ``(1, L, d)``, registered here under
    its own attribute name ``name`` (so that its qualified name stays the model's); with
    ``prefix``, ``x + P[..., :T, :]`` for sequences of ``T <= L`` tokens."""

    def __init__(self, name: str, parameter: nn.Parameter, prefix: bool = False):
        super().__init__()
        self.name, self.prefix = name, prefix
        self.register_parameter(name, parameter)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + getattr(self, self.name)[..., :x.shape[1], :]

    def extra_repr(self) -> str:
        rows = "[:T]" if self.prefix else ""
        return f"{self.name}{rows}: {tuple(getattr(self, self.name).shape)}"


@register(AddPositions)
def _positions(module: AddPositions, ctx: Context) -> stax.Layer:
    p = getattr(module, module.name)
    o = ctx.options
    explicit = o.explicit(o.W_std, ctx.name)  # no default init to assume: read from the values
    std = p.detach().double().pow(2).mean().sqrt().item() if explicit is None else float(explicit)
    ctx.hyper = {"W_std": std}
    return Positions(p.shape[-2], p.shape[-1], std=std, batched=p.ndim == 3,
                     parameterization=o.parameterization, name=module.name, prefix=module.prefix)
