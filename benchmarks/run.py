"""ntbridge benchmarks: ratios measured side by side in one process (absolute times drift).

Run: python benchmarks/run.py [--quick]
"""

from __future__ import annotations

import argparse
import time

import jax

jax.config.update("jax_num_cpu_devices", 4)  # for the device-scaling rows (CPU devices share cores)

import torch  # noqa: E402
from torch import nn  # noqa: E402

import ntbridge  # noqa: E402
from ntbridge.dlpack import shares_memory, to_jax, to_torch  # noqa: E402


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
    model = fc_model()
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


def fc_model() -> nn.Sequential:
    layers = [nn.Linear(784, 512), nn.ReLU()] + [nn.Linear(512, 512), nn.ReLU()] * 2
    return nn.Sequential(*layers, nn.Linear(512, 10))


def tiling_overhead(n: int) -> None:
    """Tiled (4 x 4 tiles, one device) vs untiled analytic FC kernel, through ntbridge.kernel."""
    x, model = torch.randn(n, 784), fc_model()
    untiled = best_time(lambda: ntbridge.kernel(model, x, batch_size=0, device_count=1), 3)
    tiled = best_time(lambda: ntbridge.kernel(model, x, batch_size=n // 4, device_count=1), 3)
    row(f"FC kernel tiled {n // 4} / untiled, 1 device (N={n})", tiled / untiled,
        f"tiled {tiled * 1e3:.1f} ms, untiled {untiled * 1e3:.1f} ms (target <= 1.10)")


def device_scaling(n: int) -> None:
    """The same tiled kernel over 1, 2 and 4 devices (on CPU the devices share the cores)."""
    x, model = torch.randn(n, 784), fc_model()
    times = {d: best_time(lambda: ntbridge.kernel(model, x, batch_size=n // 4, device_count=d), 3)
             for d in (1, 2, 4)}
    for d in (2, 4):
        row(f"FC kernel {d} devices / 1 device (N={n}, {jax.devices()[0].platform})",
            times[d] / times[1], f"{times[d] * 1e3:.1f} ms vs {times[1] * 1e3:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    args = parser.parse_args()
    n = 512 if args.quick else 2048
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, torch {torch.__version__}\n")
    print(f"{'benchmark':<52} {'ratio':>9}   detail")
    fc_vs_gram(n)
    dlpack_handoff(n)
    tiling_overhead(n)
    device_scaling(n)


if __name__ == "__main__":
    main()
