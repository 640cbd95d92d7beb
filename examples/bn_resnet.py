"""A ResNet with ``nn.BatchNorm2d`` in eval mode on scikit-learn's digits (8x8 images, 10 classes):
infinite-width NNGP and NTK regression with the running statistics the model gathered from the
training images.

Eval-mode BatchNorm is a fixed per-channel affine map ``y_c = a_c x_c + d_c`` (``a_c = gamma_c /
sqrt(running_var_c + eps)``, ``d_c = beta_c - a_c running_mean_c``). Its kernel is exact when the
input is a convolution's output (i.i.d. zero-mean Gaussian channels at infinite width) and its
output feeds an affine layer, whose independent weights average the channels again: the kernel
scales by the channel mean of ``a**2`` and gains that of ``d**2``. A nonlinearity right after it
sees channels of different scales and means (no longer identically distributed): ntbridge computes
``conv -> BN -> ReLU`` as a numerical expectation then (``examples/resnet_kernel.py``, torchvision's
layout), in closed form only without shifts. The blocks here keep every rule exact: they are
ordered ``BN -> conv -> ReLU -> conv`` with the identity skip around them, ``h + conv2(relu(conv1(bn(h))))``, a pre-activation
block whose first nonlinearity comes after the convolution instead of before it; each BN reads a
sum of convolutions (Gaussian), and a last BN before the Flatten + Linear head normalises the
final map.

The running statistics are not the defaults: the model is run in train mode over the training
images (``momentum=None``: a cumulative average, i.e. the statistics of the whole training set),
then switched to eval mode. The example prints the channel means that enter the kernel, then the
test accuracy of GP inference (NNGP) and of the t = infinity MSE ensemble (NTK), beside (except in
the quick run) the same ResNet with fresh buffers (``running_var = 1``: BN is then the constant
``1 / sqrt(1 + eps)``).

    python examples/bn_resnet.py   # NTBRIDGE_EXAMPLE_QUICK=1 for a smaller run

Runs in about 31 s on 2 shared CPU cores (`time python examples/bn_resnet.py`).
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
CHANNELS = 64


class Block(nn.Module):
    """``h + conv2(relu(conv1(bn(h))))`` on ``(N, c, H, W)``; the BN feeds a convolution.

    Example:
        >>> Block(8)(torch.randn(2, 8, 4, 4)).shape
        torch.Size([2, 8, 4, 4])
    """

    def __init__(self, c: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(c, momentum=None)  # momentum=None: cumulative running statistics
        self.conv1, self.conv2 = nn.Conv2d(c, c, 3, padding=1), nn.Conv2d(c, c, 3, padding=1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.conv2(torch.relu(self.conv1(self.bn(h))))


def resnet(c: int = CHANNELS) -> nn.Sequential:
    """``(N, 1, 8, 8) -> (N, 10)``: a stem convolution, two blocks, BN, Flatten + Linear."""
    return nn.Sequential(nn.Conv2d(1, c, 3, padding=1), Block(c), Block(c),
                         nn.BatchNorm2d(c, momentum=None), nn.Flatten(), nn.Linear(c * 64, 10))


def gather_statistics(model: nn.Module, images: torch.Tensor) -> nn.Module:
    """Runs ``model`` in train mode over ``images`` in batches (BatchNorm updates its running
    statistics; nothing is trained), then returns it in eval mode."""
    model.train()
    with torch.no_grad():
        for batch in images.split(50):
            model(batch)
    return model.eval()


def channel_means(bn: nn.BatchNorm2d) -> tuple[float, float]:
    """``(mean a**2, mean d**2)`` of eval-mode ``bn``'s map ``y = a x + d``."""
    a = bn.weight / (bn.running_var + bn.eps).sqrt()
    d = bn.bias - a * bn.running_mean
    return (a ** 2).mean().item(), (d ** 2).mean().item()


def accuracies(model: nn.Module, images: torch.Tensor, y: torch.Tensor, labels: torch.Tensor,
               train: torch.Tensor, test: torch.Tensor) -> tuple[float, float]:
    """Test accuracy of NNGP (GP inference) and NTK (t = inf) regression on ``model``'s kernels."""
    k = ntbridge.kernel(model, images[torch.cat([train, test])], images[train])  # one program
    n = len(train)
    nngp = gp_inference(k.nngp[:n], y[train], k.nngp[n:], diag_reg=1e-4)
    ntk = gradient_descent_mse_ensemble(k.ntk[:n], y[train], k.ntk[n:], t=math.inf, diag_reg=1e-4)
    hits = lambda f: (f.mean.argmax(1) == labels[test]).double().mean().item()
    return hits(nngp), hits(ntk)


def main() -> None:
    x, y, labels, train, test = load(N_TRAIN, N_TEST)
    images = x.reshape(-1, 1, 8, 8)  # float64: the solves amplify rounding by the condition number
    torch.manual_seed(0)
    fresh = resnet().double().eval()
    model = gather_statistics(resnet().double(), images[train])
    with torch.no_grad():
        for name, m in model.named_modules():
            if isinstance(m, nn.BatchNorm2d):
                a2, d2 = channel_means(m)
                print(f"BatchNorm {name}: channel means of a**2 = {a2:.3f}, d**2 = {d2:.3f} "
                      f"(fresh buffers: {1 / (1 + m.eps):.3f}, 0)")
    runs = [("running statistics of the training images", model), ("fresh buffers", fresh)]
    for label, net in runs[:1] if QUICK else runs:
        acc_nngp, acc_ntk = accuracies(net, images, y, labels, train, test)
        print(f"BN-ResNet in eval mode, {label}: test accuracy NNGP {acc_nngp:.3f}, "
              f"NTK (t = inf) {acc_ntk:.3f}")


if __name__ == "__main__":
    main()
