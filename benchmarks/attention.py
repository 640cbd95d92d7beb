"""Transformer kernels: agreement with Neural Tangents and speed.

Rows (``python benchmarks/attention.py [--nt-python nt/bin/python] [--quick]``):

* ``linear-scaling vs NT``: two tied, ``1/d`` self-attention layers with a ReLU between them
  (``GlobalSelfAttention(linear_scaling=True)``), NTK parameterization, torch's initialisation,
  float64 and float32: the largest relative difference of the NNGP and NTK, and the time of a
  steady call of each library as its users make it (``ntbridge.kernel`` of the torch model,
  ``attention="linear"``; NT's jitted ``kernel_fn``, in a child process), calls alternating
  between the two, on the same inputs;
* ``first``: the first call of each library on that network in a fresh process (N = 128, float64
  and float32; ntbridge's program cache empty), processes alternating;
* ``sandwich``: ``a1[n] c[n, m] a2[m]^T`` (what the linear-scaling layer computes) as
  ``stax.attention.sandwich``'s batched matrix products against ``2 T`` broadcast products fused
  by XLA, each form in the program of the linear-scaling network's analytic kernel (N = 128, in
  the blocks CPUs compute kernels in), called alternately, per ``T``, float64 and float32;
* ``width sweep``: ``ntbridge.analysis.width_sweep`` of a 2-layer encoder (Embedding + positions,
  mean pooling, Linear) whose heads grow as ``sqrt(width)``: the NTK's relative error per width
  and its fitted slope. Expected: ``-1/4``. A head's channels share its softmax weights, so a
  finite network's kernel averages their products over ``heads = sqrt(width)`` independent
  draws, which converges as ``heads**-1/2 = width**-1/4`` (the channel averages of values and
  MLPs converge as ``width**-1/2``, the logits' departure from Gaussian as ``1 / d_head``);
* ``text classifier``: Embedding(1000, 64) + learned positions, 2 encoder layers of 4 heads, mean
  pooling, Linear, on N = 64 sequences of 16 tokens, float32: the analytic NNGP + NTK of torch's
  attention (public ``ntbridge.kernel``, first call and steady call), the reported relative
  error of its numerical expectation, and the steady call with ``progress=True`` (tiled so that
  its bar moves).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import numpy as np

# linear-scaling workloads (N, T, dtype): the agreement size, then the sizes users run
SIZES = [(16, 8, "float64"), (128, 16, "float64"), (128, 16, "float32"), (256, 16, "float64")]
D, HEADS, ROUNDS = 16, 2, 9
# torch's initialisation of nn.MultiheadAttention (converters/attention.py): W_std of the
# queries, keys and values sqrt(1/2), of out_proj sqrt(1/3); NT's tied queries and keys take
# W_query_std * W_key_std = sq**2
STDS = dict(qk=0.5 ** 0.5, v=0.5 ** 0.5, o=3 ** -0.5)

NT_SERVER = """
import gc, json, sys, time
import jax, numpy as np
n, t, d, heads, dtype, qk, v, o, path = json.loads(sys.argv[1])
jax.config.update("jax_enable_x64", dtype == "float64")
from neural_tangents import stax
att = lambda: stax.GlobalSelfAttention(d, d, d, heads, linear_scaling=True, W_key_std=qk,
                                       W_query_std=qk, W_value_std=v, W_out_std=o)
_, _, kernel_fn = stax.serial(att(), stax.Relu(), att())
x = np.random.default_rng(0).standard_normal((n, t, d)).astype(dtype)
fn = jax.jit(kernel_fn, static_argnames="get")
gc.collect()
start = time.perf_counter()
k = jax.block_until_ready(fn(x, None, get=("nngp", "ntk")))
first = time.perf_counter() - start
np.savez(path, nngp=np.asarray(k.nngp), ntk=np.asarray(k.ntk))
print(first, flush=True)  # the first call: compiled and computed
for _ in sys.stdin:  # one timed call per line
    start = time.perf_counter()
    fn(x, None, get=("nngp", "ntk")).ntk.block_until_ready()
    print(time.perf_counter() - start, flush=True)
"""


# ntbridge's first call in a fresh process (empty program cache), as NT_SERVER's: argv = the
# benchmarks folder, then [n, t, dtype]
OURS_FIRST = """
import gc, json, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np, torch, ntbridge
from attention import D, linear_model
n, t, dtype = json.loads(sys.argv[2])
x = torch.from_numpy(np.random.default_rng(0).standard_normal((n, t, D)).astype(dtype))
model, kernel = linear_model(dtype), ntbridge.kernel  # ntbridge imports its modules on first use
gc.collect()
start = time.perf_counter()
kernel(model, x, attention="linear", parameterization="ntk")
print(time.perf_counter() - start)
"""


def linear_model(dtype: str):
    """Two bias-free self-attention layers with a ReLU between them (NT's ``serial(
    GlobalSelfAttention, Relu, GlobalSelfAttention)``), torch's initialisation."""
    import torch
    from torch import nn

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(D, HEADS, bias=False, batch_first=True)

        def forward(self, x):
            return self.attn(x, x, x, need_weights=False)[0]

    return nn.Sequential(Attention(), nn.ReLU(), Attention()).to(getattr(torch, dtype))


def _nt_server(nt_python: str, n: int, t: int, dtype: str, path: str):
    """NT_SERVER started, its first call made (its kernels saved to ``path``): the process, and
    that call's seconds."""
    nt = subprocess.Popen([nt_python, "-c", NT_SERVER, json.dumps(
        [n, t, D, HEADS, dtype, STDS["qk"], STDS["v"], STDS["o"], path])],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return nt, float(nt.stdout.readline())


def linear_rows(nt_python: str | None) -> None:
    import tempfile

    import torch

    import ntbridge

    for n, t, dtype in SIZES:
        x = np.random.default_rng(0).standard_normal((n, t, D)).astype(dtype)
        model, inputs = linear_model(dtype), torch.from_numpy(x)
        ours = lambda: ntbridge.kernel(model, inputs, attention="linear", parameterization="ntk")
        kernels = ours()
        label = f"linear-scaling N={n} T={t} {dtype}"
        if nt_python is None:
            times = [_timed(ours) for _ in range(ROUNDS)]
            print(f"{label}: ours {statistics.median(times) * 1e3:.1f} ms (no NT environment)")
            continue
        with tempfile.TemporaryDirectory() as folder:
            path = f"{folder}/nt.npz"
            nt, _ = _nt_server(nt_python, n, t, dtype, path)
            reference = np.load(path)
            for name in ("nngp", "ntk"):
                ref, got = reference[name], getattr(kernels, name).numpy()
                diff = np.abs(got - ref).max() / np.abs(ref).max()
                print(f"{label}, {name}: max relative difference to NT {diff:.2e}")
            ours_times, nt_times = [], []
            for _ in range(ROUNDS):  # alternating: both see the same load
                ours_times.append(_timed(ours))
                nt.stdin.write("go\n")
                nt.stdin.flush()
                nt_times.append(float(nt.stdout.readline()))
            nt.stdin.close()
            nt.wait()
        mine, theirs = statistics.median(ours_times), statistics.median(nt_times)
        print(f"{label}, time (median of {ROUNDS}, alternating): ours {mine * 1e3:.1f} ms, NT "
              f"{theirs * 1e3:.1f} ms: {mine / theirs:.2f}x")


def first_rows(nt_python: str, rounds: int = 3) -> None:
    """The first call of each library in a fresh process (ntbridge's program cache empty, a full
    garbage collection before both clocks), processes alternating, at the sizes users run."""
    import os
    import tempfile

    here = os.path.dirname(os.path.abspath(__file__))
    for n, t, dtype in SIZES[1:3]:
        ours, theirs = [], []
        for _ in range(rounds):
            with tempfile.TemporaryDirectory() as folder:
                env = {**os.environ, "NTBRIDGE_CACHE_DIR": folder}
                ours.append(float(subprocess.run(
                    [sys.executable, "-c", OURS_FIRST, here, json.dumps([n, t, dtype])], env=env,
                    capture_output=True, text=True, check=True).stdout.split()[-1]))
                nt, first = _nt_server(nt_python, n, t, dtype, f"{folder}/nt.npz")
                theirs.append(first)
                nt.stdin.close()
                nt.wait()
        mine, nts = statistics.median(ours), statistics.median(theirs)
        print(f"linear-scaling N={n} T={t} {dtype}, first call in a fresh process (median of "
              f"{rounds}, alternating): ours {mine:.2f} s, NT {nts:.2f} s: {mine / nts:.2f}x")


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _broadcast_sandwich(a1, c, a2):
    """``a1[n] c[n, m] a2[m]^T`` as ``2 T`` broadcast products (what XLA fuses into two elementwise
    passes over ``c``): the form ``stax.attention.sandwich`` is measured against."""
    t, a2t = c.shape[-1], a2.swapaxes(-1, -2)[None]
    left = sum(a1[:, None, :, s, None] * c[..., s, None, :] for s in range(t))
    return sum(left[..., :, r, None] * a2t[..., None, r, :] for r in range(t))


def sandwich_rows() -> None:
    import jax
    import torch

    import ntbridge
    from ntbridge import analytic
    from ntbridge.dlpack import precision
    from ntbridge.specs import Analytic
    from ntbridge.stax import attention
    from run import interleaved_times

    for dtype in ("float64", "float32"):
        for t in (4, 8, 16, 32, 64):
            x = np.random.default_rng(0).standard_normal((128, t, D)).astype(dtype)
            graph = ntbridge.convert(linear_model(dtype), attention="linear",
                                     parameterization="ntk")
            with precision(getattr(torch, dtype)):
                task = analytic.task(Analytic(("nngp", "ntk")), graph,
                                     jax.ShapeDtypeStruct(x.shape, x.dtype), None, "cpu")[0]
                forms, library = [], attention.sandwich
                for form in (library, _broadcast_sandwich):
                    attention.sandwich = form  # read when the program is traced
                    forms.append(jax.jit(lambda args, a: task.fn(args, a, None))
                                 .lower(task.args, x).compile())
                attention.sandwich = library
                ours, broadcast = map(statistics.median, interleaved_times(
                    *(lambda f=f: f(task.args, x) for f in forms), rounds=7))
            print(f"sandwich in the linear-scaling network, N=128 T={t} {dtype}: matrix "
                  f"products {ours * 1e3:.1f} ms, broadcast products {broadcast * 1e3:.1f} ms: "
                  f"{ours / broadcast:.2f}x")


def sweep_rows(quick: bool) -> None:
    import torch
    from torch import nn

    from ntbridge.analysis import width_sweep

    vocab, length = 20, 4

    class Encoder(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            self.pos = nn.Parameter(0.5 * torch.randn(length, d))
            layer = nn.TransformerEncoderLayer(d, int(d ** 0.5), 2 * d, batch_first=True)
            self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = nn.Linear(d, 1)

        def forward(self, ids):
            return self.head(self.enc(self.emb(ids) + self.pos).mean(1))

    widths = [16, 64, 256] if quick else [16, 64, 256, 1024]
    ids = torch.randint(0, vocab, (4, length), generator=torch.Generator().manual_seed(0))
    sweep = width_sweep(lambda w: Encoder(w).eval(), widths, ids, n_seeds=3, progress=False)
    print(sweep)
    print(f"width sweep, 2-layer encoder, heads = sqrt(width): slope {sweep.slope:.2f}")


def classifier_rows(quick: bool) -> None:
    import torch
    from torch import nn

    import ntbridge

    n, t, vocab, d = (16, 8, 1000, 64) if quick else (64, 16, 1000, 64)

    class TextClassifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            self.pos = nn.Parameter(0.1 * torch.randn(t, d))
            layer = nn.TransformerEncoderLayer(d, 4, 4 * d, batch_first=True)
            self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = nn.Linear(d, 1)

        def forward(self, ids):
            return self.head(self.enc(self.emb(ids) + self.pos).mean(1))

    torch.manual_seed(0)
    model = TextClassifier().eval()
    ids = torch.randint(0, vocab, (n, t))
    times = []
    for _ in range(2):
        start = time.perf_counter()
        ntbridge.kernel(model, ids)
        times.append(time.perf_counter() - start)
    error = ntbridge.expectation_error(model, ids)
    print(f"text classifier N={n} T={t}: NNGP + NTK first call {times[0]:.1f} s, steady "
          f"{times[1]:.1f} s; relative error of the expectation {error:.1e}")
    for _ in range(2):  # with a progress bar: 4 row blocks of tiles
        start = time.perf_counter()
        ntbridge.kernel(model, ids, progress=True)
        shown = time.perf_counter() - start
    print(f"text classifier with progress=True (tiles of {n // 4} sequences): steady {shown:.1f} "
          f"s, {shown / times[1]:.2f}x the single tile")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nt-python", help="a Python with Neural Tangents 0.6.5")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rows", default="linear,first,sandwich,sweep,classifier")
    args = parser.parse_args()
    if "linear" in args.rows:
        linear_rows(args.nt_python)
    if "first" in args.rows and args.nt_python:
        first_rows(args.nt_python)
    if "sandwich" in args.rows:
        sandwich_rows()
    if "sweep" in args.rows:
        sweep_rows(args.quick)
    if "classifier" in args.rows:
        classifier_rows(args.quick)
    sys.exit(0)
