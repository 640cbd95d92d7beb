"""A small U-Net on scikit-learn's digits (8x8 images, 10 classes): infinite-width NNGP and NTK
regression with the encoder/decoder's analytic kernels.

The model is an ordinary ``nn.Module`` whose ``forward`` ntbridge traces with torch.fx: an encoder
(3x3 convolutions, downsampling by stride-2 convolutions 8x8 -> 4x4 -> 2x2), a decoder
(``nn.Upsample`` 2x2 -> 4x4, ``nn.ConvTranspose2d`` 4x4 -> 8x8), and skip connections that
concatenate the encoder's maps with the decoder's along the channels (``torch.cat(..., dim=1)``).
A Flatten + Linear head reads the 8x8 output map as 10 class scores. Nearest upsampling and the
transposed convolution keep the kernel's cheap same-position layout (each output position reads
one input position per weight), and so do strided convolutions, so the whole network costs about
as much as a plain CNN of its size. (Average pooling would mix positions under one weight and need
the covariance of every pair of positions: about 64 times the work at 8x8.)

The predictions are ``ntbridge.predict``'s: the NNGP posterior mean (GP inference) and the
t = infinity mean of an infinite ensemble trained by gradient descent on the MSE (NTK), on
zero-mean one-hot targets; the class is the largest score.

    python examples/unet.py   # NTBRIDGE_EXAMPLE_QUICK=1 for a smaller run

Runs in about 13 s on 2 shared CPU cores (`time python examples/unet.py`).
"""

import math
import os

import torch
from torch import nn

import ntbridge
from digits_data import load
from ntbridge.predict import gp_inference, gradient_descent_mse_ensemble

QUICK = os.environ.get("NTBRIDGE_EXAMPLE_QUICK") == "1"
N_TRAIN, N_TEST = (100, 100) if QUICK else (1000, 797)


class UNet(nn.Module):
    """``(N, 1, 8, 8) -> (N, 10)``: two levels down, two up, a skip at each level.

    Example:
        >>> UNet()(torch.randn(2, 1, 8, 8)).shape
        torch.Size([2, 10])
    """

    def __init__(self, c: int = 64):
        super().__init__()
        conv = lambda c_in: nn.Conv2d(c_in, c, 3, padding=1)
        down = lambda: nn.Conv2d(c, c, 3, stride=2, padding=1)    # halves the map
        self.enc1, self.enc2, self.bottom = conv(1), down(), down()
        self.up2 = nn.Upsample(scale_factor=2, mode="nearest")    # 2x2 -> 4x4
        self.dec2 = conv(2 * c)
        self.up1 = nn.ConvTranspose2d(c, c, 2, stride=2)          # 4x4 -> 8x8
        self.dec1 = conv(2 * c)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(c * 8 * 8, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = torch.relu(self.enc1(x))                                     # (N, c, 8, 8)
        e2 = torch.relu(self.enc2(e1))                                    # (N, c, 4, 4)
        b = torch.relu(self.bottom(e2))                                   # (N, c, 2, 2)
        d2 = torch.relu(self.dec2(torch.cat([self.up2(b), e2], dim=1)))   # (N, c, 4, 4)
        d1 = torch.relu(self.dec1(torch.cat([self.up1(d2), e1], dim=1)))  # (N, c, 8, 8)
        return self.head(d1)


def accuracy(scores: torch.Tensor, labels: torch.Tensor) -> float:
    return (scores.argmax(1) == labels).double().mean().item()


def main() -> None:
    x, y, labels, train, test = load(N_TRAIN, N_TEST)
    images = x.reshape(-1, 1, 8, 8)  # float64: the solves amplify rounding by the condition number
    model = UNet().double()
    print(ntbridge.convert(model))
    k = ntbridge.kernel(model, images[torch.cat([train, test])], images[train])  # one program
    n = len(train)
    nngp = gp_inference(k.nngp[:n], y[train], k.nngp[n:], diag_reg=1e-4)
    ntk = gradient_descent_mse_ensemble(k.ntk[:n], y[train], k.ntk[n:], t=math.inf, diag_reg=1e-4)
    acc_nngp, acc_ntk = accuracy(nngp.mean, labels[test]), accuracy(ntk.mean, labels[test])
    print(f"U-Net NNGP regression: test accuracy {acc_nngp:.3f}")
    print(f"U-Net NTK regression (t = inf): test accuracy {acc_ntk:.3f}")
    print(f"On {N_TRAIN} training digits the infinite-width U-Net classifies {N_TEST} test digits "
          f"with accuracy {acc_nngp:.3f} as a Gaussian process (NNGP) and {acc_ntk:.3f} as an "
          f"ensemble trained to convergence (NTK).")


if __name__ == "__main__":
    main()
