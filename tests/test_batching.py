"""Tiling, devices and kernel files never change a result; the memory planner refuses early."""

import copy
import functools
import json
import os
import shutil
import subprocess
import sys
import time
import types

import numpy as np
import pytest
import torch
from torch import nn

import ntbridge
from ntbridge import devices, errors

MODEL = nn.Sequential(nn.Linear(5, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))


@pytest.fixture(scope="module")
def data():
    g = torch.Generator().manual_seed(3)
    return torch.randn(13, 5, generator=g), torch.randn(7, 5, generator=g)


@pytest.mark.parametrize("batch_size,device_count",
                         [(0, 1), (1, 2), (4, 1), (5, 2), (4, 4), (13, 4), (100, 1)])
def test_analytic_batching_invariance(data, batch_size, device_count):
    x1, x2 = data
    ref = ntbridge.kernel(MODEL, x1, x2, batch_size=0, device_count=1)
    got = ntbridge.kernel(MODEL, x1, x2, batch_size=batch_size, device_count=device_count)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=2e-6, atol=1e-7)
    sym = ntbridge.ntk(MODEL, x1, batch_size=batch_size, device_count=device_count)
    assert torch.equal(sym, sym.T)
    torch.testing.assert_close(sym, ntbridge.ntk(MODEL, x1, batch_size=0), rtol=2e-6, atol=1e-7)


def test_host_storage(data):
    x1, x2 = data
    k = ntbridge.ntk(MODEL, x1, x2, batch_size=4, store_on_device=False)
    torch.testing.assert_close(k, ntbridge.ntk(MODEL, x1, x2), rtol=2e-6, atol=1e-7)


def test_out_file_roundtrip_and_stale_refusal(data, tmp_path):
    x1, x2 = data
    path = tmp_path / "k.npy"
    k = ntbridge.ntk(MODEL, x1, batch_size=4, out=str(path))
    assert np.load(path).shape == (13, 13)
    torch.testing.assert_close(k, ntbridge.ntk(MODEL, x1), rtol=2e-6, atol=1e-7)
    record = json.loads((tmp_path / "k.npy.tiles.json").read_text())
    assert len(record["done"]) == 10  # 4 row blocks: 4 + 3 + 2 + 1 tiles on and above the diagonal
    again = ntbridge.ntk(MODEL, x1, batch_size=4, out=str(path))  # complete: nothing recomputed
    assert torch.equal(again, k)
    with pytest.raises(errors.InputError, match=r"different model, input or options \(inputs "):
        ntbridge.ntk(MODEL, x1 + 1, batch_size=4, out=str(path))
    with pytest.raises(errors.InputError, match=r"options \(computation differ"):
        ntbridge.ntk(nn.Sequential(MODEL, nn.Tanh()), x1, batch_size=4, out=str(path))
    foreign = tmp_path / "foreign.npy"
    np.save(foreign, np.zeros((13, 13), np.float32))
    with pytest.raises(errors.InputError, match="no tile record"):
        ntbridge.ntk(MODEL, x1, out=str(foreign))


TINY = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))


@pytest.fixture
def no_compiling(monkeypatch):
    """Any compilation fails the test: a refusal must come from shapes alone, before it."""
    def compile(*args, **kwargs):
        raise AssertionError("a program was compiled before the refusal")
    monkeypatch.setattr(ntbridge.programs, "compile", compile)


def test_a_kernel_beyond_memory_is_refused_in_seconds_from_shapes(no_compiling):
    """N = 1e7 with x2 = None (a 364 TiB kernel): refused before compiling or copying anything,
    in a time that does not grow with N; the message gives the size, the free memory and what to
    do."""
    x = torch.ones(1, 4).expand(10_000_000, 4)  # ten million examples in 16 bytes
    start = time.perf_counter()
    with pytest.raises(errors.MemoryBudgetError) as info:
        ntbridge.ntk(TINY, x)
    assert time.perf_counter() - start < 3
    message = str(info.value)
    assert "10000000 x 10000000 float32: at least 372,529.03 GiB" in message
    assert "free memory" in message and "out='kernel.npy'" in message
    assert "fewer examples" in message


def test_a_kernel_file_beyond_the_disk_is_refused_in_seconds_leaving_nothing(tmp_path,
                                                                             no_compiling):
    """A 33 TB kernel asked for with out=: refused from shapes against the free disk, with no file
    (not even a stub or its record) left behind."""
    x = torch.ones(1, 4).expand(2_900_000, 4)
    start = time.perf_counter()
    with pytest.raises(errors.MemoryBudgetError,
                       match=r"needs at least 31,329.69 GiB more on that disk, which has"):
        ntbridge.ntk(TINY, x, out=str(tmp_path / "k.npy"))
    assert time.perf_counter() - start < 3
    assert os.listdir(tmp_path) == []


def test_out_is_checked_against_the_free_disk(data, tmp_path, monkeypatch):
    """A kernel file larger than the free disk (here 100 bytes free) is refused before it is
    created; an earlier run's file of the request holds its space already and resumes."""
    x1, _ = data
    free = lambda directory: types.SimpleNamespace(total=10**12, used=10**12 - 100, free=100)
    path = tmp_path / "k.npy"
    with monkeypatch.context() as m:
        m.setattr(shutil, "disk_usage", free)
        with pytest.raises(errors.MemoryBudgetError,
                           match=r"out='.*k.npy': the result \(a kernel of 13 x 13 float32"):
            ntbridge.ntk(MODEL, x1, batch_size=4, out=str(path))
    assert os.listdir(tmp_path) == []
    k = ntbridge.ntk(MODEL, x1, batch_size=4, out=str(path))
    monkeypatch.setattr(shutil, "disk_usage", free)
    assert torch.equal(ntbridge.ntk(MODEL, x1, batch_size=4, out=str(path)), k)


def test_the_result_is_checked_again_at_its_exact_size(data, monkeypatch):
    """Outputs of several entries per pair (an empirical NTK of 3 outputs, trace_axes=(): 3 x 3)
    are checked at their exact size once the first program says what it is; 2 KiB usable fits
    the least size (13 x 13 float32, 676 bytes), not the exact one (6,084 bytes)."""
    x1, _ = data
    monkeypatch.setattr(ntbridge.tiling.plan, "free_bytes", lambda device: 2560)
    with pytest.raises(errors.MemoryBudgetError, match=r"the result \(a kernel of 13 x 13 x 3 x 3 "
                                                       r"float32: 0.00 GiB\) does not fit"):
        ntbridge.empirical_ntk(MODEL, x1, trace_axes=())


def test_bad_batching_options(data):
    x1, _ = data
    for kwargs, match in [({"batch_size": -1}, "batch_size must be >= 0"),
                          ({"batch_size": 2.5}, "batch_size must be an int"),
                          ({"device_count": 0}, "device_count must be"),
                          ({"device_count": 64}, "only 4 local cpu devices"),
                          ({"out": "kernel.txt"}, "out must be a path ending in .npy")]:
        with pytest.raises(errors.InputError, match=match):
            ntbridge.ntk(MODEL, x1, **kwargs)


WORKER = os.path.join(os.path.dirname(__file__), "distributed_worker.py")


def _worker(args, env=None, **kw):
    return subprocess.Popen([sys.executable, WORKER, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}, **kw)


@pytest.mark.slow
def test_killed_run_resumes_with_only_the_missing_tiles(tmp_path):
    sys.path.insert(0, os.path.dirname(__file__))
    from distributed_worker import problem
    path, record = tmp_path / "k.npy", tmp_path / "k.npy.tiles.json"
    n = 60  # tiles of 2: 30 x 31 / 2 with x2 = x1, enough that the worker is killed midway
    env = {"WORKER_N": str(n)}
    proc = _worker([str(tmp_path / "unused"), "--kernel-file", str(path), "--batch-size", "2"], env)
    deadline = time.time() + 120
    done = []
    while time.time() < deadline and len(done) < 20:
        time.sleep(0.05)
        try:
            done = json.loads(record.read_text())["done"]
        except (OSError, ValueError, KeyError):
            pass
    proc.kill()
    proc.wait()
    done = json.loads(record.read_text())["done"]
    total = (n // 2) * (n // 2 + 1) // 2
    assert 20 <= len(done) < total, "the worker must be killed midway"

    os.environ["WORKER_N"] = str(n)
    try:
        model, x = problem()
    finally:
        del os.environ["WORKER_N"]
    resumed, info = ntbridge.ntk(model, x, batch_size=2, out=str(path), return_info=True)
    assert (info.tiles, info.computed) == (total, total - len(done))
    torch.testing.assert_close(resumed, ntbridge.ntk(model, x), rtol=2e-6, atol=1e-7)
    assert torch.equal(resumed, resumed.T)


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_assemble_the_full_kernel(tmp_path):
    sys.path.insert(0, os.path.dirname(__file__))
    from distributed_worker import problem
    port = str(_free_port())
    procs = [_worker([str(tmp_path / "k"), "--process", str(i), "--port", port]) for i in (0, 1)]
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-3000:]
    model, x = problem()
    expected = ntbridge.ntk(model, x, batch_size=3).numpy()
    for i in (0, 1):
        np.testing.assert_allclose(np.load(tmp_path / f"k-{i}.npy"), expected, rtol=2e-6, atol=1e-7)


@pytest.mark.slow
def test_a_dead_process_makes_the_other_fail_clearly(tmp_path):
    """Process 1 dies after joining. Process 0 fails, bounded in time, with either ntbridge's
    ProcessError (its wait for the peer's tiles times out) or, if JAX's heartbeat check notices
    first (2 s without heartbeats, see distributed_worker.py), JAX's own termination saying that
    another task died: never a hang. (With JAX 0.10, process 0 waits for process 1's devices as
    its backend starts, so the heartbeat check ends it.)"""
    port = str(_free_port())
    env = {"NTBRIDGE_PEER_TIMEOUT": "5"}
    start = time.time()
    procs = [_worker([str(tmp_path / "k"), "--process", str(i), "--port", port, "--die"], env)
             for i in (0, 1)]
    results = [p.communicate(timeout=120) for p in procs]
    assert procs[1].returncode == 3
    assert procs[0].returncode != 0
    err = results[0][1]
    assert ("ProcessError" in err and "did not deliver its tiles" in err) or "another task died" in err
    assert time.time() - start < 60


@pytest.mark.slow
def test_memory_planner_refuses_a_tile_that_cannot_fit(tmp_path):
    """Global average pooling keeps every pair of positions: on 256 x 256 images one pair of
    examples needs (256^2)^2 floats per array, beyond any CPU's free memory: refused from XLA's
    memory analysis, before allocating, even with the result going to disk."""
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(4, 1))
    x = torch.randn(2, 1, 256, 256)
    start = time.perf_counter()
    with pytest.raises(errors.MemoryBudgetError, match="one tile of 1 x 1 examples needs"):
        ntbridge.ntk(model, x, out=str(tmp_path / "k.npy"))
    assert time.perf_counter() - start < 60


@pytest.mark.slow
@pytest.mark.parametrize("batch_size,device_count", [(3, 1), (5, 2), (4, 4)])
def test_empirical_and_monte_carlo_batching_invariance(data, batch_size, device_count):
    # float64: different tile shapes change XLA's summation order, so compare at float64 rounding
    model, (x1, x2) = copy.deepcopy(MODEL).double(), (x.double() for x in data)
    tiles = dict(batch_size=batch_size, device_count=device_count)
    jacobian_ntk = functools.partial(ntbridge.empirical_ntk, implementation="jacobian")
    for fn in (jacobian_ntk, ntbridge.empirical_nngp):
        ref = fn(model, x1, x2, trace_axes=())
        torch.testing.assert_close(fn(model, x1, x2, trace_axes=(), **tiles), ref,
                                   rtol=1e-10, atol=1e-12 * ref.abs().max().item())
        sym = fn(model, x1, **tiles)
        assert torch.equal(sym, sym.T)
    mc = ntbridge.monte_carlo(model, x1, x2, n_samples=2, get="nngp")
    torch.testing.assert_close(ntbridge.monte_carlo(model, x1, x2, n_samples=2, get="nngp",
                                                    **tiles).mean, mc.mean, rtol=1e-10,
                               atol=1e-12 * mc.mean.abs().max().item())


def test_cpu_compiler_options_keep_convolutions_off_ynnpack(monkeypatch):
    """On CPUs the programs are compiled with ntbridge's XLA options (convolutions stay XLA's own;
    machine code in one module per core; each kind of program with its own on top); an XLA that
    rejects them compiles without options, and remembers it; other platforms get none."""
    import jax

    from ntbridge import programs
    monkeypatch.setenv("NTBRIDGE_CACHE_DIR", "off")
    conv = jax.jit(lambda x, w: jax.lax.conv_general_dilated(
        x, w, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")))
    x, w = jax.numpy.ones((2, 8, 8, 32)), jax.numpy.ones((3, 3, 32, 32))
    cpu = jax.devices("cpu")[:1]
    assert devices.compiler_options("cpu") == devices.CPU_COMPILER_OPTIONS
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    split = devices.CPU_COMPILER_OPTIONS["xla_cpu_parallel_codegen_split_count"]
    assert split == str(min(cores, 32))
    key = programs.ProgramKey.of("test", "a convolution", (x, w), cpu)
    lower = lambda: conv.lower(x, w)
    assert "ynn_fusion" not in programs.compile(key, lower, cpu).as_text()
    for kind, options in devices.PROGRAM_OPTIONS.items():
        assert devices.compiler_options("cpu", kind) == {**devices.CPU_COMPILER_OPTIONS, **options}
        np.testing.assert_array_equal(programs.compile(key, lower, cpu, kind)(x, w), conv(x, w))
    assert devices.compiler_options("cpu") == devices.CPU_COMPILER_OPTIONS  # XLA took them all
    assert devices.compiler_options("gpu") == {} == devices.compiler_options("gpu", "vector")
    monkeypatch.setattr(devices, "CPU_COMPILER_OPTIONS", {"xla_cpu_no_such_option": "1"})
    monkeypatch.setattr(devices, "_REJECTED", set())  # restored untouched afterwards
    assert devices.compiler_options("cpu") == {"xla_cpu_no_such_option": "1"}
    compiled = programs.compile(key, lower, cpu)
    np.testing.assert_array_equal(compiled(x, w), conv(x, w))
    assert devices.compiler_options("cpu") == {}


@pytest.mark.parametrize("small_work", [0, devices.SMALL_WORK])
def test_analytic_programs_take_the_options_of_their_kind(monkeypatch, small_work):
    """The programs of analytic kernels of vectors (FC) and of same-position covariances (a Flatten
    head) are compiled with the options of their kind; those holding every pair of positions
    (global pooling) with the defaults; a small tile's, whatever its kind, with the "small"
    options (as these, 5 x 5 examples of at most 192 elements)."""
    from ntbridge import programs
    monkeypatch.setenv("NTBRIDGE_CACHE_DIR", "off")
    monkeypatch.setattr(devices, "SMALL_WORK", small_work)
    kinds = []
    monkeypatch.setattr(programs, "compiler_options", lambda platform, kind="default": (
        kinds.append(kind) or devices.compiler_options(platform, kind)))
    conv = [nn.Conv2d(3, 4, 3), nn.ReLU()]
    cases = [((nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1)), (5, 3), "vector"),
             ((*conv, nn.Flatten(), nn.Linear(4 * 6 * 6, 1)), (5, 3, 8, 8), "diagonal"),
             ((*conv, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 1)), (5, 3, 8, 8),
              "default")]
    for layers, shape, kind in cases:
        kinds.clear()
        programs.clear()  # compiled afresh, not found among the programs of earlier tests
        ntbridge.kernel(nn.Sequential(*layers), torch.randn(shape), None)
        assert kinds == [kind if small_work == 0 else "small"]
