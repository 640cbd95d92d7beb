"""ntbridge benchmarks: ratios measured side by side in one process (absolute times drift).

Run: python benchmarks/run.py [--quick]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import torch
from torch import nn

import ntbridge
from ntbridge.dlpack import shares_memory, to_jax, to_torch


def best_time(fn, repeats: int = 5) -> float:
    """Best wall time of ``fn()`` over ``repeats`` runs, after one warm-up (compilation) run."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return min(times)


def row(name: str, ratio: float, detail: str) -> None:
    print(f"{name:<52} {ratio:>8.2f}x   {detail}")


def fc_vs_gram(n: int) -> None:
    """Analytic FC kernel (784 -> 3 x [512, ReLU] -> 10, NNGP + NTK) vs the bare X @ X.T."""
    x = torch.randn(n, 784)
    layers = [nn.Linear(784, 512), nn.ReLU()] + [nn.Linear(512, 512), nn.ReLU()] * 2
    model = nn.Sequential(*layers, nn.Linear(512, 10))
    graph = ntbridge.convert(model)
    a = to_jax(x)
    gram = jax.jit(lambda a: a @ a.T)
    t_gram = best_time(lambda: gram(a))
    t_kernel = best_time(lambda: graph.kernel_fn(a, get=("nngp", "ntk")))
    row(f"FC kernel NNGP+NTK / Gram X@X.T (N={n})", t_kernel / t_gram,
        f"kernel {t_kernel * 1e3:.1f} ms, gram {t_gram * 1e3:.1f} ms")


def dlpack_handoff(n: int) -> None:
    """Bytes copied by the torch <-> JAX hand-off and its share of a whole ntbridge.ntk call."""
    x = torch.randn(n, 784)
    model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 10))
    a = to_jax(x)
    k = ntbridge.convert(model).kernel_fn(a, get="ntk")
    copied = (0 if shares_memory(x, a) else x.nbytes) + (0 if shares_memory(to_torch(k), k) else k.nbytes)
    t_handoff = best_time(lambda: (to_jax(x), to_torch(k)))
    t_call = best_time(lambda: ntbridge.ntk(model, x))
    row(f"DLPack hand-off / whole ntbridge.ntk call (N={n})", t_handoff / t_call,
        f"bytes copied: {copied}, hand-off {t_handoff * 1e6:.0f} us, call {t_call * 1e3:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    args = parser.parse_args()
    n = 512 if args.quick else 2048
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, torch {torch.__version__}\n")
    print(f"{'benchmark':<52} {'ratio':>9}   detail")
    fc_vs_gram(n)
    dlpack_handoff(n)


if __name__ == "__main__":
    main()
