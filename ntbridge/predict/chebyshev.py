"""The second-order Runge-Kutta-Chebyshev method (RKC; Sommeijer, Shampine and Verwer 1997), for
stiff flows whose Jacobian has real eigenvalues (gradient flows: ``-lr K H`` with ``K`` PSD and
``H`` a Hessian is similar to a symmetric matrix), and their spectral radius.

A step of ``s`` stages is a three-term recursion, each stage one evaluation of ``fun``, whose
stability polynomial is a shifted and scaled Chebyshev polynomial ``T_s`` damped by ``2/13``: it is
at most 1 in magnitude on ``[-beta(s), 0]`` with ``beta(s) >= 0.65 (s^2 - 1)``, so a step of size
``h`` is stable on eigenvalues down to ``-rho`` with ``s ~ sqrt(h rho / 0.65)`` stages: the work per
unit time grows as the square root of the stiffness instead of linearly (an explicit method's).
Off the real axis it is stable only in a thin strip: not for complex spectra (the heavy-ball
flow's). The method is second order; its local error is estimated from the two ends of the step,
``(6 h (f_0 + f_1) - 12 (y_1 - y_0)) / 15`` (the trapezoidal rule's defect, ``~ h^3 y''' / 15``).

The spectral radius ``rho`` of ``fun``'s Jacobian comes from a nonlinear power iteration on
differences of ``fun`` (no Jacobian is formed), continued from the previous estimate's vector.

Example:
    >>> rho = SpectralRadius().estimate(fun, t, y, fun(t, y))
    >>> new, d_new, err = step(fun, t, y, fun(t, y), h=1.0, s=stages(1.0 * rho))
"""

from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple

import torch

Fun = Callable[[float, torch.Tensor], torch.Tensor]

DAMPING = 2 / 13
REACH = 0.65  # beta(s) >= REACH (s^2 - 1): tests/test_predict_chebyshev.py checks it for s <= 300
# A step's error estimate over the exact solution's defect (on y' = lambda y, to leading order):
# 1 + 12 (1/6 - c3) with c3 the cubic coefficient of the stability polynomial, in [0, 1/6]:
# 3 for s = 2 (c3 = 0), 1.79 for many stages.
ESTIMATE_RATIO = 3.0


class Stage(NamedTuple):
    """``Y_j = (1 - mu - nu) Y_0 + mu Y_{j-1} + nu Y_{j-2} + h (mu_f f(Y_{j-1}) + gamma_f f(Y_0))``,
    at time ``t + c h``."""

    mu: float
    nu: float
    mu_f: float
    gamma_f: float
    c: float


@functools.lru_cache(maxsize=512)
def coefficients(s: int) -> tuple[tuple[Stage, ...], float]:
    """The ``s`` stages of the ``s``-stage method (``s >= 2``; the first, ``Y_1 = Y_0 + mu_f h
    f(Y_0)``, has ``mu = nu = gamma_f = 0``) and the stability bound ``beta(s) = (1 + w0) / w1``.

    Stage ``j`` has the polynomial ``a_j + b_j T_j(w0 + w1 z)``, ``a_j = 1 - b_j T_j(w0)``, with
    ``w0 = 1 + damping / s^2``, ``w1 = T_s'(w0) / T_s''(w0)``, ``b_j = T_j''(w0) / T_j'(w0)^2``
    (``b_0 = b_1 = b_2``): second order, ``P_s'(0) = P_s''(0) = 1``."""
    w0 = 1 + DAMPING / s**2
    t, dt, ddt = [1.0, w0], [0.0, 1.0], [0.0, 0.0]  # T_j(w0) and its first two derivatives
    for j in range(2, s + 1):
        t.append(2 * w0 * t[j - 1] - t[j - 2])
        dt.append(2 * t[j - 1] + 2 * w0 * dt[j - 1] - dt[j - 2])
        ddt.append(4 * dt[j - 1] + 2 * w0 * ddt[j - 1] - ddt[j - 2])
    w1 = dt[s] / ddt[s]
    b = [ddt[j] / dt[j] ** 2 if j >= 2 else 0.0 for j in range(s + 1)]
    b[0] = b[1] = b[2]
    out, c_prev, c = [Stage(0.0, 0.0, b[1] * w1, 0.0, b[1] * w1)], 0.0, b[1] * w1
    for j in range(2, s + 1):
        mu, nu, mu_f = 2 * w0 * b[j] / b[j - 1], -b[j] / b[j - 2], 2 * w1 * b[j] / b[j - 1]
        gamma_f = -(1 - b[j - 1] * t[j - 1]) * mu_f
        c_prev, c = c, mu * c + nu * c_prev + mu_f + gamma_f  # stage times: the method on t' = 1
        out.append(Stage(mu, nu, mu_f, gamma_f, c))
    return tuple(out), (1 + w0) / w1


def stages(h_rho: float) -> int:
    """The fewest stages (at least 2) stable for a step ``h`` on eigenvalues down to ``-rho``."""
    return max(2, 1 + math.floor(math.sqrt(1 + h_rho / REACH)))


def step(fun: Fun, t: float, y: torch.Tensor, dy: torch.Tensor, h: float,
         s: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(y at t + h, its derivative there, the local error estimate)`` by ``s`` stages, from
    ``y`` and ``dy = fun(t, y)``: ``s`` evaluations of ``fun``. The recursion runs on the stages'
    changes ``Y_j - y`` (rounding relative to the step's change, not to ``y``)."""
    rows, _ = coefficients(s)
    prev, cur, c = torch.zeros_like(y), (rows[0].mu_f * h) * dy, rows[0].c
    for row in rows[1:]:
        new = (row.mu * cur + row.nu * prev + (row.mu_f * h) * fun(t + c * h, y + cur)
               + (row.gamma_f * h) * dy)
        prev, cur, c = cur, new, row.c
    d_new = fun(t + h, y + cur)
    return y + cur, d_new, defect(cur, dy, d_new, h)


def defect(change: torch.Tensor, dy0: torch.Tensor, dy1: torch.Tensor, h: float) -> torch.Tensor:
    """``(6 h (dy0 + dy1) - 12 change) / 15`` for a step's ``change = y1 - y0``: the trapezoidal
    rule's defect, ``~ h^3 y''' / 15``, the local error estimate of :func:`step` (of any step)."""
    return (6 * h * (dy0 + dy1) - 12 * change) / 15


class SpectralRadius:
    """Estimates of the spectral radius of ``fun``'s Jacobian: ``||fun(y + v) - fun(y)|| / ||v||``
    for a small ``v`` iterated towards the dominant eigenvector (until two estimates agree within
    1%), times a safety factor 1.2 (the iteration approaches the radius from below)."""

    SAFETY, AGREE, MAX_ITER = 1.2, 0.01, 20

    def __init__(self) -> None:
        self.direction: torch.Tensor | None = None
        self.evaluations = 0

    def estimate(self, fun: Fun, t: float, y: torch.Tensor, dy: torch.Tensor) -> float:
        """The radius at ``(t, y)``, with ``dy = fun(t, y)``; continues from the last direction."""
        with torch.no_grad():
            size = torch.finfo(y.dtype).eps ** 0.5 * max(y.norm().item(), 1.0)
            v = self.direction if self.direction is not None else dy
            if v.norm() == 0:
                v = torch.ones_like(y)
            v = v * (size / v.norm())
            last = -1.0
            for _ in range(self.MAX_ITER):
                change = fun(t, y + v) - dy
                self.evaluations += 1
                norm = change.norm().item()
                radius = norm / size
                if norm == 0:
                    break
                v = change * (size / norm)
                if abs(radius - last) <= self.AGREE * radius:
                    break
                last = radius
            self.direction = v
        return self.SAFETY * radius
