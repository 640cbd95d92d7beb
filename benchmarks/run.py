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


def _cnn(head: str, size: int) -> nn.Module:
    """Two 3x3 conv layers of 64 channels with ReLU, then a Flatten or global-average-pooling head."""
    convs = [nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU()]
    tail = ([nn.Flatten(), nn.Linear(64 * size * size, 10)] if head == "Flatten" else
            [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)])
    return nn.Sequential(*convs, *tail)


def _cnn_kernel(head: str, n: int, size: int) -> tuple[float, float, int]:
    """Steady-state and compile times of the analytic NNGP + NTK of ``_cnn`` on n images, and the
    compiled program's memory (arguments, outputs and temporaries) from XLA's analysis."""
    graph = ntbridge.convert(_cnn(head, size))
    a = to_jax(torch.randn(n, 3, size, size))
    t0 = time.perf_counter()
    fn = jax.jit(lambda a: graph.kernel_fn(a, get=("nngp", "ntk"))).lower(a).compile()
    t_compile = time.perf_counter() - t0
    m = fn.memory_analysis()
    peak = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
    return best_time(lambda: fn(a)), t_compile, peak


def cnn_kernels(n_flatten: int, n_pool: int) -> None:
    """Analytic CNN kernels: scaling in N and image size, compile vs steady-state time.

    A Flatten head keeps only same-position covariances (cost ~ N^2 H W); global average pooling
    needs every pair of positions (cost ~ N^2 (H W)^2).
    """
    for head, n in (("Flatten", n_flatten), ("global avg pool", n_pool)):
        t, t_compile, peak = _cnn_kernel(head, n, 8)
        t_2n = _cnn_kernel(head, 2 * n, 8)[0]
        t_16, _, peak_16 = _cnn_kernel(head, n, 16)
        entry = lambda t: f"{t / n ** 2 * 1e6:.1f} us/entry"
        row(f"CNN {head} 8x8: time(2N)/time(N) (N={n})", t_2n / t,
            f"ideal 4; {entry(t)}, peak {peak / 2 ** 20:.1f} MiB")
        row(f"CNN {head}: time 16x16 / 8x8 (N={n})", t_16 / t,
            f"ideal {4 if head == 'Flatten' else 16}; 16x16: {entry(t_16)}, "
            f"peak {peak_16 / 2 ** 20:.1f} MiB")
        row(f"CNN {head} 8x8: compile / steady-state (N={n})", t_compile / t,
            f"compile {t_compile:.2f} s, steady {t * 1e3:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    args = parser.parse_args()
    n = 512 if args.quick else 2048
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, torch {torch.__version__}\n")
    print(f"{'benchmark':<52} {'ratio':>9}   detail")
    fc_vs_gram(n)
    dlpack_handoff(n)
    cnn_kernels(64 if args.quick else 256, 8 if args.quick else 32)


if __name__ == "__main__":
    main()
