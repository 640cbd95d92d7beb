"""The program cache: derived keys (precision included), one compilation per program per request,
a disk cache that a second process reuses, and that survives bad directories and entries."""

import copy
import json
import os
import subprocess
import sys
import textwrap
import warnings

import jax
import numpy as np
import pytest
import torch
from torch import nn

import ntbridge
from ntbridge import errors, programs

# Two kernel calls of a float64 MLP in a fresh process, counting XLA's backend compilations and
# JAX's lowerings to StableHLO.
COUNT_COMPILES = textwrap.dedent("""
    import collections, json, sys, time
    import jax, torch, ntbridge
    from torch import nn
    events = collections.Counter()
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, seconds, **kw: events.update([event.rsplit("/", 1)[-1]]))
    torch.manual_seed(0)
    fc = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                       nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)).double()
    x = torch.randn(200, 64, dtype=torch.float64)
    xs = torch.randn(157, 64, dtype=torch.float64)
    start = time.perf_counter()
    first = ntbridge.kernel(fc, x, None)
    seconds = time.perf_counter() - start
    second = ntbridge.kernel(fc, xs, x)
    torch.save({"first": first.ntk, "second": second.ntk}, sys.argv[1])
    print(json.dumps({"compiles": events["backend_compile_duration"],
                      "lowerings": events["jaxpr_to_mlir_module_duration"],
                      "first_call_s": seconds}))
""")


def _count(tmp_path, cache, name):
    env = {**os.environ, "NTBRIDGE_CACHE_DIR": str(cache)}
    out = subprocess.run([sys.executable, "-c", COUNT_COMPILES, str(tmp_path / name)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_two_calls_compile_at_most_four_programs(tmp_path):
    """A fresh process, alone with an empty cache directory, compiles (after lowering) at most
    four programs for the two calls."""
    fresh = _count(tmp_path, tmp_path / "cache", "a.pt")
    assert fresh["compiles"] <= 4 and fresh["lowerings"] >= fresh["compiles"]


@pytest.mark.slow
def test_concurrent_processes_share_one_cache_directory(tmp_path):
    """Two processes filling the same empty directory at once: both succeed with equal kernels,
    and a third finds every program there by their keys: it neither compiles nor lowers them."""
    cache = tmp_path / "cache"
    env = {**os.environ, "NTBRIDGE_CACHE_DIR": str(cache)}
    procs = [subprocess.Popen([sys.executable, "-c", COUNT_COMPILES, str(tmp_path / f"{i}.pt")],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    assert not [f for f in os.listdir(cache) if f.startswith(".tmp-")]
    warm = _count(tmp_path, cache, "2.pt")
    assert warm["compiles"] == 0 and warm["lowerings"] == 0
    results = [torch.load(tmp_path / f"{i}.pt") for i in range(3)]
    assert all(torch.equal(results[0][k], r[k]) for r in results[1:] for k in ("first", "second"))


MODELS = {  # the layer families' rules: closed forms, quadrature, LayerNorm, pooling of both kinds
    "mlp": lambda: nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(),
                                 nn.Linear(16, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 2)),
    "cnn": lambda: nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),
                                 nn.Conv2d(4, 4, 1), nn.Hardtanh(), nn.AdaptiveAvgPool2d(1),
                                 nn.Flatten(), nn.Linear(4, 2)),
}
SHAPES = {"mlp": (4,), "cnn": (2, 4, 4)}


def _entry_points(model, x):
    return [ntbridge.ntk(model, x), ntbridge.nngp(model, x[:3], x),
            *ntbridge.kernel(model, x, batch_size=2),
            ntbridge.empirical_ntk(model, x), ntbridge.empirical_nngp(model, x[:3], x),
            ntbridge.monte_carlo(model, x, n_samples=2).mean]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_float32_then_float64_then_float32(name):
    """Every entry point, every layer family: switching precision (same and fresh model objects)
    never reuses a program of the other precision, and gives the same kernels each time."""
    torch.manual_seed(0)
    model = MODELS[name]()
    x = torch.randn(5, *SHAPES[name])
    first = _entry_points(model, x)
    double = _entry_points(model.double(), x.double())
    again = _entry_points(copy.deepcopy(model).float(), x)  # a fresh object, float32 weights
    for n, (a, b, c) in enumerate(zip(first, double, again)):
        assert a.dtype == c.dtype == torch.float32 and b.dtype == torch.float64
        torch.testing.assert_close(a, c, rtol=0, atol=0)
        if n < len(first) - 1:  # Monte-Carlo samples are drawn anew in each precision
            torch.testing.assert_close(b.float(), a, rtol=2e-4, atol=2e-4 * a.abs().max().item())


def test_keys_are_derived_from_precision_shapes_and_devices():
    import jax
    import jax.numpy as jnp
    a32 = jax.ShapeDtypeStruct((3, 4), jnp.float32)
    key = lambda *args, **kw: programs.ProgramKey.of("p", "c", *args, **kw)
    assert key(a32) == key(jax.ShapeDtypeStruct((3, 4), jnp.float32))
    assert key(a32) != key(jax.ShapeDtypeStruct((3, 5), jnp.float32))
    assert key(a32) != key((a32, None))
    without = key(a32)
    with jax.enable_x64(True):
        assert key(a32) != without  # same shapes, x64 mode differs
    assert key(a32, jax.devices()[:1]) != key(a32, jax.devices()[1:2])


def test_disk_entries_are_named_by_value_unless_a_key_holds_an_object(monkeypatch):
    """Keys of plain values name their entries alike in every process (sets in any order). A
    graph's signature describes its layers by value (a user's subclass of a module converts to
    ntbridge's own layer); a layer over a user's function names it by identity, so its programs
    are named by their lowered text."""
    text = programs._text
    assert text(("tiles", (1, 2.5, None, "a"), frozenset({"x", "y"}))) == text(
        ("tiles", (1, 2.5, None, "a"), frozenset({"y", "x"})))
    assert text((1,)) != text((1.0,)) and text((1,)) != text([1])
    model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1))
    assert text(ntbridge.convert(model).signature) is not None
    assert text((nn.ReLU(),)) is None and text((lambda x: x,)) is None

    class MyReLU(nn.ReLU):
        pass

    mine = ntbridge.convert(nn.Sequential(nn.Linear(3, 8), MyReLU()))
    assert mine.signature == ntbridge.convert(model[:2]).signature
    monkeypatch.setitem(ntbridge.converters.registry.CONVERTERS, nn.ReLU,
                        lambda module, ctx: ntbridge.stax.Relu())
    assert text(ntbridge.convert(model).signature) is not None
    monkeypatch.setitem(ntbridge.converters.registry.CONVERTERS, nn.ReLU,
                        lambda module, ctx: ntbridge.stax.Numerical(lambda x: x * (x > 0), "mine"))
    assert text(ntbridge.convert(model).signature) is None


def test_only_programs_calling_lapack_load_its_kernels_from_disk(monkeypatch, tmp_path):
    """A program from disk that calls LAPACK loads JAX's LAPACK kernels first (a process that
    lowered no linear algebra would crash without them); any other program does not, since loading
    them imports SciPy's linear algebra, most of a warm first call."""
    import jax.numpy as jnp

    monkeypatch.setenv("NTBRIDGE_CACHE_DIR", str(tmp_path))
    loads = []
    monkeypatch.setattr(programs, "initialize_lapack", lambda: loads.append(1))
    devices, x = jax.devices()[:1], jnp.arange(9.0).reshape(3, 3) / 9
    for name, fn, lapack in (("product", lambda a: a @ a.T + 1, 0),
                             ("eigh", lambda a: jnp.linalg.eigh(a @ a.T + 1)[0], 1)):
        key = programs.ProgramKey.of("test", name, x, devices)
        lower = lambda: jax.jit(fn).lower(x)
        compiled = programs.compile(key, lower, devices)  # compiled and stored
        assert not loads
        loaded = programs.compile(key, lower, devices)  # found on disk
        assert len(loads) == lapack
        np.testing.assert_array_equal(np.asarray(loaded(x)), np.asarray(compiled(x)))
        loads.clear()
    assert len(list(tmp_path.glob("v3-*.xla"))) == 2


def test_layer_norm_constants_are_part_of_the_signature():
    """LayerNorm's kernel depends on its (constant) weight and bias: programs are not shared."""
    torch.manual_seed(0)
    model = MODELS["mlp"]()
    x = torch.randn(5, 4)
    before = ntbridge.ntk(model, x)
    with torch.no_grad():
        model[5].weight.fill_(2.0)
    after = ntbridge.ntk(model, x)
    assert not torch.allclose(after, before)
    programs.clear()
    torch.testing.assert_close(ntbridge.ntk(model, x), after, rtol=0, atol=0)


def _tiny():
    return nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1)), torch.randn(4, 3)


def test_unwritable_cache_directory_warns_once_and_computes(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("NTBRIDGE_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setattr(programs, "_WARNED", set())
    programs.clear()
    model, x = _tiny()
    with pytest.warns(errors.CacheWarning, match="cannot write its compilation cache"):
        k = ntbridge.ntk(model, x)
    programs.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(ntbridge.ntk(model, x), k, rtol=0, atol=0)


@pytest.mark.parametrize("failure", ["serialize", "write"])
def test_a_program_the_cache_cannot_keep_still_computes(failure, tmp_path, monkeypatch):
    """XLA failing to serialize a program (as it does for some: 'Failed to serialize
    CpuAotCompilationResult'), or the entry failing to be written with an error other than an
    OSError: a warning, no entry, and the kernel all the same."""
    from jax.experimental import serialize_executable
    model, x = _tiny()
    expected = ntbridge.ntk(model, x)
    monkeypatch.setenv("NTBRIDGE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(programs, "_WARNED", set())
    programs.clear()

    def fail(*args, **kwargs):
        raise jax.errors.JaxRuntimeError("INTERNAL: Failed to serialize CpuAotCompilationResult")

    if failure == "serialize":
        monkeypatch.setattr(serialize_executable, "serialize", fail)
        match = "cannot keep a compiled program in its compilation cache"
    else:
        monkeypatch.setattr(programs.tempfile, "mkstemp", fail)
        match = "cannot write its compilation cache"
    with pytest.warns(errors.CacheWarning, match=match):
        k = ntbridge.ntk(model, x)
    torch.testing.assert_close(k, expected, rtol=0, atol=0)
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".xla"]


def test_corrupt_entries_are_ignored_and_rewritten(tmp_path, monkeypatch):
    monkeypatch.setenv("NTBRIDGE_CACHE_DIR", str(tmp_path))
    programs.clear()
    model, x = _tiny()
    k = ntbridge.ntk(model, x)
    entries = [p for p in tmp_path.iterdir() if p.suffix == ".xla"]
    assert entries
    for p in entries:
        p.write_bytes(b"garbage")
    programs.clear()
    torch.testing.assert_close(ntbridge.ntk(model, x), k, rtol=0, atol=0)
    assert all(p.read_bytes() != b"garbage" for p in entries)


def test_programs_differing_in_unused_arguments_do_not_share_a_disk_entry(tmp_path, monkeypatch):
    """Training-mode BatchNorm ignores its running statistics, so its program lowers to the same
    text as that of a BatchNorm without them; the arguments' trees differ, and so do the entries."""
    monkeypatch.setenv("NTBRIDGE_CACHE_DIR", str(tmp_path))
    programs.clear()
    without = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4, track_running_stats=False)).eval()
    train = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    train.load_state_dict(without.state_dict(), strict=False)
    x = torch.randn(5, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", errors.BatchStatisticsWarning)
        first = ntbridge.empirical_nngp(without, x)
        torch.testing.assert_close(ntbridge.empirical_nngp(train, x), first, rtol=0, atol=0)


def test_cache_can_be_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv("NTBRIDGE_CACHE_DIR", "off")
    assert programs.cache_dir() is None
    programs.clear()
    model, x = _tiny()
    assert ntbridge.ntk(model, x).shape == (4, 4)


def test_the_pair_bytes_of_a_kernel_are_an_entry_of_the_one_cache(monkeypatch):
    """The bytes of an example pair (how the CPU's blocks are sized) are traced once per
    architecture and example, kept in programs' cache and forgotten by programs.clear()."""
    from ntbridge import analytic

    traces = []
    trace = analytic._pair_bytes
    monkeypatch.setattr(analytic, "_pair_bytes", lambda *a: traces.append(1) or trace(*a))
    graph = ntbridge.convert(nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1)))
    example = jax.ShapeDtypeStruct((5, 3), "float32")
    programs.clear()
    first = analytic._pair_bytes_of(graph, example)
    assert analytic._pair_bytes_of(graph, jax.ShapeDtypeStruct((7, 3), "float32")) == first
    assert len(traces) == 1 and first == 4
    programs.clear()
    analytic._pair_bytes_of(graph, example)
    assert len(traces) == 2


def test_a_new_size_runs_a_larger_program_padded_once(monkeypatch):
    """A first call at a new size runs a whole-tile program compiled for more examples (its tile
    padded, as edge tiles are; at most PAD_WORK times the pairs) and builds no program; the same
    size asked for again gets its own; far fewer examples get their own at once. The padded
    calls give the kernels of the size's own program, x2 = None ones symmetric; their backward
    repeats the padded tiling (it builds its VJP program only) and gives the same gradients."""
    original, built = programs.compile, []
    monkeypatch.setattr(programs, "compile", lambda *a, **k: built.append(1) or original(*a, **k))
    programs.clear()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.Flatten(),
                          nn.Linear(3 * 25, 2)).double()
    x = torch.randn(16, 2, 5, 5, dtype=torch.float64)
    kernels = lambda *xs: ntbridge.kernel(model, *xs, get=("nngp", "ntk"))
    same = lambda a, b: all(torch.allclose(p, q, rtol=1e-12, atol=1e-14) for p, q in zip(a, b))
    kernels(x, x[:10])
    padded = kernels(x, x[:7])
    assert len(built) == 1 and padded.nngp.shape == (16, 7)
    assert same(padded, kernels(x, x[:7])) and len(built) == 2  # asked again: its own program
    kernels(x)
    padded = kernels(x[:12])
    assert len(built) == 3 and torch.equal(padded.ntk, padded.ntk.T)
    assert same(padded, kernels(x[:12])) and len(built) == 4
    kernels(x[:4])  # 16 x 16 pairs are more than PAD_WORK times 4 x 4
    assert len(built) == 5
    grads = []  # the backward repeats the padded forward's tiling: it builds the VJP program only
    for asked in range(2):
        x5 = x[:5].clone().requires_grad_()
        kernels(x, x5).ntk.sum().backward()
        grads.append(x5.grad)
        assert len(built) == 6 + 2 * asked
    assert torch.allclose(*grads, rtol=1e-10, atol=1e-12)


def test_a_new_larger_size_runs_tiles_of_a_program_compiled_for_fewer(monkeypatch):
    """A first call at a size larger than every compiled one runs, tile by tile, a two-input program
    compiled for fewer examples (edge tiles padded; x2 = None: one whose tiles have as many rows as
    columns) and builds no program; it gives the kernels of the size's own program, and the size
    asked for again gets its own. Empirical kernels alike."""
    original, built = programs.compile, []
    monkeypatch.setattr(programs, "compile", lambda *a, **k: built.append(1) or original(*a, **k))
    programs.clear()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 2)).double()
    x = torch.randn(30, 3, dtype=torch.float64)
    kernels = lambda *xs: ntbridge.kernel(model, *xs, get=("nngp", "ntk"), return_info=True)
    same = lambda a, b: all(torch.allclose(p, q, rtol=1e-12, atol=1e-14) for p, q in zip(a, b))
    kernels(x[:8], x[:8])
    for x1, x2 in ((x[:20], x[:7]), (x[:13], None)):  # 3 x 1 tiles; 3 of 2 x 2 (x2 = None)
        (k, info), (own, own_info) = kernels(x1, x2), kernels(x1, x2)
        assert (info.tiles, info.tile, own_info.tiles) == (3, (8, 8), 1) and same(k, own)
        assert len(built) == (2 if x2 is not None else 3)  # each size asked again compiled
    assert torch.equal(k.ntk, k.ntk.T)
    kernels(x[:9], x[:9])  # 2 x 2 tiles of 8 x 8 are more than PAD_WORK times 9 x 9 pairs
    assert len(built) == 4
    empirical = lambda *xs: ntbridge.empirical_ntk(model, *xs)  # empirical kernels too
    empirical(x[:8], x[:8])
    built.clear()
    padded = empirical(x[:20], x[:7])
    assert not built and same([padded], [empirical(x[:20], x[:7])]) and len(built) == 1


EXPECTATION_ERRORS = """
import sys
sys.path.insert(0, sys.argv[1])
import torch, ntbridge
from helpers import Attention
model = Attention(64, 2).double()
x = torch.randn(3, 4, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
for points in (8, 32):
    ntbridge.expectation_error(model, x, attention_points=points)
"""


def test_a_process_exits_cleanly_after_its_programs(tmp_path):
    """Compiled programs are freed while XLA is up (an exit hook of ``ntbridge.programs``): left
    to the interpreter's teardown, this script (two expectation-error programs of attention,
    loaded from the disk cache by the second process) ended with "terminate called without an
    active exception" and exit status 134 in a third of the runs on a busy machine (a race: none
    on a quiet one)."""
    env = {**os.environ, "NTBRIDGE_CACHE_DIR": str(tmp_path)}
    for _ in range(2):  # the first process writes the programs, the second loads them
        script = [sys.executable, "-c", EXPECTATION_ERRORS, os.path.dirname(__file__)]
        out = subprocess.run(script, env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert "terminate called" not in out.stderr
