"""Preconditioned conjugate gradients for kernel systems ``(K + s I) X = B`` with many right-hand
sides, reading the kernel in row blocks (:class:`.operator.KernelOperator`): the kernel may be a
file on disk (``ntbridge.kernel(..., out=path)``), and the memory used is a few row blocks plus a
handful of ``(n, c)`` vectors and the preconditioner's ``(n, rank)`` factor.

The columns are solved side by side, each with its own step lengths and stopping test, sharing one
pass over the kernel per iteration (the cost that matters when the kernel is read from disk).
A block Krylov method (one space for all columns) can take fewer iterations, but needs deflation
when columns become dependent; the kernels' spectra are handled by the preconditioner instead.

Preconditioner: a partial pivoted Cholesky factor ``L (n, rank)`` of ``K`` (greedy on the largest
remaining diagonal entry; each step reads one row), applied as ``P = L L^T + d I`` by the Woodbury
identity, with ``d = s + mean(diag(K - L L^T))``: NNGP/NTK kernels of high-dimensional inputs are
about a low-rank part plus a multiple of the identity, which ``d`` stands in for (measured against
``d = s`` and Jacobi in the benchmarks' README). ``rank = 0`` gives Jacobi (``P = diag(K) + s``).

Stopping rule: per column, ``|b - A x| / |b| <= tol`` for the *true* residual: when the
recursively updated residual passes the test, the residual is recomputed and CG restarts from
``x`` if rounding left it above ``tol``. A solve that has not met ``tol`` within ``max_iter``
iterations raises :class:`ntbridge.errors.ConvergenceError` with the residual reached, never a
silent answer. The solution's relative error is at most ``cond(A) * tol``.

Not differentiable by torch autograd (use the dense solvers for gradients).

Example:
    >>> x, info = solve(k, y, shift=1e-3, tol=1e-8)       # k (n, n), y (n, c): (k + 1e-3 I) x = y
    >>> info.iterations, info.residual.max()
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..errors import ConvergenceError, InputError
from .operator import KernelOperator


class Info(NamedTuple):
    """How a solve went: ``iterations`` (conjugate-gradient steps, restarts included),
    ``products`` (passes over the kernel: the steps plus a check of the true residual per
    restart), ``residual (c,)`` the true relative residual of each column, ``rank`` of the
    preconditioner."""

    iterations: int
    products: int
    residual: torch.Tensor
    rank: int


def default_tol(dtype: torch.dtype) -> float:
    """The default relative residual: 1e-6 for float64 kernels, 1e-4 for float32 ones (whose
    entries are already rounded to ~1e-7 relative, so that a smaller residual rarely changes
    predictions; smaller values are reachable, the arithmetic being float64)."""
    return 1e-6 if dtype == torch.float64 else 1e-4


def check_settings(tol: float, max_iter: int, rank: int) -> None:
    if not 0 < tol < 1:
        raise InputError(f"tol must be in (0, 1) (a relative residual), got {tol!r}.")
    if int(max_iter) != max_iter or max_iter < 1:
        raise InputError(f"max_iter must be a positive integer, got {max_iter!r}.")
    if int(rank) != rank or rank < 0:
        raise InputError(f"preconditioner_rank must be an integer >= 0, got {rank!r}.")


def pivoted_cholesky(a: KernelOperator, rank: int, rel_tol: float = 1e-10) -> torch.Tensor:
    """``L (n, r)``, ``r <= rank``, with ``L L^T`` the greedy partial Cholesky factorisation of the
    kernel (without the shift): each step takes the largest remaining diagonal entry as the pivot
    and reads its row. Stops early when that entry falls below ``rel_tol * max(diag)``."""
    diag = a.k.diagonal().to(a.dtype).clone()
    factor = torch.zeros(a.n, min(rank, a.n), dtype=a.dtype, device=a.k.device)
    top = float(diag.max()) if a.n else 0.0
    for j in range(factor.shape[1]):
        pivot = int(diag.argmax())
        if not diag[pivot] > rel_tol * top:
            return factor[:, :j]
        row = a.rows_of(torch.tensor([pivot], device=a.k.device))[0]
        row = row - factor[:, :j] @ factor[pivot, :j]
        factor[:, j] = row / diag[pivot].sqrt()
        diag -= factor[:, j] ** 2
        diag[pivot] = 0.0
    return factor


class Preconditioner:
    """``P^-1 v`` for ``P = L L^T + d I`` by the Woodbury identity (``L`` empty: ``P = diag(A)``).

    Args:
      a: the operator ``K + s I``.
      rank: the pivoted Cholesky's rank (0: Jacobi).
    """

    def __init__(self, a: KernelOperator, rank: int):
        self.factor = pivoted_cholesky(a, rank)
        self.rank = self.factor.shape[1]
        residual = a.k.diagonal().to(a.dtype) - (self.factor ** 2).sum(1)
        self.d = a.shift + float(residual.clamp_min(0).mean()) if a.n else 1.0
        if self.rank == 0 or not self.d > 0:  # Jacobi
            self.rank, self.jacobi = 0, a.diagonal().clamp_min(torch.finfo(a.dtype).tiny)
            return
        core = self.factor.T @ self.factor
        self.core = torch.linalg.cholesky(core + self.d * torch.eye(self.rank, dtype=a.dtype,
                                                                    device=core.device))

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        if self.rank == 0:
            return v / self.jacobi[:, None]
        inner = torch.cholesky_solve(self.factor.T @ v, self.core)
        return (v - self.factor @ inner) / self.d


def solve(k: torch.Tensor, b: torch.Tensor, *, shift: float = 0.0, tol: float | None = None,
          max_iter: int = 1000, preconditioner_rank: int = 300,
          block_rows: int | None = None) -> tuple[torch.Tensor, Info]:
    """``X = (k + shift I)^-1 B`` by preconditioned conjugate gradients.

    Args:
      k: symmetric positive semi-definite ``(n, n)`` (in memory or mapped from disk).
      b: right-hand sides ``(n, c)``.
      shift: ``s >= 0`` added to the diagonal (absolute).
      tol: relative residual per column (default :func:`default_tol` of ``k``'s dtype).
      max_iter: iterations (passes over ``k``) allowed, restarts included.
      preconditioner_rank: rank of the pivoted Cholesky preconditioner (0: Jacobi).
      block_rows: rows of ``k`` read at once (default: 8 MiB of float64 rows).

    Returns:
      ``X (n, c)`` in float64 (the arithmetic's dtype, whatever ``k``'s: see
      :class:`.operator.KernelOperator`), and an :class:`Info`.

    Raises:
      ConvergenceError: ``tol`` not met within ``max_iter`` iterations.
      InputError: bad settings, or ``k`` is not positive definite (a direction of negative
        curvature).
    """
    tol = default_tol(k.dtype) if tol is None else tol
    check_settings(tol, max_iter, preconditioner_rank)
    a = KernelOperator(k, shift, block_rows=block_rows)
    precondition = Preconditioner(a, preconditioner_rank)
    return iterate(a, b.to(k.device, a.dtype), precondition, tol, max_iter)


def iterate(a: KernelOperator, b: torch.Tensor, precondition: Preconditioner, tol: float,
            max_iter: int) -> tuple[torch.Tensor, Info]:
    """The conjugate-gradient iterations, column by column side by side, with restarts from the
    true residual (see the module's docstring)."""
    norm_b = b.norm(dim=0)
    norm_b = torch.where(norm_b > 0, norm_b, 1)
    target = tol * norm_b
    x = torch.zeros_like(b)
    residual = b.clone()
    iterations, restarts = 0, 0
    while True:
        relative = residual.norm(dim=0) / norm_b
        if not bool(torch.isfinite(relative).all()):
            raise InputError("conjugate gradients met non-finite values; check that the train "
                             "kernel and the targets are finite.")
        active = relative > tol
        if not bool(active.any()):
            return x, Info(iterations, a.products, relative, precondition.rank)
        if iterations >= max_iter or restarts > 10:
            raise not_converged(relative, tol, iterations, max_iter, a.dtype, restarts > 10)
        x, iterations = cg_run(a, x, residual, active, precondition, target, max_iter,
                               iterations)
        residual = b - a.matmul(x)  # the true residual
        restarts += 1


def cg_run(a: KernelOperator, x: torch.Tensor, r: torch.Tensor,
           active: torch.Tensor, precondition: Preconditioner, target: torch.Tensor,
           max_iter: int, iterations: int) -> tuple[torch.Tensor, int]:
    """Conjugate gradients from ``x`` with residual ``r`` on the ``active`` columns until each
    column's recursive residual is below ``target`` (or ``max_iter``); returns ``x`` and the
    iteration count."""
    x, r = x.clone(), r[:, active]
    z = precondition(r)
    p, rz = z.clone(), (r * z).sum(0)
    cols = active.nonzero().ravel()
    while iterations < max_iter:
        ap = a.matmul(p)
        iterations += 1
        curvature = (p * ap).sum(0)
        if bool((curvature <= 0).any()):
            raise InputError("the train kernel (plus diag_reg) is not positive definite: "
                             "conjugate gradients met a direction of non-positive curvature; pass "
                             "diag_reg > 0, or check that it is the kernel of the training inputs "
                             "with themselves.")
        alpha = rz / curvature
        x[:, cols] += alpha * p
        r = r - alpha * ap
        going = r.norm(dim=0) > target[cols]
        if not bool(going.any()):
            break
        if not bool(going.all()):  # drop the columns that are done
            cols, r, p, rz = cols[going], r[:, going], p[:, going], rz[going]
        z = precondition(r)
        rz_new = (r * z).sum(0)
        p = z + (rz_new / rz) * p
        rz = rz_new
    return x, iterations


def not_converged(residual: torch.Tensor, tol: float, iterations: int, max_iter: int,
                  dtype: torch.dtype, stalled: bool) -> ConvergenceError:
    """The error of a solve that did not reach ``tol``."""
    worst = float(residual.max())
    why = (f"its true residual stalled at {worst:.3g} > tol = {tol:.3g} after {iterations} "
           f"iterations (rounding in {str(dtype).replace('torch.', '')} limits it)" if stalled else
           f"it reached a relative residual |b - A x| / |b| of {worst:.3g} > tol = {tol:.3g} "
           f"within max_iter = {max_iter} iterations")
    return ConvergenceError(
        f"conjugate gradients did not converge: {why} (worst of {residual.numel()} columns). "
        f"Raise max_iter or the preconditioner's rank, raise diag_reg (the kernel's condition "
        f"number sets the iterations), compute the kernel in float64, or use the dense solver "
        f"(gp_inference's solver='cholesky', the ensemble's solver='eigh').", residual=worst,
        iterations=iterations)
