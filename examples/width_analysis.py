"""How far are finite torch MLPs from their infinite-width kernels? A width sweep, as a table, a
CSV and a log-log plot.

    python examples/width_analysis.py [PLOT.png]   # NTBRIDGE_EXAMPLE_QUICK=1 for a smaller run

The slope approaches -0.5 as the widths grow; deeper networks reach that regime at larger widths.
"""

import os
import sys

import torch
from torch import nn

import ntbridge

QUICK = os.environ.get("NTBRIDGE_EXAMPLE_QUICK") == "1"
plot_path = sys.argv[1] if len(sys.argv) > 1 else "width_analysis.png"


def build(width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, 1))


x = torch.randn(8, 32, generator=torch.Generator().manual_seed(0))
widths = [32, 128, 512] if QUICK else [64, 256, 1024, 4096]
sweep = ntbridge.analysis.width_sweep(build, widths, x, n_seeds=2 if QUICK else 4,
                                      implementation="structured")
print(sweep)
print(f"\nNTK: error ~ width^{sweep.fit('ntk').slope:.2f} (about -0.5 expected)")
csv_path = os.path.splitext(plot_path)[0] + ".csv"
sweep.to_csv(csv_path)
print("Plot written to", sweep.plot(plot_path), "and the table to", csv_path)
