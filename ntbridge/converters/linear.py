"""Converters of affine layers: ``nn.Linear``."""

from torch import nn

from .. import stax
from .registry import Context, register


@register(nn.Linear)
def _linear(module: nn.Linear, ctx: Context) -> stax.Layer:
    return stax.Dense(module.in_features, module.out_features,
                      **ctx.affine(module.in_features, module.weight, module.bias))
