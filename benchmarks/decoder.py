"""A decoder's analytic kernels against the same-size encoder's, measured side by side.

Run: python benchmarks/decoder.py [--quick]   (the rows are part of benchmarks/run.py)

Decoder: 3x4x4 inputs, ``ConvTranspose2d(3, 64, 4, stride=2, padding=1)`` (8x8), ReLU,
``Upsample(scale_factor=2)`` (nearest, 16x16), ``Conv2d(64, 64, 3, padding=1)``, ReLU, Flatten,
Linear. Encoder: run.py's Flatten CNN at 16x16 (two 3x3 convolutions of 64 channels on 3x16x16
inputs, the same head). Both keep same-position covariances only (nearest upsampling selects one
input per output), so both cost ~ N^2 H W at the 16x16 maps. Target: decoder <= 1.5x.
"""

from __future__ import annotations

import argparse
import statistics

import jax
import torch
from torch import nn

import ntbridge
from ntbridge.dlpack import to_jax
from run import _cnn, interleaved_times, row


def decoder() -> nn.Sequential:
    return nn.Sequential(
        nn.ConvTranspose2d(3, 64, 4, stride=2, padding=1), nn.ReLU(), nn.Upsample(scale_factor=2),
        nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(64 * 16 * 16, 10))


def _program(model: nn.Module, x: torch.Tensor):
    """The compiled NNGP + NTK program of ``model`` on ``x``, as a call without arguments."""
    graph, a = ntbridge.convert(model), to_jax(x)
    fn = jax.jit(lambda a: graph.kernel_fn(a, get=("nngp", "ntk"))).lower(a).compile()
    return lambda: fn(a)


def decoder_rows(n: int, rounds: int) -> None:
    """The compiled programs, then the public ``ntbridge.kernel`` calls (tiles included)."""
    models = (decoder(), _cnn("Flatten", 16))
    inputs = (torch.randn(n, 3, 4, 4), torch.randn(n, 3, 16, 16))
    programs = [_program(m, x) for m, x in zip(models, inputs)]
    calls = [lambda m=m, x=x: ntbridge.kernel(m, x) for m, x in zip(models, inputs)]
    for what, (dec, enc) in (("program", programs), ("ntbridge.kernel", calls)):
        t_dec, t_enc = (statistics.median(t) for t in interleaved_times(dec, enc, rounds))
        row(f"decoder / encoder 16x16 {what} (N={n})", t_dec / t_enc,
            f"target <= 1.5; {t_dec * 1e3:.0f} ms vs {t_enc * 1e3:.0f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    args = parser.parse_args()
    decoder_rows(128, 3 if args.quick else 7)
