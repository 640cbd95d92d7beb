"""Predictions from kernels: infinite-width GP inference and ensembles, and the function-space
dynamics of gradient descent for any kernel (infinite-width, or a finite network's empirical NTK).

Torch tensors in and out, computed in the kernels' dtype (float64 recommended: these solves
amplify rounding errors by the kernel's condition number), differentiable by torch autograd
w.r.t. the kernels and the targets (the iterative solvers compute in float64 and are not).

* :mod:`.gp`: :func:`gp_inference` (the NNGP posterior) and :func:`gradient_descent_mse_ensemble`
  (mean and covariance of the infinite ensemble trained on the MSE, at one time or many), by
  dense solves or, with ``solver="cg"``, by products with the kernels only (:mod:`.iterative`:
  conjugate gradients, :mod:`.cg`, and Lanczos, :mod:`.lanczos`, reading kernels in row blocks,
  :mod:`.operator`; kernels on disk work).
* :mod:`.closed_form`: :func:`gradient_descent_mse`, the MSE's dynamics in closed form (discrete steps or
  continuous time) for kernels ``(n, n)`` or ``(n, n, O, O)``; :func:`max_learning_rate`.
* :mod:`.flow`: :func:`gradient_descent` for any torch loss (cross-entropy included), with
  optional heavy-ball momentum, by the adaptive Runge-Kutta solver of :mod:`.ode` (with the
  Runge-Kutta-Chebyshev steps of :mod:`.chebyshev` on stiff stretches).

Example:
    >>> from ntbridge import predict
    >>> k = ntbridge.ntk(model, torch.cat([x_train, x_test]), x_train)
    >>> out = predict.gradient_descent(predict.mse, k[:n], y, 0.5, t=[10.0, math.inf],
    ...                                k_test_train=k[n:])
"""

from .flow import gradient_descent, mse
from .gp import Prediction, gp_inference, gradient_descent_mse_ensemble
from .closed_form import Trajectory, gradient_descent_mse, max_learning_rate

__all__ = ["Prediction", "Trajectory", "gp_inference", "gradient_descent", "gradient_descent_mse",
           "gradient_descent_mse_ensemble", "max_learning_rate", "mse"]
