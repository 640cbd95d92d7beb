"""Random features (``ntbridge.features``): how their error falls with their number, and kernel
regression on 200,000 examples as a linear model.

1. Relative error ``|phi phi^T - K| / |K|`` (Frobenius, mean over seeds) of the NNGP and NTK of a
   3-hidden-layer ReLU MLP and of a CNN (two 3x3 convolutions, global average pooling) against
   ``ntbridge.kernel``, for F = 64 ... 4096 features (the CNN to 2048); the log-log slope (theory: -1/2), and a plot.
2. Regression of a teacher network's outputs (16 inputs, noise 0.1) with the NNGP of a
   2-hidden-layer ReLU MLP: exact kernel regression (``predict.gp_inference``) against ridge
   regression on F random features and on F Nyström features (``ntbridge.nystrom_features``, F
   landmarks drawn from the training inputs), on 5,000 training examples where all run (the same
   regularisation, relative to the kernel's mean diagonal as ``diag_reg`` is); then both kinds
   of features on 200,000 training examples (time, peak memory, test error).

    python benchmarks/features.py [--quick] [--plot features.png]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time

import numpy as np
import torch
from torch import nn

import ntbridge

REG = 1e-2  # the regressions' noise, relative to the kernel's mean diagonal (as diag_reg)
KINDS = ("random", "Nystrom")


def mlp(d: int, hidden: int) -> nn.Module:
    layers = [nn.Linear(d, 512)]
    for _ in range(hidden - 1):
        layers += [nn.ReLU(), nn.Linear(512, 512)]
    return nn.Sequential(*layers, nn.ReLU(), nn.Linear(512, 1))


def cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 1))


def error_rows(sizes: dict[str, list[int]], seeds: int) -> dict:
    """Per network and kernel, the mean relative error at each F, and the fitted slope."""
    gen = torch.Generator().manual_seed(0)
    cases = {"MLP (3 hidden, ReLU)": (mlp(16, 3).double(), torch.randn(128, 16, generator=gen)),
             "CNN (2 conv, GAP)": (cnn().double(), torch.randn(32, 3, 8, 8, generator=gen))}
    curves = {}
    for (label, (model, x)), fs in zip(cases.items(), sizes.values()):
        x = x.double()
        exact = ntbridge.kernel(model, x)
        errors = {"nngp": [], "ntk": []}
        for f in fs:
            phis = [ntbridge.features(model, x, f, get=("nngp", "ntk"), seed=s) for s in range(seeds)]
            for name, k in exact._asdict().items():
                errors[name].append(np.mean([float((getattr(p, name) @ getattr(p, name).T - k).norm()
                                                   / k.norm()) for p in phis]))
        for name, e in errors.items():
            slope = np.polyfit(np.log(fs), np.log(e), 1)[0]
            curves[f"{label} {name}"] = (fs, e)
            print(f"{label:22s} {name:4s} slope {slope:+.2f}  errors "
                  + " ".join(f"F={f}:{v:.3g}" for f, v in zip(fs, e)), flush=True)
    return curves


def _teacher(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs ``(n, 16)`` and the outputs of a fixed random tanh network, plus noise 0.1."""
    torch.manual_seed(1234)  # the teacher is the same for every draw of inputs
    teacher = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=gen)
    with torch.no_grad():
        y = 3 * teacher(x) + 0.1 * torch.randn(n, 1, generator=gen)
    return x, y


def ridge(phi: torch.Tensor, y: torch.Tensor, phi_test: torch.Tensor) -> torch.Tensor:
    """Predictions of ridge regression on features, ``phi_test (phi^T phi + s I)^-1 phi^T y``
    (= the GP mean with kernel ``phi phi^T`` and noise ``s``), solved in float64, where ``s =
    REG * mean(diag(phi phi^T))``: the noise ``gp_inference(..., diag_reg=REG)`` adds."""
    gram = (phi.T @ phi).double()
    shift = REG * gram.trace() / len(phi)
    a = gram + shift * torch.eye(len(gram), dtype=gram.dtype)
    return phi_test.double() @ torch.linalg.solve(a, (phi.T @ y.to(phi.dtype)).double())


def test_error(pred: torch.Tensor, y: torch.Tensor) -> float:
    return float(((pred - y) ** 2).mean() / y.var())


def feature_map(kind: str, model: nn.Module, x: torch.Tensor, n_train: int,
                n_features: int) -> torch.Tensor:
    """``"random"`` or ``"Nystrom"`` features of ``x``, whose first ``n_train`` rows are the
    training inputs (the landmarks are drawn from them)."""
    if kind == "random":
        return ntbridge.features(model, x, n_features)
    draw = torch.randperm(n_train, generator=torch.Generator().manual_seed(0))[:n_features]
    return ntbridge.nystrom_features(model, x, x[draw])


def regression_rows(n_small: int, n_features: int) -> None:
    """Exact NNGP regression against ridge regression on both kinds of features."""
    model, (x_test, y_test) = mlp(16, 2), _teacher(10_000, seed=1)
    x, y = _teacher(n_small, seed=2)
    x, y, x_all = x.double(), y.double(), torch.cat([x.double(), x_test.double()])
    k = ntbridge.nngp(model, x_all, x)
    e_exact = test_error(ntbridge.predict.gp_inference(k[:n_small], y, k[n_small:],
                                                       diag_reg=REG).mean, y_test)
    print(f"N = {n_small}: exact NNGP regression test error {e_exact:.4f} (relative MSE)")
    for kind in KINDS:
        phi = feature_map(kind, model, x_all, n_small, n_features)
        e = test_error(ridge(phi[:n_small], y, phi[n_small:]), y_test)
        print(f"N = {n_small}: {n_features} {kind} features {e:.4f} "
              f"({100 * (e / e_exact - 1):+.1f}%)", flush=True)


def large_row(kind: str, n_large: int, n_features: int) -> None:
    """Ridge regression on ``n_large`` examples' float32 features of ``kind``: time, peak memory
    of the process (run one kind per process to read its own) and test error."""
    model, (x_test, y_test) = mlp(16, 2), _teacher(10_000, seed=1)
    x, y = _teacher(n_large, seed=2)
    start = time.perf_counter()
    phi = feature_map(kind, model, torch.cat([x, x_test]), n_large, n_features)
    made = time.perf_counter() - start
    pred = ridge(phi[:n_large], y, phi[n_large:])
    total = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20
    print(f"N = {n_large}: {n_features} float32 {kind} features in {made:.0f} s, regression done "
          f"in {total:.0f} s (target < 300 s), peak memory {peak:.1f} GiB; test error "
          f"{test_error(pred, y_test):.4f}", flush=True)


def plot(curves: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 4))
    for label, (fs, errors) in curves.items():
        ax.loglog(fs, errors, "o-", label=label)
    fs, errors = next(iter(curves.values()))
    ax.loglog(fs, [errors[0] * (f / fs[0]) ** -0.5 for f in fs], "k--", label="slope -1/2")
    ax.set_xlabel("number of features F")
    ax.set_ylabel("relative Frobenius error")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"Plot written to {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--plot", help="write the error-vs-features plot to this PNG")
    parser.add_argument("--large", nargs=3, metavar=("KIND", "N", "F"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.large:
        return large_row(args.large[0], int(args.large[1]), int(args.large[2]))
    full = [64, 128, 256, 512, 1024, 2048, 4096]
    sizes = {"mlp": [64, 256], "cnn": [64, 256]} if args.quick else {"mlp": full, "cnn": full[:-1]}
    curves = error_rows(sizes, 2 if args.quick else 3)
    if args.plot:
        plot(curves, args.plot)
    n_small, n_large, n_features = (500, 5_000, 256) if args.quick else (5_000, 200_000, 2048)
    regression_rows(n_small, n_features)
    for kind in KINDS:  # one process each, so that each peak memory is its own
        subprocess.run([sys.executable, __file__, "--large", kind, str(n_large), str(n_features)],
                       check=True)


if __name__ == "__main__":
    main()
