"""The training sweep: torch models of growing width trained by full-batch gradient descent beside
their linearizations and the infinite-width dynamics, compared in function space.

For each width and seed, a fresh model (torch's default init) is trained on
``L = 1/2 sum |f(x_train) - y_train|^2`` with plain full-batch steps; so is its linearization
(``ntbridge.linearize``); and the infinite-width prediction is the closed form
(``ntbridge.predict.gradient_descent_mse``) on the analytic NTK of the architecture, started from
the model's own initial outputs (so the three agree at step 0 and differ only by how training
moves them). At the recorded steps, the distances on the test points are
``rms(f_model - f_linearized)`` and ``rms(f_model - f_infinite)`` (root mean square over test
points and output units). Both shrink as the width grows: the network trains like its
linearization, whose NTK tends to the analytic one. (With torch's uniform init and few inputs,
the first layer's pre-activations are not quite Gaussian, and the distance to the infinite-width
dynamics levels off where the empirical NTK's limit differs from the analytic one.)

Example:
    >>> build = lambda w: nn.Sequential(nn.Linear(8, w), nn.Tanh(), nn.Linear(w, 1))
    >>> sweep = training_sweep(build, [64, 1024], x_train, y_train, x_test, steps=200)
    >>> print(sweep)                 # distances per width and step: mean ± standard error
"""

from __future__ import annotations

import copy
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

from ..api import ntk, sample_seed
from ..linearize import linearize
from ..errors import InputError, InputTypeError
from ..predict import gradient_descent_mse, max_learning_rate
from .sweep import check_widths, seeded_model
from .training_report import TrainingSweep


def _checkpoints(steps: int | Sequence[int]) -> tuple[int, ...]:
    """The steps recorded: five evenly spaced from 0 for an int, else the steps given (sorted)."""
    if isinstance(steps, int) and not isinstance(steps, bool):
        if steps < 1:
            raise InputError(f"steps must be >= 1, got {steps}.")
        return tuple(sorted({round(steps * i / 4) for i in range(5)}))
    try:
        recorded = tuple(sorted({int(s) for s in steps}))
    except (TypeError, ValueError):
        raise InputTypeError(f"steps must be an int or a sequence of ints, got {steps!r}.") from None
    if not recorded or recorded[0] < 0:
        raise InputError(f"steps must be non-negative step counts, got {steps!r}.")
    return recorded


def _train(module: nn.Module, x_train: torch.Tensor, y_train: torch.Tensor,
           x_test: torch.Tensor, lr: float, checkpoints: tuple[int, ...]) -> torch.Tensor:
    """Full-batch gradient descent on ``1/2 sum |f - y|^2``; the test outputs at the checkpoints,
    ``(len(checkpoints), m, O)``."""
    optimizer = torch.optim.SGD(module.parameters(), lr=lr)
    recorded = []
    for step in range(checkpoints[-1] + 1):
        if step in checkpoints:
            with torch.no_grad():
                recorded.append(module(x_test))
        if step < checkpoints[-1]:
            optimizer.zero_grad()
            (0.5 * ((module(x_train) - y_train) ** 2).sum()).backward()
            optimizer.step()
    return torch.stack(recorded)


def _rms(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    """Root mean square difference per checkpoint (over test points and output units)."""
    return (a - b).double().pow(2).flatten(1).mean(1).sqrt().numpy()


def training_sweep(make_model: Callable[[int], nn.Module], widths: Sequence[int],
                   x_train: torch.Tensor, y_train: torch.Tensor, x_test: torch.Tensor,
                   steps: int | Sequence[int], *, learning_rate: float | None = None,
                   n_seeds: int = 3, seed: int = 0) -> TrainingSweep:
    """Train models of growing width beside their linearizations and the infinite-width dynamics.

    Args:
      make_model: ``make_model(width) -> nn.Module`` with torch's default init, of an architecture
        the analytic NTK covers (called under ``torch.manual_seed``, as in ``width_sweep``).
      widths: the widths to try.
      x_train: ``(n, *input)``; y_train: ``(n, O)`` targets; x_test: ``(m, *input)``.
      steps: the number of full-batch steps (recorded at five evenly spaced steps), or the steps
        to record.
      learning_rate: the step size; None: half of ``ntbridge.predict.max_learning_rate`` of the
        analytic NTK at each width (with torch's standard parameterization the NTK grows with the
        width, and so would a fixed rate's instability).
      n_seeds: models per width (>= 2 for standard errors).
      seed: model ``(w, s)`` is built after ``torch.manual_seed(sample_seed(seed, w, s))``.

    Returns:
      A :class:`TrainingSweep` (prints as a table; ``plot``, ``mean``, ``standard_error``).

    Example:
        >>> sweep = training_sweep(build, [32, 512], x, y, x_star, steps=100, n_seeds=4)
        >>> sweep.mean("linearized")[:, -1]     # the final distance per width, shrinking
    """
    widths, checkpoints = check_widths(widths), _checkpoints(steps)
    if isinstance(n_seeds, bool) or not isinstance(n_seeds, int) or n_seeds < 1:
        raise InputError(f"n_seeds must be a positive int, got {n_seeds!r}.")
    if y_train.ndim != 2 or len(y_train) != len(x_train):
        raise InputError(f"y_train must be (n, O) with n = {len(x_train)} (the rows of x_train), "
                         f"got {tuple(y_train.shape)}.")
    if learning_rate is not None and not learning_rate > 0:
        raise InputError(f"learning_rate must be > 0 (or None for half the stability limit), got "
                         f"{learning_rate!r}.")
    shape = (len(widths), n_seeds, len(checkpoints))
    distances = {"linearized": np.zeros(shape), "infinite": np.zeros(shape)}
    rates = []
    n = len(x_train)
    for i, width in enumerate(widths):
        for s in range(n_seeds):
            model = seeded_model(make_model, width, sample_seed(seed, width, s), "make_model")
            model = model.to(x_train.dtype)
            if s == 0:  # the analytic NTK depends on the architecture only
                k = ntk(model, torch.cat([x_train, x_test]), x_train, progress=False).double()
                lr = (0.5 * max_learning_rate(k[:n]) if learning_rate is None
                      else learning_rate)
                rates.append(lr)
            with torch.no_grad():
                f0, f0_test = model(x_train), model(x_test)
            infinite = gradient_descent_mse(k[:n], y_train.double(), lr, steps=list(checkpoints),
                                            k_test_train=k[n:], fx_train_0=f0.double(),
                                            fx_test_0=f0_test.double()).test
            lin = _train(linearize(model), x_train, y_train, x_test, lr, checkpoints)
            trained = _train(copy.deepcopy(model), x_train, y_train, x_test, lr, checkpoints)
            distances["linearized"][i, s] = _rms(trained, lin)
            distances["infinite"][i, s] = _rms(trained, infinite)
    return TrainingSweep(tuple(widths), checkpoints, distances, tuple(rates))
