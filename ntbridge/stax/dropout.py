"""Dropout in training mode: its kernel rule (Neural Tangents' Dropout); eval mode is Identity."""

from __future__ import annotations

import jax.numpy as jnp

from ..errors import UnsupportedLayerError
from .features import refused
from .kernel import Kernel
from .layers import Layer


def _same_example(a: jnp.ndarray, factor: float, batch_pairs: bool, diagonal_spatial: bool,
                  channelwise: bool) -> jnp.ndarray:
    """``a`` with its same-mask entries multiplied by ``factor``: same example (the batch diagonal
    when ``batch_pairs``) and, unless ``channelwise``, same position."""
    mask = jnp.ones((), bool)
    if batch_pairs:
        mask = jnp.eye(a.shape[0], a.shape[1], dtype=bool).reshape(a.shape[:2] + (1,) * (a.ndim - 2))
    if not (channelwise or diagonal_spatial):
        first = 2 if batch_pairs else 1
        for axis in range(first, a.ndim, 2):
            n = a.shape[axis]
            shape = [1] * a.ndim
            shape[axis], shape[axis + 1] = n, n
            mask = mask & jnp.eye(n, dtype=bool).reshape(shape)
    return jnp.where(mask, a * factor, a)


def Dropout(p: float, channelwise: bool = False, name: str = "Dropout") -> Layer:
    """torch's ``nn.Dropout(p)`` in training mode (``channelwise``: ``nn.Dropout1d/2d/3d``, one mask
    per channel of each example).

    Kernel: each unit is multiplied by ``m / (1 - p)``, ``m`` Bernoulli(1 - p) independent per
    example and entry (per channel when ``channelwise``): ``E[m m'] / (1 - p)**2`` is ``1 / (1 - p)``
    for the same mask and 1 otherwise. So the entries that share a mask (an example with itself in
    ``cov1``/``cov2``, and on the batch diagonal of ``nngp``/``ntk`` when x2 is x1) are divided by
    ``1 - p``; the output is no longer Gaussian. The forward pass is random: ``apply_fn`` raises
    (call ``model.eval()`` for empirical kernels of the deterministic network).
    """
    if not 0 <= p < 1:
        raise UnsupportedLayerError(f"{name}(p={p}) in training mode has no kernel rule (p must be "
                                    f"in [0, 1)); call model.eval() or use p < 1.")
    factor = 1.0 / (1.0 - p)

    def apply_fn(params, x):
        raise UnsupportedLayerError(
            f"{name} in training mode is random; call model.eval() for the forward pass and the "
            f"empirical kernels (the analytic kernel of training-mode {name} is supported).")

    def kernel_fn(k: Kernel) -> Kernel:
        d = k.diagonal_spatial
        scale = lambda a, pairs: _same_example(a, factor, pairs, d, channelwise)
        diagonal = lambda a: scale(a, True) if k.x1_is_x2 else a
        return k.replace(nngp=diagonal(k.nngp), ntk=None if k.ntk is None else diagonal(k.ntk),
                         cov1=scale(k.cov1, False), cov2=scale(k.cov2, False), is_gaussian=False)

    return Layer(lambda key, shape: (tuple(shape), {}), apply_fn, kernel_fn, pairwise=False,
                 features=refused("dropout in training mode; call model.eval()."))
