"""Converters of structural modules that do not change values: ``nn.Identity``."""

from torch import nn

from .. import stax
from .registry import Context, register


@register(nn.Identity)
def _identity(module: nn.Identity, ctx: Context) -> stax.Layer:
    return stax.Identity()
