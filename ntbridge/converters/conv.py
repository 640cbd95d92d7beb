"""Converters of convolutions: ``nn.Conv1d/2d/3d`` and ``nn.ConvTranspose1d/2d/3d``."""

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


@register(nn.ConvTranspose1d)
@register(nn.ConvTranspose2d)
@register(nn.ConvTranspose3d)
def _conv_transpose(module: nn.ConvTranspose1d | nn.ConvTranspose2d | nn.ConvTranspose3d,
                    ctx: Context) -> stax.Layer:
    # torch's fan_in of a (in, out / groups, *k) weight: out / groups * prod(kernel_size), what its
    # default init and init="infer" read the variance against (torch allows padding_mode="zeros"
    # only, and forward's output_size is not passed by a Sequential or a traced call of the module)
    fan_in = module.weight[0].numel()
    return stax.ConvTranspose(module.in_channels, module.out_channels, module.kernel_size,
                              stride=module.stride, padding=module.padding,
                              output_padding=module.output_padding, dilation=module.dilation,
                              groups=module.groups,
                              **ctx.affine(fan_in, module.weight, module.bias))
