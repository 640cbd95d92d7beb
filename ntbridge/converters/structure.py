"""Converters of structural modules: ``nn.Identity``, ``nn.Flatten``, ``nn.Unflatten``, dropout,
and :class:`SwapLast`, a traced ``x.transpose(1, 2)``."""

import torch
from torch import nn

from .. import stax
from ..errors import UnsupportedLayerError
from .registry import Context, register


@register(nn.Identity)
def _identity(module: nn.Identity, ctx: Context) -> stax.Layer:
    return stax.Identity()


class SwapLast(nn.Module):
    """``x.transpose(1, 2)`` of ``(N, C, L)`` or ``(N, L, C)``; ``to_last``: the channels of
    ``(N, C, *S)`` moved last (True) or back (False) (``stax.SwapLast``)."""

    def __init__(self, to_last: bool | None = None):
        super().__init__()
        self.to_last = to_last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.to_last is None:
            return x.transpose(1, 2)
        return x.movedim(1, -1) if self.to_last else x.movedim(-1, 1)


@register(SwapLast)
def _swap_last(module: SwapLast, ctx: Context) -> stax.Layer:
    return stax.SwapLast(module.to_last)


@register(nn.Flatten)
def _flatten(module: nn.Flatten, ctx: Context) -> stax.Layer:
    return stax.Flatten(module.start_dim, module.end_dim)


@register(nn.Unflatten)
def _unflatten(module: nn.Unflatten, ctx: Context) -> stax.Layer:
    if isinstance(module.dim, str):
        raise UnsupportedLayerError("named-tensor Unflatten is not supported; give dim as an int")
    return stax.Unflatten(module.dim, tuple(module.unflattened_size))


@register(nn.Dropout)
@register(nn.Dropout1d)
@register(nn.Dropout2d)
@register(nn.Dropout3d)
def _dropout(module: nn.Dropout, ctx: Context) -> stax.Layer:
    """Eval mode: Identity. Training mode: Dropout's kernel rule (see ``stax.Dropout``)."""
    if not module.training:
        return stax.Identity()
    return stax.Dropout(module.p, channelwise=not isinstance(module, nn.Dropout),
                        name=type(module).__name__)
