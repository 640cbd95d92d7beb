"""The ``ntbridge`` command.

``ntbridge demo``: on a fixed synthetic data set, the analytic NNGP and NTK of a small MLP, and how
far the empirical NTK of freshly initialised torch models of growing width is from its
infinite-width limit.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from torch import nn


def _mlp(width: int, d_in: int = 16) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_in, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, 1))


def _matrix(name: str, k: torch.Tensor) -> str:
    rows = "\n".join("  " + " ".join(f"{v:8.4f}" for v in row) for row in k.tolist())
    return f"{name} {tuple(k.shape)}:\n{rows}"


def demo(widths: list[int], seeds: int, n: int) -> None:
    import ntbridge

    x = torch.randn(n, 16, generator=torch.Generator().manual_seed(0))
    print(f"ntbridge demo: MLP 16 -> [width, ReLU] x 2 -> 1 on {n} fixed Gaussian inputs.\n")
    start = time.perf_counter()
    k = ntbridge.kernel(_mlp(widths[0]), x, parameterization="ntk")
    print(f"(analytic kernels, first call incl. compilation: {time.perf_counter() - start:.2f} s)")
    print(_matrix("Analytic NNGP", k.nngp))
    print(_matrix("Analytic NTK, NTK parameterization (width-independent)", k.ntk))
    print("\nEmpirical NTK of torch's default init vs the analytic NTK at the same widths "
          "(standard parameterization)")
    print(f"relative Frobenius error, mean ± std over {seeds} seeds:\n")
    print(f"{'width':>7} | {'rel. error':>18} | {'analytic s':>10} | {'empirical s':>11}")
    print(f"{'':>7} | {'':>18} | {'(compiled)':>10} | {'(per seed)':>11}")
    print(f"{'-' * 7}-+-{'-' * 18}-+-{'-' * 10}-+-{'-' * 11}")
    for width in widths:
        errors, t_emp = [], 0.0
        for seed in range(seeds):
            torch.manual_seed(seed)
            model = _mlp(width)
            t0 = time.perf_counter()
            emp = ntbridge.empirical_ntk(model, x)
            t_emp += time.perf_counter() - t0
            if seed == 0:
                ntbridge.ntk(model, x)  # compile for this width
                t0 = time.perf_counter()
                exact = ntbridge.ntk(model, x)
                t_ana = time.perf_counter() - t0
            errors.append((torch.linalg.norm(emp - exact) / torch.linalg.norm(exact)).item())
        e = torch.tensor(errors)
        print(f"{width:>7} | {e.mean():8.4f} ± {e.std():7.4f} | {t_ana:10.3f} | {t_emp / seeds:11.3f}")
    print(f"\nThe error falls about as width**-0.5 (finite-width fluctuations). "
          f"Total {time.perf_counter() - start:.1f} s.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ntbridge", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="kernels of a small MLP and the width convergence table")
    p.add_argument("--widths", default="64,256,1024,4096", help="comma-separated widths")
    p.add_argument("--seeds", type=int, default=3, help="seeds per width")
    p.add_argument("--n", type=int, default=6, help="number of inputs")
    args = parser.parse_args(argv)
    if args.command == "demo":
        demo([int(w) for w in args.widths.split(",")], args.seeds, args.n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
