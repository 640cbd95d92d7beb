"""An explicit Runge-Kutta integrator with error control (Dormand and Prince's 5(4) pair), in
torch, for the function-space dynamics of :mod:`.flow`.

Each step takes the 5th-order solution and estimates its local error by the embedded 4th-order
one; a step is accepted when the error, measured as ``rms(err / (atol + rtol * |y|))``, is at most
1, and the next step size follows ``err ** -1/5``. The last stage of a step is the first of the
next (evaluated at the new solution), so a step costs six evaluations. Steps are shortened to land
on the times asked. Torch operations only: the solution differentiates by autograd in ``fun``'s
inputs (the step sizes are not differentiated).

Example:
    >>> ys = solve(lambda t, y: -y, torch.ones(3), [0.0, 1.0, 2.0], rtol=1e-8, atol=1e-10)
    >>> ys.shape                    # (3 times, 3): exp(-t) at each time
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from ..errors import InputError

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


def solve(fun: Fun, y0: torch.Tensor, times: Sequence[float], *, rtol: float, atol: float,
          max_steps: int = 100_000) -> torch.Tensor:
    """The solution of ``dy/dt = fun(t, y)``, ``y(0) = y0``, at ``times`` (sorted, >= 0, finite):
    a tensor ``(len(times), *y0.shape)``."""
    t, y, dy = 0.0, y0, fun(0.0, y0)
    with torch.no_grad():  # the starting step: a small change of y relative to its scale
        scale = atol + rtol * y0.abs()
        d0, d1 = _rms(y0 / scale), _rms(dy / scale)
    h = 0.01 * d0 / d1 if min(d0, d1) > 1e-5 else 1e-6
    out, accepted = [], 0
    for target in times:
        while t < target:
            if accepted == max_steps:
                raise InputError(f"the integration took max_steps={max_steps} steps and reached "
                                 f"t={t:.4g} of {target:.4g}: the dynamics are stiff at this "
                                 f"learning rate; ask for shorter times or raise max_steps.")
            h_try = min(h, target - t)
            new, d_new, err = _step(fun, t, y, dy, h_try)
            with torch.no_grad():
                size = _rms(err / (atol + rtol * torch.maximum(y.abs(), new.abs())))
            factor = _GROW if size == 0 else _SAFETY * size ** -0.2
            if size <= 1:
                t = target if h_try == target - t else t + h_try  # land exactly on the target
                y, dy, accepted = new, d_new, accepted + 1
                h = h_try * min(_GROW, max(_SHRINK, factor))
            else:
                h = h_try * max(_SHRINK, min(1.0, factor))
        out.append(y)
    return torch.stack(out) if out else y0.new_empty((0, *y0.shape))
