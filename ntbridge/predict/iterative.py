"""``solver="cg"`` for :func:`.gp.gp_inference` and :func:`.gp.gradient_descent_mse_ensemble`:
the same predictions by products with the kernels only, read in row blocks, so that kernels on
disk (``ntbridge.kernel(..., out=path)``) larger than memory work, and no ``O(n^3)`` step is taken.

* ``t = inf`` (and GP inference): ``(K + s I)^-1`` times the targets (and, for the covariance,
  times the columns of ``K(test, train)^T``) by preconditioned conjugate gradients, :mod:`.cg`.
* finite ``t``: ``A^-1 (I - exp(-lr t A))`` times the same columns by the Lanczos process,
  :mod:`.lanczos`, for all finite times at once.

Arithmetic in float64 whatever the kernels' dtype; results in the train kernel's dtype. Not
differentiable by torch autograd (the dense solvers are).

Example:
    >>> pred = gp_inference(k_tt, y, k_st, diag_reg=1e-3, solver="cg", tol=1e-8)
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..errors import InputError
from . import cg, lanczos
from .checks import diagonal_shift
from .operator import matmul_rows


class Settings(NamedTuple):
    """The iterative solvers' stopping rule: relative ``tol``, ``max_iter`` steps, and the rank of
    the conjugate gradients' preconditioner (:func:`.cg.solve`'s keyword arguments)."""

    tol: float
    max_iter: int
    preconditioner_rank: int


def settings(solver: str, dense: str, dtype: torch.dtype, tol: float | None,
             max_iter: int | None, preconditioner_rank: int | None) -> Settings | None:
    """The settings of ``solver="cg"`` (None for the function's ``dense`` solver), checked."""
    if solver not in (dense, "cg"):
        other = ("; the ensemble's dense solver is 'eigh' (finite times need the eigenvalues)"
                 if solver == "cholesky" else "")
        raise InputError(f"solver must be {dense!r} or 'cg', got {solver!r}{other}.")
    given = {"tol": tol, "max_iter": max_iter, "preconditioner_rank": preconditioner_rank}
    if solver == dense:
        if named := [name for name, value in given.items() if value is not None]:
            verb = "applies" if len(named) == 1 else "apply"
            raise InputError(f"{', '.join(named)} {verb} to solver='cg' only; the dense solver "
                             f"({dense!r}) is exact.")
        return None
    chosen = Settings(cg.default_tol(dtype) if tol is None else tol,
                      1000 if max_iter is None else max_iter,
                      300 if preconditioner_rank is None else preconditioner_rank)
    cg.check_settings(*chosen)
    return chosen


def columns(y: torch.Tensor, k_test_train: torch.Tensor, covariance: bool) -> torch.Tensor:
    """The right-hand sides ``[y | K(test, train)^T]`` ``(n, c [+ m])``, float64."""
    y = y.to(k_test_train.device, torch.float64)
    return torch.cat([y, k_test_train.T.to(torch.float64)], 1) if covariance else y


def gp_inference(k_train_train: torch.Tensor, y: torch.Tensor, k_test_train: torch.Tensor,
                 k_test_test: torch.Tensor | None, diag_reg: float,
                 how: Settings) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The posterior mean ``(m, c)`` and covariance ``(m, m)`` (or None) by conjugate gradients."""
    rhs = columns(y, k_test_train, k_test_test is not None)
    x, _ = cg.solve(k_train_train, rhs, shift=float(diagonal_shift(k_train_train, diag_reg)),
                    **how._asdict())
    dtype, c = k_train_train.dtype, y.shape[1]
    mean = matmul_rows(k_test_train, x[:, :c]).to(dtype)
    if k_test_test is None:
        return mean, None
    cov = k_test_test.to(torch.float64) - matmul_rows(k_test_train, x[:, c:])
    return mean, ((cov + cov.T) / 2).to(dtype)


def transients(k: torch.Tensor, rhs: torch.Tensor, when: torch.Tensor, lr: float,
               diag_reg: float, how: Settings) -> torch.Tensor:
    """``A^-1 (I - exp(-lr t A)) rhs`` ``(T, n, c)`` for each time of ``when (T,)`` (``inf``: the
    solve, 0: zeros), with ``A`` the train kernel plus its regularisation; float64."""
    s = float(diagonal_shift(k, diag_reg))
    out = torch.zeros(len(when), *rhs.shape, dtype=torch.float64, device=k.device)
    when = when.to(k.device)
    infinite, finite = torch.isinf(when), (when > 0) & torch.isfinite(when)
    if bool(infinite.any()):
        x, _ = cg.solve(k, rhs, shift=s, **how._asdict())
        out[infinite] = x
    if bool(finite.any()):
        fx, _ = lanczos.flow_solve(k, rhs, lr, when[finite], shift=s, tol=how.tol,
                                   max_iter=how.max_iter)
        out[finite] = fx
    return out


def ensemble(ntk_train_train: torch.Tensor, y: torch.Tensor, ntk_test_train: torch.Tensor,
             when: torch.Tensor, lr: float, diag_reg: float, nngp: tuple | None,
             how: Settings) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The ensemble's mean ``(T, m, c)`` and covariance ``(T, m, m)`` (``nngp``: the train, test-
    train and test-test NNGPs, or None) at the times ``when (T,)``, by CG and Lanczos."""
    g = transients(ntk_train_train, columns(y, ntk_test_train, nngp is not None), when, lr,
                   diag_reg, how)
    c, dtype = y.shape[1], ntk_train_train.dtype
    mean = torch.stack([matmul_rows(ntk_test_train, gt[:, :c]) for gt in g]).to(dtype)
    if nngp is None:
        return mean, None
    k_train, k_cross, k_test = nngp
    covs = []
    for gt in g:
        p_t = gt[:, c:]                                    # P^T = f(A) K_ntk(test, train)^T
        spread = p_t.T @ matmul_rows(k_train, p_t)         # P K P^T
        cross = matmul_rows(k_cross, p_t).T                # P K*^T
        cov = k_test.to(torch.float64) + spread - cross - cross.T
        covs.append((cov + cov.T) / 2)
    return mean, torch.stack(covs).to(dtype)
