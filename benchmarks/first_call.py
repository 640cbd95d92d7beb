"""First calls: XLA compilations per call, a fresh process with an empty vs a warm compilation
cache, and the command line's start-up, each measured as a ratio in one run.

Run: python benchmarks/first_call.py [--rounds R] [--nt-python nt/bin/python]

Every workload runs in fresh processes (as a notebook or a CI job does), alternately with an empty
and with a warm cache directory, so both see the same machine load. With ``--nt-python``, the same
analytic workloads also run under Neural Tangents 0.6.5 in that interpreter's environment (NHWC
inputs, ``stax.Conv``/``Flatten``/``GlobalAvgPool``, x64 for float64; its ``kernel_fn`` jitted as its
README recommends), alternating with ntbridge's processes, and the first calls are compared:
- as they come: each first call carries whatever the imports left to Python's cyclic garbage
  collector. After ``import torch, jax`` a full collection of their ~240,000 objects is a few
  thousand allocations away, so it falls in the first thing the process does (ntbridge's first
  call); Neural Tangents' import (TensorFlow's) happens to end just after one, so its first call
  carries none. The rows show each side's collection time;
- after a collection (``gc.collect()`` in both processes before the clock): the work of the call
  itself, on both sides;
- and the compilers apart: Neural Tangents' program of each first call (a portable StableHLO
  artifact) compiled by its jaxlib 0.4.23 and by the JAX ntbridge runs on, and ntbridge's own
  first-call compilations beside the latter.
That environment installs from the registry:
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
# start_clock() starts a first call's clock, after a full collection when the process's third
# argument is "collected".
GC_CLOCK = """
import gc, sys, time
gc_s, gc_started = [0.0], [0.0]
def gc_clock(phase, info):
    if phase == "start":
        gc_started[0] = time.perf_counter()
    else:
        gc_s[0] += time.perf_counter() - gc_started[0]
gc.callbacks.append(gc_clock)
def start_clock():
    if sys.argv[3:] == ["collected"]:
        gc.collect()
    return time.perf_counter(), gc_s[0]
"""
# XLA's backend compilations of the process, in seconds (after ``import jax``)
COMPILES = """
compiles = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, seconds, **kw: compiles.append(seconds)
    if event == "/jax/core/compile/backend_compile_duration" else None)
"""
# One workload per fresh process: two kernel calls (x2 = None, then a second input set), then the
# first call again (the steady call), then new sizes: the second input set less three examples,
# and three times over; timed, with XLA's backend compilations counted. Imports (ntbridge's own
# are made on first use of ntbridge.kernel, Neural Tangents' by "from neural_tangents import
# stax") are timed apart, and with a third argument "collected" a full collection runs between
# them and the clock.
WORKLOAD = GC_CLOCK + """
import json, sys
t0 = time.perf_counter()
import jax, torch, ntbridge
from torch import nn
""" + COMPILES + """
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
imported = time.perf_counter()
start, gc0 = start_clock()
kernel(model, x, None)
first, gc1, compile_s = time.perf_counter(), gc_s[0], sum(compiles)
kernel(model, xs, x)
second = time.perf_counter()
kernel(model, x, None)
steady = time.perf_counter()
kernel(model, xs[:-3], x)  # a new size: three fewer examples
smaller = time.perf_counter()
kernel(model, torch.cat([xs] * 3), x)  # a new size: three times the examples
print(json.dumps({"import_s": imported - t0, "first_s": first - start, "gc_s": gc1 - gc0,
                  "second_s": second - first, "steady_s": steady - second,
                  "new_size_s": smaller - steady, "larger_s": time.perf_counter() - smaller,
                  "compiles": len(compiles), "compile_s": compile_s}))
"""
# Neural Tangents' network of each workload and its jitted kernel_fn (its own environment; NHWC).
NT_MODEL = """
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
"""
# The same two calls under Neural Tangents.
NT_WORKLOAD = GC_CLOCK + """
import json, sys
t0 = time.perf_counter()
""" + NT_MODEL + """
imported = time.perf_counter()
start, gc0 = start_clock()
jax.block_until_ready(kernel_fn(x, None, ("nngp", "ntk")))
first, gc1 = time.perf_counter(), gc_s[0]
jax.block_until_ready(kernel_fn(xs, x, ("nngp", "ntk")))
second = time.perf_counter()
print(json.dumps({"import_s": imported - t0, "first_s": first - start, "gc_s": gc1 - gc0,
                  "second_s": second - first}))
"""
# Neural Tangents' program of the first call, compiled by its own jaxlib 0.4.23 (seconds printed)
# and written to the last argument as a portable StableHLO artifact (jax.experimental.export),
# which the XLA of the JAX ntbridge runs on compiles (OUR_COMPILER: the artifact last, its dtype
# before). Both compile a trivial program first, so neither counts XLA's start-up; both use XLA's
# default options. NT_EXPORT follows any script that builds NT's ``kernel_fn`` and inputs ``x``.
NT_EXPORT = """
from jax.experimental.export import export as export_module
program = jax.jit(lambda x: kernel_fn(x, None, ("nngp", "ntk")))
open(sys.argv[-1], "wb").write(export_module.export(program)(x).mlir_module_serialized)
lowered = program.lower(x)
jax.jit(lambda a: a + 1).lower(1.0).compile()
t0 = time.perf_counter()
lowered.compile()
print(time.perf_counter() - t0)
"""
NT_PROGRAM = """
import sys, time
""" + NT_MODEL + NT_EXPORT
OUR_COMPILER = """
import sys, time, jax, jax.extend
from jax._src.lib import xla_client
jax.config.update("jax_enable_x64", sys.argv[-2] == "float64")
backend = jax.extend.backend.get_backend("cpu")
jax.jit(lambda a: a + 1).lower(1.0).compile()
program = open(sys.argv[-1], "rb").read()
t0 = time.perf_counter()
backend.compile_and_load(program, xla_client.DeviceList(tuple(backend.local_devices()[:1])),
                         xla_client.CompileOptions())
print(time.perf_counter() - t0)
"""
WORKLOADS = [("FC", "float64"), ("FC", "float32"), ("CNN Flatten", "float32"),
             ("CNN GAP", "float32")]


def _child(args: list[str], cache: str, python: str = sys.executable,
           workload: str = WORKLOAD) -> dict:
    env = {**os.environ, "NTBRIDGE_CACHE_DIR": cache}
    out = subprocess.run([python, "-c", workload, *args], env=env, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


HEADER = f"{'benchmark':<52} {'ratio':>9}   detail"  # the columns of row()


def row(name: str, ratio: float, detail: str) -> None:
    print(f"{name:<52} {ratio:>8.2f}x   {detail}")


def first_calls(rounds: int, nt_python: str | None) -> dict[tuple[str, str], float]:
    """Per workload: compilations of two calls, the first call with a warm cache / empty, and
    (with ``nt_python``) the first call / Neural Tangents' first call, as they come and after a
    collection (see the module doc). Returns each workload's first-call compile seconds (median,
    empty cache)."""
    compile_s = {}
    for name, dtype in WORKLOADS:
        runs = {"cold": [], "warm": [], "nt": [], "cold collected": [], "nt collected": []}
        for _ in range(rounds):
            cache, fresh = (tempfile.mkdtemp(prefix="ntbridge-bench-cache-") for _ in range(2))
            try:
                runs["cold"].append(_child([name, dtype], cache))
                runs["warm"].append(_child([name, dtype], cache))
                if nt_python:
                    runs["nt"].append(_child([name, dtype], cache, nt_python, NT_WORKLOAD))
                    runs["cold collected"].append(_child([name, dtype, "collected"], fresh))
                    runs["nt collected"].append(
                        _child([name, dtype, "collected"], cache, nt_python, NT_WORKLOAD))
            finally:
                shutil.rmtree(cache, ignore_errors=True)
                shutil.rmtree(fresh, ignore_errors=True)
        median = lambda key, side: statistics.median(r[key] for r in runs[side])
        compile_s[name, dtype] = median("compile_s", "cold")
        label = f"{name} {dtype}"
        versus = [("empty cache", "cold", "nt"), ("warm cache", "warm", "nt"),
                  ("empty cache, after a collection", "cold collected", "nt collected")]
        for what, ours, theirs in versus if nt_python else ():
            row(f"{label}: first call ({what}) / NT's", median("first_s", ours) /
                median("first_s", theirs), f"ntbridge {median('first_s', ours):.2f} s (GC "
                f"{median('gc_s', ours):.2f} s), NT {median('first_s', theirs):.2f} s (GC "
                f"{median('gc_s', theirs):.2f} s); imports {median('import_s', ours):.2f} s vs "
                f"{median('import_s', theirs):.2f} s; target <= 1x")
        row(f"{label}: compilations, all five calls (empty cache)", median("compiles", "cold"),
            f"warm cache: {median('compiles', 'warm'):.0f}; target <= 4 (empty), 0 (warm)")
        row(f"{label}: first call, warm / empty cache", median("first_s", "warm") /
            median("first_s", "cold"), f"empty {median('first_s', 'cold'):.2f} s, warm "
            f"{median('first_s', 'warm'):.2f} s (median of {rounds}); target <= 0.3x")
        first, new_size = median("first_s", "cold"), median("new_size_s", "cold")
        row(f"{label}: a new x2 size / first call (empty cache)", new_size / first,
            f"{new_size:.2f} s vs {first:.2f} s (x2 three examples fewer than the second "
            f"call's); target <= 0.3x")
        larger = median("larger_s", "cold")
        row(f"{label}: a larger x1 size / first call (empty cache)", larger / first,
            f"{larger:.2f} s vs {first:.2f} s (x1 three times the second call's); target <= 0.3x")
        first, steady = median("first_s", "warm"), median("steady_s", "warm")
        row(f"{label}: first call / steady call, warm cache", first / steady,
            f"{first:.2f} s vs {steady:.2f} s: {first - steady:.2f} s above (imports "
            f"{median('import_s', 'warm'):.2f} s apart); target <= 0.5 s above")
    return compile_s


def compilers(rounds: int, nt_python: str, compile_s: dict[tuple[str, str], float]) -> None:
    """Per workload: Neural Tangents' program compiled by this JAX's XLA / by its jaxlib 0.4.23,
    and ntbridge's program(s) of the first call (``compile_s``, with an empty cache and its own
    options) / NT's program, both by this JAX's XLA."""
    folder = tempfile.mkdtemp(prefix="ntbridge-bench-hlo-")
    program = os.path.join(folder, "program.mlirbc")
    seconds = lambda python, code, spec: float(subprocess.run(
        [python, "-c", code, *spec, program], capture_output=True, text=True,
        check=True).stdout.split()[-1])
    try:
        for spec in WORKLOADS:
            nt_old, nt_here = [], []  # seconds: by NT's XLA, by this one
            for _ in range(rounds):
                nt_old.append(seconds(nt_python, NT_PROGRAM, spec))
                nt_here.append(seconds(sys.executable, OUR_COMPILER, spec))
            nt_old, nt_here = statistics.median(nt_old), statistics.median(nt_here)
            ntbridge = compile_s[spec]
            label = " ".join(spec)
            row(f"{label}: NT's program, compile by this XLA / by NT's", nt_here / nt_old,
                f"{nt_here:.3f} s vs {nt_old:.3f} s (jaxlib 0.4.23), the same StableHLO")
            row(f"{label}: compile, ntbridge's first call / NT's program", ntbridge / nt_here,
                f"{ntbridge:.3f} s vs {nt_here:.3f} s, both by this XLA")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


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
    print(HEADER)
    rows(args.rounds, args.nt_python)


def rows(rounds: int, nt_python: str | None = None) -> None:
    """Every row of this file (``run.py`` calls it)."""
    cli_startup(2 * rounds)
    compile_s = first_calls(rounds, nt_python)
    if nt_python:
        compilers(rounds, nt_python, compile_s)


if __name__ == "__main__":
    main()
