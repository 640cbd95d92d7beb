"""Kernel distillation (KIP, Nguyen et al. 2021) on scikit-learn's digits: learn 10 support images
(one per class) and their labels so that infinite-width NNGP kernel regression on them alone
classifies the test set, by Adam through ntbridge's differentiable kernels.

The loss is the MSE of kernel regression from the support set to a batch of training images,
``K(batch, S) (K(S, S) + reg I)^-1 y_S`` vs the batch's one-hot targets: torch autograd carries
its gradient through ``ntbridge.nngp`` to the support images and through
``ntbridge.predict.gp_inference`` to their labels. The baseline is kernel regression on the 10 real
images the support set starts from.

    python examples/kernel_distillation.py [--out DIR]   # NTBRIDGE_EXAMPLE_QUICK=1: a smaller run

Writes ``kernel_distillation.png`` (the learned images; needs matplotlib: pip install
'ntbridge[plot]') into DIR (default: the current directory).

Runs in about 8 s on 2 shared CPU cores (`time python examples/kernel_distillation.py`).
"""

import argparse
import os

import torch
from torch import nn

import ntbridge
from digits_data import load
from ntbridge.predict import gp_inference

QUICK = os.environ.get("NTBRIDGE_EXAMPLE_QUICK") == "1"
STEPS, BATCH = (8, 60) if QUICK else (100, 300)
parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--out", default=".", metavar="DIR", help="where to write the plot")
out = parser.parse_args().out

x, y, labels, train, test = load(1000, 797)
model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                      nn.Linear(512, 10)).double()


def predict(support: torch.Tensor, support_y: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
    """NNGP kernel regression ``(len(points), 10)`` from the support set to ``points``."""
    return gp_inference(ntbridge.nngp(model, support), support_y,
                        ntbridge.nngp(model, points, support), diag_reg=1e-3).mean


def accuracy(support: torch.Tensor, support_y: torch.Tensor) -> float:
    with torch.no_grad():
        scores = predict(support, support_y, x[test])
    return (scores.argmax(1) == labels[test]).double().mean().item()


# One random real training image per class: the baseline, and where the learned set starts.
real = torch.stack([train[labels[train] == c][torch.randint(0, int((labels[train] == c).sum()), ())]
                    for c in range(10)])
support = x[real].clone().requires_grad_()
support_y = y[real].clone().requires_grad_()
optimizer = torch.optim.Adam([support, support_y], lr=0.02)
for step in range(STEPS):
    batch = train[torch.randperm(len(train))[:BATCH]]
    loss = ((predict(support, support_y, x[batch]) - y[batch]) ** 2).sum(1).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

print(f"NNGP kernel regression on 10 random real images: test accuracy "
      f"{accuracy(x[real], y[real]):.3f}")
print(f"NNGP kernel regression on 10 learned images ({STEPS} Adam steps): test accuracy "
      f"{accuracy(support.detach(), support_y.detach()):.3f}")

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    print("matplotlib is not installed (pip install 'ntbridge[plot]'): no plot written")
else:
    os.makedirs(out, exist_ok=True)
    fig, axes = plt.subplots(2, 10, figsize=(10, 2.4))
    for row, images, title in ((0, x[real], "real"), (1, support.detach(), "learned")):
        for c, ax in enumerate(axes[row]):
            ax.imshow(images[c].reshape(8, 8).numpy(), cmap="gray_r")
            ax.set_xticks([]), ax.set_yticks([])
            ax.set_title(f"{title} {c}", fontsize=7)
    path = os.path.join(out, "kernel_distillation.png")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    print("Plot written to", path)
