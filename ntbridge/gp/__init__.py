"""Kernel methods on the analytic kernels: Gaussian processes and feature maps.

* :mod:`.gpytorch`: the NNGP and NTK as GPyTorch kernels (``NNGPKernel``, ``NTKKernel``), for
  GPyTorch's models and BoTorch's; GPyTorch is an optional extra (``pip install 'ntbridge[gp]'``),
  imported by that module only (users import it as ``ntbridge.gpytorch``).
* :mod:`.features`: random features ``phi (N, F)`` with ``phi @ phi.T ~ K``, built from each stax
  layer's feature map (``Layer.features``, beside its kernel rule), exported as
  ``ntbridge.features``.
* :mod:`.nystrom`: Nystrom features, the exact kernel projected onto landmarks' span, exported
  as ``ntbridge.nystrom_features``.
"""
