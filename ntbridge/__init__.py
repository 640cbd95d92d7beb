"""ntbridge: the infinite-width and empirical NTK/NNGP kernels of PyTorch models, computed in JAX.

Example:
    >>> import torch, ntbridge
    >>> model = torch.nn.Sequential(torch.nn.Linear(3, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
    >>> x = torch.randn(8, 3)
    >>> ntbridge.ntk(model, x).shape
    torch.Size([8, 8])
"""

from . import analysis, errors, predict, programs, stax, testing, tiling
from .api import Estimate, empirical_nngp, empirical_ntk, kernel, monte_carlo, nngp, ntk
from .converters import Graph, Kernels, convert
from .converters import register as register_converter

__version__ = "0.1.0"

__all__ = ["Estimate", "Graph", "Kernels", "analysis", "convert", "monte_carlo", "predict", "programs", "testing", "empirical_nngp", "empirical_ntk", "errors", "kernel",
           "nngp", "ntk", "register_converter", "stax", "tiling"]
