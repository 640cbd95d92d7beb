"""Digits (8x8 images, 10 classes, shipped with scikit-learn): a torch MLP trained by full-batch
gradient descent on the cross-entropy, beside its linearization and the infinite-width dynamics;
then a learning-rate sweep across the stability limit ``ntbridge.predict.max_learning_rate``.

* The network and its linearization (``ntbridge.linearize``) are trained with ``torch.optim.SGD``.
* The infinite-width prediction is ``ntbridge.predict.gradient_descent`` (an ODE solver, any loss)
  on the analytic NTK, started from the network's initial outputs.
* The learning rate is half the limit for the summed cross-entropy, whose Hessian in the outputs
  has eigenvalues at most 1/2 (``loss_curvature=0.5``), on the network's empirical NTK.

    python examples/training_dynamics.py   # NTBRIDGE_EXAMPLE_QUICK=1 for a smaller run

Runs in about 75 s on 2 shared CPU cores (`time python examples/training_dynamics.py`).
"""

import copy
import math
import os
import warnings

import torch
import torch.nn.functional as F
from torch import nn

import ntbridge
from digits_data import load
from ntbridge.predict import gradient_descent, max_learning_rate

QUICK = os.environ.get("NTBRIDGE_EXAMPLE_QUICK") == "1"
N_TRAIN, N_TEST, WIDTH = (50, 100, 64) if QUICK else (300, 500, 512)
STEPS, SWEEP_STEPS = (40, 20) if QUICK else (300, 150)

x, y, labels, train, test = load(N_TRAIN, N_TEST)
one_hot = F.one_hot(labels, 10).double()


def cross_entropy(f: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(f, targets, reduction="sum")


def mse(f: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return 0.5 * ((f - targets) ** 2).sum()


def mlp(width: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, 10)).double()


def fit(module: nn.Module, loss, targets: torch.Tensor, lr: float, steps: int) -> nn.Module:
    """Full-batch gradient descent on the training points."""
    optimizer = torch.optim.SGD(module.parameters(), lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        loss(module(x[train]), targets).backward()
        optimizer.step()
    return module


def shown(loss: float) -> str:
    return f"{loss:.3g}" if math.isfinite(loss) else "diverged (nan)"


def accuracy(scores: torch.Tensor) -> float:
    return (scores.argmax(1) == labels[test]).double().mean().item()


torch.manual_seed(0)
model = mlp(WIDTH)
k_empirical = ntbridge.empirical_ntk(model, x[train], trace_axes=())  # (n, n, 10, 10)
lr = 0.5 * max_learning_rate(k_empirical, loss_curvature=0.5)
net = fit(copy.deepcopy(model), cross_entropy, one_hot[train], lr, STEPS)
lin = fit(ntbridge.linearize(model), cross_entropy, one_hot[train], lr, STEPS)

k = ntbridge.ntk(model, torch.cat([x[train], x[test]]), x[train])  # analytic, per output unit
with torch.no_grad():
    f0, f0_test = model(x[train]), model(x[test])
    infinite = gradient_descent(cross_entropy, k[:N_TRAIN], one_hot[train], lr, float(STEPS),
                                k_test_train=k[N_TRAIN:], fx_train_0=f0, fx_test_0=f0_test)
    scores = {"network": net(x[test]), "linearized": lin(x[test]), "infinite width": infinite.test}
print(f"Cross-entropy, {STEPS} full-batch steps at lr {lr:.3g} (half the limit), width {WIDTH}, "
      f"{N_TRAIN} training digits:")
for name, s in scores.items():
    agree = (s.argmax(1) == scores["network"].argmax(1)).double().mean().item()
    print(f"  {name:>14}: test accuracy {accuracy(s):.3f}, same class as the network on "
          f"{agree:.1%} of test digits")

limit = max_learning_rate(k_empirical)  # the MSE's: 2 / lambda_max of the empirical NTK
print(f"\nMSE learning-rate sweep, {SWEEP_STEPS} steps (max_learning_rate = {limit:.3g}); "
      f"final training loss:")
for fraction in (0.5, 0.9, 1.1, 2.0, 8.0):
    losses = []
    for module in (copy.deepcopy(model), ntbridge.linearize(model)):
        with warnings.catch_warnings():  # a diverging loss overflows to inf, as it should
            warnings.simplefilter("ignore", RuntimeWarning)
            trained = fit(module, mse, y[train], fraction * limit, SWEEP_STEPS)
            with torch.no_grad():
                losses.append(mse(trained(x[train]), y[train]).item())
    print(f"  {fraction:.1f} x limit: network {shown(losses[0])}, linearized {shown(losses[1])}")
print("Beyond the limit the linearization diverges. The network itself can escape up to a few "
      "times the limit by shrinking its NTK early in training (the 'catapult' phase), and "
      "diverges further out.")
