"""predict against direct numpy/scipy computations; testing's report."""

import math

import numpy as np
import pytest
import scipy.linalg
import torch

from ntbridge import errors, predict
from ntbridge.testing import assert_kernels_close, compare_kernels


def psd(n, m, seed):
    """A joint PSD kernel over n train + m test points (float64 torch), split into blocks."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(n + m, n + m + 3))
    k = a @ a.T / a.shape[1]
    t = torch.from_numpy(k)
    return t[:n, :n], t[n:, :n], t[n:, n:], t


def test_gp_inference_matches_numpy():
    ktt, kst, kss, _ = psd(8, 3, 0)
    y = torch.from_numpy(np.random.default_rng(1).normal(size=(8, 2)))
    pred = predict.gp_inference(ktt, y, kst, kss, diag_reg=1e-3)
    reg = ktt.numpy() + 1e-3 * np.mean(np.diag(ktt.numpy())) * np.eye(8)
    np.testing.assert_allclose(pred.mean.numpy(), kst.numpy() @ np.linalg.solve(reg, y.numpy()),
                               rtol=1e-10)
    cov = kss.numpy() - kst.numpy() @ np.linalg.solve(reg, kst.numpy().T)
    np.testing.assert_allclose(pred.covariance.numpy(), cov, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("t", [0.0, 0.3, 2.0, math.inf])
def test_gradient_descent_ensemble_matches_expm_and_linear_gaussian_algebra(t):
    ntt, nst, _, _ = psd(7, 3, 2)
    ktt, kst, kss, joint = psd(7, 3, 3)
    y = torch.from_numpy(np.random.default_rng(4).normal(size=(7, 1)))
    pred = predict.gradient_descent_mse_ensemble(ntt, y, nst, t, nngp_train_train=ktt,
                                                 nngp_test_train=kst, nngp_test_test=kss, learning_rate=0.7)
    theta = ntt.numpy()
    if t == math.inf:
        p = nst.numpy() @ np.linalg.inv(theta)
    else:
        p = nst.numpy() @ np.linalg.solve(theta, np.eye(7) - scipy.linalg.expm(-0.7 * t * theta))
    np.testing.assert_allclose(pred.mean.numpy(), p @ y.numpy(), rtol=1e-8, atol=1e-12)
    # f_t(x*) = f_0(x*) - P (f_0(X) - y): a linear map of the joint Gaussian prior f_0 ~ N(0, joint)
    lin = np.concatenate([-p, np.eye(3)], axis=1)
    np.testing.assert_allclose(pred.covariance.numpy(), lin @ joint.numpy() @ lin.T, rtol=1e-7,
                               atol=1e-10)


def test_infinite_time_is_kernel_regression_and_needs_a_regular_kernel():
    ntt, nst, _, _ = psd(6, 2, 5)
    y = torch.arange(6.0, dtype=torch.float64)[:, None]
    pred = predict.gradient_descent_mse_ensemble(ntt, y, nst)
    np.testing.assert_allclose(pred.mean.numpy(), nst.numpy() @ np.linalg.solve(ntt.numpy(), y.numpy()),
                               rtol=1e-8)
    singular = torch.ones(3, 3, dtype=torch.float64)
    with pytest.raises(errors.InputError, match="diag_reg"):
        predict.gradient_descent_mse_ensemble(singular, torch.ones(3, 1), torch.ones(1, 3))
    with pytest.raises(errors.InputError, match="y_train has 4 rows"):
        predict.gp_inference(ntt[:3, :3], torch.ones(4, 1), nst[:, :3])


def blocks(k: torch.Tensor, n: int):
    """The train-train, test-train and test-test blocks of a joint kernel symmetrized (gradcheck
    perturbs entries one at a time; the solvers read one triangle)."""
    k = (k + k.T) / 2
    return k[:n, :n], k[n:, :n], k[n:, n:]


@pytest.mark.parametrize("t", [0.7, math.inf])
def test_predictions_differentiate_in_the_kernels_and_the_targets(t):
    """Torch code only (no numpy, no detach): gradcheck w.r.t. every kernel and the targets."""
    *_, nngp = psd(5, 3, 0)
    *_, ntk = psd(5, 3, 1)
    y = torch.from_numpy(np.random.default_rng(2).normal(size=(5, 2)))
    nngp, ntk, y = (a.clone().requires_grad_() for a in (nngp, ntk, y))

    def gp(k, y):
        ktt, kst, kss = blocks(k, 5)
        return predict.gp_inference(ktt, y, kst, kss, diag_reg=1e-3)

    def ensemble(ntk, nngp, y):
        (ttt, tst, _), (ktt, kst, kss) = blocks(ntk, 5), blocks(nngp, 5)
        return predict.gradient_descent_mse_ensemble(
            ttt, y, tst, t, nngp_train_train=ktt, nngp_test_train=kst, nngp_test_test=kss,
            learning_rate=0.5, diag_reg=1e-3)

    assert torch.autograd.gradcheck(gp, (nngp, y))
    assert torch.autograd.gradcheck(ensemble, (ntk, nngp, y))


def test_assert_kernels_close_reports_the_worst_entry():
    a = torch.eye(3)
    b = a.clone()
    b[1, 2] = 0.5
    assert_kernels_close(a, a.clone())
    with pytest.raises(AssertionError, match=r"worst entry \(1, 2\): actual 0, expected 0.5"):
        assert_kernels_close(a, b, rtol=1e-3)
    report = compare_kernels(a, b)
    assert not report.close and report.max_abs_error == 0.5
    assert report.rel_frobenius_error == pytest.approx(0.5 / math.sqrt(3.25))
    nan = a.clone()
    nan[0, 0] = float("nan")
    assert not compare_kernels(nan, a).close


def test_neural_tangents_names_defaults_and_the_old_spellings():
    """learning_rate, t=None (infinite time) and fx_train_0/fx_test_0 everywhere; lr=, f_train_0=
    and f_test_0= still work for one release, with a DeprecationWarning."""
    ntt, nst, _, _ = psd(5, 2, 6)
    y = torch.from_numpy(np.random.default_rng(7).normal(size=(5, 2)))
    f0, fs0 = y.flip(0), y[:2] + 1
    infinite = predict.gradient_descent_mse_ensemble(ntt, y, nst, math.inf)
    assert torch.equal(predict.gradient_descent_mse_ensemble(ntt, y, nst).mean, infinite.mean)
    new = predict.gradient_descent_mse_ensemble(ntt, y, nst, 0.5, learning_rate=0.3)
    with pytest.deprecated_call(match="lr= is deprecated.*pass learning_rate="):
        old = predict.gradient_descent_mse_ensemble(ntt, y, nst, 0.5, lr=0.3)
    assert torch.equal(old.mean, new.mean)
    with pytest.raises(TypeError, match="pass learning_rate only"):
        predict.gradient_descent_mse_ensemble(ntt, y, nst, lr=0.3, learning_rate=0.3)
    for solve in (predict.gradient_descent_mse,
                  lambda *a, **kw: predict.gradient_descent(predict.mse, *a, **kw)):
        new = solve(ntt, y, k_test_train=nst, fx_train_0=f0, fx_test_0=fs0)  # t=None: inf
        assert torch.equal(new.test, solve(ntt, y, 1.0, math.inf, k_test_train=nst,
                                           fx_train_0=f0, fx_test_0=fs0).test)
        with pytest.deprecated_call(match="f_(train|test)_0= is deprecated") as caught:
            old = solve(ntt, y, 0.5, 2.0, k_test_train=nst, f_train_0=f0, f_test_0=fs0)
        assert len(caught) == 2
        assert torch.equal(old.test, solve(ntt, y, 0.5, 2.0, k_test_train=nst, fx_train_0=f0,
                                           fx_test_0=fs0).test)
    with pytest.raises(errors.InputError, match=r"t=inf \(or None, the default\) needs"):
        predict.gradient_descent(lambda f, y: ((f - y) ** 4).sum(), ntt, y)


def test_kernels_that_are_not_positive_definite_name_diag_reg():
    ntt, nst, _, _ = psd(4, 2, 8)
    y = torch.ones(4, 1, dtype=torch.float64)
    indefinite = ntt - 2 * torch.linalg.eigvalsh(ntt)[1] * torch.eye(4, dtype=torch.float64)
    with pytest.raises(errors.InputError, match=r"not positive definite \(its leading minor of "
                                                r"order \d is not\); pass diag_reg > 0"):
        predict.gp_inference(indefinite, y, nst)
    for t in (1.0, None):
        with pytest.raises(errors.InputError, match="ntk_train_train is not positive semi-definite"):
            predict.gradient_descent_mse_ensemble(indefinite, y, nst, t)
    singular = torch.ones(4, 4, dtype=torch.float64)
    with pytest.raises(errors.InputError, match="not positive definite.*diag_reg > 0"):
        predict.gp_inference(singular, y, nst)
    assert torch.isfinite(predict.gp_inference(singular, y, nst, diag_reg=1e-6).mean).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_kernels_are_computed_in_float32(dtype):
    """As ntbridge's kernel functions treat float16/bfloat16 inputs: float32 arithmetic and
    results, equal to float64 arithmetic on the same (rounded) entries to float32 accuracy."""
    ntt, nst, kss, _ = (k.to(dtype) for k in psd(6, 2, 9))
    y = torch.from_numpy(np.random.default_rng(10).normal(size=(6, 1))).to(dtype)
    as64 = [k.double() for k in (ntt, nst, kss, y)]
    calls = (lambda k, ks, kk, y: predict.gp_inference(k, y, ks, kk, diag_reg=1e-2),
             lambda k, ks, kk, y: predict.gradient_descent_mse_ensemble(
                 k, y, ks, 3.0, nngp_train_train=k, nngp_test_train=ks, nngp_test_test=kk),
             lambda k, ks, kk, y: predict.gradient_descent_mse(k, y, 0.5, steps=4, k_test_train=ks),
             lambda k, ks, kk, y: (predict.gradient_descent(
                 lambda f, y: ((f - y) ** 4).sum(), k, y, 0.5, 1.0, k_test_train=ks).test,))
    for call in calls:
        for got, expected in zip(call(ntt, nst, kss, y), call(*as64)):
            assert got.dtype == torch.float32
            torch.testing.assert_close(got, expected.float(), rtol=1e-4, atol=1e-5)
    assert predict.max_learning_rate(ntt) == pytest.approx(predict.max_learning_rate(as64[0]),
                                                           rel=1e-6)
