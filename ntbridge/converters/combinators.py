"""Modules standing for the combinations of a traced ``forward`` (:mod:`.trace`): sums, concatenations
and scalings by constants, with their converters. A sum's rule refuses to run when its branches
may be correlated (``Add.correlated`` says why), a concatenation's along positions too; their
forward passes and empirical kernels still work.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import stax
from ..errors import UnsupportedLayerError
from ..stax.layers import without_kernel
from .registry import Context, register


class Add(nn.Module):
    """``x1 + x2 + ...`` (a residual sum); ``correlated`` says why its kernel rule is not exact."""

    def __init__(self, correlated: str = ""):
        super().__init__()
        self.correlated = correlated

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return sum(xs[1:], xs[0])

    def extra_repr(self) -> str:
        return f"correlated={self.correlated!r}" if self.correlated else ""


class Concat(nn.Module):
    """``torch.cat(xs, dim)``; ``correlated`` says why the branches may be correlated."""

    def __init__(self, dim: int = 1, correlated: str = ""):
        super().__init__()
        self.dim, self.correlated = dim, correlated

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return torch.cat(xs, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}" + (f", correlated={self.correlated!r}" if self.correlated else "")


class Scale(nn.Module):
    """``c * x`` for a constant ``c``."""

    def __init__(self, c: float):
        super().__init__()
        self.c = c

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c * x

    def extra_repr(self) -> str:
        return f"c={self.c!r}"


@register(Add)
def _add_layer(module: Add, ctx: Context) -> stax.Layer:
    layer = stax.FanInSum()
    if not module.correlated:
        return layer

    return without_kernel(layer, (
        f"{module.correlated}, so the kernel of their sum is not the sum of their kernels. The "
        f"rule is exact when one branch ends in a Linear/Conv layer the other does not depend "
        f"on (h + Linear(relu(h))); restructure the block so, or use ntbridge.empirical_ntk."))


@register(Concat)
def _concat_layer(module: Concat, ctx: Context) -> stax.Layer:
    return along_positions_if_uncorrelated(stax.FanInConcat(module.dim), module.dim,
                                           module.correlated)


def along_positions_if_uncorrelated(layer: stax.Layer, dim: int, correlated: str,
                                    stacked: bool = False) -> stax.Layer:
    """``layer`` joining branches along ``dim`` (a new axis if ``stacked``), whose kernel rule
    refuses ``correlated`` branches when they are joined along positions in the full layout:
    their cross-covariances fill it, and are only known (zero) for uncorrelated branches. The
    channel average, and the diagonal layout's same-position covariances, need none."""
    if not correlated:
        return layer

    def kernel_fn(ks):
        axis = dim % (len(ks[0].shape1) + stacked)
        if axis != (1 if stacked else ks[0].channel_axis) and not ks[0].diagonal_spatial:
            raise UnsupportedLayerError(
                f"{correlated}, and {'stacked' if stacked else 'concatenated'} along positions "
                f"their cross-covariances enter the kernel, known only for uncorrelated branches "
                f"(each ending in a Linear/Conv layer the others do not depend on). Join them "
                f"along the channels, or use ntbridge.empirical_ntk / ntbridge.monte_carlo.")
        return layer.kernel_fn(ks)

    return layer._replace(kernel_fn=kernel_fn)


@register(Scale)
def _scale_layer(module: Scale, ctx: Context) -> stax.Layer:
    return stax.Scale(module.c)
