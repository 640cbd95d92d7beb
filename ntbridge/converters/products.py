"""Products of tensors in a traced ``forward`` (``a * b``, ``torch.mul(a, b)``, ``a.mul(b)``), e.g.
the gates of GLU/SwiGLU blocks ``F.silu(fc1(x)) * fc2(x)``: the module standing for them and its
converter, ``stax.FanInProd`` (the product of kernels), or a refusal naming why the factors may be
dependent (:func:`~.trace.independence.dependent` works it out from the converted nodes).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .. import stax
from ..stax.layers import without_kernel
from .registry import Context, register


class Multiply(nn.Module):
    """``x1 * x2 * ...``; ``dependent`` says why its kernel rule would not be exact."""

    def __init__(self, dependent: str = ""):
        super().__init__()
        self.dependent = dependent

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return math.prod(xs[1:], start=xs[0])

    def extra_repr(self) -> str:
        return f"dependent={self.dependent!r}" if self.dependent else ""


@register(Multiply)
def _multiply(module: Multiply, ctx: Context) -> stax.Layer:
    layer = stax.FanInProd()
    if not module.dependent:
        return layer
    return without_kernel(layer, (
        f"{module.dependent}, so the kernel of their product is not the product of their "
        f"kernels. It is exact for factors that each start with a Linear/Conv layer of their own "
        f"after the tensors they share (F.silu(fc1(x)) * fc2(x)), all but one with identically "
        f"distributed channels; otherwise use ntbridge.empirical_ntk for the finite model's "
        f"kernel or ntbridge.monte_carlo for the infinite-width one."))
