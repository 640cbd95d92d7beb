"""Converters of convolutions: ``nn.Conv1d``, ``nn.Conv2d``, ``nn.Conv3d``."""

from torch import nn

from .. import stax
from .registry import Context, register


@register(nn.Conv1d)
@register(nn.Conv2d)
@register(nn.Conv3d)
def _conv(module: nn.Conv1d | nn.Conv2d | nn.Conv3d, ctx: Context) -> stax.Layer:
    fan_in = module.weight[0].numel()  # in_channels / groups * prod(kernel_size)
    return stax.Conv(module.in_channels, module.out_channels, module.kernel_size,
                     stride=module.stride, padding=module.padding, dilation=module.dilation,
                     groups=module.groups, padding_mode=module.padding_mode,
                     **ctx.affine(fan_in, module.weight, module.bias))
