"""Converters of elementwise activations."""

from torch import nn

from .. import stax
from .registry import Context, register


@register(nn.ReLU)
def _relu(module: nn.ReLU, ctx: Context) -> stax.Layer:
    return stax.Relu()
