"""predict's iterative solvers (solver="cg"): conjugate gradients and Lanczos against the dense
solves on NNGP/NTK kernels, to bounds derived from the stated tolerance; kernels on disk; memory
(no operation on the kernel larger than a block of rows); array-valued times; errors."""

import math

import pytest
import torch

import ntbridge
from ntbridge import errors, predict
from ntbridge.predict import cg
from ntbridge.predict.operator import KernelOperator
from helpers import mlp

N, M = 1000, 50


@pytest.fixture(scope="module")
def data():
    """Joint NNGP and NTK (float64) of a ReLU MLP over N train + M test points in 6 dimensions
    (low-dimensional inputs: the kernels are badly conditioned), and smooth targets."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N + M, 6, generator=g, dtype=torch.float64)
    model = mlp(6, [256, 256], 1).double()
    k = ntbridge.kernel(model, x, get=("nngp", "ntk"))
    y = torch.stack([torch.sin(x[:N, :3].sum(1)), torch.cos(x[:N, 3])], 1)
    return x, model, k.nngp, k.ntk, y


def bound(k_test_train, k_reg, tol, b):
    """``|K* (x - x*)|`` per column is at most ``|K*|_2 |A^-1|_2 |r|`` with the residual
    ``|r| <= tol |b|`` per column: the bound CG's stopping rule gives (plus the dense solve's own
    rounding, ``cond(A) eps``, far smaller in float64)."""
    smallest = torch.linalg.eigvalsh(k_reg)[0]
    return torch.linalg.matrix_norm(k_test_train, 2) / smallest * tol * b.norm(dim=0)


def test_cg_gp_inference_matches_cholesky_within_its_tolerance(data):
    _, _, nngp, _, y = data
    ktt, kst, kss = nngp[:N, :N], nngp[N:, :N], nngp[N:, N:]
    tol = 1e-10
    dense = predict.gp_inference(ktt, y, kst, kss, diag_reg=1e-3)
    pred = predict.gp_inference(ktt, y, kst, kss, diag_reg=1e-3, solver="cg", tol=tol)
    k_reg = ktt + 1e-3 * ktt.diagonal().mean() * torch.eye(N, dtype=ktt.dtype)
    assert torch.all((pred.mean - dense.mean).norm(dim=0) <= bound(kst, k_reg, tol, y))
    cov_bound = bound(kst, k_reg, tol, kst.T)
    assert torch.all((pred.covariance - dense.covariance).norm(dim=0) <= cov_bound)
    assert torch.equal(pred.covariance, pred.covariance.T)
    # the bound is not vacuous: it is small against the values
    assert bound(kst, k_reg, tol, y).max() < 1e-3 * dense.mean.norm(dim=0).min()


def test_cg_residual_is_the_true_one_and_the_preconditioner_cuts_iterations(data):
    _, _, nngp, _, y = data
    k = nngp[:N, :N]
    shift = 1e-4 * k.diagonal().mean().item()
    steps = {}
    for rank in (0, 100):
        x, info = cg.solve(k, y, shift=shift, tol=1e-8, preconditioner_rank=rank)
        true = (y - (k @ x + shift * x)).norm(dim=0) / y.norm(dim=0)
        assert torch.all(true <= 1e-8) and torch.allclose(info.residual, true, rtol=1e-3)
        assert info.rank == rank
        steps[rank] = info.iterations
    assert steps[100] < steps[0] / 2, steps


def test_float32_kernels_are_solved_in_float64_to_any_tolerance(data):
    _, _, nngp, _, y = data
    k, b = nngp[:N, :N].float(), y.float()
    shift = 1e-3 * k.diagonal().double().mean().item()
    x, info = cg.solve(k, b, shift=shift, tol=1e-9)
    assert x.dtype == torch.float64
    exact = k.double() + shift * torch.eye(N, dtype=torch.float64)  # the float32 entries, exactly
    assert torch.all((b.double() - exact @ x).norm(dim=0) / b.double().norm(dim=0) <= 1e-9)


class Watched(torch.Tensor):
    """A tensor that records the size of every tensor that an operation on it makes (views too)."""

    largest = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        out = super().__torch_function__(func, types, args, kwargs or {})
        for o in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(o, torch.Tensor):
                Watched.largest = max(Watched.largest, o.numel())
        if isinstance(out, Watched):
            return out.as_subclass(torch.Tensor)
        return out


def test_kernel_on_disk_is_read_in_row_blocks(data, tmp_path):
    x, model, nngp, _, y = data
    on_disk = ntbridge.nngp(model, x[:N], out=tmp_path / "k.npy")
    dense = predict.gp_inference(nngp[:N, :N], y, nngp[N:, :N], diag_reg=1e-3)
    pred = predict.gp_inference(on_disk, y, nngp[N:, :N], diag_reg=1e-3, solver="cg", tol=1e-8)
    k_reg = nngp[:N, :N] + 1e-3 * nngp[:N, :N].diagonal().mean() * torch.eye(N, dtype=y.dtype)
    assert torch.all((pred.mean - dense.mean).norm(dim=0) <= bound(nngp[N:, :N], k_reg, 1e-8, y))
    # memory: the solver never makes anything of the kernel larger than a block of rows
    watched = on_disk.as_subclass(Watched)
    Watched.largest = 0
    rows = 64
    a = KernelOperator(watched, 0.1, block_rows=rows)
    _, info = cg.iterate(a, y.double(), cg.Preconditioner(a, 20), 1e-6, 1000)
    assert Watched.largest <= rows * N
    assert a.blocks_read == info.products * math.ceil(N / rows)


def test_array_valued_times_against_the_eigendecomposition(data):
    _, _, nngp, ntk, y = data
    t = [[0.0, 10.0], [1000.0, math.inf]]
    k_train, k_cross = nngp[:N, :N], nngp[N:, :N]
    blocks = dict(nngp_train_train=k_train, nngp_test_train=k_cross, nngp_test_test=nngp[N:, N:])
    lr = 1 / ntk[:N, :N].diagonal().sum().item()  # below 2 / lambda_max
    args = (ntk[:N, :N], y, ntk[N:, :N], t)
    dense = predict.gradient_descent_mse_ensemble(*args, learning_rate=lr, diag_reg=1e-3,
                                                  **blocks)
    tol = 1e-10
    fast = predict.gradient_descent_mse_ensemble(*args, learning_rate=lr, diag_reg=1e-3, **blocks,
                                                 solver="cg", tol=tol)
    assert dense.mean.shape == fast.mean.shape == (2, 2, M, 2)
    assert dense.covariance.shape == fast.covariance.shape == (2, 2, M, M)
    assert torch.equal(fast.mean[0, 0], torch.zeros(M, 2, dtype=y.dtype))
    # finite times: the Lanczos estimate's change is an estimate of its error, not a bound; the
    # process converges about linearly, so 1e3 * tol of the values' scale is a wide margin
    for i, j in ((0, 1), (1, 0)):
        scale = dense.mean[i, j].abs().max()
        assert (fast.mean[i, j] - dense.mean[i, j]).abs().max() <= 1e3 * tol * scale
        scale = dense.covariance[i, j].abs().max()
        assert (fast.covariance[i, j] - dense.covariance[i, j]).abs().max() <= 1e3 * tol * scale
    # t = inf: the bound of the solve (the eigendecomposition's rounding is far below it)
    a = ntk[:N, :N] + 1e-3 * ntk[:N, :N].diagonal().mean() * torch.eye(N, dtype=y.dtype)
    assert torch.all((fast.mean[1, 1] - dense.mean[1, 1]).norm(dim=0)
                     <= bound(ntk[N:, :N], a, tol, y))
    # covariance: P = K_ntk* A^-1 solved column by column to tol, so |dP|_F <= delta below, and
    # |d cov|_F <= 2 delta (|K|_2 |P|_2 + |K*|_2) + delta^2 |K|_2
    p = torch.linalg.solve(a, ntk[N:, :N].T).T
    delta = tol * torch.linalg.matrix_norm(ntk[N:, :N]) / torch.linalg.eigvalsh(a)[0]
    two = (lambda m: torch.linalg.matrix_norm(m, 2))
    cov_bound = 2 * delta * (two(k_train) * two(p) + two(k_cross)) + delta ** 2 * two(k_train)
    assert torch.linalg.matrix_norm(fast.covariance[1, 1] - dense.covariance[1, 1]) <= cov_bound
    # a number t keeps the shapes of before
    one = predict.gradient_descent_mse_ensemble(ntk[:N, :N], y, ntk[N:, :N], 10.0,
                                                learning_rate=lr, diag_reg=1e-3)
    assert one.mean.shape == (M, 2) and torch.allclose(one.mean, dense.mean[0, 1], rtol=0,
                                                       atol=1e-12)


def test_not_converging_raises_with_the_residual(data):
    _, _, nngp, ntk, y = data
    with pytest.raises(errors.ConvergenceError, match="max_iter = 3") as caught:
        predict.gp_inference(nngp[:N, :N], y, nngp[N:, :N], diag_reg=1e-6, solver="cg",
                             tol=1e-12, max_iter=3, preconditioner_rank=0)
    assert caught.value.residual > 1e-12 and caught.value.iterations == 3
    assert "diag_reg" in str(caught.value) and "solver='cholesky'" in str(caught.value)
    assert "solver='eigh'" in str(caught.value)  # the ensemble's dense solver, named too
    with pytest.raises(errors.ConvergenceError, match="Lanczos"):
        predict.gradient_descent_mse_ensemble(ntk[:N, :N], y, ntk[N:, :N], 1e6, solver="cg",
                                              tol=1e-10, max_iter=10, diag_reg=1e-6,
                                              learning_rate=1 / ntk[:N, :N].diagonal().sum().item())


@pytest.mark.parametrize("kwargs, match", [
    (dict(solver="qr"), "solver must be 'cholesky' or 'cg'"),
    (dict(solver="cg", tol=0.0), "tol must be in"),
    (dict(solver="cg", tol=-1e-3), "tol must be in"),
    (dict(solver="cg", max_iter=0), "max_iter must be"),
    (dict(solver="cg", preconditioner_rank=-1), "preconditioner_rank must be"),
    (dict(tol=1e-6), "tol applies to solver='cg' only"),
    (dict(max_iter=10, preconditioner_rank=5), "max_iter, preconditioner_rank apply to"),
    (dict(solver="cg", diag_reg=-1.0), "diag_reg must be >= 0"),
])
def test_bad_arguments(kwargs, match):
    k = torch.eye(4, dtype=torch.float64)
    with pytest.raises(errors.InputError, match=match):
        predict.gp_inference(k, torch.ones(4, 1), k[:2], **kwargs)


def test_bad_kernels_and_the_ensemble_solver_names():
    k, y = torch.eye(4, dtype=torch.float64), torch.ones(4, 1)
    with pytest.raises(errors.InputError, match="dense solver is 'eigh'"):
        predict.gradient_descent_mse_ensemble(k, y, k[:2], solver="cholesky")
    with pytest.raises(errors.InputError, match="not positive definite"):
        predict.gp_inference(-k, y, k[:2], solver="cg")
    nan = k.clone()
    nan[1, 2] = float("nan")
    with pytest.raises(errors.InputError, match="non-finite"):
        predict.gp_inference(nan, y, k[:2], solver="cg", preconditioner_rank=0)
    with pytest.raises(errors.InputError, match="t must be >= 0"):
        predict.gradient_descent_mse_ensemble(k, y, k[:2], [1.0, -1.0], solver="cg")


def test_pivoted_cholesky_is_exact_at_full_rank():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(30, 40, generator=g, dtype=torch.float64)
    k = a @ a.T
    factor = cg.pivoted_cholesky(KernelOperator(k), 30)
    assert torch.allclose(factor @ factor.T, k, atol=1e-10 * k.abs().max())
    low = cg.pivoted_cholesky(KernelOperator(a[:, :5] @ a[:, :5].T), 30)
    assert low.shape == (30, 5)  # stops once the rest of the diagonal is zero
