"""What the predictors check of their arguments, and the one layout of outputs they share.

A train kernel is ``(n, n)``, per output unit (the full kernel is ``K ⊗ I``, as ``ntbridge.ntk``
gives it), or ``(n, n, O, O)``, over output units too (``ntbridge.empirical_ntk(...,
trace_axes=())``). Either way the solvers work with one matrix and columns of values: an
``(n, n)`` kernel acts on each of the ``O`` columns of ``(n, O)`` targets; an ``(n, n, O, O)``
kernel is the ``(n O, n O)`` matrix acting on the targets flattened to one column.

Example:
    >>> layout = Layout.of(torch.zeros(5, 5, 2, 2), torch.zeros(5, 2))
    >>> layout.flat(torch.zeros(5, 2)).shape
    torch.Size([10, 1])
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..errors import InputError


def diagonal_shift(k: torch.Tensor, diag_reg: float) -> torch.Tensor | float:
    """``diag_reg * mean(diag(k))``, the absolute shift ``diag_reg`` stands for (the regularizer is
    relative to the kernel's scale); reads the diagonal only, and not at all for ``diag_reg = 0``."""
    if not diag_reg >= 0:
        raise InputError(f"diag_reg must be >= 0, got {diag_reg}.")
    return diag_reg * torch.diagonal(k).mean() if diag_reg else 0.0


def regularized(k: torch.Tensor, diag_reg: float) -> torch.Tensor:
    """``k + diag_reg * mean(diag(k)) * I`` (see :func:`diagonal_shift`)."""
    shift = diagonal_shift(k, diag_reg)
    return k + shift * torch.eye(k.shape[0], dtype=k.dtype, device=k.device)


def computable(*kernels: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """The kernels in a dtype torch's linear algebra takes: float16 and bfloat16 become float32
    (ntbridge's kernel functions compute and return those inputs in float32 too); others, and
    None, pass unchanged.

    Example:
        >>> computable(torch.eye(2, dtype=torch.float16), None)[0].dtype
        torch.float32
    """
    low = (torch.float16, torch.bfloat16)
    return tuple(k.float() if k is not None and k.dtype in low else k for k in kernels)


def spectrum(name: str, k: torch.Tensor, diag_reg: float,
             limit: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenvalues ``(n,)`` (ascending) and eigenvectors ``(n, n)`` of ``k`` regularized by
    ``diag_reg``, checked: positive semi-definite up to rounding, and positive definite when the
    ``t = inf`` ``limit`` is asked (it inverts ``k``)."""
    lam, vecs = torch.linalg.eigh(regularized(k, diag_reg))
    if lam[0] < -tolerance(k) * lam[-1].abs():
        raise InputError(f"{name} is not positive semi-definite (eigenvalues from "
                         f"{lam[0].item():.3g} to {lam[-1].item():.3g}); pass a kernel matrix of "
                         f"the training inputs (diag_reg > 0 lifts rounding errors).")
    if limit and lam[0] <= 0:
        raise InputError(f"{name} is singular, so the t=inf limit is undefined; pass diag_reg > 0 "
                         f"(e.g. 1e-6).")
    return lam, vecs


def check_blocks(k_train_train: torch.Tensor, y_train: torch.Tensor,
                 k_test_train: torch.Tensor) -> torch.Tensor:
    """The targets as ``(n, k)`` after checking that the per-unit blocks fit them."""
    n = k_train_train.shape[0]
    if k_train_train.shape != (n, n):
        raise InputError(f"k_train_train must be square, got {tuple(k_train_train.shape)}.")
    if y_train.shape[0] != n:
        raise InputError(f"y_train has {y_train.shape[0]} rows but k_train_train is {n} x {n}.")
    if k_test_train.shape[1] != n:
        raise InputError(f"k_test_train must be (m, {n}), got {tuple(k_test_train.shape)}.")
    return y_train.reshape(n, -1).to(k_train_train.dtype)


def finite(name: str, value: torch.Tensor) -> None:
    if not bool(torch.isfinite(value).all()):
        raise InputError(f"{name} has non-finite entries (nan or inf); compute it in float64, or "
                         f"check the model's outputs and weights.")


def tolerance(k: torch.Tensor) -> float:
    """Relative size of rounding allowed in a kernel's symmetry and eigenvalues: ``sqrt(eps)``
    (float64 1.5e-8, float32 3.5e-4), well above the rounding of a kernel computed in that dtype."""
    return torch.finfo(k.dtype).eps ** 0.5


class Layout(NamedTuple):
    """``n`` training points, ``outputs`` output units; ``full``: the kernel is ``(n, n, O, O)``."""

    n: int
    outputs: int
    full: bool

    @staticmethod
    def of_kernel(k_train_train: torch.Tensor) -> Layout:
        """The layout of a train kernel ``(n, n)`` or ``(n, n, O, O)``, checked (one output unit
        for ``(n, n)`` until targets say how many)."""
        if not isinstance(k_train_train, torch.Tensor) or not k_train_train.is_floating_point():
            raise InputError("k_train_train must be a floating-point torch tensor, got "
                             f"{getattr(k_train_train, 'dtype', type(k_train_train).__name__)}.")
        shape, n = tuple(k_train_train.shape), k_train_train.shape[0]
        if len(shape) not in (2, 4) or shape[:2] != (n, n) or shape[2:3] != shape[3:4]:
            raise InputError(f"k_train_train must be (n, n) or (n, n, O, O), got {shape}.")
        return Layout(n, shape[2] if len(shape) == 4 else 1, len(shape) == 4)

    @staticmethod
    def of(k_train_train: torch.Tensor, y_train: torch.Tensor) -> Layout:
        """The layout of a train kernel and its targets ``(n,)`` or ``(n, O)``, checked."""
        n, outputs, full = Layout.of_kernel(k_train_train)
        if not isinstance(y_train, torch.Tensor) or y_train.ndim not in (1, 2) or len(y_train) != n:
            raise InputError(f"y_train must be a tensor (n,) or (n, O) with n = {n} (the rows of "
                             f"k_train_train), got {tuple(getattr(y_train, 'shape', ()))}.")
        if full and (y_train.shape[1] if y_train.ndim == 2 else 1) != outputs:
            raise InputError(f"y_train must be ({n}, {outputs}) for k_train_train of shape "
                             f"{tuple(k_train_train.shape)}, got {tuple(y_train.shape)}.")
        finite("y_train", y_train)
        return Layout(n, y_train.shape[1] if y_train.ndim == 2 else 1, full)

    def flat(self, f: torch.Tensor) -> torch.Tensor:
        """``(rows, O)`` values as the solvers' columns: ``(rows, O)``, or ``(rows O, 1)``."""
        return f.reshape(-1, 1) if self.full else f

    def values(self, columns: torch.Tensor) -> torch.Tensor:
        """The inverse of :meth:`flat`: ``(..., rows, O)``."""
        return columns.reshape(*columns.shape[:-2], -1, self.outputs)

    def matrix(self, name: str, k: torch.Tensor, rows: int | None = None) -> torch.Tensor:
        """A kernel against the training points as the solvers' matrix ``(rows [O], n [O])``,
        checked for its shape and finiteness (``rows`` None: the train kernel, also symmetry)."""
        expected = (rows or self.n, self.n, *((self.outputs,) * 2 * self.full))
        if tuple(k.shape) != expected:
            raise InputError(f"{name} must be {expected} to fit k_train_train and y_train, got "
                             f"{tuple(k.shape)}.")
        finite(name, k)
        if self.full:
            k = k.permute(0, 2, 1, 3).reshape(expected[0] * self.outputs, self.n * self.outputs)
        if rows is None:
            asymmetry = (k - k.T).abs().max()
            if asymmetry > tolerance(k) * k.abs().max():
                raise InputError(f"{name} is not symmetric (largest |K - K^T| is "
                                 f"{asymmetry.item():.3g}); pass the kernel of the training "
                                 f"inputs with themselves.")
        return k

    def initial(self, name: str, f0: torch.Tensor | None, rows: int,
                like: torch.Tensor) -> torch.Tensor:
        """The outputs at time 0 as columns (zeros when None: the infinite ensemble's mean)."""
        if f0 is None:
            return self.flat(torch.zeros(rows, self.outputs, dtype=like.dtype, device=like.device))
        if f0.ndim == 0 or tuple(f0.reshape(f0.shape[0], -1).shape) != (rows, self.outputs):
            raise InputError(f"{name} must be ({rows}, {self.outputs}) like the targets, got "
                             f"{tuple(f0.shape)}.")
        finite(name, f0)
        return self.flat(f0.reshape(rows, self.outputs).to(like.dtype))
