"""ntbridge benchmarks: ratios measured side by side in one process (absolute times drift).

Run: python benchmarks/run.py [--quick] [--empirical-only] [--device cuda] [--nt-python PATH]

First calls (compilations, an empty vs a warm compilation cache, Neural Tangents' first call with
``--nt-python``) and the command line's start-up come from ``first_call.py``, in fresh processes;
the analytic kernels at the sizes users run, against Neural Tangents with ``--nt-python``, from
``kernel_speed.py`` (fresh processes too).

JAX sees one CPU device, as in a user's process; the device-scaling rows run in a child process
with four CPU devices (sharing the cores).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import time

import jax
import torch
from torch import nn

import ntbridge
from ntbridge import analytic
from ntbridge.dlpack import shares_memory, to_jax, to_torch
from ntbridge.specs import Analytic

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import first_call  # noqa: E402  (this folder's first-call rows)
import kernel_speed  # noqa: E402  (the analytic kernels against Neural Tangents)
from first_call import HEADER, row  # noqa: E402


def finish(result) -> None:
    """Waits until ``result`` (JAX arrays or torch tensors) is computed, on CPU or GPU."""
    jax.block_until_ready(result)
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def best_time(fn, repeats: int = 5) -> float:
    """Best wall time of ``fn()`` over ``repeats`` runs, after one warm-up (compilation) run."""
    finish(fn())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        finish(fn())
        times.append(time.perf_counter() - t0)
    return min(times)


def interleaved_times(a, b, rounds: int) -> tuple[list[float], list[float]]:
    """Wall times of ``a()`` and ``b()`` called alternately ``rounds`` times each, after a warm-up:
    both see the same load of a shared machine."""
    samples = ([], [])
    for fn in (a, b):
        finish(fn())
    for _ in range(rounds):
        for fn, times in zip((a, b), samples):
            t0 = time.perf_counter()
            finish(fn())
            times.append(time.perf_counter() - t0)
    return samples


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
    hidden = [layer for _ in range(2) for layer in (nn.Linear(512, 512), nn.ReLU())]
    return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), *hidden, nn.Linear(512, 10))


def tiling_overhead(name: str, model: nn.Module, x: torch.Tensor) -> None:
    """Tiled (4 x 4 tiles, one device) vs untiled analytic kernel, through ntbridge.kernel."""
    n = x.shape[0]
    untiled = best_time(lambda: ntbridge.kernel(model, x, batch_size=0, device_count=1), 3)
    tiled = best_time(lambda: ntbridge.kernel(model, x, batch_size=n // 4, device_count=1), 3)
    row(f"{name} kernel tiled {n // 4} / untiled, 1 device (N={n})", tiled / untiled,
        f"tiled {tiled * 1e3:.1f} ms, untiled {untiled * 1e3:.1f} ms (target <= 1.10)")


def device_scaling(n: int) -> None:
    """The same tiled kernel over 1, 2 and 4 devices (on CPU the devices share the cores); run
    by a child process (``--device-scaling N``) that sees four CPU devices."""
    x, model = torch.randn(n, 784), fc_model()
    times = {d: best_time(lambda: ntbridge.kernel(model, x, batch_size=n // 4, device_count=d), 3)
             for d in (1, 2, 4)}
    for d in (2, 4):
        row(f"FC kernel {d} devices / 1 device (N={n}, {jax.devices()[0].platform})",
            times[d] / times[1], f"{times[d] * 1e3:.1f} ms vs {times[1] * 1e3:.1f} ms")


def torch_func_ntk(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor | None, how: str,
                   trace: bool = False) -> torch.Tensor:
    """The empirical NTK the torch.func way: Jacobian contraction or NTK-vector products (vmap over
    the output basis of a VJP, then a JVP). The full kernel (N1, N2, O, O), or with ``trace`` the
    output-averaged (N1, N2) (contraction 'nof,mof->nm' / O). x2 None: x1's Jacobians serve both."""
    from torch.func import functional_call, jacrev, jvp, vjp, vmap
    params = {k: v.detach() for k, v in model.named_parameters()}
    single = lambda p, x: functional_call(model, p, (x[None],))[0]
    if how == "jacobian":
        j1 = vmap(jacrev(single), (None, 0))(params, x1)
        j2 = j1 if x2 is None else vmap(jacrev(single), (None, 0))(params, x2)
        outputs = next(iter(j1.values())).shape[1]
        spec, scale = ("nof,mof->nm", outputs) if trace else ("nof,mpf->nmop", 1)
        return sum(torch.einsum(spec, a.flatten(2), j2[k].flatten(2))
                   for k, a in j1.items()) / scale
    x2 = x1 if x2 is None else x2
    f1 = lambda p: functional_call(model, p, (x1,))

    def per_x2(x):
        _, pull = vjp(lambda p: single(p, x), params)
        column = lambda ct: jvp(f1, (params,), pull(ct))[1]  # (N1, O)
        return vmap(column)(torch.eye(model(x1[:1]).shape[-1], dtype=x1.dtype, device=x1.device))

    full = vmap(per_x2)(x2).permute(2, 0, 3, 1)
    return full.diagonal(dim1=2, dim2=3).mean(-1) if trace else full


def peak_memory(model: nn.Module, x1, x2, trace_axes, impl: str,
                batch_size: int | None = None) -> int | None:
    """Bytes of a strategy's compiled program (arguments, outputs, temporaries), from XLA; with
    ``batch_size``, of the program of one off-diagonal tile. None when compiling itself runs out of
    memory (a GPU compiler tunes its products on the device)."""
    from ntbridge.empirical import empirical_ntk_fn
    if batch_size:
        x1, x2 = x1[:batch_size], (x1 if x2 is None else x2)[:batch_size]
    graph = ntbridge.convert(model)
    a1, a2 = to_jax(x1), None if x2 is None else to_jax(x2)
    run = jax.jit(empirical_ntk_fn(graph, impl).plan(graph.params, a1, a2,
                                                     trace_axes=trace_axes)[0])
    try:
        m = run.lower((graph.params, None), a1, a2).compile().memory_analysis()
    except jax.errors.JaxRuntimeError as e:
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        return None
    return m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes


def memory_text(peak: int | None, batch_size: int | None) -> str:
    """A program's peak memory in words; tiled, against the planner's budget for one tile."""
    from ntbridge.devices import free_bytes
    from ntbridge.tiling.plan import MEMORY_FRACTION
    if peak is None:
        return "compiling it ran out of device memory"
    if not batch_size:
        return f"peak memory {peak / 2 ** 20:.0f} MiB"
    budget = free_bytes(jax.devices()[0]) * MEMORY_FRACTION
    return (f"peak memory of a tile {peak / 2 ** 20:.0f} MiB, planner's budget "
            f"{budget / 2 ** 20:.0f} MiB: {'PASS' if peak <= budget else 'FAIL'}")


def strategies_vs_auto(name: str, model: nn.Module, x1, x2, trace_axes, limit_s: float,
                       repeats: int, batch_size: int | None = None) -> None:
    """Each empirical strategy's time and peak memory vs the one auto picked, called alternately
    with auto; strategies whose XLA estimate is above ``limit_s`` seconds or 4 GiB are reported,
    not run."""
    call = lambda impl="auto": ntbridge.empirical_ntk(model, x1, x2, trace_axes=trace_axes,
                                                      implementation=impl, batch_size=batch_size)
    t0 = time.perf_counter()
    _, info = ntbridge.empirical_ntk(model, x1, x2, trace_axes=trace_axes, return_info=True,
                                     batch_size=batch_size)
    print(f"  auto picked {info.implementation} (first call, choice and compilation included: "
          f"{time.perf_counter() - t0:.1f} s): {info.reason}")
    ratios = {}  # strategy / auto, best times of alternate calls
    for impl, cost in sorted(info.costs.items()):
        peak = peak_memory(model, x1, x2, trace_axes, impl, batch_size)
        memory = memory_text(peak, batch_size)
        too_big = cost["estimated_s"] > limit_s or peak is None or peak > 2 ** 32
        if too_big and impl != info.implementation:
            print(f"{name + ': ' + impl + ' / auto':<52} {'-':>8}    not run: XLA estimate "
                  f"{cost['estimated_s']:.1f} s, {memory}")
            continue
        theirs, ours = map(min, interleaved_times(lambda: call(impl), call, repeats))
        ratios[impl] = theirs / ours
        row(f"{name}: {impl} / auto", ratios[impl],
            f"{impl} {theirs * 1e3:.1f} ms, auto {ours * 1e3:.1f} ms, {memory}")
    fastest = min(ratios, key=ratios.get)
    verdict = "PASS" if ratios[fastest] >= 1 / 1.2 else "FAIL"
    row(f"{name}: fastest strategy / auto", ratios[fastest],
        f"fastest: {fastest}; check auto <= 1.2x fastest: {verdict}")


def tutorial_cnn(device: str) -> nn.Module:
    """The torch.func NTK tutorial's CNN: 3 conv 3x3 layers of 32 channels, ReLU, Flatten, Linear
    to 10, for 3x32x32 images."""
    return nn.Sequential(nn.Conv2d(3, 32, 3), nn.ReLU(), nn.Conv2d(32, 32, 3), nn.ReLU(),
                         nn.Conv2d(32, 32, 3), nn.Flatten(), nn.Linear(32 * 26 * 26, 10)).to(device)


def vs_torch_func(name: str, model: nn.Module, x1, x2, trace_axes, how: str, target: float,
                  rounds: int, batch_size: int | None = None) -> None:
    """ntbridge auto / torch.func (``how``) on the same kernel, called alternately."""
    auto = lambda: ntbridge.empirical_ntk(model, x1, x2, trace_axes=trace_axes,
                                          batch_size=batch_size)
    reference = lambda: torch_func_ntk(model, x1, x2, how, trace=trace_axes == (-1,))
    ours, theirs = interleaved_times(auto, reference, rounds)
    ratios = {"best": min(ours) / min(theirs),
              "median": statistics.median(ours) / statistics.median(theirs)}
    verdict = "PASS" if max(ratios.values()) <= target else "FAIL"
    row(f"{name}: auto / torch.func {how}", ratios["median"],
        f"ratio of medians; of best times {ratios['best']:.2f}x; torch.func median "
        f"{statistics.median(theirs) * 1e3:.0f} ms over {rounds} interleaved calls; target "
        f"<= {target}x: {verdict}")


def empirical_cnn(repeats: int, device: str) -> None:
    """The tutorial CNN's full empirical NTK of 20 x 5 images, model and inputs on ``device``
    ("cpu" or "cuda")."""
    model, images = tutorial_cnn(device), lambda n: torch.randn(n, 3, 32, 32, device=device)
    x1, x2 = images(20), images(5)
    name = f"CNN empirical NTK (20x5 images, full, {device})"
    strategies_vs_auto(name, model, x1, x2, (), limit_s=60, repeats=repeats)
    for how, target, rounds in (("jacobian", 0.5, 3 * repeats), ("ntvp", 1.0, repeats)):
        vs_torch_func(name, model, x1, x2, (), how, target, rounds)


def empirical_cnn_traced(repeats: int, device: str) -> None:
    """The tutorial CNN's empirical NTK with the default trace_axes (float32): 20 x 5 images, 64
    with x2 = None, and 256 with x2 = None in tiles of 128."""
    model, images = tutorial_cnn(device), lambda n: torch.randn(n, 3, 32, 32, device=device)
    for n1, n2, batch_size in ((20, 5, None), (64, None, None), (256, None, 128)):
        x1, x2 = images(n1), None if n2 is None else images(n2)
        tiles = f", tiles of {batch_size}" if batch_size else ""
        name = f"CNN empirical NTK ({n1}x{n2 or 'None'}{tiles}, traced, {device})"
        strategies_vs_auto(name, model, x1, x2, (-1,), limit_s=20, repeats=repeats,
                           batch_size=batch_size)
        vs_torch_func(name, model, x1, x2, (-1,), "jacobian", 0.5, 2 * repeats, batch_size)


def cpu_convolution(batch: int) -> None:
    """XLA's CPU convolutions with its default options (YNNPACK) vs ntbridge's (XLA's own): a
    batch of 3x3, 32-channel convolutions of 28x28 maps, the size of the tutorial CNN's."""
    from ntbridge.devices import compiler_options
    conv = lambda x, w: jax.lax.conv_general_dilated(
        x, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=("NHWC", "HWIO", "NHWC"),
        precision=jax.lax.Precision.HIGHEST)
    x, w = jax.numpy.ones((batch, 28, 28, 32)), jax.numpy.ones((3, 3, 32, 32))
    default, ours = jax.jit(conv), jax.jit(conv, compiler_options=compiler_options("cpu"))
    t_default, t_ours = map(min, interleaved_times(lambda: default(x, w), lambda: ours(x, w), 5))
    row(f"CPU convolution (batch {batch}): XLA default / ntbridge", t_default / t_ours,
        f"default {t_default * 1e3:.1f} ms, ntbridge's options {t_ours * 1e3:.1f} ms")


def compile_options(quick: bool) -> None:
    """Analytic programs compiled with ntbridge's CPU options changed one way at a time: each kind
    of program's options (:data:`ntbridge.devices.PROGRAM_OPTIONS`: "vector" for FC, "diagonal"
    for Flatten heads, none for global pooling) against the defaults, the "small" options against
    the kind's (ntbridge takes them for small programs only: the last workload), LLVM's level 0
    against the small options' level 1, and ntbridge's codegen split (one LLVM module per core)
    against XLA's (32). Compile times (best of 3, alternately, each from a fresh lowering) and
    steady state (alternately)."""
    from ntbridge.devices import CPU_COMPILER_OPTIONS, compiler_options, usable_cores
    from ntbridge.tiling.plan import Tiling
    from ntbridge.tiling.compiled import options_kind
    workloads = [("FC", fc_model(), (256 if quick else 1024, 784)),
                 ("CNN Flatten 16x16", _cnn("Flatten", 16), (32 if quick else 128, 3, 16, 16)),
                 ("CNN GAP 8x8", _cnn("global avg pool", 8), (8 if quick else 32, 3, 8, 8)),
                 ("CNN GAP 8x8", _cnn("global avg pool", 8), (6, 3, 8, 8))]  # a small program
    split = "xla_cpu_parallel_codegen_split_count"
    for name, model, shape in workloads:
        a = to_jax(torch.randn(shape))
        task = analytic.task(Analytic(), ntbridge.convert(model), a, None, "cpu")[0]
        used = options_kind(task, Tiling(len(a), len(a), len(a), True), a)
        ours = compiler_options("cpu", used)
        comparisons = [(f"{kind} options", compiler_options("cpu", kind), compiler_options("cpu"),
                        f"{kind} / default; ntbridge uses {used} here")
                       for kind in ("vector", "diagonal")]
        small = compiler_options("cpu", "small")
        comparisons.append(("small options", small, compiler_options("cpu", task.program_kind(a)),
                            f"small / {task.program_kind(a)}; ntbridge uses {used} here"))
        comparisons.append(("LLVM level 0", {**small, "xla_backend_optimization_level": "0"},
                            small, "level 0 / the small options' level 1"))
        comparisons.append(("codegen split", ours, {k: v for k, v in ours.items() if k != split},
                            f"{CPU_COMPILER_OPTIONS[split]} modules ({usable_cores()} cores)"
                            " / XLA's 32"))
        for label, options_a, options_b, detail in comparisons:
            times, programs = ([], []), [None, None]
            for _ in range(3):
                for i, options in enumerate((options_a, options_b)):
                    # a fresh lowering each time: JAX keeps what it compiled from one in memory
                    lowered = jax.jit(functools.partial(task.fn, task.args)).lower(a, None)
                    t0 = time.perf_counter()
                    programs[i] = lowered.compile(compiler_options=options)
                    times[i].append(time.perf_counter() - t0)
            compile_a, compile_b = map(min, times)
            steady_a, steady_b = map(min, interleaved_times(lambda: programs[0](a, None),
                                                             lambda: programs[1](a, None), 5))
            row(f"{label}, {name} N={shape[0]}: compile", compile_a / compile_b,
                f"{compile_a:.2f} s vs {compile_b:.2f} s; {detail}")
            row(f"{label}, {name} N={shape[0]}: steady", steady_a / steady_b,
                f"{steady_a * 1e3:.1f} ms vs {steady_b * 1e3:.1f} ms")


def empirical_wide_mlp(n: int, repeats: int, device: str) -> None:
    """784 -> 3 x [2048, ReLU] -> 10, full kernel of N x N: the structured strategy's advantage."""
    layers = [nn.Linear(784, 2048), nn.ReLU()] + [nn.Linear(2048, 2048), nn.ReLU()] * 2
    model = nn.Sequential(*layers, nn.Linear(2048, 10)).to(device)
    x = torch.randn(n, 784, device=device)
    strategies_vs_auto(f"wide MLP empirical NTK (N={n}, full, {device})", model, x, None, (),
                       limit_s=60, repeats=repeats)


def _cnn(head: str, size: int) -> nn.Module:
    """Two 3x3 conv layers of 64 channels with ReLU, then a Flatten or global-average-pooling head."""
    convs = [nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU()]
    tail = ([nn.Flatten(), nn.Linear(64 * size * size, 10)] if head == "Flatten" else
            [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)])
    return nn.Sequential(*convs, *tail)


def _cnn_kernel(head: str, n: int, size: int) -> tuple[float, float, int]:
    """Steady-state and compile times of the analytic NNGP + NTK of ``_cnn`` on n images, and the
    compiled program's memory (arguments, outputs and temporaries) from XLA's analysis."""
    graph = ntbridge.convert(_cnn(head, size))
    a = to_jax(torch.randn(n, 3, size, size))
    t0 = time.perf_counter()
    fn = jax.jit(lambda a: graph.kernel_fn(a, get=("nngp", "ntk"))).lower(a).compile()
    t_compile = time.perf_counter() - t0
    m = fn.memory_analysis()
    peak = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
    return best_time(lambda: fn(a)), t_compile, peak


def cnn_kernels(n_flatten: int, n_pool: int) -> None:
    """Analytic CNN kernels: scaling in N and image size, compile vs steady-state time.

    A Flatten head keeps only same-position covariances (cost ~ N^2 H W); global average pooling
    needs every pair of positions (cost ~ N^2 (H W)^2).
    """
    for head, n in (("Flatten", n_flatten), ("global avg pool", n_pool)):
        t, t_compile, peak = _cnn_kernel(head, n, 8)
        t_2n = _cnn_kernel(head, 2 * n, 8)[0]
        t_16, _, peak_16 = _cnn_kernel(head, n, 16)
        entry = lambda t: f"{t / n ** 2 * 1e6:.1f} us/entry"
        row(f"CNN {head} 8x8: time(2N)/time(N) (N={n})", t_2n / t,
            f"ideal 4; {entry(t)}, peak {peak / 2 ** 20:.1f} MiB")
        row(f"CNN {head}: time 16x16 / 8x8 (N={n})", t_16 / t,
            f"ideal {4 if head == 'Flatten' else 16}; 16x16: {entry(t_16)}, "
            f"peak {peak_16 / 2 ** 20:.1f} MiB")
        row(f"CNN {head} 8x8: compile / steady-state (N={n})", t_compile / t,
            f"compile {t_compile:.2f} s, steady {t * 1e3:.1f} ms")


def analytic_rows(n: int, quick: bool) -> None:
    """The infinite-width kernel rows (CPU; on a GPU machine, its default JAX device)."""
    fc_vs_gram(n)
    dlpack_handoff(n)
    tiling_overhead("FC", fc_model(), torch.randn(n, 784))
    tiling_overhead("CNN Flatten 8x8", _cnn("Flatten", 8), torch.randn(n // 8, 3, 8, 8))
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    sys.stdout.flush()  # the child's rows come after this process's
    subprocess.run([sys.executable, __file__, "--device-scaling", str(n)], check=True,
                   env={**os.environ, "XLA_FLAGS": flags})
    cnn_kernels(64 if quick else 256, 8 if quick else 32)
    from gradients import gradient_rows  # imports this module's helpers
    gradient_rows(quick)
    from activations import cost_rows
    cost_rows(256, 3 if quick else 7, ("float32",))
    from decoder import decoder_rows
    decoder_rows(128, 3 if quick else 7)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--empirical-only", action="store_true", help="the empirical NTK rows only")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the empirical NTK rows put the torch model and inputs")
    parser.add_argument("--nt-python", metavar="PATH",
                        help="a Python with neural-tangents 0.6.5 (see first_call.py)")
    parser.add_argument("--device-scaling", type=int, metavar="N", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.device_scaling:  # the child process of analytic_rows
        device_scaling(args.device_scaling)
        return
    # ntbridge computes float32 in full precision (XLA's HIGHEST): so does torch, for a fair race
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    n = 512 if args.quick else 2048
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, torch {torch.__version__}\n")
    print(HEADER)
    repeats = 2 if args.quick else 5
    if args.device == "cpu":
        cpu_convolution(50 if args.quick else 250)
        if not args.empirical_only:
            compile_options(args.quick)
    if not args.empirical_only:
        first_call.rows(1 if args.quick else 3, args.nt_python)
        kernel_speed.rows(args.nt_python, quick=args.quick)
        analytic_rows(n, args.quick)
    empirical_wide_mlp(64 if args.quick else 256, repeats, args.device)
    empirical_cnn(repeats, args.device)
    empirical_cnn_traced(repeats, args.device)


if __name__ == "__main__":
    main()
