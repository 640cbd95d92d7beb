"""Gradient descent on the MSE in closed form, for any (finite- or infinite-width) kernel, and the
largest stable learning rate.

The loss is ``L = 1/2 sum_i |f(x_i) - y_i|^2`` (a sum over training points and output units).
A network that trains like its linearization moves its outputs by ``f <- f - lr * K grad_f L``
per step, with ``K`` its NTK on the training points: for the MSE, ``f - y`` evolves as
``(I - lr K)^k`` after ``k`` steps and as ``exp(-lr K t)`` in continuous time (gradient flow, the
small-step limit: ``t`` is measured in steps). Test points follow
``f(x*) - f_0(x*) = -lr K(x*, X) sum_j (f_j - y)``. Both are solved once, by the kernel's
eigendecomposition.

Example:
    >>> k = ntbridge.empirical_ntk(model, x, trace_axes=())        # (n, n, O, O), finite width
    >>> out = gradient_descent_mse(k, y, learning_rate=0.1, steps=[0, 10, 100], fx_train_0=model(x))
    >>> out.train.shape                                            # (3, n, O)
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import torch

from ..errors import InputError, LearningRateWarning, renamed, warn
from .checks import Layout, computable, spectrum

Times = float | Sequence[float] | torch.Tensor


class Trajectory(NamedTuple):
    """Outputs at the times asked: ``train (*t.shape, n, O)``, ``test (*t.shape, m, O)`` (None
    without ``k_test_train``)."""

    train: torch.Tensor
    test: torch.Tensor | None


def times(name: str, t: Times | None,
          integer: bool = False) -> tuple[torch.Tensor, tuple[int, ...]]:
    """``(flat float64 times, their shape)``, checked: >= 0 (``math.inf`` allowed), integers for
    step counts; ``None`` is ``math.inf`` (Neural Tangents' convention)."""
    when = torch.as_tensor(math.inf if t is None else t, dtype=torch.float64).detach().cpu()
    finite = when[torch.isfinite(when)]
    if bool(torch.isnan(when).any()) or bool((when < 0).any()):
        raise InputError(f"{name} must be >= 0 (or math.inf), got {t!r}.")
    if integer and bool((finite != finite.round()).any()):
        raise InputError(f"{name} counts steps and must be whole numbers, got {t!r}.")
    return when.reshape(-1), tuple(when.shape)


def stability_limit(largest_eigenvalue: float, loss_curvature: float, momentum: float) -> float:
    """``2 (1 + momentum) / (loss_curvature * largest_eigenvalue)`` (see :func:`max_learning_rate`)."""
    return 2 * (1 + momentum) / (loss_curvature * largest_eigenvalue)


def max_learning_rate(k_train_train: torch.Tensor, *, loss_curvature: float = 1.0,
                      momentum: float = 0.0) -> float:
    """The learning rate beyond which full-batch gradient descent (with heavy-ball momentum)
    diverges on a network that trains like its linearization with NTK ``k_train_train``.

    Near a minimum, a step maps the outputs' error ``e`` to ``(I - lr K H) e`` with ``H`` the loss'
    Hessian in the outputs; a mode of ``K H`` of eigenvalue ``a`` is stable when
    ``0 < lr a < 2`` (with momentum ``b``, the recursion ``e' = (1 + b - lr a) e - b e_prev``
    is stable when ``0 < lr a < 2 (1 + b)``). With ``a <= lambda_max(K) * c``, ``c`` the largest
    eigenvalue of ``H`` (``loss_curvature``):

        max_learning_rate = 2 (1 + momentum) / (c * lambda_max(K)).

    ``c = 1`` for ``L = 1/2 sum |f - y|^2`` (exact; ``c = 1/n`` for ``1/(2 n) sum |f - y|^2``);
    ``c = 1/2`` bounds the softmax cross-entropy summed over examples (its Hessian per example,
    ``diag(p) - p p^T``, has eigenvalues at most 1/2).

    Args:
      k_train_train: ``(n, n)`` per output unit (the same limit as ``K ⊗ I``) or ``(n, n, O, O)``.

    Example:
        >>> lr = max_learning_rate(ntbridge.ntk(model, x_train)) / 2     # a safe step
    """
    layout = Layout.of_kernel(k_train_train)
    (k_train_train,) = computable(k_train_train)
    if not loss_curvature > 0:
        raise InputError(f"loss_curvature must be > 0, got {loss_curvature!r}.")
    if not 0 <= momentum < 1:
        raise InputError(f"momentum must be in [0, 1), got {momentum!r}.")
    k = layout.matrix("k_train_train", k_train_train)
    largest = torch.linalg.eigvalsh((k + k.T) / 2)[-1].item()
    if largest <= 0:
        raise InputError(f"k_train_train has no positive eigenvalue (largest {largest:.3g}); it is "
                         f"not an NTK.")
    return stability_limit(largest, loss_curvature, momentum)


def modes(lam: torch.Tensor, lr: float, when: torch.Tensor,
           discrete: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per time (rows) and eigenvalue (columns): the factor by which a mode of ``f - y`` has
    decayed, and ``lr`` times its sum (or integral) over the steps so far, ``(1 - decay) / lam``."""
    infinite = torch.isinf(when)[:, None]
    w = torch.where(infinite, 0, when[:, None]).to(lam.dtype)
    if discrete:  # (1 - lr lam)^k, through log1p and expm1 where 1 - lr lam > 0 (no cancellation)
        stable = lr * lam < 1
        log_rate = torch.log1p(-torch.where(stable, lr * lam, 0))
        decay = torch.where(stable, torch.exp(w * log_rate), (1 - lr * lam) ** w)
        gone = torch.where(stable, -torch.expm1(w * log_rate), 1 - decay)
    else:
        decay, gone = torch.exp(-lr * lam * w), -torch.expm1(-lr * lam * w)
    positive = lam > 0
    safe = torch.where(positive, lam, 1)
    integral = torch.where(positive, gone / safe, lr * w)
    return torch.where(infinite, 0, decay), torch.where(infinite, 1 / safe, integral)


@renamed(f_train_0="fx_train_0", f_test_0="fx_test_0")
def gradient_descent_mse(k_train_train: torch.Tensor, y_train: torch.Tensor,
                         learning_rate: float = 1.0, t: Times | None = None, *,
                         steps: Times | None = None, diag_reg: float = 0.0,
                         k_test_train: torch.Tensor | None = None,
                         fx_train_0: torch.Tensor | None = None,
                         fx_test_0: torch.Tensor | None = None) -> Trajectory:
    """Outputs of gradient descent on the MSE with kernel ``k_train_train``, in closed form.

    Args:
      k_train_train: ``(n, n)`` per output unit (e.g. ``ntbridge.ntk``) or ``(n, n, O, O)`` (e.g.
        ``ntbridge.empirical_ntk(..., trace_axes=())``); symmetric positive semi-definite.
      y_train: ``(n, O)`` or ``(n,)`` targets.
      learning_rate: the step size ``lr``.
      t: continuous times (gradient flow; ``math.inf`` the converged limit), a number or an array;
        None (default): ``math.inf``.
      steps: instead of ``t``, numbers of discrete steps (warns beyond :func:`max_learning_rate`).
      diag_reg: adds ``diag_reg * mean(diag(k))`` to the train kernel's diagonal.
      k_test_train: ``(m, n)`` or ``(m, n, O, O)``, for predictions on test points.
      fx_train_0, fx_test_0: outputs at time 0, ``(n, O)`` and ``(m, O)``; zeros (the infinite
        ensemble's mean) when None. (``f_train_0``/``f_test_0``: their deprecated names.)

    float16/bfloat16 kernels are computed in float32 and give float32 outputs (as ntbridge's
    kernel functions do).

    Returns:
      A :class:`Trajectory`: ``train (*t.shape, n, O)`` and ``test (*t.shape, m, O)``.

    Example:
        >>> out = gradient_descent_mse(ntk_tt, y, 0.5, t=[1.0, math.inf], k_test_train=ntk_st)
        >>> out.test.shape                                       # (2, m, O)
    """
    layout = Layout.of(k_train_train, y_train)
    if t is not None and steps is not None:
        raise InputError("pass t (continuous time) or steps (discrete steps), not both.")
    discrete = steps is not None
    when, shape = times("steps" if discrete else "t", steps if discrete else t, integer=discrete)
    k_train_train, k_test_train = computable(k_train_train, k_test_train)
    if not 0 < learning_rate < math.inf:
        raise InputError(f"learning_rate must be a positive number, got {learning_rate!r}.")
    k = layout.matrix("k_train_train", k_train_train)
    lam, vecs = spectrum("k_train_train", (k + k.T) / 2, diag_reg, bool(torch.isinf(when).any()))
    if discrete and learning_rate > (limit := stability_limit(lam[-1].item(), 1.0, 0.0)):
        warn(LearningRateWarning(f"learning_rate {learning_rate:.4g} exceeds the stability limit "
                                 f"of discrete steps, max_learning_rate = 2 / lambda_max(K) = "
                                 f"{limit:.4g}: the outputs diverge."))
    y = layout.flat(y_train.to(k.dtype))
    coef = vecs.T @ (layout.initial("fx_train_0", fx_train_0, layout.n, k) - y)  # (N, C)
    decay, integral = modes(lam.clamp_min(0), learning_rate, when, discrete)
    train = layout.values(y + vecs @ (decay[:, :, None] * coef))
    test = None
    if k_test_train is not None:
        k_star = layout.matrix("k_test_train", k_test_train, rows=k_test_train.shape[0])
        f_test = layout.initial("fx_test_0", fx_test_0, k_test_train.shape[0], k)
        test = layout.values(f_test - (k_star @ vecs) @ (integral[:, :, None] * coef))
        test = test.reshape(*shape, *test.shape[1:])
    return Trajectory(train.reshape(*shape, *train.shape[1:]), test)
