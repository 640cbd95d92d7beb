"""The backward pass of analytic kernels relative to their forward, measured side by side.

Run: python benchmarks/gradients.py [--quick]   (also part of benchmarks/run.py)

Rows: the FC model (784 -> 3 x [512, ReLU] -> 10, N = 256) and a CNN with global average pooling
(3 x [conv 3x3 of 64 channels, ReLU] + GAP, 8x8 images, N = 32), NNGP + NTK with x2 = None. The
forward is ``ntbridge.kernel`` without gradients; the backward is ``torch.autograd.grad`` of a
weighted sum of both kernels w.r.t. the inputs (one forward's graph, retained). Goal: <= 3x.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from torch import nn

import ntbridge
from run import fc_model, interleaved_times, row


def cnn_gap() -> nn.Sequential:
    """3 x [conv 3x3 of 64 channels, ReLU], global average pooling, Linear to 10."""
    convs = [nn.Conv2d(3, 64, 3, padding=1), nn.ReLU()]
    for _ in range(2):
        convs += [nn.Conv2d(64, 64, 3, padding=1), nn.ReLU()]
    return nn.Sequential(*convs, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


def backward_vs_forward(name: str, model: nn.Module, x: torch.Tensor, rounds: int) -> None:
    """One row: median backward time / median forward time of the NNGP + NTK of ``x``."""
    def forward():
        with torch.no_grad():
            return ntbridge.kernel(model, x)

    xg = x.clone().requires_grad_()
    k = ntbridge.kernel(model, xg)
    w = torch.randn_like(k.nngp), torch.randn_like(k.ntk)
    loss = (w[0] * k.nngp).sum() + (w[1] * k.ntk).sum()
    backward = lambda: torch.autograd.grad(loss, xg, retain_graph=True)
    t_forward, t_backward = (statistics.median(t) for t in interleaved_times(forward, backward,
                                                                             rounds))
    row(f"{name} NNGP+NTK backward / forward (N={x.shape[0]})", t_backward / t_forward,
        f"backward {t_backward * 1e3:.1f} ms, forward {t_forward * 1e3:.1f} ms (goal <= 3)")


def gradient_rows(quick: bool) -> None:
    """The FC and CNN-GAP rows (smaller inputs with ``quick``)."""
    rounds = 3 if quick else 7
    backward_vs_forward("FC", fc_model(), torch.randn(64 if quick else 256, 784), rounds)
    backward_vs_forward("CNN-GAP 8x8", cnn_gap(), torch.randn(8 if quick else 32, 3, 8, 8), rounds)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    gradient_rows(parser.parse_args().quick)
