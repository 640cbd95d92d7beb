"""Converters of normalization layers: ``nn.LayerNorm``, ``nn.RMSNorm`` and
``nn.BatchNorm1d/2d/3d``."""

from __future__ import annotations

import torch
from torch import nn

from .. import stax
from ..stax.layers import without_kernel
from ..stax.sources import ChannelMap
from .registry import Context, register


def _constant(t: torch.Tensor | None) -> float | None:
    """The value of every entry of ``t`` (None if ``t`` is None, NaN if the entries differ)."""
    if t is None:
        return None
    t = t.detach()
    return t.flatten()[0].item() if bool((t == t.flatten()[0]).all()) else float("nan")


@register(nn.LayerNorm)
def _layer_norm(module: nn.LayerNorm, ctx: Context) -> stax.Layer:
    weight, bias = _constant(module.weight), _constant(module.bias)
    layer = stax.LayerNorm(tuple(module.normalized_shape), module.eps, weight, bias)
    return _affine_constants(layer, "LayerNorm", ctx, weight=weight, bias=bias)


@register(nn.RMSNorm)
def _rms_norm(module: nn.RMSNorm, ctx: Context) -> stax.Layer:
    weight = _constant(module.weight)
    eps = module.eps
    if eps is None:  # torch's default: the machine epsilon of the input's dtype (the module's)
        dtype = torch.float32 if module.weight is None else module.weight.dtype
        eps = torch.finfo(dtype).eps
    layer = stax.RMSNorm(tuple(module.normalized_shape), eps, weight)
    return _affine_constants(layer, "RMSNorm", ctx, weight=weight)


def rms_norm_of(weight: nn.Parameter | None, eps: float) -> nn.RMSNorm:
    """The ``nn.RMSNorm`` of the last axis computing ``x * rsqrt(mean(x**2, -1) + eps) * weight``
    (written out in a model), holding the model's ``weight`` itself (None: no weight)."""
    if weight is None:  # over the last axis, whatever its size (-1: see stax.RMSNorm)
        return nn.RMSNorm(-1, eps, elementwise_affine=False)
    module = nn.RMSNorm(tuple(weight.shape), eps, dtype=weight.dtype)
    module.weight = weight
    return module


def _affine_constants(layer: stax.Layer, kind: str, ctx: Context, **values: float | None
                      ) -> stax.Layer:
    """``layer`` of a norm whose affine parameters have ``values`` (NaN where they vary, which no
    kernel rule takes: the layer then has its forward only)."""
    ctx.hyper.update(values)  # the kernel depends on them: the signature has them
    varies = [name for name, v in values.items() if v is not None and v != v]
    if not varies:
        return layer
    return without_kernel(layer, (
        f"{kind}'s {' and '.join(varies)} vary across entries, so its output units are not "
        f"identically distributed and the analytic kernel has no rule for them; use "
        f"ntbridge.empirical_ntk for trained {kind} parameters."))


def _channel_constants(module: nn.BatchNorm1d) -> dict[str, torch.Tensor]:
    """Eval-mode ``module``'s constants per channel (float64): ``s = sqrt(running_var + eps)``,
    ``mu``, ``a = gamma / s``, ``d = beta - a mu``."""
    s = (module.running_var.detach().double() + module.eps).sqrt()
    mu = module.running_mean.detach().double()
    affine = lambda t, default: default(s) if t is None else t.detach().double()
    a = affine(module.weight, torch.ones_like) / s
    return {"s": s, "mu": mu, "a": a, "d": affine(module.bias, torch.zeros_like) - a * mu}


def _channel_map(module: nn.BatchNorm1d) -> ChannelMap:
    """Eval-mode ``module``'s map per channel, for the rules of nonlinearities after it."""
    values = {name: tuple(t.tolist()) for name, t in _channel_constants(module).items()}
    return ChannelMap(values["a"], values["d"], values["mu"], values["s"],
                      module.weight is not None, module.bias is not None)


class ChannelScale(nn.Module):
    """``x * gamma`` for the model's parameter ``gamma``, one scale per channel, ``(C, 1, ...,
    1)`` or ``(C,)`` for channels last (ConvNeXt's layer scale), registered here under its own
    attribute name ``name`` (so that its qualified name stays the model's)."""

    def __init__(self, name: str, parameter: nn.Parameter):
        super().__init__()
        self.name = name
        self.register_parameter(name, parameter)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * getattr(self, self.name)


@register(ChannelScale)
def _channel_scale(module: ChannelScale, ctx: Context) -> stax.Layer:
    gamma = getattr(module, module.name)
    values = tuple(gamma.detach().double().flatten().tolist())
    zeros = (0.0,) * len(values)
    cmap = ChannelMap(values, zeros, zeros, (1.0,) * len(values), gamma.requires_grad, False)
    ctx.hyper.update(channel_map=hash(cmap))  # the kernel depends on the values
    return stax.ChannelScale(module.name, tuple(gamma.shape), cmap)


@register(nn.BatchNorm1d)
@register(nn.BatchNorm2d)
@register(nn.BatchNorm3d)
@register(nn.SyncBatchNorm)
def _batch_norm(module: nn.BatchNorm1d, ctx: Context) -> stax.Layer:
    tensors = tuple(name for name, _ in (*module.named_parameters(), *module.named_buffers()))
    if module.training or module.running_mean is None:  # batch statistics
        return stax.BatchNorm(module.eps, None, tensors)
    cmap = _channel_map(module)
    moments = stax.ChannelMoments.of(cmap)
    # the kernel depends on the buffers: the signature has them
    ctx.hyper.update(moments._asdict(), channel_map=hash(cmap))
    return stax.BatchNorm(module.eps, moments, tensors, cmap)
