"""Converters of structural modules that do not change values: ``nn.Identity``."""

from torch import nn

from .. import stax
from .registry import Context, register


@register(nn.Identity)
def _identity(module: nn.Identity, ctx: Context) -> stax.Layer:
    return stax.Identity()


@register(nn.Dropout)
@register(nn.Dropout1d)
@register(nn.Dropout2d)
@register(nn.Dropout3d)
def _dropout(module: nn.modules.dropout._DropoutNd, ctx: Context) -> stax.Layer:
    """Eval mode: Identity. Training mode: Dropout's kernel rule (see ``stax.Dropout``)."""
    if not module.training:
        return stax.Identity()
    return stax.Dropout(module.p, channelwise=not isinstance(module, nn.Dropout),
                        name=type(module).__name__)
