"""Numerical robustness: degenerate and extreme inputs, deep networks, float32 and float64, and the
continuity of ReLU-family kernels; kernel calls from several threads at once."""

import copy
import math
import threading

import pytest
import torch
from torch import nn

import ntbridge
from helpers import mlp

DTYPES = [torch.float32, torch.float64]


def inputs(n=4, d=3, dtype=torch.float64, seed=0):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def assert_sane(k: torch.Tensor, symmetric: bool = True):
    """Finite; with x2 = x1 exactly symmetric and PSD (eigenvalues >= -1e-5 * largest)."""
    assert torch.isfinite(k).all()
    if symmetric:
        assert torch.equal(k, k.T)
        eig = torch.linalg.eigvalsh(k.double())
        assert eig[0] >= -1e-5 * eig[-1].abs()


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
def test_identical_and_nearly_identical_inputs(dtype):
    model = mlp(3, [16, 16], 1)
    x = inputs(dtype=dtype)
    x = torch.cat([x, x[:2], x[:2] + 1e-7 * torch.ones_like(x[:2])])  # repeated and nearly so
    analytic = lambda *xs: tuple(ntbridge.kernel(model, *xs))  # the NTK and the NNGP in one call
    empirical = lambda *xs: (ntbridge.empirical_ntk(model.to(dtype), *xs),)
    for fn in (analytic, empirical):
        for k, again in zip(fn(x), fn(x, x.clone())):
            assert_sane(k)
            # an example with itself, its copy and a 1e-7 neighbour: equal up to rounding, O(1e-7)
            torch.testing.assert_close(k[4:6, 4:6], k[:2, :2], rtol=0, atol=0)
            torch.testing.assert_close(k[6:, 6:], k[:2, :2], rtol=1e-5, atol=0)
            torch.testing.assert_close(again, k, rtol=1e-5, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False])
def test_zero_inputs(dtype, bias):
    model = mlp(3, [16, 16], 1, bias=bias).to(dtype)
    x = torch.cat([torch.zeros(2, 3, dtype=dtype), inputs(2, dtype=dtype)])
    analytic = ntbridge.kernel(model, x)  # the NNGP and the NTK in one call
    for k in (*analytic, ntbridge.empirical_ntk(model, x), ntbridge.empirical_nngp(model, x)):
        assert_sane(k)
        if not bias:  # a bias-free ReLU network maps 0 to 0: its rows of the kernel vanish
            assert (k[:2] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [1e-8, 1e-4, 1e4, 1e8])
def test_input_scales_are_degree_two_homogeneous(dtype, scale):
    """A bias-free ReLU network is positively homogeneous: kernel(s x) = s^2 kernel(x), exactly in
    exact arithmetic; here within a few float roundings per layer."""
    model = mlp(3, [16, 16], 1, bias=False).to(dtype)
    x = inputs(dtype=dtype)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    for fn in (ntbridge.ntk, ntbridge.nngp, ntbridge.empirical_ntk):
        base, scaled = fn(model, x), fn(model, x * scale)
        assert_sane(scaled)
        torch.testing.assert_close(scaled / scale ** 2, base, rtol=tol, atol=tol * base.abs().max().item())


@pytest.mark.slow
@pytest.mark.parametrize("network,dtype", [("mlp", torch.float64), ("cnn", torch.float32)])
def test_deep_mlp_and_deep_cnn(network, dtype):
    """Depth 50 MLP and depth 20 CNN (small widths; compiling them dominates the time, so one
    dtype each): analytic and empirical kernels finite, symmetric, PSD."""
    if network == "mlp":
        model, data = mlp(3, [8] * 50, 1), inputs(5, dtype=dtype)
    else:
        convs = [m for _ in range(20) for m in (nn.Conv1d(2, 2, 3, padding=1), nn.ReLU())]
        model = nn.Sequential(nn.Conv1d(1, 2, 3, padding=1), *convs, nn.Flatten(), nn.Linear(12, 1))
        data = inputs(5, 6, dtype=dtype).reshape(5, 1, 6)
    model = model.to(dtype)
    for k in (*ntbridge.kernel(model, data),
              ntbridge.empirical_ntk(model, data, implementation="jacobian")):
        assert k.dtype == dtype
        assert_sane(k)


def test_a_deeper_network_compiles_a_proportionally_larger_program():
    """Twice the layers, about twice the compiled program (2.16x the multiplications from 8 to 16
    layers): each layer's per-example variances are computed once, not repeated by XLA's fusion
    inside every later layer (2.70x, growing as the depth squared, before)."""
    import jax
    import jax.numpy as jnp

    from ntbridge.stax import Dense, Relu, serial
    from ntbridge.stax.kernel import input_kernel

    def multiplications(depth):
        block = (Dense(4, 4, W_std=1.0, b_std=0.1), Relu())
        net = serial(*[layer for _ in range(depth) for layer in block])
        k = lambda x: net.kernel_fn(input_kernel(x, None, compute_ntk=True, diagonal_spatial=True))
        program = jax.jit(lambda x: k(x).ntk).lower(jnp.ones((3, 4))).compile()
        return program.as_text().count(" multiply(")

    assert multiplications(16) < 2.4 * multiplications(8)


@pytest.mark.parametrize("act", [nn.ReLU, lambda: nn.LeakyReLU(0.1)])
def test_relu_family_kernels_are_continuous_as_x2_tends_to_x1(act):
    """``K(x, x + eps d) -> K(x, x)``, with bounds from the formulas (float64).

    NNGP: ``K(x, y) = <phi(x), phi(y)>``, so by Cauchy-Schwarz ``|K(x, y') - K(x, y)| <=
    sqrt(K(x, x)) ||phi(y') - phi(y)||``; both activations are 1-Lipschitz and each Linear layer
    scales squared feature distances by ``W_std**2`` (torch's init: 1/3; the bias cancels), so
    ``||phi(y') - phi(y)||**2 <= 3**-L ||y' - y||**2 / d`` for L Linear layers on d inputs
    (plus float64 rounding of the kernel, 1e-12 relative).
    NTK: its derivative factor ``(pi - t) / (2 pi)`` is Lipschitz in the angle ``t``, and the angle
    of x and x + eps d is O(eps), at worst sqrt(eps) after layers: 100x smaller steps shrink the
    gap at least 10x.
    """
    model, d, layers = mlp(3, [16, 16], 1, act=act), 3, 3
    x, direction = inputs(3), inputs(1, seed=1)[0]
    gaps = []
    for eps in (1e-1, 1e-3, 1e-5, 1e-7):
        k = ntbridge.kernel(model, torch.cat([x, x + eps * direction]))
        cross, same = k.nngp[:3, 3:].diagonal(), k.nngp[:3, :3].diagonal()
        lipschitz = math.sqrt(3.0 ** -layers * eps ** 2 * direction.square().sum() / d)
        assert ((cross - same).abs() <= same.sqrt() * lipschitz + 1e-12 * same).all()
        gaps.append((k.ntk[:3, 3:].diagonal() - k.ntk[:3, :3].diagonal()).abs().max().item())
    assert all(b <= a / 10 for a, b in zip(gaps[:3], gaps[1:3])), gaps
    assert gaps[-1] <= 1e-6 * k.ntk.diagonal().min().item(), gaps


@pytest.mark.slow
def test_kernel_calls_from_four_threads_match_serial_calls():
    """Analytic and empirical kernels, float32 and float64, from 4 threads at once (fresh models,
    so the threads build the shared compile caches together) equal the serial results."""
    def calls():
        base = mlp(3, [8, 8], 1)
        x = inputs(5, dtype=torch.float32, seed=2)
        wide = copy.deepcopy(base).double()
        return [lambda: ntbridge.ntk(base, x), lambda: ntbridge.nngp(base, x.double(), batch_size=2),
                lambda: ntbridge.empirical_ntk(base, x, batch_size=3, device_count=2),
                lambda: ntbridge.empirical_ntk(wide, x.double(), implementation="auto")]

    torch.manual_seed(7)
    jobs = calls()
    results, errors = [None] * len(jobs), []

    def run(i):
        try:
            results[i] = jobs[i]()
        except Exception as e:  # reported below, with its thread
            errors.append((i, e))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    torch.manual_seed(7)
    serial = [job() for job in calls()]
    for got, expected in zip(results, serial):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
