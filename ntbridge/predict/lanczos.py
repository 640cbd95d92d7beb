"""Matrix functions times vectors, ``f(A) B`` for ``A = K + s I``, by the Lanczos process: the
finite-time gradient-descent ensembles' ``A^-1 (I - exp(-lr t A)) B`` for many times ``t`` at once,
from products with the kernel only (read in row blocks, :class:`.operator.KernelOperator`).

For each column ``b`` of ``B``, ``j`` Lanczos steps give an orthonormal basis ``Q_j (n, j)`` of the
Krylov space of ``A`` and ``b`` and the tridiagonal ``T_j = Q_j^T A Q_j``; then
``f(A) b ~ |b| Q_j f(T_j) e_1``, with ``f(T_j)`` from ``T_j``'s eigendecomposition, for every
``t`` from the same basis. The basis is kept (``j`` vectors per column) and every new vector is
orthogonalised against all of them twice (full reorthogonalisation: without it rounding makes
copies of converged eigenvectors and the estimate drifts).

Stopping rule: the estimate is formed every few steps (at ``j = 8, 16, ...``, then every ``j / 8``);
the process stops when, for every column and time, it moved by at most ``tol`` relative to its
norm since the last check. There is no residual for a matrix function; this change is the usual a
posteriori estimate of the error (the process converges about linearly). Steps needed grow like
``sqrt(lr * t * lambda_max)`` and at most like ``sqrt(cond(A))`` (``t = inf`` is a linear solve:
:mod:`.cg` does it with a preconditioner, which a matrix function cannot use). Not reaching ``tol``
within ``max_iter`` steps raises :class:`ntbridge.errors.ConvergenceError`.

Memory: the basis, ``max_iter`` vectors ``(n, c)`` at most, besides the kernel's row blocks.
Not differentiable by torch autograd.

Example:
    >>> fx = flow_solve(ntk, y, lr=1.0, when=torch.tensor([1.0, 10.0]), shift=1e-4)  # (2, n, c)
"""

from __future__ import annotations

from typing import Callable

import torch

from ..errors import ConvergenceError
from .closed_form import modes
from .operator import KernelOperator

Function = Callable[[torch.Tensor], torch.Tensor]


def estimate(basis: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor, norm: torch.Tensor,
             f: Function) -> torch.Tensor:
    """``|b| Q_j f(T_j) e_1`` per column: ``(T, n, c)`` from the basis ``(c, >= j, n)``, the
    tridiagonals' ``alpha (j, c)`` and ``beta (j - 1, c)``, and ``norm (c,)``."""
    j = alpha.shape[0]
    tri = torch.diag_embed(alpha.T) + torch.diag_embed(beta.T, 1) + torch.diag_embed(beta.T, -1)
    theta, s = torch.linalg.eigh(tri)                              # (c, j), (c, j, j)
    values = f(theta.reshape(-1)).reshape(-1, *theta.shape)         # (T, c, j)
    coef = torch.einsum("cji,tci,ci->ctj", s, values, s[:, 0, :])   # f(T_j) e_1: (c, T, j)
    return torch.bmm(coef * norm[:, None, None], basis[:, :j]).permute(1, 2, 0)


def reorthogonalize(w: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """``w (c, n)`` less its components along the basis vectors ``(c, j, n)``, twice (once is
    not enough when ``w`` has lost most of its norm to them)."""
    for _ in range(2):
        w = w - torch.bmm(torch.bmm(basis, w[:, :, None]).transpose(1, 2), basis)[:, 0]
    return w


def apply_function(a: KernelOperator, b: torch.Tensor, f: Function, *, tol: float,
                   max_iter: int) -> tuple[torch.Tensor, int]:
    """``f(A) B`` ``(T, n, c)`` for ``B (n, c)`` and a function ``f`` of eigenvalues ``(j,)`` to
    values ``(T, j)`` at ``T`` times, and the Lanczos steps taken (see the module's docstring).
    The basis is kept per column, ``(c, j, n)``, grown by doubling."""
    n, c = b.shape
    norm = b.norm(dim=0)
    basis = torch.zeros(c, min(max_iter, n, 31) + 1, n, dtype=a.dtype, device=b.device)
    basis[:, 0] = (b / torch.where(norm > 0, norm, 1)).T
    alphas, betas, previous, change = [], [], None, float("inf")
    scale, check, tiny = 0.0, 8, torch.finfo(a.dtype).tiny
    for j in range(1, min(max_iter, n) + 1):
        q = basis[:, j - 1]
        w = a.matmul(q.T).T
        alphas.append((q * w).sum(1))
        w = reorthogonalize(w, basis[:, :j])
        beta = w.norm(dim=1)
        scale = max(scale, float(alphas[-1].abs().max()))
        broken = beta <= 1e3 * torch.finfo(a.dtype).eps * max(scale, tiny)
        beta = torch.where(broken, 0, beta)  # an invariant subspace: the estimate is exact
        if j == basis.shape[1]:  # grow the basis, up to max_iter + 1 vectors
            basis = torch.cat([basis, torch.zeros_like(basis[:, :min(j, max_iter + 1 - j)])], 1)
        basis[:, j] = torch.where(broken[:, None], 0, w / torch.where(broken, 1, beta)[:, None])
        done = bool(broken.all()) or j == n
        if done or j == check or j == max_iter:
            check += max(8, j // 8)
            current = estimate(basis, torch.stack(alphas), torch.stack(betas) if betas else
                               torch.zeros(0, c, dtype=a.dtype), norm, f)
            if previous is not None:
                moved = (current - previous).norm(dim=1) / current.norm(dim=1).clamp_min(tiny)
                change = float(moved.max())
            if done or change <= tol:
                return current, j
            previous = current
        betas.append(beta)
    raise ConvergenceError(
        f"the Lanczos process for finite t did not converge: its estimate still moved by "
        f"{change:.3g} (relative) > tol = {tol:.3g} within max_iter = {max_iter} steps. Raise "
        f"max_iter, raise diag_reg, use t = math.inf (a preconditioned solve) for long times, or "
        f"use the dense solver (solver='eigh').", residual=change, iterations=max_iter)


def flow_solve(k: torch.Tensor, b: torch.Tensor, lr: float, when: torch.Tensor, *, shift: float,
               tol: float, max_iter: int,
               block_rows: int | None = None) -> tuple[torch.Tensor, int]:
    """``A^-1 (I - exp(-lr t A)) B`` ``(T, n, c)`` for finite times ``when (T,)`` >= 0, with
    ``A = k + shift I`` (gradient flow's accumulated step), in float64; and the steps taken."""
    a = KernelOperator(k, shift, block_rows=block_rows)
    b, when = b.to(k.device, a.dtype), when.to(k.device)

    def f(lam: torch.Tensor) -> torch.Tensor:
        return modes(lam.clamp_min(0), lr, when, discrete=False)[1]

    return apply_function(a, b, f, tol=tol, max_iter=max_iter)
