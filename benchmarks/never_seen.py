"""First calls on never-seen architectures: random MLPs, CNNs, residual and concatenating networks,
each in a fresh process with an empty program cache, against Neural Tangents 0.6.5 on the same
architecture, alternating.

Run: python benchmarks/never_seen.py --nt-python nt/bin/python [--count 19] [--seed 0]
     python benchmarks/never_seen.py --nt-python nt/bin/python --depths 10 25 50

Each architecture is drawn from ``--seed`` (a JSON description both sides build: torch modules for
ntbridge, ``stax`` layers for Neural Tangents, NHWC images there) and its analytic NNGP + NTK of
64 inputs with themselves (CNNs: 32 images 8x8x3) is computed once, float32, timed after a full
garbage collection in both processes (``first_call.py``'s "after a collection"), imports apart.
Neural Tangents' ``kernel_fn`` is jitted, as its README recommends. The rows: each
architecture's ratio, then their median and geometric mean (target <= 0.25x). With ``--depths``,
MLPs of that many hidden ReLU layers instead (width 512), and how ntbridge's first call grows
with the depth.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import statistics
import sys
import tempfile

from first_call import GC_CLOCK, HEADER, _child, row

ACTIVATIONS = ("relu", "gelu", "leaky_relu")


def architecture(rng: random.Random) -> dict:
    """A random architecture: its family, layers' widths and activations, and the head."""
    family = rng.choice(("mlp", "cnn", "residual", "concat"))
    depth = rng.randint(1, 3) if family == "cnn" else rng.randint(2, 4)
    return {"family": family, "width": rng.choice((64, 128, 256, 512)),
            "activations": [rng.choice(ACTIVATIONS) for _ in range(depth)],
            "kernel": rng.choice((1, 3)), "head": rng.choice(("flatten", "pool"))}


# ntbridge's side: the architecture as torch modules (a module of its own for the residual and
# concatenating families, as users write them), NNGP + NTK of x with itself.
OURS = GC_CLOCK + """
import json, sys
t0 = time.perf_counter()
import torch, ntbridge
from torch import nn
spec = json.loads(sys.argv[1])
w, acts = spec["width"], spec["activations"]
act = lambda name: {"relu": nn.ReLU(), "gelu": nn.GELU(), "leaky_relu": nn.LeakyReLU(0.1)}[name]
class Residual(nn.Module):
    def __init__(self, name):
        super().__init__()
        self.a, self.l = act(name), nn.Linear(w, w)
    def forward(self, x):
        return x + self.l(self.a(x))
class Concat(nn.Module):
    def __init__(self, name):
        super().__init__()
        self.a, self.l1, self.l2 = act(name), nn.Linear(w, w // 2), nn.Linear(w, w // 2)
        self.l = nn.Linear(w, w)
    def forward(self, x):
        h = self.a(x)
        return self.l(torch.cat([self.l1(h), self.l2(h)], -1))
torch.manual_seed(0)
if spec["family"] == "cnn":
    k, layers, c = spec["kernel"], [], 3
    for name in acts:
        layers += [nn.Conv2d(c, w // 4, k, padding=k // 2), act(name)]
        c = w // 4
    head = ([nn.Flatten(), nn.Linear(c * 64, 10)] if spec["head"] == "flatten" else
            [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 10)])
    model, x = nn.Sequential(*layers, *head), torch.randn(32, 3, 8, 8)
else:
    block = {"mlp": lambda name: nn.Sequential(act(name), nn.Linear(w, w)),
             "residual": Residual, "concat": Concat}[spec["family"]]
    model = nn.Sequential(nn.Linear(32, w), *[block(name) for name in acts], nn.ReLU(),
                          nn.Linear(w, 10))
    x = torch.randn(64, 32)
kernel = ntbridge.kernel
imported = time.perf_counter()
start, gc0 = start_clock()
kernel(model, x, None)
print(json.dumps({"import_s": imported - t0, "first_s": time.perf_counter() - start,
                  "gc_s": gc_s[0] - gc0}))
"""
# Neural Tangents' side: the same architecture in stax (standard parameterization, torch's
# default weight variance 1/(3 fan_in)), its kernel_fn jitted.
THEIRS = GC_CLOCK + """
import json, sys
t0 = time.perf_counter()
import jax, numpy as np
from neural_tangents import stax
spec = json.loads(sys.argv[1])
w, acts = spec["width"], spec["activations"]
std = dict(W_std=3 ** -0.5, b_std=0.1, parameterization="standard")
act = lambda name: {"relu": stax.Relu(), "gelu": stax.Gelu(),
                    "leaky_relu": stax.LeakyRelu(0.1)}[name]
rng = np.random.default_rng(0)
if spec["family"] == "cnn":
    k, layers = spec["kernel"], []
    for name in acts:
        layers += [stax.Conv(w // 4, (k, k), padding="SAME", **std), act(name)]
    head = [stax.Flatten()] if spec["head"] == "flatten" else [stax.GlobalAvgPool()]
    layers += head + [stax.Dense(10, **std)]
    x = rng.standard_normal((32, 8, 8, 3)).astype("float32")
else:
    def block(name):
        if spec["family"] == "mlp":
            return stax.serial(act(name), stax.Dense(w, **std))
        if spec["family"] == "residual":
            return stax.serial(stax.FanOut(2), stax.parallel(
                stax.serial(act(name), stax.Dense(w, **std)), stax.Identity()), stax.FanInSum())
        return stax.serial(act(name), stax.FanOut(2), stax.parallel(
            stax.Dense(w // 2, **std), stax.Dense(w // 2, **std)), stax.FanInConcat(),
            stax.Dense(w, **std))
    layers = ([stax.Dense(w, **std)] + [block(name) for name in acts]
              + [stax.Relu(), stax.Dense(10, **std)])
    x = rng.standard_normal((64, 32)).astype("float32")
kernel_fn = jax.jit(stax.serial(*layers)[2], static_argnames="get")
imported = time.perf_counter()
start, gc0 = start_clock()
jax.block_until_ready(kernel_fn(x, None, ("nngp", "ntk")))
print(json.dumps({"import_s": imported - t0, "first_s": time.perf_counter() - start,
                  "gc_s": gc_s[0] - gc0}))
"""


def first_calls(spec: str, nt_python: str) -> tuple[float, float]:
    """ntbridge's and Neural Tangents' first calls on the architecture ``spec`` (JSON), each side
    in a fresh process with an empty cache (seconds)."""
    cache = tempfile.mkdtemp(prefix="ntbridge-bench-cache-")
    try:
        ours = _child([spec, "-", "collected"], cache, sys.executable, OURS)
        theirs = _child([spec, "-", "collected"], cache, nt_python, THEIRS)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return ours["first_s"], theirs["first_s"]


def rows(count: int, seed: int, nt_python: str) -> None:
    """One row per architecture (ntbridge's first call / NT's), then the median and geometric mean
    of the ratios."""
    rng, ratios = random.Random(seed), []
    for n in range(count):
        spec = json.dumps(architecture(rng))
        ours, theirs = first_calls(spec, nt_python)
        ratios.append(ours / theirs)
        row(f"never seen #{n}: first call / NT's", ratios[-1],
            f"{ours:.2f} s vs {theirs:.2f} s; {spec}")
    row(f"never seen, {count} architectures: median", statistics.median(ratios),
        "ntbridge's first call / NT's; target <= 0.25x")
    row(f"never seen, {count} architectures: geometric mean",
        math.exp(statistics.fmean(map(math.log, ratios))), "target <= 0.25x")


def deep_rows(depths: list[int], nt_python: str) -> None:
    """Deep MLPs (ReLU, width 512) at each of ``depths``: the first call / NT's, and how much
    longer ntbridge's first call takes than at the depth before (proportional growth: the ratio of
    the depths)."""
    before = None
    for depth in depths:
        spec = json.dumps({"family": "mlp", "width": 512, "activations": ["relu"] * depth,
                           "kernel": 1, "head": "flatten"})
        ours, theirs = first_calls(spec, nt_python)
        growth = "" if before is None else (f"; {ours / before[1]:.2f}x the first call at depth "
                                            f"{before[0]} ({depth / before[0]:.2f}x the depth)")
        row(f"deep MLP, {depth} hidden layers: first call / NT's", ours / theirs,
            f"{ours:.2f} s vs {theirs:.2f} s{growth}")
        before = (depth, ours)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nt-python", required=True, help="a Python with neural-tangents 0.6.5")
    parser.add_argument("--count", type=int, default=19, help="architectures")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--depths", type=int, nargs="+", metavar="D",
                        help="instead: deep MLPs of these numbers of hidden layers")
    args = parser.parse_args()
    print(HEADER)
    if args.depths:
        deep_rows(args.depths, args.nt_python)
    else:
        rows(args.count, args.seed, args.nt_python)
