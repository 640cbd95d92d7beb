"""Infinite-width kernels of two CNNs that differ only in their head: a Flatten readout (which keeps
each pixel's covariance with itself only) vs global average pooling (which also sees the
covariances between positions, so it is translation-aware). The empirical NTK of a wide network of
each kind is compared to its limit.

    python examples/cnn_kernels.py        # NTBRIDGE_EXAMPLE_QUICK=1 for a smaller run

Runs in about 5 s on 2 shared CPU cores (`time python examples/cnn_kernels.py`).
"""

import os

import torch
from torch import nn

import ntbridge

QUICK = os.environ.get("NTBRIDGE_EXAMPLE_QUICK") == "1"
CHANNELS = 32 if QUICK else 128
SIZE = 6 if QUICK else 8


def cnn(head: str, channels: int = CHANNELS) -> nn.Sequential:
    body = [nn.Conv2d(3, channels, 3, padding=1), nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU()]
    if head == "flatten":
        return nn.Sequential(*body, nn.Flatten(), nn.Linear(channels * SIZE * SIZE, 1))
    return nn.Sequential(*body, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 1))


torch.manual_seed(0)
x = torch.randn(5, 3, SIZE, SIZE)
shifted = torch.roll(x[:1], shifts=1, dims=3)  # the first image, shifted by one pixel
inputs = torch.cat([x, shifted])

for head in ("flatten", "global average pooling"):
    model = cnn(head)
    k = ntbridge.kernel(model, inputs)
    emp = ntbridge.empirical_ntk(model, inputs)
    corr = lambda a, i, j: (a[i, j] / (a[i, i] * a[j, j]).sqrt()).item()
    print(f"--- head: {head}")
    print(f"analytic NTK correlation of an image with its 1-pixel shift: {corr(k.ntk, 0, 5):.3f}, "
          f"with another image: {corr(k.ntk, 0, 1):.3f}")
    print(f"empirical NTK ({CHANNELS} channels) vs analytic: relative error "
          f"{((emp - k.ntk).norm() / k.ntk.norm()).item():.3f}")
