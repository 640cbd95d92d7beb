"""An explicit Runge-Kutta integrator with error control (Dormand and Prince's 5(4) pair), in
torch, for the function-space dynamics of :mod:`.flow`; on stiff gradient flows it switches to the
Runge-Kutta-Chebyshev method of :mod:`.chebyshev` where that costs fewer evaluations.

Each step takes the 5th-order solution and estimates its local error by the embedded 4th-order
one; a step is accepted when the error, measured as ``rms(err / (atol + rtol * |y|))``, is at most
1, and the next step size follows ``err ** -1/5``. The last stage of a step is the first of the
next (evaluated at the new solution), so a step costs six evaluations. Steps are shortened to land
on the times asked. Torch operations only: the solution differentiates by autograd in ``fun``'s
inputs (the step sizes are not differentiated).

Stiffness: on real eigenvalues down to ``-rho`` the pair is stable only for steps
``h <= 3.3 / rho``, whatever the accuracy asked. With ``real_spectrum=True`` (gradient flows) the
solver estimates ``rho`` (every 25 steps) and, where the Dormand-Prince steps are bound by
stability, compares their cost, 6 evaluations per ``3.3 / rho`` of time, with that of Chebyshev
steps, ``s(h rho) ~ sqrt(h rho / 0.65)`` per step ``h``, for the ``h`` their error estimate allows
(from a Dormand-Prince step, predicted by its trapezoidal defect); the cheaper takes the next
step. Both are under the same error control (``err ** -1/3`` for the second-order Chebyshev
steps); only the method's choice depends on the estimates.

Example:
    >>> ys = solve(lambda t, y: -y, torch.ones(3), [0.0, 1.0, 2.0], rtol=1e-8, atol=1e-10)
    >>> ys.shape                    # (3 times, 3): exp(-t) at each time
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from ..errors import InputError
from . import chebyshev

# The Dormand-Prince tableau: stage times, stage weights (the last row is the 5th-order solution),
# and the difference of the 5th- and 4th-order weights (the error estimate).
_C = (1 / 5, 3 / 10, 4 / 5, 8 / 9, 1.0, 1.0)
_A = ((1 / 5,),
      (3 / 40, 9 / 40),
      (44 / 45, -56 / 15, 32 / 9),
      (19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729),
      (9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656),
      (35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84))
_E = (71 / 57600, 0.0, -71 / 16695, 71 / 1920, -17253 / 339200, 22 / 525, -1 / 40)
_SAFETY, _SHRINK, _GROW = 0.9, 0.2, 10.0
_STABLE = 3.3  # h rho the pair is stable for on real eigenvalues (its interval: [-3.307, 0])
_REFRESH = 25  # accepted steps between estimates of the spectral radius

Fun = Callable[[float, torch.Tensor], torch.Tensor]


def _combine(weights: Sequence[float], stages: list[torch.Tensor]) -> torch.Tensor:
    return sum(w * k for w, k in zip(weights, stages) if w)


def _step(fun: Fun, t: float, y: torch.Tensor, first: torch.Tensor,
          h: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(y at t + h, its derivative there, the local error estimate)``."""
    stages = [first]
    for c, a in zip(_C, _A):
        new = y + h * _combine(a, stages)
        stages.append(fun(t + c * h, new))
    return new, stages[-1], h * _combine(_E, stages)


def _rms(x: torch.Tensor) -> float:
    return x.pow(2).mean().sqrt().item()


def _factor(size: float, power: int) -> float:
    """The change of step size for an error ``size`` (1: the tolerance) of an estimate that scales
    as ``h ** power``, before the bounds on growth and shrinking."""
    return _GROW if size == 0 else _SAFETY * size ** (-1 / power)


class _DormandPrince:
    """Steps by the Dormand-Prince pair; the interface the driver steps through."""

    def step(self, fun: Fun, t: float, y: torch.Tensor, dy: torch.Tensor,
             h: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """``(y at t + h, its derivative there, the local error estimate, its power of h)``."""
        return (*_step(fun, t, y, dy, h), 5)

    def accepted(self, h: float, taken: float, y: torch.Tensor, new: torch.Tensor,
                 dy: torch.Tensor, d_new: torch.Tensor, scale: torch.Tensor) -> float:
        """The next step's size after an accepted step ``taken`` from ``y`` to ``new``
        (derivatives ``dy``, ``d_new``; ``scale`` the error's), given the proposal ``h`` of its
        error control."""
        return h

    def rejected(self) -> None:
        """A step was rejected."""


class _Switching(_DormandPrince):
    """Dormand-Prince steps, or Runge-Kutta-Chebyshev ones where those cost fewer evaluations,
    for a flow with real eigenvalues; keeps the spectral radius ``rho``.

    ``rounding``: ``rtol / eps`` of the dtype, the largest ``h rho`` of a Chebyshev step. Its error
    estimate takes the derivative at the rounded new state, whose rounding (``eps |y|``) the stiff
    modes amplify ``h rho`` times; beyond ``rtol / eps`` that noise would exceed the tolerance
    (float32 with rtol near its eps: no Chebyshev steps)."""

    def __init__(self, rounding: float) -> None:
        self.radius = chebyshev.SpectralRadius()
        self.rho, self.age, self.chebyshev, self.rounding = 0.0, None, False, rounding

    def step(self, fun: Fun, t: float, y: torch.Tensor, dy: torch.Tensor,
             h: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        if self.age is None or self.age >= _REFRESH:  # the first step, or rho is due
            self.rho, self.age = self.radius.estimate(fun, t, y, dy), 0
        if not self.chebyshev:
            return super().step(fun, t, y, dy, h)
        return (*chebyshev.step(fun, t, y, dy, h, chebyshev.stages(h * self.rho)), 3)

    def accepted(self, h: float, taken: float, y: torch.Tensor, new: torch.Tensor,
                 dy: torch.Tensor, d_new: torch.Tensor, scale: torch.Tensor) -> float:
        """Compares the evaluations per unit time: Dormand-Prince at its stability bound, 6 per
        ``_STABLE / rho``, and Chebyshev steps, ``s(h rho)`` per ``h``; from a Dormand-Prince step,
        ``h`` is predicted from the step's trapezoidal defect (the error a Chebyshev step of its
        size would estimate, up to ``chebyshev.ESTIMATE_RATIO``)."""
        self.age += 1
        if self.rho == 0:
            self.chebyshev = False
            return h
        bound, ceiling = 6 * self.rho / _STABLE, self.rounding / self.rho
        if self.chebyshev:
            h = min(h, ceiling)
            self.chebyshev = chebyshev.stages(h * self.rho) / h < bound
            return h
        if h * self.rho <= _STABLE:  # not bound by stability
            return h
        with torch.no_grad():
            defect = _rms(chebyshev.defect(new - y, dy, d_new, taken) / scale)
        ratio = _factor(chebyshev.ESTIMATE_RATIO * defect, 3)
        h_cheb = min(ceiling, taken * min(_GROW, max(_SHRINK, ratio)))
        self.chebyshev = chebyshev.stages(h_cheb * self.rho) / h_cheb < bound
        return h_cheb if self.chebyshev else h

    def rejected(self) -> None:
        if self.chebyshev and self.age:  # its stage count may have been too low: new rho
            self.age = None


def solve(fun: Fun, y0: torch.Tensor, times: Sequence[float], *, rtol: float, atol: float,
          max_steps: int = 100_000, real_spectrum: bool = False) -> torch.Tensor:
    """The solution of ``dy/dt = fun(t, y)``, ``y(0) = y0``, at ``times`` (sorted, >= 0, finite):
    a tensor ``(len(times), *y0.shape)``. ``real_spectrum``: ``fun``'s Jacobian has real
    eigenvalues (a gradient flow), so that stiff stretches may take Chebyshev steps."""
    t, y, dy = 0.0, y0, fun(0.0, y0)
    with torch.no_grad():  # the starting step: a small change of y relative to its scale
        scale = atol + rtol * y0.abs()
        d0, d1 = _rms(y0 / scale), _rms(dy / scale)
    h = 0.01 * d0 / d1 if min(d0, d1) > 1e-5 else 1e-6
    method = _Switching(rtol / torch.finfo(y0.dtype).eps) if real_spectrum else _DormandPrince()
    out, accepted = [], 0
    for target in times:
        while t < target:
            if accepted == max_steps:
                raise InputError(f"the integration took max_steps={max_steps} steps and reached "
                                 f"t={t:.4g} of {target:.4g}: the dynamics are stiff at this "
                                 f"learning rate; ask for shorter times or raise max_steps.")
            h_try = min(h, target - t)
            new, d_new, err, power = method.step(fun, t, y, dy, h_try)
            with torch.no_grad():
                scale = atol + rtol * torch.maximum(y.abs(), new.abs())
                size = _rms(err / scale)
            if size <= 1:
                h = h_try * min(_GROW, max(_SHRINK, _factor(size, power)))
                h = method.accepted(h, h_try, y, new, dy, d_new, scale)
                t = target if h_try == target - t else t + h_try  # land exactly on the target
                y, dy, accepted = new, d_new, accepted + 1
            else:
                h = h_try * max(_SHRINK, min(1.0, _factor(size, power)))
                method.rejected()
        out.append(y)
    return torch.stack(out) if out else y0.new_empty((0, *y0.shape))
