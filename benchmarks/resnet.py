"""ResNets' analytic kernels: torchvision's ResNet-18 layout, and the pre-activation ResNet that
Neural Tangents can express, side by side with it.

Run: python benchmarks/resnet.py [--n 64] [--size 32] [--points 256] [--nt-python nt/bin/python]
[--nt-n 8] [--nt-size 16]

Rows:

* ``resnet18``: ``ntbridge.kernel`` (NNGP and NTK, float32) of torchvision's ResNet-18 layout
  (``examples/torchvision_resnets.py``, eval mode) on ``n`` random images ``3 x size x size``, its
  BatchNorms fresh and with trained-looking statistics: the first call (compilation included),
  a steady call, the tile the plan chose, its memory (XLA's analysis of the tile's program) and
  the budget the plan kept it within, the process's peak resident memory, and the reported
  error of the numerical expectations (``ntbridge.expectation_error`` on 4 of the images);
* ``pre-activation`` (with ``--nt-python``): a ResNet of blocks ``x + conv(relu(conv(relu(x))))``
  (3x3 convolutions with zero padding, 2x2 average pooling between stages, ReLU, global average
  pooling, Linear): every nonlinearity sees a Gaussian, so both libraries have closed forms;
  Neural Tangents' ``stax`` network in a child process (its jitted ``kernel_fn``), both in float64
  and NTK parameterization (NT's default):
  the largest difference of each kernel relative to its largest entry and the steady time of each.
* ``once`` (``--rows once [--batch-size B]``): the fresh layout's first call alone (the whole
  cost at N = 64), its tiles and the peak resident memory;
* ``cost`` (``--rows cost [--n 2] [--size 16]``): the ResNet-18 and ResNet-50 layouts with
  trained-looking statistics, ``ntbridge.kernel`` and ``ntbridge.expectation_error``, each a first
  call (compilation included) and a steady one;
* ``montecarlo`` (``--rows montecarlo [--models ...] [--width 64] [--dtype float32]``):
  ResNet-18, ResNet-34 and ResNet-50 layouts at their own width (64, or ``--width``), BatchNorms
  fresh and with trained-looking statistics, on ``--mc-n`` random images ``3 x size x size``: the
  analytic NNGP and NTK (in ``--dtype``) against ``--samples`` fresh models (the same dtype)
  drawn as torch draws them (each convolution's and Linear's ``reset_parameters()``;
  BatchNorm's buffers, ``gamma`` and ``beta`` kept), NNGP ``f f^T / 10``, NTK over two of the
  outputs (every parameter, ``gamma`` and ``beta`` included): the largest z-score over the
  kernels' entries (the samples' standard error and the reported error in quadrature), and the
  standard error relative to the kernel's largest entry.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, jacrev

import ntbridge

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from torchvision_resnets import resnet18, resnet34, resnet50, trained_statistics  # noqa: E402

W_STD, B_STD, WIDTH, STAGES = 1.5, 0.1, 16, 3

NT_WORKLOAD = """
import json, sys, time
import jax, numpy as np
jax.config.update("jax_enable_x64", True)
from neural_tangents import stax
W, b, width, stages, folder = json.loads(sys.argv[1])
C = lambda: stax.Conv(width, (3, 3), padding="SAME", W_std=W, b_std=None)
block = stax.serial(stax.FanOut(2), stax.parallel(
    stax.serial(stax.Relu(), C(), stax.Relu(), C()), stax.Identity()), stax.FanInSum())
layers = [C()]
for s in range(stages):
    layers += [block] + ([stax.AvgPool((2, 2), (2, 2))] if s < stages - 1 else [])
_, _, kernel_fn = stax.serial(*layers, stax.Relu(), stax.GlobalAvgPool(), stax.Dense(10, W, b))
kernel_fn = jax.jit(kernel_fn, static_argnames="get")
x = np.load(folder + "/x.npy")
k = kernel_fn(x, None, get=("nngp", "ntk")); k.ntk.block_until_ready()
start = time.perf_counter()
k = kernel_fn(x, None, get=("nngp", "ntk")); k.ntk.block_until_ready()
np.savez(folder + "/nt.npz", nngp=k.nngp, ntk=k.ntk, seconds=time.perf_counter() - start)
"""


class PreActBlock(nn.Module):
    """``x + conv2(relu(conv1(relu(x))))``."""

    def __init__(self, c: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(torch.relu(self.conv1(torch.relu(x))))


def preact_resnet() -> nn.Sequential:
    """The pre-activation ResNet both libraries express (module doc)."""
    layers = [nn.Conv2d(3, WIDTH, 3, padding=1, bias=False)]
    for s in range(STAGES):
        layers += [PreActBlock(WIDTH)] + ([nn.AvgPool2d(2)] if s < STAGES - 1 else [])
    return nn.Sequential(*layers, nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(WIDTH, 10))


def resnet18_rows(n: int, size: int, points: int) -> None:
    x = torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(0))
    for label, model in (("fresh", resnet18().eval()), ("trained", trained_statistics(resnet18()))):
        opts = dict(expectation_points=points)
        start = time.perf_counter()
        ntbridge.kernel(model, x, **opts)
        first = time.perf_counter() - start
        start = time.perf_counter()
        _, info = ntbridge.kernel(model, x + 0.5, return_info=True, **opts)
        steady = time.perf_counter() - start
        error = ntbridge.expectation_error(model, x[:4], **opts)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20
        print(f"resnet18 {label:<8} N={n} {size}x{size} points={points}: first call {first:.1f} s, "
              f"steady {steady:.1f} s, tile {info.tile} ({info.tile_bytes / 2 ** 30:.2f} GiB of a budget of {info.budget / 2 ** 30:.1f}), "
              f"peak RSS {peak:.2f} GiB, reported error {error:.1e}", flush=True)


def resnet18_once(n: int, size: int, points: int, batch_size: int | None) -> None:
    """The fresh ResNet-18 layout's first call alone (the whole cost at large N), its tiling and
    the process's peak resident memory."""
    x = torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(0))
    start = time.perf_counter()
    _, info = ntbridge.kernel(resnet18().eval(), x, return_info=True, batch_size=batch_size,
                              expectation_points=points)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20
    print(f"resnet18 fresh N={n} {size}x{size} points={points}, one call: {seconds:.0f} s, "
          f"{info.tiles} tiles {info.tile} of {info.tile_bytes / 2 ** 30:.2f} GiB, peak RSS "
          f"{peak:.2f} GiB", flush=True)


def preact_rows(nt_python: str, n: int, size: int) -> None:
    x = np.random.default_rng(0).standard_normal((n, 3, size, size))
    model = preact_resnet().double()
    opts = dict(W_std=W_STD, b_std=B_STD, parameterization="ntk")  # NT's default
    ntbridge.kernel(model, torch.from_numpy(x), **opts)
    start = time.perf_counter()
    ours = ntbridge.kernel(model, torch.from_numpy(x), **opts)
    seconds = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as folder:
        np.save(Path(folder) / "x.npy", x.transpose(0, 2, 3, 1))  # NT: channels last
        subprocess.run([nt_python, "-c", NT_WORKLOAD,
                        json.dumps([W_STD, B_STD, WIDTH, STAGES, folder])], check=True,
                       capture_output=True)
        with np.load(Path(folder) / "nt.npz") as f:
            theirs = dict(f)
    rel = lambda a, ref: float(np.abs(a.numpy() - ref).max() / np.abs(ref).max())
    print(f"pre-activation N={n} {size}x{size} float64: NNGP {rel(ours.nngp, theirs['nngp']):.1e}, "
          f"NTK {rel(ours.ntk, theirs['ntk']):.1e} from NT; steady call ntbridge {seconds:.2f} s, "
          f"NT {float(theirs['seconds']):.2f} s", flush=True)


def cost_rows(n: int, size: int, points: int) -> None:
    x = torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(0))
    for name, build in (("resnet18", resnet18), ("resnet50", resnet50)):
        model, parts = trained_statistics(build()), []
        for call in (ntbridge.kernel, ntbridge.expectation_error):
            for label in ("first", "steady"):
                start = time.perf_counter()
                call(model, x, expectation_points=points)
                parts.append(f"{call.__name__} {label} {time.perf_counter() - start:.1f} s")
        print(f"cost {name} trained N={n} {size}x{size}: {'; '.join(parts)}", flush=True)


def fresh_samples(model: nn.Module, x: torch.Tensor, samples: int) -> tuple[torch.Tensor, ...]:
    """Per-sample NNGP ``f f^T / outputs`` and NTK (two outputs) of ``model`` redrawn ``samples``
    times by its convolutions' and Linears' own ``reset_parameters()`` (seeds 0, 1, ...)."""
    drawn = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    nngps, ntks = [], []
    for s in range(samples):
        torch.manual_seed(s)
        for m in drawn:
            m.reset_parameters()
        params = {k: v.detach() for k, v in model.named_parameters()}
        f = functional_call(model, params, x)
        jac = jacrev(lambda p: functional_call(model, p, x)[:, :2])(params)
        nngps.append(f @ f.T / f.shape[1])
        ntks.append(sum(torch.einsum("nop,mop->nm", j.flatten(2), j.flatten(2))
                        for j in jac.values()) / 2)
    return torch.stack(nngps).detach(), torch.stack(ntks).detach()


def montecarlo_rows(n: int, size: int, samples: int, points: int, width: int,
                    names: list[str], dtype: torch.dtype) -> None:
    x = torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(0), dtype=dtype)
    builds = {"resnet18": resnet18, "resnet34": resnet34, "resnet50": resnet50}
    for name in names:
        build = lambda: builds[name](width=width).to(dtype)
        for label, model in (("fresh", build().eval()), ("trained", trained_statistics(build()))):
            start = time.perf_counter()
            k = ntbridge.kernel(model, x, expectation_points=points)
            error = ntbridge.expectation_error(model, x, expectation_points=points)
            seconds = time.perf_counter() - start
            start = time.perf_counter()
            nngps, ntks = fresh_samples(model, x, samples)
            mc_seconds = time.perf_counter() - start
            parts = []
            for kernel, drawn in (("NNGP", k.nngp), ("NTK", k.ntk)):
                s = {"NNGP": nngps, "NTK": ntks}[kernel]
                se = s.std(0, correction=1) / samples ** 0.5
                spread = torch.sqrt(se ** 2 + (error * drawn.abs().max()) ** 2)
                z = ((drawn - s.mean(0)).abs() / spread).max()
                parts.append(f"{kernel} max z {z:.2f} (standard error "
                             f"{se.max() / drawn.abs().max():.1e} of its largest entry)")
            print(f"montecarlo {name} width {width} {label:<8} {str(dtype)[6:]} N={n} "
                  f"{size}x{size}, {samples} samples: "
                  f"{', '.join(parts)}; reported error {error:.1e}; analytic {seconds:.0f} s, "
                  f"samples {mc_seconds:.0f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--points", type=int, default=256)
    parser.add_argument("--nt-python", metavar="PATH", help="a Python with neural-tangents 0.6.5")
    parser.add_argument("--nt-n", type=int, default=8)
    parser.add_argument("--nt-size", type=int, default=16)
    parser.add_argument("--rows", choices=("timing", "once", "montecarlo", "cost"),
                        default="timing")
    parser.add_argument("--batch-size", type=int, help="tiles of this many images (--rows once)")
    parser.add_argument("--mc-n", type=int, default=3)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--models", nargs="+", default=["resnet18", "resnet34", "resnet50"])
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    args = parser.parse_args()
    if args.rows == "once":
        return resnet18_once(args.n, args.size, args.points, args.batch_size)
    if args.rows == "montecarlo":
        return montecarlo_rows(args.mc_n, args.size, args.samples, args.points, args.width,
                               args.models, getattr(torch, args.dtype))
    if args.rows == "cost":
        return cost_rows(args.n, args.size, args.points)
    if args.nt_python:
        preact_rows(args.nt_python, args.nt_n, args.nt_size)
    resnet18_rows(args.n, args.size, args.points)


if __name__ == "__main__":
    main()
