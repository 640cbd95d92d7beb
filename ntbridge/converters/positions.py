"""Positional embeddings added to a sequence and learned tokens joining it (a ViT's class token):
the modules standing for them and their converters (``stax.embedding``'s ``Positions``,
``Token``). The traced spellings that make them are :mod:`.trace.positions`'.

``P`` is a parameter of the model, ``(L, d)`` or ``(1, L, d)``, added whole or by its first T rows
(:class:`AddPositions`); a learned token is a parameter ``(1, 1, d)`` expanded to the batch
(:class:`LearnedToken`), then concatenated with the tokens.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import stax
from ..stax.embedding import Positions, Row, Token
from .registry import Context, register, rms


class AddPositions(nn.Module):
    """``x + P`` for the model's parameter ``P`` ``(L, d)`` or ``(1, L, d)``, registered here under
    its own attribute name ``name`` (so that its qualified name stays the model's); with
    ``prefix``, ``x + P[..., :T, :]`` for sequences of ``T <= L`` tokens. ``init_std``: the
    standard deviation torch's init gives ``P`` (an ``nn.Embedding``'s: 1), None for a bare
    parameter."""

    def __init__(self, name: str, parameter: nn.Parameter, prefix: bool = False,
                 init_std: float | None = None):
        super().__init__()
        self.name, self.prefix, self.init_std = name, prefix, init_std
        self.register_parameter(name, parameter)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + getattr(self, self.name)[..., :x.shape[1], :]

    def extra_repr(self) -> str:
        rows = "[:T]" if self.prefix else ""
        return f"{self.name}{rows}: {tuple(getattr(self, self.name).shape)}"


class AddRow(AddPositions):
    """``x + P[row]`` for the model's parameter ``P`` ``(rows, d)``: one of its rows added to every
    token (BERT's token type of constant ids)."""

    def __init__(self, name: str, parameter: nn.Parameter, row: int,
                 init_std: float | None = None):
        super().__init__(name, parameter, init_std=init_std)
        self.row = row

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + getattr(self, self.name)[self.row]

    def extra_repr(self) -> str:
        return f"{self.name}[{self.row}]: {tuple(getattr(self, self.name).shape)}"


class LearnedToken(nn.Module):
    """``P.expand(N, -1, -1)`` for the model's parameter ``P`` ``(1, 1, d)`` and the ``N`` examples
    of ``x``, registered here under its own attribute name ``name``."""

    def __init__(self, name: str, parameter: nn.Parameter):
        super().__init__()
        self.name, self.init_std = name, None
        self.register_parameter(name, parameter)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self, self.name).expand(x.shape[0], -1, -1)


def _std(module: AddPositions | LearnedToken, ctx: Context) -> float:
    """The standard deviation of the module's parameter's entries: the explicit ``W_std``, that
    of its module's init (torch's, or a library's: ``Context.library_std``), or (a bare parameter
    has no default init) read from the values."""
    o = ctx.options
    explicit = o.explicit(o.W_std, ctx.name)
    if explicit is not None:
        std = float(explicit)
    elif module.init_std is not None and o.init == "torch":  # an nn.Embedding's rows: as it is drawn
        std = module.init_std if ctx.library_std is None else ctx.library_std
    else:
        std = rms(getattr(module, module.name))
    ctx.hyper = {"W_std": std}
    return std


@register(LearnedToken)
def _token(module: LearnedToken, ctx: Context) -> stax.Layer:
    return Token(getattr(module, module.name).shape[-1], std=_std(module, ctx),
                 parameterization=ctx.options.parameterization, name=module.name)


@register(AddPositions)
def _positions(module: AddPositions, ctx: Context) -> stax.Layer:
    p, o, std = getattr(module, module.name), ctx.options, _std(module, ctx)
    return Positions(p.shape[-2], p.shape[-1], std=std, batched=p.ndim == 3,
                     parameterization=o.parameterization, name=module.name, prefix=module.prefix)


@register(AddRow)
def _row(module: AddRow, ctx: Context) -> stax.Layer:
    p = getattr(module, module.name)
    return Row(p.shape[0], p.shape[1], row=module.row, std=_std(module, ctx),
               parameterization=ctx.options.parameterization, name=module.name)
