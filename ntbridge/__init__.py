"""ntbridge: the infinite-width and empirical NTK/NNGP kernels of PyTorch models, computed in JAX.

Example:
    >>> import torch, ntbridge
    >>> model = torch.nn.Sequential(torch.nn.Linear(3, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
    >>> x = torch.randn(8, 3)
    >>> ntbridge.ntk(model, x).shape
    torch.Size([8, 8])

The public names below are imported on first use, so that ``import ntbridge`` (and the
``ntbridge`` command's ``--help``) loads neither torch nor JAX until a kernel is asked for.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING

# JAX preallocates most of a GPU's memory on first use, starving torch in the same process.
# Unless the user configured it, ntbridge asks JAX to allocate on demand (see the README).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

__version__ = "0.1.0"

_EXPORTS = {  # public name -> (module, attribute)
    "Estimate": ("results", "Estimate"), "empirical_nngp": ("api", "empirical_nngp"),
    "empirical_ntk": ("api", "empirical_ntk"), "kernel": ("api", "kernel"),
    "expectation_error": ("api", "expectation_error"),
    "monte_carlo": ("api", "monte_carlo"), "nngp": ("api", "nngp"), "ntk": ("api", "ntk"),
    "Graph": ("converters", "Graph"), "Kernels": ("results", "Kernels"),
    "convert": ("converters", "convert"), "register_converter": ("converters", "register"),
    "features": ("gp.features", "features"), "nystrom_features": ("gp.nystrom", "nystrom_features"),
    "linearize": ("dynamics", "linearize"), "taylor_expand": ("dynamics", "taylor_expand"),
}
_MODULES = ("analysis", "dynamics", "errors", "predict", "programs", "stax", "testing", "tiling")
_OPTIONAL = ("gpytorch",)  # modules of optional extras ("gp"): importable, not in __all__
__all__ = sorted([*_EXPORTS, *_MODULES])

if TYPE_CHECKING:  # what the lazy imports bind, for type checkers and editors
    from . import analysis, dynamics, errors, predict, programs, stax, testing, tiling  # noqa: F401
    from .api import (empirical_nngp, empirical_ntk, expectation_error, kernel,  # noqa: F401
                      monte_carlo, nngp, ntk)
    from .converters import Graph, convert  # noqa: F401
    from .converters import register as register_converter  # noqa: F401
    from .dynamics import linearize, taylor_expand  # noqa: F401
    from .gp.features import features  # noqa: F401
    from .gp.nystrom import nystrom_features  # noqa: F401
    from .results import Estimate, Kernels  # noqa: F401


def __getattr__(name: str):
    if name in _MODULES or name in _OPTIONAL:
        return importlib.import_module(f"{__name__}.{name}")
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ntbridge' has no attribute {name!r}")
    module, attribute = _EXPORTS[name]
    value = getattr(importlib.import_module(f"{__name__}.{module}"), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
