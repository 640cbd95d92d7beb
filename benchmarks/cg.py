"""ntbridge.predict's iterative solvers (solver="cg") against the dense ones, and kernel regression
past the memory of a dense solve.

* ``agreement``: N = 5,000 float64 (an FC ReLU network's NNGP and NTK on synthetic data): CG
  against Cholesky (predictions, the bound ``|K*| |A^-1| tol |y|``, iterations, time), the
  preconditioner's rank against the iterations, and the ensemble at finite times (Lanczos)
  against the eigendecomposition.
* ``scale``: N = 20,000 float32, the NNGP written to disk with ``out=`` and solved by CG: time and
  the process' peak memory (goal: under 10 minutes, under 4 GiB; a dense solve needs the 1.6 GB
  kernel in memory and a factorisation of it).

    python benchmarks/cg.py [--threads 1] [--only agreement|scale] [--n 5000] [--n-large 20000]
"""

import argparse
import math
import os
import tempfile
import threading
import time

import torch
from torch import nn

import ntbridge
from ntbridge import predict
from ntbridge.predict import cg, lanczos
from ntbridge.predict.operator import KernelOperator

D = 16


def mlp(dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                         nn.Linear(512, 1)).to(dtype)


def task(n: int, m: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``n + m`` Gaussian inputs in 16 dimensions and targets from a random tanh teacher plus
    noise of standard deviation 0.1 (the targets have about unit variance)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n + m, D, generator=g, dtype=torch.float64)
    a, b = torch.randn(D, 32, generator=g, dtype=torch.float64), torch.randn(32, 1, generator=g,
                                                                             dtype=torch.float64)
    y = torch.tanh(x @ a / math.sqrt(D)) @ b / math.sqrt(32 * 0.4)
    y = y + 0.1 * torch.randn(n + m, 1, generator=g, dtype=torch.float64)
    return x.to(dtype), y.to(dtype)


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


class PeakMemory:
    """The process' peak resident memory over a phase: the kernel's high-water mark (VmHWM, reset
    at the start by ``/proc/self/clear_refs``), and its anonymous and file-backed parts sampled
    every 20 ms in a thread."""

    def __init__(self):
        self.anon = self.file = self.hwm = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    @staticmethod
    def status() -> dict:
        with open("/proc/self/status") as f:
            return {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f
                    if line.startswith(("RssAnon", "RssFile", "VmHWM"))}

    def run(self):
        while not self.stop.wait(0.02):
            now = self.status()
            self.anon, self.file = max(self.anon, now["RssAnon"]), max(self.file, now["RssFile"])

    def __enter__(self):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        self.before = self.status()["RssAnon"]
        self.thread.start()
        return self

    def __exit__(self, *_):
        self.stop.set()
        self.thread.join()
        self.hwm = self.status()["VmHWM"]

    def __str__(self):
        return (f"peak {gib(self.hwm)} (at most {gib(self.anon)} anonymous, "
                f"{gib(self.anon - self.before)} more than at the start; {gib(self.file)} file "
                f"pages)")


def gib(b: float) -> str:
    return f"{b / 2**30:.2f} GiB"


def agreement(n: int, m: int = 500) -> None:
    x, y = task(n, m, torch.float64)
    k, secs = timed(lambda: ntbridge.kernel(mlp(torch.float64), x, x[:n], get=("nngp", "ntk")))
    print(f"N = {n} float64, {m} test points; kernels {secs:.1f} s")
    nngp, ntk, yt = k.nngp, k.ntk, y[:n]
    reg = 1e-3
    a = nngp[:n] + reg * nngp[:n].diagonal().mean() * torch.eye(n, dtype=torch.float64)
    (lam, secs) = timed(lambda: torch.linalg.eigvalsh(a))
    print(f"  NNGP + {reg} mean(diag): eigenvalues {lam[0]:.3g} .. {lam[-1]:.3g}, "
          f"cond {lam[-1] / lam[0]:.3g} ({secs:.1f} s)")
    dense, secs = timed(lambda: predict.gp_inference(nngp[:n], yt, nngp[n:], diag_reg=reg))
    print(f"  cholesky: {secs:.2f} s, test rmse {(dense.mean - y[n:]).square().mean().sqrt():.4f}"
          f" (targets' rms {y[n:].square().mean().sqrt():.4f})")
    k_star = torch.linalg.matrix_norm(nngp[n:], 2)
    shift = reg * float(nngp[:n].diagonal().mean())
    for tol in (1e-6, 1e-10):
        (x_cg, info), secs = timed(lambda: cg.solve(nngp[:n], yt, shift=shift, tol=tol))
        pred = nngp[n:] @ x_cg
        err = (pred - dense.mean).norm() / dense.mean.norm()
        bound = k_star / lam[0] * tol * yt.norm() / dense.mean.norm()
        print(f"  cg tol {tol:g}: {info.iterations} iterations, {secs:.2f} s, predictions' "
              f"relative difference {err:.2e} (bound cond-based {bound:.2e}), residual "
              f"{info.residual.max():.2e}")
    ranks(nngp[:n], yt)
    float32_arithmetic(nngp[:n].float(), yt.float(), shift)
    finite_times(ntk, y, n)


def ranks(k: torch.Tensor, y: torch.Tensor) -> None:
    """Iterations against the preconditioner's rank and ``d`` (the Woodbury diagonal)."""
    for reg in (1e-2, 1e-4):
        shift = reg * float(k.diagonal().mean())
        row = []
        for rank in (0, 100, 300):
            for variant in (("d = s + mean(diag(K - L L^T))", "d = s") if rank else ("Jacobi",)):
                a = KernelOperator(k, shift)
                pre = cg.Preconditioner(a, rank)
                if variant == "d = s":
                    pre.d = shift
                    core = pre.factor.T @ pre.factor + shift * torch.eye(pre.rank,
                                                                         dtype=torch.float64)
                    pre.core = torch.linalg.cholesky(core)
                try:
                    (_, info), secs = timed(lambda: cg.iterate(a, y.double(), pre, 1e-8, 3000))
                    row.append(f"{variant} rank {rank}: {info.iterations} ({secs:.1f} s)")
                except ntbridge.errors.ConvergenceError:
                    row.append(f"{variant} rank {rank}: > 3000")
        print(f"  iterations to tol 1e-8, diag_reg {reg:g}: " + "; ".join(row))


def float32_arithmetic(k: torch.Tensor, y: torch.Tensor, shift: float) -> None:
    """A float32 kernel's products in float32 against float64 (the default): time and the residual
    CG reaches."""
    row = []
    for dtype in (torch.float32, torch.float64):
        a = KernelOperator(k, shift, dtype=dtype)
        v = y.to(dtype)
        _, secs = timed(lambda: [a.matmul(v) for _ in range(10)])
        try:
            (_, info), _ = timed(lambda: cg.iterate(a, v, cg.Preconditioner(a, 300), 1e-6, 1000))
            reached = f"tol 1e-6 in {info.iterations} iterations"
        except ntbridge.errors.ConvergenceError as e:
            reached = f"stalls at residual {e.residual:.2g} ({e.iterations} iterations)"
        row.append(f"{str(dtype).replace('torch.', '')} products {secs / 10 * 1e3:.0f} ms, "
                   f"CG {reached}")
    print("  the float32 kernel: " + "; ".join(row))


def finite_times(ntk: torch.Tensor, y: torch.Tensor, n: int) -> None:
    """The ensemble at finite times, lr half the stability limit (``lr lambda_max = 1``)."""
    t = [10.0, 100.0, 1000.0, 10000.0, math.inf]
    lr = predict.max_learning_rate(ntk[:n]) / 2
    args = (ntk[:n], y[:n], ntk[n:], t)
    dense, secs = timed(lambda: predict.gradient_descent_mse_ensemble(*args, lr=lr, diag_reg=1e-3))
    far = ((dense.mean[:-1] - dense.mean[-1]).flatten(1).norm(dim=1) /
           dense.mean[-1].norm()).tolist()
    print(f"  ensemble at t = {t}, lr = 1 / lambda_max: eigh {secs:.1f} s; relative distance of "
          f"the finite times' mean to t = inf's: " + ", ".join(f"{e:.2g}" for e in far))
    shift = 1e-3 * float(ntk[:n].diagonal().mean())
    for tol in (1e-6, 1e-10):
        fast, secs = timed(lambda: predict.gradient_descent_mse_ensemble(
            *args, lr=lr, diag_reg=1e-3, solver="cg", tol=tol))
        err = ((fast.mean - dense.mean).flatten(1).norm(dim=1) /
               dense.mean.flatten(1).norm(dim=1))
        steps = [lanczos.flow_solve(ntk[:n], y[:n], lr, torch.tensor([when], dtype=torch.float64),
                                    shift=shift, tol=tol, max_iter=1000)[1] for when in t[:-1]]
        print(f"    cg tol {tol:g}: {secs:.1f} s, relative difference per t "
              + ", ".join(f"{e:.1e}" for e in err.tolist())
              + f"; Lanczos steps per finite t alone {steps}")


def scale(n: int, batch_size: int | None, m: int = 1000) -> None:
    x, y = task(n, m, torch.float32)
    model = mlp(torch.float32)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "nngp.npy")
        start = time.perf_counter()
        with PeakMemory() as kernels:
            k_train, secs_k = timed(lambda: ntbridge.nngp(model, x[:n], out=path, progress=False,
                                                          batch_size=batch_size))
            k_test, secs_t = timed(lambda: ntbridge.nngp(model, x[n:], x[:n], progress=False))
        with PeakMemory() as solve:
            pred, secs_cg = timed(lambda: predict.gp_inference(k_train, y[:n], k_test,
                                                               diag_reg=1e-3, solver="cg"))
        total = time.perf_counter() - start
        size = os.path.getsize(path)
        shift = 1e-3 * float(k_train.diagonal().double().mean())
        (_, info), secs_info = timed(lambda: cg.solve(k_train, y[:n], shift=shift, tol=1e-4))
    rmse = (pred.mean - y[n:]).square().mean().sqrt()
    print(f"N = {n} float32 on disk ({gib(size)} file, batch_size {batch_size}), {m} test points, "
          f"diag_reg 1e-3, default tol:")
    print(f"  kernels {secs_k:.1f} s (train, to disk) + {secs_t:.1f} s (test), CG {secs_cg:.1f} s;"
          f" total {total:.1f} s (goal < 600 s)")
    print(f"  test rmse {rmse:.4f} (targets' rms {y[n:].square().mean().sqrt():.4f}); the solve "
          f"again by cg.solve: {info.iterations} iterations, {info.products} passes over the "
          f"kernel, residual {info.residual.max():.2e}, {secs_info:.1f} s")
    print(f"  memory (goal < 4 GiB): kernels {kernels}; CG {solve}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", choices=("agreement", "scale"))
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--n-large", type=int, default=20000)
    parser.add_argument("--batch-size", type=int, default=None,
                        help="tiles of the large kernel (default: ntbridge's, the largest that fit)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.only != "scale":
        agreement(args.n)
    if args.only != "agreement":
        scale(args.n_large, args.batch_size)


if __name__ == "__main__":
    main()
