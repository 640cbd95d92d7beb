"""Transformer kernels: agreement with Neural Tangents and speed.

Rows (``python benchmarks/attention.py [--nt-python nt/bin/python] [--quick]``):

* ``linear-scaling vs NT``: NT's ``GlobalSelfAttention(linear_scaling=True)`` against
  ``ntbridge.kernel(model, x, attention="linear")`` (torch's model converted at each call) on two
  networks, NTK parameterization, torch's initialisation, float64 and float32: "pair", two tied,
  ``1/d`` self-attention layers with a ReLU between them (kernels of every pair of tokens out), and
  "classifier", the text classifier below with the layers NT has (no biases, LayerNorm without
  affine parameters, positions embedded from ``torch.arange``; for NT one-hot ids and positions
  through a Dense layer), the issue's N = 64 and the sizes users run. The largest relative
  difference of the NNGP and NTK, and the time of a steady call of each library as its users make
  it (NT's jitted ``kernel_fn`` in a child process), calls alternating, on the same inputs;
* ``first``: the first call of each library on those networks in a fresh process (ntbridge's
  program cache empty), processes alternating; and the compilers apart: NT's program (a
  StableHLO artifact, as ``first_call.py`` makes it) compiled by its jaxlib 0.4.23 and by the XLA
  ntbridge runs on, beside ntbridge's compilations in its first call;
* ``sandwich``: ``a1[n] c[n, m] a2[m]^T`` (what the linear-scaling layer computes) as
  ``stax.attention_rule.sandwich``'s batched matrix products against ``2 T`` broadcast
  products fused by XLA, each form in the program of the pair network's analytic kernel (N = 128, in
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
  its bar moves);
* ``rule``: that classifier on N = 32 sequences with 8 replicates of 8, 16 and 32 points (the
  default): steady calls and the reported error (``--rows rule``);
* ``fresh``: that classifier's calls in a new process with an empty program cache (N = 32): the
  first call, the same call again, and x2 of a size not asked for before;
* ``cost``: where that classifier's steady call goes (N = 32, float32): the call with 8 x 2, 8 x 8
  and 8 x 32 points; the expectation of one CPU block of pairs (256, T = 16) with and without
  the NTK's terms; and XLA's speed on the expectation's batched matrix products against one
  large product (ntbridge's compiler options, GFLOP/s).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import numpy as np

from first_call import COMPILES, NT_EXPORT, OUR_COMPILER

# Neural Tangents' network and inputs (argv[1]: [network, n, t, dtype, stds, path])
NT_MODEL = """
import gc, json, sys, time
import jax, numpy as np
network, n, t, dtype, stds, path = json.loads(sys.argv[1])
jax.config.update("jax_enable_x64", dtype == "float64")
from neural_tangents import stax
qk, v, o, lin = stds
att = lambda d, heads: stax.GlobalSelfAttention(d, d, d, heads, linear_scaling=True,
                                                W_key_std=qk, W_query_std=qk, W_value_std=v,
                                                W_out_std=o)
if network == "pair":
    d = %(D)d
    _, _, kernel_fn = stax.serial(att(d, %(HEADS)d), stax.Relu(), att(d, %(HEADS)d))
    x = np.random.default_rng(0).standard_normal((n, t, d)).astype(dtype)
else:  # the text classifier; the embeddings as a Dense layer of one-hot ids and positions
    vocab, d, heads = %(CLASSIFIER)s
    ids = np.random.default_rng(0).integers(0, vocab, (n, t))
    used, index = np.unique(ids, return_inverse=True)  # one-hot of the ids in use: same kernel
    x = np.zeros((n, t, len(used) + t), dtype)
    x[np.arange(n)[:, None], np.arange(t), index.reshape(n, t)] = 1
    x[:, np.arange(t), len(used) + np.arange(t)] = 1
    res = lambda f: stax.serial(stax.FanOut(2), stax.parallel(f, stax.Identity()), stax.FanInSum())
    mlp = lambda: stax.serial(stax.Dense(4 * d, W_std=lin), stax.Relu(), stax.Dense(d, W_std=lin))
    norm = lambda: stax.LayerNorm(axis=-1, eps=1e-5)
    block = lambda: stax.serial(res(att(d, heads)), norm(), res(mlp()), norm())
    _, _, kernel_fn = stax.serial(stax.Dense(d, W_std=x.shape[-1] ** 0.5), block(), block(),
                                  stax.GlobalAvgPool(channel_axis=-1), stax.Dense(1, W_std=lin))
"""
# ... then served: its first call, then one timed call per line of its input
NT_SERVE = """
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


# linear-scaling workloads (network, N, T, dtype): "pair" is two attention layers with a ReLU
# between them (the agreement size, then the sizes users run); "classifier" the text classifier
# of the speed target (N = 64, float32) and at the sizes users run
SIZES = [("pair", 16, 8, "float64"), ("pair", 128, 16, "float64"), ("pair", 128, 16, "float32"),
         ("pair", 256, 16, "float64"), ("pair", 256, 16, "float32"),
         ("classifier", 64, 16, "float32"), ("classifier", 64, 16, "float64"),
         ("classifier", 128, 16, "float32"), ("classifier", 128, 16, "float64"),
         ("classifier", 256, 16, "float32"), ("classifier", 256, 16, "float64")]
FIRST = [("pair", 128, 16, "float64"), ("pair", 128, 16, "float32"),
         ("classifier", 64, 16, "float32"), ("classifier", 128, 16, "float64")]
D, HEADS, ROUNDS = 16, 2, 9
VOCAB, WIDTH, CLASSIFIER_HEADS = 1000, 64, 4
# torch's initialisation of nn.MultiheadAttention (converters/attention.py): W_std of the
# queries, keys and values sqrt(1/2), of out_proj sqrt(1/3); NT's tied queries and keys take
# W_query_std * W_key_std = sq**2; nn.Linear's weights sqrt(1/3)
STDS = (0.5 ** 0.5, 0.5 ** 0.5, 3 ** -0.5, 3 ** -0.5)

NT_MODEL = NT_MODEL % dict(D=D, HEADS=HEADS, CLASSIFIER=(VOCAB, WIDTH, CLASSIFIER_HEADS))
NT_SERVER = NT_MODEL + NT_SERVE

# ntbridge's first call in a fresh process (empty program cache), as NT_SERVER's: argv = the
# benchmarks folder, then [network, n, t, dtype]
OURS_FIRST = """
import gc, json, sys, time
sys.path.insert(0, sys.argv[1])
import jax, ntbridge
from attention import workload
""" + COMPILES + """
model, inputs = workload(*json.loads(sys.argv[2]))
kernel = ntbridge.kernel  # ntbridge imports its modules on first use
gc.collect()
start = time.perf_counter()
kernel(model, inputs, attention="linear", parameterization="ntk")
print(time.perf_counter() - start, sum(compiles))
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


def text_classifier(t: int, dtype: str = "float32", like_nt: bool = False):
    """Embedding(1000, 64) + learned positions, 2 encoder layers of 4 heads, mean pooling, Linear
    (eval mode). ``like_nt``: with the layers Neural Tangents has, no biases, LayerNorm without
    affine parameters, and the positions an ``nn.Embedding`` of ``torch.arange(T)`` (variance 1:
    NT's one-hot positions through the first Dense layer)."""
    import torch
    from torch import nn

    class TextClassifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(VOCAB, WIDTH)
            self.pos = nn.Embedding(t, WIDTH) if like_nt else nn.Parameter(
                0.1 * torch.randn(t, WIDTH))
            layer = nn.TransformerEncoderLayer(WIDTH, CLASSIFIER_HEADS, 4 * WIDTH,
                                               batch_first=True, bias=not like_nt)
            if like_nt:
                layer.norm1, layer.norm2 = (nn.LayerNorm(WIDTH, elementwise_affine=False)
                                            for _ in range(2))
            self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = nn.Linear(WIDTH, 1, bias=not like_nt)

        def forward(self, ids):
            pos = self.pos(torch.arange(ids.shape[1])) if like_nt else self.pos
            return self.head(self.enc(self.emb(ids) + pos).mean(1))

    torch.manual_seed(0)
    return TextClassifier().eval().to(getattr(torch, dtype))


def workload(network: str, n: int, t: int, dtype: str):
    """The torch model and inputs of NT_MODEL's ``network`` (the same random inputs)."""
    import torch

    rng = np.random.default_rng(0)
    if network == "pair":
        return linear_model(dtype), torch.from_numpy(rng.standard_normal((n, t, D)).astype(dtype))
    return text_classifier(t, dtype, like_nt=True), torch.from_numpy(rng.integers(0, VOCAB, (n, t)))


def _nt_server(nt_python: str, network: str, n: int, t: int, dtype: str, path: str):
    """NT_SERVER started, its first call made (its kernels saved to ``path``): the process, and
    that call's seconds."""
    nt = subprocess.Popen([nt_python, "-c", NT_SERVER, json.dumps(
        [network, n, t, dtype, STDS, path])],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return nt, float(nt.stdout.readline())


def linear_rows(nt_python: str | None) -> None:
    import tempfile

    import ntbridge

    for network, n, t, dtype in SIZES:
        model, inputs = workload(network, n, t, dtype)
        ours = lambda: ntbridge.kernel(model, inputs, attention="linear", parameterization="ntk")
        kernels = ours()
        label = f"linear-scaling {network} N={n} T={t} {dtype}"
        if nt_python is None:
            times = [_timed(ours) for _ in range(ROUNDS)]
            print(f"{label}: ours {statistics.median(times) * 1e3:.1f} ms (no NT environment)")
            continue
        with tempfile.TemporaryDirectory() as folder:
            path = f"{folder}/nt.npz"
            nt, _ = _nt_server(nt_python, network, n, t, dtype, path)
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
    garbage collection before both clocks), processes alternating, at the sizes users run; and
    the compilers apart: NT's program (a StableHLO artifact) compiled by its jaxlib 0.4.23 and by
    the XLA ntbridge runs on, beside ntbridge's own compilations in its first call."""
    import os
    import tempfile

    here = os.path.dirname(os.path.abspath(__file__))
    nt_program = "import sys, time\n" + NT_MODEL + NT_EXPORT
    seconds = lambda python, code, *args, env=None: [float(v) for v in subprocess.run(
        [python, "-c", code, *args], env=env, capture_output=True, text=True,
        check=True).stdout.split()[-2:]]
    for network, n, t, dtype in FIRST:
        runs = {key: [] for key in ("ours", "compile", "nt", "nt_by_nt", "nt_by_ours")}
        for _ in range(rounds):
            with tempfile.TemporaryDirectory() as folder:
                first, compiled = seconds(sys.executable, OURS_FIRST, here,
                                          json.dumps([network, n, t, dtype]),
                                          env={**os.environ, "NTBRIDGE_CACHE_DIR": folder})
                runs["ours"].append(first)
                runs["compile"].append(compiled)
                nt, first = _nt_server(nt_python, network, n, t, dtype, f"{folder}/nt.npz")
                runs["nt"].append(first)
                nt.stdin.close()
                nt.wait()
                spec, artifact = json.dumps([network, n, t, dtype, STDS, ""]), f"{folder}/nt.bc"
                runs["nt_by_nt"].append(seconds(nt_python, nt_program, spec, artifact)[-1])
                runs["nt_by_ours"].append(seconds(sys.executable, OUR_COMPILER, dtype,
                                                  artifact)[-1])
        m = {key: statistics.median(v) for key, v in runs.items()}
        label = f"linear-scaling {network} N={n} T={t} {dtype}"
        print(f"{label}, first call in a fresh process (median of {rounds}, alternating): ours "
              f"{m['ours']:.2f} s (XLA compiling {m['compile']:.2f} s), NT {m['nt']:.2f} s: "
              f"{m['ours'] / m['nt']:.2f}x")
        print(f"{label}, compilation: NT's program by its jaxlib 0.4.23 {m['nt_by_nt']:.2f} s, "
              f"by this XLA {m['nt_by_ours']:.2f} s; ours by this XLA {m['compile']:.2f} s: "
              f"{m['compile'] / m['nt_by_ours']:.2f}x NT's program")


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _broadcast_sandwich(a1, c, a2):
    """``a1[n] c[n, m] a2[m]^T`` as ``2 T`` broadcast products (what XLA fuses into two elementwise
    passes over ``c``): the form ``stax.attention_rule.sandwich`` is measured against."""
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
    from ntbridge.stax import attention_rule as attention
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

    import ntbridge

    n, t = (16, 8) if quick else (64, 16)
    model = text_classifier(t)
    ids = torch.randint(0, VOCAB, (n, t))
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


def rule_rows(quick: bool) -> None:
    """The classifier at N = 32 (the first-calls issue's size) with 8 replicates of 8, 16 and 32
    points (the default): steady calls (the median of 3 after a first) and the reported error."""
    import torch

    import ntbridge

    n, t = (8, 8) if quick else (32, 16)
    model = text_classifier(t)
    ids = torch.randint(0, VOCAB, (n, t), generator=torch.Generator().manual_seed(0))
    for points in (8, 16, 32):
        times = []
        for _ in range(4):
            start = time.perf_counter()
            ntbridge.kernel(model, ids, attention_points=points)
            times.append(time.perf_counter() - start)
        error = ntbridge.expectation_error(model, ids, attention_points=points)
        print(f"text classifier N={n} T={t}, 8 x {points} points: first call {times[0]:.1f} s, "
              f"steady {statistics.median(times[1:]):.2f} s; reported error {error:.1e}")


CLASSIFIER_CALLS = """
import sys, time
sys.path.insert(0, sys.argv[1])
import torch, ntbridge
from attention import text_classifier, VOCAB
n = int(sys.argv[2])
ids = torch.randint(0, VOCAB, (n, 16), generator=torch.Generator().manual_seed(0))
model = text_classifier(16)
seconds = []
for x2 in (None, None, ids[:n * 3 // 4]):
    start = time.perf_counter()
    ntbridge.kernel(model, ids, x2)
    seconds.append(time.perf_counter() - start)
print(*seconds)
"""


def fresh_rows(rounds: int, quick: bool) -> None:
    """The classifier's calls as a new process makes them (empty program cache): the first call
    (N = 32, x2 = None, the default rule), the same call again, and x2 of a size not asked for
    before (3/4 of N)."""
    import os
    import tempfile

    here, n = os.path.dirname(os.path.abspath(__file__)), 8 if quick else 32
    runs = []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as folder:
            out = subprocess.run([sys.executable, "-c", CLASSIFIER_CALLS, here, str(n)],
                                 env={**os.environ, "NTBRIDGE_CACHE_DIR": folder},
                                 capture_output=True, text=True, check=True)
            runs.append([float(v) for v in out.stdout.split()[-3:]])
    first, steady, new = (statistics.median(r[i] for r in runs) for i in range(3))
    print(f"text classifier N={n} T=16, a fresh process (median of {rounds}): first call "
          f"{first:.1f} s, steady {steady:.1f} s, a new x2 size {new:.1f} s "
          f"({new / first:.2f}x the first call)")


def cost_rows(rounds: int) -> None:
    import jax
    import jax.numpy as jnp
    import torch

    import ntbridge
    from ntbridge.devices import compiler_options
    from ntbridge.stax.attention_rule import _softmax_moments
    from ntbridge.stax.softmax_moments import Rule

    def median_time(fn, *args) -> float:  # after a first call; JAX arrays or torch tensors
        jax.block_until_ready(fn(*args))
        return statistics.median(_timed(lambda: jax.block_until_ready(fn(*args)))
                                 for _ in range(rounds))

    compiled = lambda fn, *args: jax.jit(fn).lower(*args).compile(
        compiler_options=compiler_options("cpu", "default"))
    model = text_classifier(16)
    ids = torch.randint(0, VOCAB, (32, 16), generator=torch.Generator().manual_seed(0))
    for points in (2, 8, 32):
        seconds = median_time(lambda: ntbridge.kernel(model, ids, attention_points=points))
        print(f"text classifier N=32 T=16 float32, 8 x {points} points: {seconds:.2f} s")
    rng, pairs, t = np.random.default_rng(0), 256, 16

    def psd(n: int) -> np.ndarray:  # (pairs, n, n) covariances
        a = rng.standard_normal((pairs, n, 2 * n)).astype("float32")
        return a @ a.swapaxes(-1, -2) / (2 * n)

    def blocks() -> tuple:  # (cov_n, cov_nm, cov_m) of queries or keys, variances about 1/4
        c = psd(2 * t) / 4
        return c[:, :t, :t], c[:, :t, t:], c[:, t:, t:]

    kq, kk, kv, ntks = blocks(), blocks(), psd(t), tuple(psd(t) for _ in range(3))
    for name, tangents in (("NNGP", None), ("NNGP and NTK", ntks)):
        fn = compiled(lambda kq, kk, kv, ntks: _softmax_moments(kq, kk, kv, ntks, (None, None),
                                                                Rule(), None), kq, kk, kv, tangents)
        print(f"expectation of {pairs} pairs, T=16, 8 x 32 points, {name}: "
              f"{median_time(fn, kq, kk, kv, tangents) * 1e3:.0f} ms")
    a = jnp.ones((pairs, 16 * t, t), "float32")  # a block's weights (query x point, key) by Kv
    b, big = jnp.ones((pairs, t, t), "float32"), jnp.ones((2048, 2048), "float32")
    batched = compiled(lambda a, b: jnp.einsum("pik,pkj->pij", a, b), a, b)
    large = compiled(lambda x: x @ x, big)
    print(f"XLA float32: batched products {pairs} x (256 x 16) @ (16 x 16) "
          f"{2 * a.size * t / median_time(batched, a, b) / 1e9:.0f} GFLOP/s, one 2048^3 "
          f"product {2 * 2048 ** 3 / median_time(large, big) / 1e9:.0f} GFLOP/s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nt-python", help="a Python with Neural Tangents 0.6.5")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rows",
                        default="linear,first,sandwich,sweep,classifier,rule,fresh,cost")
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
    if "rule" in args.rows:
        rule_rows(args.quick)
    if "fresh" in args.rows:
        fresh_rows(1 if args.quick else 3, args.quick)
    if "cost" in args.rows:
        cost_rows(3 if args.quick else 7)
    sys.exit(0)
