"""Converters of resizing: ``nn.Upsample`` (and its ``UpsamplingNearest2d``/``UpsamplingBilinear2d``
subclasses), ``nn.PixelShuffle``, ``nn.PixelUnshuffle``."""

from torch import nn

from .. import stax
from .registry import Context, register


@register(nn.Upsample)
def _upsample(module: nn.Upsample, ctx: Context) -> stax.Layer:
    # the module's repr omits them, yet they change the kernel: the signature must have them
    ctx.hyper.update(align_corners=module.align_corners,
                     recompute_scale_factor=module.recompute_scale_factor)
    return stax.Upsample(module.size, module.scale_factor, module.mode, module.align_corners,
                         module.recompute_scale_factor, name=type(module).__name__)


@register(nn.PixelShuffle)
def _pixel_shuffle(module: nn.PixelShuffle, ctx: Context) -> stax.Layer:
    return stax.PixelShuffle(module.upscale_factor)


@register(nn.PixelUnshuffle)
def _pixel_unshuffle(module: nn.PixelUnshuffle, ctx: Context) -> stax.Layer:
    return stax.PixelUnshuffle(module.downscale_factor)
