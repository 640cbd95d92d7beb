"""How fast a one-hidden-layer Tanh MLP's empirical NTK approaches the analytic one, with torch's
default (uniform) init and with Gaussian weights of the same variances.

The relative error falls as width**-1/2 only asymptotically: at small widths the fluctuations are
not yet Gaussian, and with torch's uniform weights and few inputs the first layer's pre-activations
are not quite Gaussian either, so the empirical kernel converges to a limit slightly off the
analytic (Gaussian) one and the error levels off near that floor.

    python benchmarks/width_rates.py      # a few minutes on 2 cores
"""

import warnings

import numpy as np
import torch
from torch import nn

import ntbridge
from ntbridge.errors import InitMismatchWarning

INPUTS, EXAMPLES, SEEDS = 16, 16, 8
WIDTHS = [32, 128, 512, 2048, 8192, 32768]


def build(gaussian: bool):
    def model(width: int) -> nn.Module:
        m = nn.Sequential(nn.Linear(INPUTS, width), nn.Tanh(), nn.Linear(width, 1)).double()
        if gaussian:  # torch's variances 1/(3 fan_in), drawn from a normal instead of a uniform
            with torch.no_grad():
                for layer in (m[0], m[2]):
                    for p in layer.parameters():
                        p.normal_(0, (3 * layer.in_features) ** -0.5)
        return m
    return model


def main() -> None:
    # Gaussian weights exceed the uniform init's bounds that the check reads; their variances are
    # torch's, which the analytic kernel assumes
    warnings.filterwarnings("ignore", category=InitMismatchWarning)
    x = torch.randn(EXAMPLES, INPUTS, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for name, gaussian in (("torch init (uniform)", False), ("Gaussian init", True)):
        sweep = ntbridge.analysis.width_sweep(build(gaussian), WIDTHS, x, n_seeds=SEEDS,
                                              implementation="structured")
        error = sweep.mean("ntk")
        local = np.diff(np.log(error)) / np.diff(np.log(WIDTHS))
        print(f"{name}: slope {sweep.fit('ntk')} over {WIDTHS[0]}..{WIDTHS[-1]}; errors "
              f"{np.array2string(error, precision=4)}; slopes between neighbours "
              f"{np.array2string(local, precision=2)}")


if __name__ == "__main__":
    main()
