"""The infinite-width kernels of torchvision's ResNet-18 layout (``examples/torchvision_resnets.py``:
the stem ``conv 7x7 -> BatchNorm -> ReLU -> MaxPool``, BasicBlocks whose ReLU follows ``out +
identity``, downsample shortcuts, global average pooling) on scikit-learn's digits upsampled to
16x16 and repeated over 3 channels, used for kernel regression: test accuracy of GP inference
(NNGP) and of the t = infinity MSE ensemble (NTK).

BatchNorm in eval mode with fresh buffers (as the model is built): before the stem's ReLU its rule
is in closed form; MaxPool and the ReLUs after residual sums are numerical expectations (scrambled
Sobol samples of the Gaussian sources, ``ntbridge.stax.sources``), here with 64 points per
replicate (``expectation_points=64``; the default 256 costs about 4x the time), whose error the
example reports (``ntbridge.expectation_error``, on a few examples).

    python examples/resnet_kernel.py   # NTBRIDGE_EXAMPLE_QUICK=1 for a smaller run

Runs in about 2.5 min of CPU time on 2 shared cores, 9 min of wall time while they were busy with
other work (`time python examples/resnet_kernel.py`; the quick run, 4x4 digits and 16 points:
about 20 s of CPU time); test accuracy 0.62 (NNGP) and 0.62 (NTK) with 50 training digits.
"""

import math
import os

import torch
from torch import nn

import ntbridge
from digits_data import load
from ntbridge.predict import gp_inference, gradient_descent_mse_ensemble
from torchvision_resnets import resnet18

QUICK = os.environ.get("NTBRIDGE_EXAMPLE_QUICK") == "1"
N_TRAIN, N_TEST = (10, 10) if QUICK else (50, 50)
SIZE = 4 if QUICK else 16  # quick: 4x4 digits, maps of 1x1 after the stem (a smaller program)
POINTS = 16 if QUICK else 64


def images(x: torch.Tensor) -> torch.Tensor:
    """Digits ``(N, 64)`` as ``(N, 3, SIZE, SIZE)`` images: bilinear resampling, 3 equal
    channels."""
    up = nn.functional.interpolate(x.reshape(-1, 1, 8, 8), size=(SIZE, SIZE), mode="bilinear",
                                   align_corners=False)
    return up.expand(-1, 3, -1, -1).contiguous()


def main() -> None:
    x, y, labels, train, test = load(N_TRAIN, N_TEST)
    data = images(x.float())
    model = resnet18(num_classes=10).eval()
    error = ntbridge.expectation_error(model, data[train[:4]], expectation_points=POINTS)
    print(f"ResNet-18 layout, expectation_points={POINTS}: reported relative error of the "
          f"kernels {error:.1e}")
    k = ntbridge.kernel(model, data[torch.cat([train, test])], data[train],
                        expectation_points=POINTS)
    nngp, ntk = k.nngp.double(), k.ntk.double()
    n = len(train)
    gp = gp_inference(nngp[:n], y[train], nngp[n:], diag_reg=1e-4)
    ens = gradient_descent_mse_ensemble(ntk[:n], y[train], ntk[n:], t=math.inf, diag_reg=1e-4)
    hits = lambda f: (f.mean.argmax(1) == labels[test]).double().mean().item()
    print(f"ResNet-18 layout at infinite width, {n} training digits: test accuracy NNGP "
          f"{hits(gp):.3f}, NTK (t = inf) {hits(ens):.3f}")


if __name__ == "__main__":
    main()
