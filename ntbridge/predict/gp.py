"""Infinite-width predictions from kernels: GP inference and gradient-descent MSE ensembles.

Torch tensors in and out, computed in the kernels' dtype (float64 recommended: these solves
amplify rounding errors by the kernel's condition number). Shapes: ``k_train_train (n, n)``,
``y_train (n, k)``, ``k_test_train (m, n)``, ``k_test_test (m, m)``.

Training is gradient flow on ``L = 1/2 sum_i |f(x_i) - y_i|^2`` with learning rate ``lr``
(``learning_rate``): ``df/dt = -lr * NTK (f - y)``; ``t = inf`` (or None, the default) is the
converged ensemble. float16/bfloat16 kernels are computed in float32, giving float32 results.

Two solvers: the dense ones (default: a Cholesky factorisation for GP inference, an
eigendecomposition for the ensemble) are torch operations, differentiable by torch autograd
w.r.t. the kernels and the targets (e.g. through ``ntbridge.nngp`` to the inputs, as in
``examples/kernel_distillation.py``). ``solver="cg"`` (:mod:`.iterative`) needs products with the
kernels only, read in row blocks: kernels on disk larger than memory work, to a stated tolerance,
without gradients.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ..errors import InputError, renamed
from . import iterative
from .checks import check_blocks, computable, finite, regularized, spectrum
from .closed_form import Times, modes, times


class Prediction(NamedTuple):
    """Mean ``(m, k)`` of the predictions on the test points and their covariance ``(m, m)``
    (None when ``k_test_test`` was not given). The covariance is per output unit. For an
    ensemble at an array of times ``t``, both have ``t``'s shape in front: ``(*t.shape, m, k)``
    and ``(*t.shape, m, m)``."""

    mean: torch.Tensor
    covariance: torch.Tensor | None


def gp_inference(k_train_train: torch.Tensor, y_train: torch.Tensor, k_test_train: torch.Tensor,
                 k_test_test: torch.Tensor | None = None, *, diag_reg: float = 0.0,
                 solver: str = "cholesky", tol: float | None = None, max_iter: int | None = None,
                 preconditioner_rank: int | None = None) -> Prediction:
    """Exact Bayesian posterior of a GP with kernel ``k`` (e.g. the NNGP), noise ``diag_reg``.

    Args:
      k_train_train: ``(n, n)``; k_test_train: ``(m, n)``; k_test_test: ``(m, m)`` or None.
      y_train: ``(n, k)`` targets.
      diag_reg: adds ``diag_reg * mean(diag(k_train_train))`` to the train kernel's diagonal.
      solver: ``"cholesky"`` (default; dense, differentiable) or ``"cg"``: preconditioned
        conjugate gradients reading the kernels in row blocks (kernels mapped from disk by
        ``out=`` work; memory: a few blocks, the ``(n, k + m)`` right-hand sides and an
        ``(n, preconditioner_rank)`` factor), not differentiable. The covariance solves for the
        ``m`` columns of ``k_test_train^T`` too.
      tol: with ``solver="cg"``, the relative residual ``|b - A x| / |b|`` each column must reach
        (default 1e-6 for float64 kernels, 1e-4 for float32); the solution's relative error is
        at most ``cond(A) * tol``.
      max_iter: with ``solver="cg"``, the iterations allowed (default 1000); beyond them
        :class:`ntbridge.errors.ConvergenceError` is raised with the residual reached.
      preconditioner_rank: with ``solver="cg"``, the rank of the pivoted Cholesky preconditioner
        (default 300; 0: Jacobi).

    Example:
        >>> k = ntbridge.kernel(model, torch.cat([x_test, x_train]), x_train, get="nngp")
        >>> pred = ntbridge.predict.gp_inference(k_train_train, y_train, k_test_train,
        ...                                      diag_reg=1e-4)
        >>> big = ntbridge.nngp(model, x_train, out="k.npy")         # (n, n) on disk
        >>> pred = ntbridge.predict.gp_inference(big, y_train, k_test_train, diag_reg=1e-4,
        ...                                      solver="cg", tol=1e-6)
    """
    k_train_train, k_test_train, k_test_test = computable(k_train_train, k_test_train, k_test_test)
    y = check_blocks(k_train_train, y_train, k_test_train)
    how = iterative.settings(solver, "cholesky", k_train_train.dtype, tol, max_iter,
                             preconditioner_rank)
    if how is not None:
        finite("y_train", y)
        return Prediction(*iterative.gp_inference(k_train_train, y, k_test_train, k_test_test,
                                                  diag_reg, how))
    chol, info = torch.linalg.cholesky_ex(regularized(k_train_train, diag_reg))
    if info > 0:
        raise InputError(f"k_train_train plus diag_reg * mean(diag) = {diag_reg:g} is not positive "
                         f"definite (its leading minor of order {info.item()} is not); pass "
                         f"diag_reg > 0 (e.g. 1e-6, more for a float32 kernel), and a kernel "
                         f"matrix of the training inputs with themselves.")
    mean = k_test_train @ torch.cholesky_solve(y, chol)
    cov = None
    if k_test_test is not None:
        half = torch.linalg.solve_triangular(chol, k_test_train.T, upper=False)
        cov = k_test_test - half.T @ half
    return Prediction(mean, cov)


@renamed(lr="learning_rate")
def gradient_descent_mse_ensemble(ntk_train_train: torch.Tensor, y_train: torch.Tensor,
                                  ntk_test_train: torch.Tensor, t: Times | None = None, *,
                                  nngp_train_train: torch.Tensor | None = None,
                                  nngp_test_train: torch.Tensor | None = None,
                                  nngp_test_test: torch.Tensor | None = None,
                                  learning_rate: float = 1.0, diag_reg: float = 0.0,
                                  solver: str = "eigh",
                                  tol: float | None = None, max_iter: int | None = None,
                                  preconditioner_rank: int | None = None) -> Prediction:
    """Mean and covariance of the infinite ensemble of wide networks trained for time ``t``.

    With ``P(t) = ntk_test_train NTK^-1 (I - exp(-lr NTK t))`` (NTK = ``ntk_train_train``,
    ``lr = learning_rate``; ``lr=`` is its deprecated spelling): mean
    ``P(t) y``; covariance (needs the NNGPs) ``K** + P K P^T - P K*^T - K* P^T`` with ``K`` the
    train NNGP and ``K*`` the test-train NNGP.

    Args:
      t: a time >= 0 (``math.inf`` or None, the default: converged) or an array of them: the
        mean is then ``(*t.shape, m, k)`` and the covariance ``(*t.shape, m, m)`` (a number:
        ``(m, k)`` and ``(m, m)``).
      solver: ``"eigh"`` (default): one eigendecomposition of the NTK for all times, dense and
        differentiable. ``"cg"``: products with the kernels only, read in row blocks (kernels
        on disk by ``out=`` work), not differentiable: ``t = inf`` by preconditioned conjugate
        gradients (as :func:`gp_inference`), finite times by one Lanczos process for all of
        them (its basis, up to ``max_iter`` vectors of ``(n, k [+ m])``, is kept; the steps grow
        like ``sqrt(lr * t * lambda_max)``).
      tol, max_iter, preconditioner_rank: with ``solver="cg"``, as in :func:`gp_inference`; for
        finite times ``tol`` bounds the relative change of the Lanczos estimate between checks.

    Example:
        >>> pred = gradient_descent_mse_ensemble(ntk_tt, y, ntk_st, diag_reg=1e-6)  # t = inf
        >>> pred = gradient_descent_mse_ensemble(ntk_tt, y, ntk_st, t=[1.0, 10.0, math.inf],
        ...                                      diag_reg=1e-6, solver="cg")
        >>> pred.mean.shape                                          # (3, m, k)
    """
    ntk_train_train, ntk_test_train, nngp_train_train, nngp_test_train, nngp_test_test = computable(
        ntk_train_train, ntk_test_train, nngp_train_train, nngp_test_train, nngp_test_test)
    y = check_blocks(ntk_train_train, y_train, ntk_test_train)
    when, shape = times("t", t)
    if not 0 < learning_rate < math.inf:
        raise InputError(f"learning_rate must be a positive number, got {learning_rate!r}.")
    how = iterative.settings(solver, "eigh", ntk_train_train.dtype, tol, max_iter,
                             preconditioner_rank)
    if nngp_test_test is not None and (nngp_train_train is None or nngp_test_train is None):
        raise InputError("the covariance needs nngp_train_train, nngp_test_train and "
                         "nngp_test_test.")
    nngp = None if nngp_test_test is None else (nngp_train_train, nngp_test_train, nngp_test_test)
    if how is not None:
        finite("y_train", y)
        mean, cov = iterative.ensemble(ntk_train_train, y, ntk_test_train, when, learning_rate,
                                       diag_reg, nngp, how)
    else:
        mean, cov = dense_ensemble(ntk_train_train, y, ntk_test_train, when, learning_rate,
                                   diag_reg, nngp)
    return Prediction(mean.reshape(*shape, *mean.shape[1:]),
                      None if cov is None else cov.reshape(*shape, *cov.shape[1:]))


def dense_ensemble(ntk_train_train: torch.Tensor, y: torch.Tensor, ntk_test_train: torch.Tensor,
                   when: torch.Tensor, lr: float, diag_reg: float,
                   nngp: tuple | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The ensemble's mean ``(T, m, k)`` and covariance ``(T, m, m)`` (or None) at the times
    ``when (T,)``, by an eigendecomposition of the NTK."""
    eigvals, vecs = spectrum("ntk_train_train", ntk_train_train, diag_reg,
                             bool(torch.isinf(when).any()))
    # (1 - exp(-lr lam t)) / lam, with its limit lr t at lam = 0 (1 / lam at t = inf): (T, n)
    factor = modes(eigvals.clamp_min(0), lr, when, discrete=False)[1]
    p = (ntk_test_train @ vecs) * factor[:, None, :] @ vecs.T  # (T, m, n)
    mean = p @ y
    if nngp is None:
        return mean, None
    nngp_train_train, nngp_test_train, nngp_test_test = nngp
    cross = p @ nngp_test_train.T
    return mean, nngp_test_test + p @ nngp_train_train @ p.mT - cross - cross.mT
