"""First calls: XLA compilations per call, a fresh process with an empty vs a warm compilation
cache, and the command line's start-up, each measured as a ratio in one run.

Run: python benchmarks/first_call.py [--rounds R] [--nt-python nt/bin/python]

Every workload runs in fresh processes (as a notebook or a CI job does), alternately with an empty
and with a warm cache directory, so both see the same machine load. With ``--nt-python``, the same
analytic workloads also run under Neural Tangents 0.6.5 in that interpreter's environment (NHWC
inputs, ``stax.Conv``/``Flatten``/``GlobalAvgPool``, x64 for float64; its ``kernel_fn`` jitted as its
README recommends), alternating with ntbridge's processes, and the first calls are compared. That
environment installs from the registry:
``python -m venv nt && nt/bin/pip install "jax[cpu]==0.4.23" jaxlib==0.4.23 "numpy<2" "scipy<1.13"
neural-tangents==0.6.5``. ``run.py`` runs these rows too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

# Seconds spent in Python's cyclic garbage collector, clocked in both workloads: a full collection
# scans every object the imports left (torch's too) and falls wherever the allocation counts say.
GC_CLOCK = """
import gc, time
gc_s, gc_started = [0.0], [0.0]
def gc_clock(phase, info):
    if phase == "start":
        gc_started[0] = time.perf_counter()
    else:
        gc_s[0] += time.perf_counter() - gc_started[0]
gc.callbacks.append(gc_clock)
"""
# One workload per fresh process: two kernel calls (x2 = None, then a second input set), timed,
# with XLA's backend compilations counted. Imports (ntbridge's own are made on first use of
# ntbridge.kernel, Neural Tangents' by "from neural_tangents import stax") are timed apart.
WORKLOAD = GC_CLOCK + """
import json, sys
t0 = time.perf_counter()
import jax, torch, ntbridge
from torch import nn
compiles = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, seconds, **kw: compiles.append(event)
    if event == "/jax/core/compile/backend_compile_duration" else None)
name, dtype = sys.argv[1], getattr(torch, sys.argv[2])
torch.manual_seed(0)
if name == "FC":
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    x, xs = torch.randn(1000, 64), torch.randn(797, 64)
else:
    head = ([nn.Flatten(), nn.Linear(64 * 8 * 8, 10)] if name == "CNN Flatten" else
            [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)])
    model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), *head)
    x, xs = torch.randn(32, 3, 8, 8), torch.randn(16, 3, 8, 8)
model, x, xs = model.to(dtype), x.to(dtype), xs.to(dtype)
kernel = ntbridge.kernel  # ntbridge imports its modules on first use: an import, not the call
imported, gc0 = time.perf_counter(), gc_s[0]
kernel(model, x, None)
first, gc1 = time.perf_counter(), gc_s[0]
kernel(model, xs, x)
second = time.perf_counter()
print(json.dumps({"import_s": imported - t0, "first_s": first - imported, "gc_s": gc1 - gc0,
                  "second_s": second - first, "compiles": len(compiles)}))
"""
# The same two calls under Neural Tangents (its own environment; inputs NHWC).
NT_WORKLOAD = GC_CLOCK + """
import json, sys
t0 = time.perf_counter()
import jax, numpy as np
name, dtype = sys.argv[1], sys.argv[2]
jax.config.update("jax_enable_x64", dtype == "float64")
from neural_tangents import stax
rng = np.random.default_rng(0)
std = dict(W_std=3 ** -0.5, b_std=0.1, parameterization="standard")
if name == "FC":
    layers = [stax.Dense(512, **std), stax.Relu()] * 3 + [stax.Dense(10, **std)]
    x, xs = rng.standard_normal((1000, 64)), rng.standard_normal((797, 64))
else:
    conv = [stax.Conv(64, (3, 3), padding="SAME", **std), stax.Relu()] * 2
    head = [stax.Flatten()] if name == "CNN Flatten" else [stax.GlobalAvgPool()]
    layers = conv + head + [stax.Dense(10, **std)]
    x, xs = rng.standard_normal((32, 8, 8, 3)), rng.standard_normal((16, 8, 8, 3))
x, xs = x.astype(dtype), xs.astype(dtype)
kernel_fn = jax.jit(stax.serial(*layers)[2], static_argnames="get")
imported, gc0 = time.perf_counter(), gc_s[0]
jax.block_until_ready(kernel_fn(x, None, ("nngp", "ntk")))
first, gc1 = time.perf_counter(), gc_s[0]
jax.block_until_ready(kernel_fn(xs, x, ("nngp", "ntk")))
second = time.perf_counter()
print(json.dumps({"import_s": imported - t0, "first_s": first - imported, "gc_s": gc1 - gc0,
                  "second_s": second - first}))
"""
WORKLOADS = [("FC", "float64"), ("FC", "float32"), ("CNN Flatten", "float32"),
             ("CNN GAP", "float32")]


def _child(args: list[str], cache: str, python: str = sys.executable,
           workload: str = WORKLOAD) -> dict:
    env = {**os.environ, "NTBRIDGE_CACHE_DIR": cache}
    out = subprocess.run([python, "-c", workload, *args], env=env, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def row(name: str, ratio: float, detail: str) -> None:
    print(f"{name:<52} {ratio:>8.2f}x   {detail}")


def first_calls(rounds: int, nt_python: str | None) -> None:
    """Per workload: compilations of two calls, the first call with a warm cache / empty, and
    (with ``nt_python``) the first call / Neural Tangents' first call."""
    for name, dtype in WORKLOADS:
        cold, warm, nt = [], [], []
        for _ in range(rounds):
            cache = tempfile.mkdtemp(prefix="ntbridge-bench-cache-")
            try:
                cold.append(_child([name, dtype], cache))
                warm.append(_child([name, dtype], cache))
                if nt_python:
                    nt.append(_child([name, dtype], cache, nt_python, NT_WORKLOAD))
            finally:
                shutil.rmtree(cache, ignore_errors=True)
        median = lambda runs, key: statistics.median(r[key] for r in runs)
        label = f"{name} {dtype}"
        for what, runs in (("empty cache", cold), ("warm cache", warm)) if nt else ():
            row(f"{label}: first call ({what}) / NT's", median(runs, "first_s") /
                median(nt, "first_s"), f"ntbridge {median(runs, 'first_s'):.2f} s (GC "
                f"{median(runs, 'gc_s'):.2f} s), NT {median(nt, 'first_s'):.2f} s (GC "
                f"{median(nt, 'gc_s'):.2f} s); imports {median(runs, 'import_s'):.2f} s vs "
                f"{median(nt, 'import_s'):.2f} s; target <= 1x")
        row(f"{label}: compilations, two calls (empty cache)", median(cold, "compiles"),
            f"warm cache: {median(warm, 'compiles'):.0f}; target <= 4 (empty), 0 (warm)")
        row(f"{label}: first call, warm / empty cache", median(warm, "first_s") /
            median(cold, "first_s"), f"empty {median(cold, 'first_s'):.2f} s, warm "
            f"{median(warm, 'first_s'):.2f} s (median of {rounds}); target <= 0.35x")


def cli_startup(rounds: int) -> None:
    """``ntbridge --help`` and ``ntbridge compare`` vs ``python -c "import numpy"``."""
    import numpy as np
    folder = tempfile.mkdtemp(prefix="ntbridge-bench-cli-")
    a = os.path.join(folder, "a.npy")
    np.save(a, np.eye(3))
    commands = {"ntbridge --help": [sys.executable, "-m", "ntbridge.cli", "--help"],
                "ntbridge compare": [sys.executable, "-m", "ntbridge.cli", "compare", a, a]}
    baseline = [sys.executable, "-c", "import numpy"]
    timed = lambda cmd: _wall(lambda: subprocess.run(cmd, capture_output=True, check=True))
    for name, cmd in commands.items():
        ours, base = [], []
        for _ in range(rounds):
            ours.append(timed(cmd))
            base.append(timed(baseline))
        row(f"CLI start-up: {name} / import numpy", statistics.median(ours) /
            statistics.median(base), f"{statistics.median(ours) * 1e3:.0f} ms vs "
            f"{statistics.median(base) * 1e3:.0f} ms; target <= 4x")
    shutil.rmtree(folder, ignore_errors=True)


def _wall(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3, help="fresh processes per measurement")
    parser.add_argument("--nt-python", metavar="PATH",
                        help="a Python with neural-tangents 0.6.5, to compare first calls")
    args = parser.parse_args()
    print(f"{'benchmark':<52} {'ratio':>9}   detail")
    rows(args.rounds, args.nt_python)


def rows(rounds: int, nt_python: str | None = None) -> None:
    """Every row of this file (``run.py`` calls it)."""
    cli_startup(2 * rounds)
    first_calls(rounds, nt_python)


if __name__ == "__main__":
    main()
