"""Cost per kernel entry of the numerical activation rules against the rule they replaced,
measured side by side.

Run: python benchmarks/activations.py [--quick]   (the float32 rows are part of benchmarks/run.py)

The reference ("old") is the rule every activation without a closed form had before the exact
activation kernels: the trapezoidal 2-D rule with 64 equally spaced nodes per dimension on
[-6.5, 6.5] (``smooth_rule`` with those nodes), on the same activation's function. Each row:
median time of today's compiled rule / the old one's on 256 x 256 entries (variances in
[0.3, 10], correlations in [-1, 1]), called alternately. Goal in float32: <= 2; float64 for
information (the old rule had the same nodes in float64, and was far less accurate).
"""

from __future__ import annotations

import argparse
import statistics

import jax
import numpy as np
from torch import nn

from ntbridge.converters.activations import twin
from ntbridge.stax.activations import numerical_rule
from ntbridge.stax.quadrature import smooth_rule
from run import interleaved_times, row

OLD = (64, 6.5)  # nodes per dimension, half width in standard deviations
MODULES = (nn.Softsign(), nn.Softplus(2.0, 5.0), nn.Tanh())


def entries(n: int, dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(c, q1, q2)`` of ``n x n`` kernel entries."""
    rng = np.random.default_rng(0)
    q1, q2 = rng.uniform(0.3, 10.0, (2, n, n))
    c = rng.uniform(-1.0, 1.0, (n, n)) * np.sqrt(q1 * q2)
    return tuple(a.astype(dtype) for a in (c, q1, q2))


def cost_rows(n: int, rounds: int, dtypes=("float32", "float64")) -> None:
    """One row per activation of ``MODULES`` and dtype of ``dtypes``."""
    for dtype in map(np.dtype, dtypes):
        with jax.enable_x64(dtype == np.float64):
            args = [jax.device_put(a) for a in entries(n, dtype)]
            for module in MODULES:
                fn_twin = twin(module)
                new = jax.jit(numerical_rule(*fn_twin))
                old = jax.jit(smooth_rule(fn_twin.fn, {dtype: OLD}))
                t_new, t_old = (statistics.median(t) for t in interleaved_times(
                    lambda: new(*args), lambda: old(*args), rounds))
                row(f"{module!r} {dtype.name} rule / old rule ({n}x{n})", t_new / t_old,
                    f"{t_new * 1e3:.1f} ms vs {t_old * 1e3:.1f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    args = parser.parse_args()
    cost_rows(256, 3 if args.quick else 7)
