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
import sys
import types
from typing import TYPE_CHECKING

# JAX preallocates most of a GPU's memory on first use, starving torch in the same process.
# Unless the user configured it, ntbridge asks JAX to allocate on demand (see docs/scale.md, GPUs).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

__version__ = "0.1.0"

_EXPORTS = {  # public name -> (module, attribute)
    "Estimate": ("results", "Estimate"), "empirical_nngp": ("api", "empirical_nngp"),
    "empirical_ntk": ("api", "empirical_ntk"), "kernel": ("api", "kernel"),
    "expectation_error": ("api", "expectation_error"),
    "monte_carlo": ("api", "monte_carlo"), "sample_seed": ("api", "sample_seed"), "nngp": ("api", "nngp"), "ntk": ("api", "ntk"),
    "Graph": ("converters", "Graph"), "Kernels": ("results", "Kernels"),
    "convert": ("converters", "convert"), "register_converter": ("converters", "register"),
    "features": ("gp.features", "features"), "nystrom_features": ("gp.nystrom", "nystrom_features"),
    "linearize": ("linearize", "linearize"), "taylor_expand": ("linearize", "taylor_expand"),
}
_MODULES = ("analysis", "errors", "predict", "programs", "stax", "testing", "tiling")
_OPTIONAL = ("gpytorch",)  # modules of optional extras ("gp"): importable, not in __all__
_RENAMED = {"dynamics": "linearize"}  # former module names -> modules; not in __all__
__all__ = sorted([*_EXPORTS, *_MODULES])

if TYPE_CHECKING:  # what the lazy imports bind, for type checkers and editors
    from . import analysis, errors, predict, programs, stax, testing, tiling  # noqa: F401
    from .api import (empirical_nngp, empirical_ntk, expectation_error, kernel,  # noqa: F401
                      monte_carlo, nngp, ntk, sample_seed)
    from .converters import Graph, convert  # noqa: F401
    from .converters import register as register_converter  # noqa: F401
    from .gp.features import features  # noqa: F401
    from .gp.nystrom import nystrom_features  # noqa: F401
    from .linearize import linearize, taylor_expand  # noqa: F401
    from .results import Estimate, Kernels  # noqa: F401


def __getattr__(name: str):
    if name in _MODULES or name in _OPTIONAL or name in _RENAMED:
        return importlib.import_module(f"{__name__}.{_RENAMED.get(name, name)}")
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ntbridge' has no attribute {name!r}")
    module, attribute = _EXPORTS[name]
    value = getattr(importlib.import_module(f"{__name__}.{module}"), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


class _Package(types.ModuleType):
    """The package's module type: a submodule named like a public function (``linearize``) does
    not replace the function when it is first imported (Python binds submodules on their
    package); ``ntbridge.linearize`` stays the function, the module is ``sys.modules``'."""

    def __setattr__(self, name: str, value) -> None:
        if not (name in _EXPORTS and isinstance(value, types.ModuleType)):
            super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
