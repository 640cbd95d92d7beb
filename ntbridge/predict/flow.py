"""Gradient descent on any differentiable loss in function space, by an ODE solver.

A network that trains like its linearization, with NTK ``K`` on the training points, moves its
outputs by ``f <- f - lr * K grad_f L(f, y)`` per step. In continuous time (``t`` counted in
steps) that is the gradient flow ``df/dt = -lr K grad_f L(f)``; the outputs on test points follow
``f(x*) = f_0(x*) - lr K(x*, X) G(t)`` with ``G(t) = integral of grad_f L`` from 0 to t, which is
integrated beside ``f`` (one kernel product per evaluation, whatever the number of test points).

Heavy-ball momentum ``b``: the steps ``v <- b v - lr K grad L``, ``f <- f + v`` are, in continuous
time, ``f'' + (1 - b) f' = -lr K grad_f L(f)``, starting at rest (``f'(0) = 0``), and ``G`` then
solves ``G'' + (1 - b) G' = grad_f L``. The flow is integrated by :func:`.ode.solve` with error
control (``rtol``, ``atol`` bound each step's local error); ``G`` only when test points are asked.

Stiffness: the flow's Jacobian ``-lr K H`` (``H`` the loss' Hessian in the outputs) has the
eigenvalues of the symmetric ``-lr K^1/2 H K^1/2``: real for any loss, convex or not, down to
``-lr lambda_max(K) c`` for a loss of curvature ``c`` (-1 at half the stable learning rate), while
the slow modes need times ``t >> 1``: stiff. Without momentum the solver then takes
Runge-Kutta-Chebyshev steps, a step ``h`` for ``~ sqrt(h / 0.65)`` evaluations instead of
``6 h / 3.3``. The heavy-ball flow's eigenvalues are complex (``mu^2 + (1 - b) mu + lr a = 0``
for an eigenvalue ``a`` of ``K H``): Dormand-Prince steps only.

Example:
    >>> ce = lambda f, y: torch.nn.functional.cross_entropy(f, y, reduction="sum")
    >>> out = gradient_descent(ce, ntk_tt, one_hot, 0.1, t=[10.0, 100.0], k_test_train=ntk_st)
    >>> out.test.argmax(-1)                                      # (2, m) predicted classes
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from ..errors import InputError, renamed
from .checks import Layout, computable
from .closed_form import Times, Trajectory, gradient_descent_mse, times
from .ode import solve

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def mse(f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``1/2 sum |f - y|^2``, the loss of :func:`.closed_form.gradient_descent_mse` (a scalar).

    Example:
        >>> gradient_descent(mse, ntk_tt, y, 0.5, t=math.inf)   # the closed form's limit
    """
    return 0.5 * ((f - y) ** 2).sum()


def _flow(k: torch.Tensor, gradient: Callable[[torch.Tensor], torch.Tensor], lr: float,
          momentum: float | None, test: bool) -> Callable[[float, torch.Tensor], torch.Tensor]:
    """The right-hand side on the state ``(f, G)``, or ``(f, f', G, G')`` with momentum; without
    ``G`` (and ``G'``) unless ``test`` (only test points need it)."""
    if momentum is None:
        def fun(t: float, state: torch.Tensor) -> torch.Tensor:
            g = gradient(state[0])
            return torch.stack((-lr * (k @ g), g)[:1 + test])
        return fun
    friction = 1 - momentum

    def heavy_ball(t: float, state: torch.Tensor) -> torch.Tensor:
        f, v = state[:2]
        g = gradient(f)
        moving = (v, -friction * v - lr * (k @ g))
        return torch.stack((*moving, state[3], g - friction * state[3]) if test else moving)
    return heavy_ball


@renamed(f_train_0="fx_train_0", f_test_0="fx_test_0")
def gradient_descent(loss: Loss, k_train_train: torch.Tensor, y_train: torch.Tensor,
                     learning_rate: float = 1.0, t: Times | None = None, *,
                     momentum: float | None = None, k_test_train: torch.Tensor | None = None,
                     fx_train_0: torch.Tensor | None = None,
                     fx_test_0: torch.Tensor | None = None,
                     rtol: float = 1e-7, atol: float = 1e-10,
                     max_steps: int = 100_000) -> Trajectory:
    """Outputs of continuous-time gradient descent on ``loss`` with kernel ``k_train_train``.

    Args:
      loss: ``loss(f, y_train) -> scalar`` in torch, ``f`` shaped as ``y_train``; e.g. :func:`mse`,
        or ``lambda f, y: F.cross_entropy(f, y, reduction="sum")`` with one-hot (or probability)
        targets. Its gradient is taken by ``torch.func.grad``. :func:`mse` without momentum is
        solved in closed form (:func:`.closed_form.gradient_descent_mse`), not by the solver.
      k_train_train: ``(n, n)`` per output unit or ``(n, n, O, O)``, symmetric.
      y_train: ``(n, O)`` or ``(n,)`` targets; the outputs have their shape (``O = 1`` for ``(n,)``).
      learning_rate: ``lr``, scaling the kernel.
      t: times in steps (a number or an array); ``math.inf`` (or None, the default) only with
        :func:`mse`, whose limit is in closed form (other losses, e.g. cross-entropy on separable
        data, have no limit).
      momentum: ``b`` in [0, 1) for heavy-ball momentum; None for plain gradient descent.
      k_test_train: ``(m, n)`` or ``(m, n, O, O)``, for predictions on test points.
      fx_train_0, fx_test_0: outputs at time 0, ``(n, O)`` and ``(m, O)``; zeros when None
        (``f_train_0``/``f_test_0``: their deprecated names).
      rtol, atol: the solver's error tolerances (relative to the state, absolute).
      max_steps: the most solver steps before giving up (stiff dynamics with momentum: long times).

    Returns:
      A :class:`Trajectory`: ``train (*t.shape, n, O)``, ``test (*t.shape, m, O)`` or None.

    Example:
        >>> out = gradient_descent(mse, k, y, 0.1, t=[1.0, 10.0], momentum=0.9)
        >>> out.train.shape                                      # (2, n, O)
    """
    if loss is mse and momentum is None:  # a linear flow: its closed form, exact at any time
        return gradient_descent_mse(k_train_train, y_train, learning_rate, t,
                                    k_test_train=k_test_train, fx_train_0=fx_train_0,
                                    fx_test_0=fx_test_0)
    layout = Layout.of(k_train_train, y_train)
    k_train_train, k_test_train = computable(k_train_train, k_test_train)
    when, shape = times("t", t)
    if not 0 < learning_rate < math.inf:
        raise InputError(f"learning_rate must be a positive number, got {learning_rate!r}.")
    if momentum is not None and not 0 <= momentum < 1:
        raise InputError(f"momentum must be in [0, 1) (or None for none), got {momentum!r}.")
    infinite = torch.isinf(when)
    if bool(infinite.any()) and loss is not mse:
        raise InputError("t=inf (or None, the default) needs loss=ntbridge.predict.mse, whose "
                         "limit is in closed form; for other losses pass finite times.")
    k = layout.matrix("k_train_train", k_train_train)
    k_star = (None if k_test_train is None else
              layout.matrix("k_test_train", k_test_train, rows=k_test_train.shape[0]))
    f0 = layout.initial("fx_train_0", fx_train_0, layout.n, k)
    f0_star = (None if k_star is None else
               layout.initial("fx_test_0", fx_test_0, len(k_test_train), k))

    shaped = lambda columns: layout.values(columns).reshape(y_train.shape)
    gradient = torch.func.grad(lambda columns: loss(shaped(columns), y_train))
    finite_times, order = torch.sort(when[~infinite])
    parts = (1 if momentum is None else 2) * (1 if k_star is None else 2)  # f [f'] [G [G']]
    start = torch.stack([f0, *[torch.zeros_like(f0)] * (parts - 1)])
    states = solve(_flow(k, gradient, learning_rate, momentum, test=k_star is not None), start,
                   finite_times.tolist(), rtol=rtol, atol=atol, max_steps=max_steps,
                   real_spectrum=momentum is None)[torch.argsort(order)]
    train = states[:, 0]
    test = None if k_star is None else f0_star - learning_rate * k_star @ states[:, parts // 2]
    if bool(infinite.any()):
        limit = gradient_descent_mse(k_train_train, y_train, learning_rate, math.inf,
                                     k_test_train=k_test_train, fx_train_0=fx_train_0,
                                     fx_test_0=fx_test_0)
        train = _merge(train, layout.flat(limit.train), infinite)
        test = None if test is None else _merge(test, layout.flat(limit.test), infinite)
    shaped_in_time = lambda columns: layout.values(columns).reshape(*shape, -1, layout.outputs)
    return Trajectory(shaped_in_time(train), None if test is None else shaped_in_time(test))


def _merge(finite: torch.Tensor, limit: torch.Tensor, infinite: torch.Tensor) -> torch.Tensor:
    """The solutions at finite times and the limit, in the order of the times asked."""
    out = finite.new_empty(len(infinite), *limit.shape)
    out[~infinite] = finite
    out[infinite] = limit
    return out
