"""The GPyTorch/BoTorch kernels of :mod:`ntbridge.gp.gpytorch`, under the name users import them by
(``from ntbridge.gpytorch import NTKKernel``; GPyTorch: ``pip install 'ntbridge[gp]'``)."""

from .gp.gpytorch import TESTED_VERSIONS, NNGPKernel, NTKKernel, check_version

__all__ = ["NNGPKernel", "NTKKernel", "TESTED_VERSIONS", "check_version"]
