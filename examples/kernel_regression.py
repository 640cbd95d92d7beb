"""Digits (8x8 images, 10 classes, shipped with scikit-learn): infinite-width NNGP and NTK
regression vs a finite torch MLP of the same architecture trained with SGD.

The infinite-width predictions are ``ntbridge.predict``'s: the NNGP posterior mean (GP inference)
and the t = infinity mean of an infinite ensemble trained by gradient descent on the MSE (NTK).
The finite network is trained by minibatch SGD on the same MSE loss and one-hot targets.

    python examples/kernel_regression.py   # NTBRIDGE_EXAMPLE_QUICK=1 for a smaller run

Runs in about 5 s on 2 shared CPU cores (`time python examples/kernel_regression.py`).
"""

import math
import os

import torch
from torch import nn

import ntbridge
from digits_data import load
from ntbridge.predict import gp_inference, gradient_descent_mse_ensemble

QUICK = os.environ.get("NTBRIDGE_EXAMPLE_QUICK") == "1"
N_TRAIN, N_TEST = (300, 200) if QUICK else (1000, 797)
WIDTH, EPOCHS = (256, 15) if QUICK else (512, 25)
LR = 0.1

x, y, labels, train, test = load(N_TRAIN, N_TEST)


def mlp(width: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, 10))


def accuracy(scores: torch.Tensor) -> float:
    return (scores.argmax(1) == labels[test]).double().mean().item()


# Infinite width: kernels in float64 (the solves amplify rounding by the condition number).
model = mlp(WIDTH).double()
k_train = ntbridge.kernel(model, x[train])
k_test = ntbridge.kernel(model, x[test], x[train])
nngp = gp_inference(k_train.nngp, y[train], k_test.nngp, diag_reg=1e-4)
ntk = gradient_descent_mse_ensemble(k_train.ntk, y[train], k_test.ntk, t=math.inf, diag_reg=1e-4)
print(f"infinite-width NNGP regression: test accuracy {accuracy(nngp.mean):.3f}")
print(f"infinite-width NTK regression (t = inf): test accuracy {accuracy(ntk.mean):.3f}")

# Finite width: the same architecture, torch's default init, minibatch SGD on the MSE.
net = mlp(WIDTH)
xf, yf = x.float(), y.float()
for epoch in range(EPOCHS):
    for batch in torch.randperm(N_TRAIN).split(32):
        loss = 0.5 * ((net(xf[train][batch]) - yf[train][batch]) ** 2).sum(1).mean()
        grads = torch.autograd.grad(loss, list(net.parameters()))
        with torch.no_grad():
            for p, g in zip(net.parameters(), grads):
                p -= LR * g
with torch.no_grad():
    print(f"finite MLP (width {WIDTH}, SGD, {EPOCHS} epochs): test accuracy "
          f"{accuracy(net(xf[test])):.3f}")
