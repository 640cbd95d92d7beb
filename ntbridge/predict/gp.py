"""Infinite-width predictions from kernels: GP inference and gradient-descent MSE ensembles.

Torch tensors in and out, computed in the kernels' dtype (float64 recommended: these solves
amplify rounding errors by the kernel's condition number). Shapes: ``k_train_train (n, n)``,
``y_train (n, k)``, ``k_test_train (m, n)``, ``k_test_test (m, m)``.

Training is gradient flow on ``L = 1/2 sum_i |f(x_i) - y_i|^2`` with learning rate ``lr``:
``df/dt = -lr * NTK (f - y)``; ``t = inf`` is the converged ensemble.

Torch operations only: predictions are differentiable by torch autograd w.r.t. the kernels and the
targets (e.g. through ``ntbridge.nngp`` to the inputs, as in ``examples/kernel_distillation.py``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ..errors import InputError
from .checks import check_blocks, regularized
from .closed_form import modes


class Prediction(NamedTuple):
    """Mean ``(m, k)`` of the predictions on the test points and their covariance ``(m, m)``
    (None when ``k_test_test`` was not given). The covariance is per output unit."""

    mean: torch.Tensor
    covariance: torch.Tensor | None


def gp_inference(k_train_train: torch.Tensor, y_train: torch.Tensor, k_test_train: torch.Tensor,
                 k_test_test: torch.Tensor | None = None, *, diag_reg: float = 0.0) -> Prediction:
    """Exact Bayesian posterior of a GP with kernel ``k`` (e.g. the NNGP), noise ``diag_reg``.

    Example:
        >>> k = ntbridge.kernel(model, torch.cat([x_test, x_train]), x_train, get="nngp")
        >>> pred = ntbridge.predict.gp_inference(k_train_train, y_train, k_test_train, diag_reg=1e-4)
    """
    y = check_blocks(k_train_train, y_train, k_test_train)
    chol = torch.linalg.cholesky(regularized(k_train_train, diag_reg))
    mean = k_test_train @ torch.cholesky_solve(y, chol)
    cov = None
    if k_test_test is not None:
        half = torch.linalg.solve_triangular(chol, k_test_train.T, upper=False)
        cov = k_test_test - half.T @ half
    return Prediction(mean, cov)


def gradient_descent_mse_ensemble(ntk_train_train: torch.Tensor, y_train: torch.Tensor,
                                  ntk_test_train: torch.Tensor, t: float = math.inf, *,
                                  nngp_train_train: torch.Tensor | None = None,
                                  nngp_test_train: torch.Tensor | None = None,
                                  nngp_test_test: torch.Tensor | None = None,
                                  lr: float = 1.0, diag_reg: float = 0.0) -> Prediction:
    """Mean and covariance of the infinite ensemble of wide networks trained for time ``t``.

    With ``P(t) = ntk_test_train NTK^-1 (I - exp(-lr NTK t))`` (NTK = ``ntk_train_train``): mean
    ``P(t) y``; covariance (needs the NNGPs) ``K** + P K P^T - P K*^T - K* P^T`` with ``K`` the
    train NNGP and ``K*`` the test-train NNGP. Computed by an eigendecomposition of the NTK.

    Example:
        >>> pred = gradient_descent_mse_ensemble(ntk_tt, y, ntk_st, t=math.inf, diag_reg=1e-6)
    """
    y = check_blocks(ntk_train_train, y_train, ntk_test_train)
    if t < 0:
        raise InputError(f"t must be >= 0 (or math.inf), got {t}.")
    eigvals, vecs = torch.linalg.eigh(regularized(ntk_train_train, diag_reg))
    if t == math.inf and eigvals.min() <= 0:
        raise InputError("the train NTK is singular, so the t=inf ensemble is undefined; pass "
                         "diag_reg > 0 (e.g. 1e-6).")
    # (1 - exp(-lr lam t)) / lam, with its limit lr t at lam = 0 (1 / lam at t = inf)
    factor = modes(eigvals.clamp_min(0), lr, torch.tensor([float(t)], dtype=torch.float64),
                   discrete=False)[1][0]
    p = (ntk_test_train @ vecs) * factor @ vecs.T  # (m, n)
    mean = p @ y
    cov = None
    if nngp_test_test is not None:
        if nngp_train_train is None or nngp_test_train is None:
            raise InputError("the covariance needs nngp_train_train, nngp_test_train and "
                             "nngp_test_test.")
        cross = p @ nngp_test_train.T
        cov = nngp_test_test + p @ nngp_train_train @ p.T - cross - cross.T
    return Prediction(mean, cov)
