"""Nyström features: the exact kernel's features on the span of a set of landmark inputs.

For landmarks ``L`` ``(M, ...)`` (e.g. a random subset of the training inputs),
``phi(x) = K(x, L) V diag(lambda)^-1/2`` with ``K(L, L) = V diag(lambda) V^T``, so that
``phi(x) phi(y)^T = K(x, L) K(L, L)^+ K(L, y)``: the kernel projected onto the landmarks' span,
exact for ``x`` or ``y`` among the landmarks. Unlike random features (:func:`ntbridge.features`),
whose error falls as ``F**-1/2`` whatever the data, the projection keeps the kernel's leading
directions on the data, so a few thousand landmarks give kernel regression within a few percent of
the exact kernel's (``benchmarks/features.py``), for any model the analytic kernels take.
Each example costs ``M`` kernel entries: ``N x M`` in all, never ``N x N``.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ..api import kernel
from ..errors import InputError, ShapeError
from ..pipeline import validate
from ..results import Kernels


def _projection(k_ll: torch.Tensor, rcond: float) -> torch.Tensor:
    """``V diag(lambda)^-1/2`` ``(M, M)`` (float64) of the landmarks' kernel, the directions of
    eigenvalues below ``rcond * lambda_max`` left out (their columns zero, so that every call
    with the same landmarks gives features of the same width)."""
    values, vectors = torch.linalg.eigh(k_ll.double())
    kept = values > rcond * values.max()
    return vectors * torch.where(kept, values, 1).rsqrt() * kept


def nystrom_features(model: nn.Module, x: torch.Tensor, landmarks: torch.Tensor, *,
                     get: str | Sequence[str] = "nngp", rcond: float = 1e-10,
                     chunk_size: int = 8192, **kernel_options) -> torch.Tensor | Kernels:
    """Nyström features ``phi (N, M)`` of ``model``'s analytic kernels on the landmarks:
    ``phi(x) @ phi(y).T = K(x, L) K(L, L)^+ K(L, y)`` (module doc).

    Args:
      model: any model :func:`ntbridge.kernel` takes analytically.
      x: ``(N, *input_shape)``, finite; ``phi`` takes the kernels' dtype (float64 for float64
        inputs, else float32) and x's device.
      landmarks: ``(M, *input_shape)``, e.g. ``x_train[torch.randperm(len(x_train))[:2048]]``.
        Compute train and test features with the same landmarks: they then belong to one kernel.
      get: ``"nngp"``, ``"ntk"``, or a tuple of both (then a :class:`~ntbridge.Kernels` record).
      rcond: eigenvalues of ``K(L, L)`` below ``rcond`` times the largest are left out (their
        columns of ``phi`` are zero), e.g. those of repeated landmarks.
      chunk_size: examples of x whose kernel with the landmarks is computed at once (memory
        ``chunk_size * M`` entries beside the result).
      kernel_options: as :func:`ntbridge.kernel` (``parameterization``, ``init``, ``W_std``,
        ``progress``, ...).

    Example:
        >>> landmarks = x_train[torch.randperm(len(x_train))[:2048]]
        >>> phi = ntbridge.nystrom_features(model, x_train, landmarks)   # (N, 2048)
        >>> phi_test = ntbridge.nystrom_features(model, x_test, landmarks)
    """
    names = (get,) if isinstance(get, str) else tuple(get)  # checked by ntbridge.kernel
    validate(x, landmarks, names=("x", "landmarks"))  # named as the user knows them
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise InputError(f"chunk_size must be a positive integer, got {chunk_size!r}.")
    k_ll = kernel(model, landmarks, get=names, **kernel_options)
    shape = getattr(k_ll, names[0]).shape
    if len(shape) != 2:
        raise ShapeError(f"the kernels have shape {tuple(shape)}: the model's output has positions; "
                         f"Nyström features need (N1, N2) kernels: end the model in a Linear or a "
                         f"pooling and Flatten.")
    projections = {n: _projection(getattr(k_ll, n), rcond) for n in names}
    values = {}
    for start in range(0, len(x), chunk_size):
        k_xl = kernel(model, x[start:start + chunk_size], landmarks, get=names, **kernel_options)
        for name in names:
            k = getattr(k_xl, name)
            phi = values.setdefault(name, k.new_empty((len(x), len(landmarks))))
            phi[start:start + len(k)] = k @ projections[name].to(k.dtype)
    return Kernels.pick(values, get)
