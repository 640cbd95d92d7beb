"""Analytic kernel speed at the sizes users run, against Neural Tangents 0.6.5, and how far each row
is from its memory-traffic floor.

Run: python benchmarks/kernel_speed.py [--nt-python nt/bin/python] [--rounds R] [--quick] [--only TEXT]

Each workload (NNGP + NTK, 'ntk' parameterization, W_std 1.3 (1.4 for convolutions), b_std 0.2
(0.1), default options: the planner picks tiles) runs in a fresh process that times the steady
state (best of a few calls after the first). With ``--nt-python``, the same workload runs under
Neural Tangents in that interpreter (NHWC inputs, ``stax.Conv``/``Flatten``/``GlobalAvgPool``, x64
for float64, its ``kernel_fn`` jitted), alternating with ntbridge's processes; the ratio is
ntbridge / NT (the median over rounds of each side's best time).

The floor: a memory-bound kernel computed layer by layer in main memory must at least read and
write, per layer, the arrays it keeps (NNGP and NTK, ``N1 N2`` entries times the spatial pairs
they hold); the floor is those bytes divided by this machine's copy bandwidth (measured in the same
process, a large array ``a + 1``). Computed in blocks that stay in cache (``ntbridge.tiling.blocks``)
a kernel can go below it.
Each row also prints the tiles the planner chose, the memory one tile's program needs (XLA's
analysis: arguments, outputs and temporaries), the planner's budget for it and the result's size.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

# One workload in a fresh process: (name, dtype, N1, N2 (0: x2 = None), image size, channels).
COMMON = """
import json, sys, time
import numpy as np
name, dtype, n1, n2, size, channels = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7])
rng = np.random.default_rng(0)
depth = 3
def inputs(n):
    shape = (n, 784) if name == "FC" else (n, channels, size, size)
    return rng.standard_normal(shape).astype(dtype)
x1, x2 = inputs(n1), (inputs(n2) if n2 else None)
def best(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)
repeats = 5 if n1 * max(n1, n2) * (size * size if name.endswith("GAP") else 1) ** 2 < 3e8 else 2
"""
WORKLOAD = COMMON + """
import jax, torch, ntbridge
from torch import nn
torch.set_default_dtype(getattr(torch, dtype))
if name == "FC":
    model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    std = dict(W_std=1.3, b_std=0.2)
else:
    layers = []
    for i in range(depth):
        layers += [nn.Conv2d(channels if i == 0 else 64, 64, 3, padding=1), nn.ReLU()]
    head = ([nn.Flatten(), nn.Linear(64 * size * size, 10)] if name == "CNN Flatten" else
            [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)])
    model = nn.Sequential(*layers, *head)
    std = dict(W_std=1.4, b_std=0.1)
t1, t2 = torch.from_numpy(x1), (torch.from_numpy(x2) if n2 else None)
call = lambda: ntbridge.kernel(model, t1, t2, parameterization="ntk", **std)
seconds = best(call, repeats)
kernels, run = ntbridge.kernel(model, t1, t2, parameterization="ntk", return_info=True, **std)
result = sum(k.nbytes for k in kernels)
a = jax.numpy.ones((64 * 2 ** 20 // 4,), jax.numpy.float32)  # copy bandwidth, 256 MiB each way
copy = jax.jit(lambda a: a + 1)
bandwidth = 2 * a.nbytes / best(lambda: copy(a).block_until_ready(), 5)
print(json.dumps({"seconds": seconds, "bandwidth": bandwidth, "tiles": run.tiles,
                  "peak": run.tile_bytes, "budget": run.budget, "result": result}))
"""
NT_WORKLOAD = COMMON + """
import jax
jax.config.update("jax_enable_x64", dtype == "float64")
from neural_tangents import stax
x1 = x1 if name == "FC" else x1.transpose(0, 2, 3, 1)
x2 = x2 if name == "FC" or x2 is None else x2.transpose(0, 2, 3, 1)
if name == "FC":
    std = dict(W_std=1.3, b_std=0.2)
    layers = [stax.Dense(512, **std), stax.Relu()] * 3 + [stax.Dense(10, **std)]
else:
    std = dict(W_std=1.4, b_std=0.1)
    layers = [stax.Conv(64, (3, 3), padding="SAME", **std), stax.Relu()] * depth
    layers += [stax.Flatten() if name == "CNN Flatten" else stax.GlobalAvgPool(), stax.Dense(10, **std)]
kernel_fn = jax.jit(stax.serial(*layers)[2], static_argnames="get")
seconds = best(lambda: jax.block_until_ready(kernel_fn(x1, x2, ("nngp", "ntk"))), repeats)
print(json.dumps({"seconds": seconds}))
"""

# (name, dtype, N1, N2, size, channels): the sizes users run, and their targets' range.
ROWS = [
    ("FC", "float32", 2048, 0, 0, 0),
    ("FC", "float64", 2048, 0, 0, 0),
    ("CNN Flatten", "float32", 128, 0, 16, 3),
    ("CNN Flatten", "float64", 128, 0, 16, 3),
    ("CNN GAP", "float32", 32, 0, 8, 3),
    ("CNN GAP", "float32", 16, 0, 16, 3),
    ("CNN GAP", "float32", 100, 0, 8, 1),
    ("CNN GAP", "float64", 100, 0, 8, 1),
    ("CNN GAP", "float64", 300, 300, 8, 1),
    ("CNN GAP", "float64", 64, 0, 16, 3),
]
QUICK_ROWS = [r for r in ROWS if r[2] * max(r[2], r[3]) <= 128 * 128]
TARGETS = {"FC": 0.5, "CNN Flatten": 0.5, "CNN GAP": 0.3}


def floor_bytes(name: str, dtype: str, n1: int, n2: int, size: int) -> int:
    """Bytes the kernel must read and write per layer: NNGP and NTK of every layer's output."""
    pairs = n1 * (n2 or n1) * (1 if name == "FC" else size ** 2 if name == "CNN Flatten" else size ** 4)
    layers = 4  # three hidden layers (affine and ReLU in one pass) and the readout
    return 2 * 2 * pairs * layers * (4 if dtype == "float32" else 8)


def _child(python: str, workload: str, spec) -> dict:
    out = subprocess.run([python, "-c", workload, *map(str, spec)], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nt-python", metavar="PATH", help="a Python with neural-tangents 0.6.5")
    parser.add_argument("--rounds", type=int, default=1, help="alternating process pairs per row")
    parser.add_argument("--quick", action="store_true", help="the small rows only")
    parser.add_argument("--only", default="", help="the rows whose label contains this")
    args = parser.parse_args()
    print(f"{'benchmark':<52} {'ratio':>9}   detail")
    rows(args.nt_python, args.rounds, args.quick, args.only)


def rows(nt_python: str | None = None, rounds: int = 1, quick: bool = False,
         only: str = "") -> None:
    """Every row of this file whose spec contains ``only`` (``run.py`` calls it)."""
    for spec in QUICK_ROWS if quick else ROWS:
        if only not in " ".join(map(str, spec)):
            continue
        name, dtype, n1, n2, size, channels = spec
        ours, theirs = [], []
        for _ in range(rounds):
            ours.append(_child(sys.executable, WORKLOAD, spec))
            if nt_python:
                try:
                    theirs.append(_child(nt_python, NT_WORKLOAD, spec))
                except subprocess.CalledProcessError as e:  # e.g. killed for memory
                    print(f"  (Neural Tangents' process failed: exit status {e.returncode})")
        seconds = statistics.median(r["seconds"] for r in ours)
        floor = floor_bytes(name, dtype, n1, n2, size) / statistics.median(
            r["bandwidth"] for r in ours)
        image = "" if name == "FC" else f" {size}x{size}x{channels}"
        label = f"{name}{image} {dtype} N={n1}{'x' + str(n2) if n2 else ''}"
        mib = lambda key: f"{ours[0][key] / 2 ** 20:.0f} MiB"
        detail = (f"{seconds * 1e3:.1f} ms, floor {floor * 1e3:.1f} ms ({seconds / floor:.1f}x), "
                  f"{ours[0]['tiles']} tile(s) of peak {mib('peak')} (budget {mib('budget')}), "
                  f"result {mib('result')}")
        if theirs:
            nt = statistics.median(r["seconds"] for r in theirs)
            print(f"{label + ' / NT':<52} {seconds / nt:>8.2f}x   {detail}, NT {nt * 1e3:.1f} ms;"
                  f" target <= {TARGETS[name]}x", flush=True)
        else:
            print(f"{label:<52} {seconds * 1e3:>7.1f}ms   {detail}", flush=True)


if __name__ == "__main__":
    main()
