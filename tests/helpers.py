"""What several test modules share: relative errors (two formulas, named for the difference) and
the MLP builder."""

import numpy as np
import torch
from torch import nn


def frobenius_relative_error(a, b) -> float:
    """``|a - b| / |b|`` in the Frobenius norm (torch tensors)."""
    return (torch.linalg.norm(a - b) / torch.linalg.norm(b)).item()


def max_relative_error(a, b) -> float:
    """The largest difference relative to the largest entry of ``b``, ``max|a - b| / max|b|`` (torch
    tensors, or anything numpy reads)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return float(((a - b).abs().max() / b.abs().max()).detach())
    a, b = np.asarray(a), np.asarray(b)
    return float(np.abs(a - b).max() / np.abs(b).max())


def mlp(d_in: int, widths, d_out: int, act=nn.ReLU, bias: bool = True) -> nn.Sequential:
    """``nn.Linear`` layers of the given hidden widths, each followed by ``act`` (a module class,
    instantiated per layer, or one module instance used after every hidden layer), then a linear
    readout to ``d_out``. torch's default init, layers created in order (the same weights as
    ``nn.Sequential(nn.Linear(...), act(), ...)`` spelled out)."""
    layers, fan_in = [], d_in
    for width in widths:
        layers += [nn.Linear(fan_in, width, bias=bias), act if isinstance(act, nn.Module) else act()]
        fan_in = width
    return nn.Sequential(*layers, nn.Linear(fan_in, d_out, bias=bias))
