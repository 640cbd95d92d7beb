"""Training dynamics: the cost of a linearized model's forward+backward against the model's own,
and ntbridge.predict.gradient_descent on 1,000 training points to t = 1e4.

Goals: linearized / original <= 3x; the ODE under 10 s on 2 cores.

    python benchmarks/dynamics.py [--threads N] [--quick] [--rows all|linearized|ode]
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

import ntbridge
from ntbridge.predict import gradient_descent, max_learning_rate, mse


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                         nn.Linear(512, 10))


def cnn() -> nn.Module:
    """The torch.func tutorial's CNN (as in benchmarks/run.py)."""
    return nn.Sequential(nn.Conv2d(3, 32, 3), nn.ReLU(), nn.Conv2d(32, 32, 3), nn.ReLU(),
                         nn.Conv2d(32, 32, 3), nn.ReLU(), nn.Flatten(), nn.Linear(32 * 26 * 26, 10))


def seconds(fn, repeats: int) -> float:
    """Median wall time of ``fn()`` over ``repeats`` runs, after two warm-up runs."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def forward_backward(module: nn.Module, x: torch.Tensor):
    def step():
        module.zero_grad()
        module(x).square().sum().backward()
    return step


def linearized_rows(repeats: int) -> None:
    torch.manual_seed(0)
    for name, model, x in (("MLP 64-512-512-10, batch 256", mlp(), torch.randn(256, 64)),
                           ("CNN 3x(conv 32) + linear, batch 32", cnn(), torch.randn(32, 3, 32, 32))):
        original = seconds(forward_backward(model, x), repeats)
        linear = seconds(forward_backward(ntbridge.linearize(model), x), repeats)
        print(f"{name}: original {original * 1e3:.1f} ms, linearized {linear * 1e3:.1f} ms, "
              f"ratio {linear / original:.2f} (goal <= 3)")


def ode_rows(n: int, t: float, m: int = 200) -> None:
    torch.manual_seed(0)
    x = torch.randn(n, 64, dtype=torch.float64)
    labels = torch.randint(0, 10, (n,))
    model = mlp().double()
    k = ntbridge.ntk(model, x)  # (n, n), per output unit
    k_test = ntbridge.ntk(model, torch.randn(m, 64, dtype=torch.float64), x)
    ce = F.one_hot(labels, 10).double()
    y = ce - 0.1
    for name, loss, curvature, targets, test in (
            ("cross-entropy", lambda f, y: F.cross_entropy(f, y, reduction="sum"), 0.5, ce, None),
            ("MSE (predict.mse: the closed form)", mse, 1.0, y, None),
            ("MSE of one's own (the solver)", lambda f, y: mse(f, y), 1.0, y, None),
            (f"MSE of one's own, {m} test points", lambda f, y: mse(f, y), 1.0, y, k_test)):
        lr = 0.5 * max_learning_rate(k, loss_curvature=curvature)
        start = time.perf_counter()
        gradient_descent(loss, k, targets, lr, t, k_test_train=test)
        elapsed = time.perf_counter() - start
        print(f"gradient_descent, {name}, n = {n}, 10 outputs, lr = half the limit, t = {t:g}: "
              f"{elapsed:.2f} s (goal < 10 s)")
    start = time.perf_counter()
    ntbridge.predict.gradient_descent_mse(k, y, lr, t)
    print(f"gradient_descent_mse (closed form), same: {time.perf_counter() - start:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, help="torch's intra-op threads (default: torch's)")
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--rows", choices=("all", "linearized", "ode"), default="all",
                        help="which rows to run (default: all)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch threads: {torch.get_num_threads()}")
    if args.rows in ("all", "linearized"):
        linearized_rows(repeats=5 if args.quick else 20)
    if args.rows in ("all", "ode"):
        ode_rows(n=200 if args.quick else 1000, t=1e3 if args.quick else 1e4)


if __name__ == "__main__":
    main()
