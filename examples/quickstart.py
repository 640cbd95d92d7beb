"""Quickstart: the infinite-width kernels of a torch MLP, its empirical NTK, and a Monte-Carlo check.

    python examples/quickstart.py          # NTBRIDGE_EXAMPLE_QUICK=1 for a smaller run

Runs in about 7 s on 2 shared CPU cores (`time python examples/quickstart.py`).
"""

import os

import torch
from torch import nn

import ntbridge

QUICK = os.environ.get("NTBRIDGE_EXAMPLE_QUICK") == "1"
WIDTH = 256 if QUICK else 1024

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(),
                      nn.Linear(WIDTH, 1))
x1, x2 = torch.randn(10, 16), torch.randn(4, 16)

# Infinite width, closed form: one (N1, N2) kernel per output unit.
k = ntbridge.kernel(model, x1, x2)
print("analytic NNGP", tuple(k.nngp.shape), "NTK", tuple(k.ntk.shape))

# This model's own weights: the empirical NTK, averaged over output units.
emp = ntbridge.empirical_ntk(model, x1, x2)
print(f"width {WIDTH}: empirical vs analytic NTK, relative error "
      f"{((emp - k.ntk).norm() / k.ntk.norm()).item():.3f}")

# The average over many fresh initialisations converges to the analytic kernel.
est = ntbridge.monte_carlo(model, x1, x2, n_samples=8 if QUICK else 16)
print(f"Monte-Carlo mean over {est.n_samples} inits vs analytic NTK, relative error "
      f"{((est.mean - k.ntk).norm() / k.ntk.norm()).item():.3f} "
      f"(mean standard error {est.standard_error.mean().item():.2e})")

# For CI: does the kernel still match a stored one?
report = ntbridge.testing.compare_kernels(ntbridge.ntk(model, x1, x2), k.ntk, rtol=1e-5)
print(report.report())
