"""Function-space gradient descent: closed forms against matrix functions, the ODE solver against
the closed form and explicit recursions, stability limits, and bad input."""

import math
import warnings

import numpy as np
import pytest
import scipy.linalg
import torch
import torch.nn.functional as F

from ntbridge import errors, predict
from ntbridge.predict import chebyshev, ode


def kernel(n, m, seed, scale=1.0):
    """A joint PSD kernel over n train + m test points (float64), as (train-train, test-train)."""
    a = torch.from_numpy(np.random.default_rng(seed).normal(size=(n + m, n + m + 2)))
    k = scale * a @ a.T / a.shape[1]
    return k[:n, :n], k[n:, :n]


def targets(n, o, seed):
    return torch.from_numpy(np.random.default_rng(seed).normal(size=(n, o)))


def test_closed_form_is_the_matrix_exponential_and_the_matrix_power():
    k, ks = kernel(6, 3, 0)
    y, f0, fs0 = targets(6, 2, 1), targets(6, 2, 2), targets(3, 2, 3)
    lr, t, steps = 0.3, 2.5, 7
    out = predict.gradient_descent_mse(k, y, lr, t=[0.0, t], k_test_train=ks, fx_train_0=f0,
                                       fx_test_0=fs0)
    K, Ks, r0 = k.numpy(), ks.numpy(), (f0 - y).numpy()
    np.testing.assert_allclose(out.train[0], f0, atol=1e-12)
    np.testing.assert_allclose(out.train[1], y.numpy() + scipy.linalg.expm(-lr * t * K) @ r0, atol=1e-10)
    test = fs0.numpy() - Ks @ np.linalg.solve(K, (np.eye(6) - scipy.linalg.expm(-lr * t * K)) @ r0)
    np.testing.assert_allclose(out.test[1], test, atol=1e-9)
    f, fs = f0.numpy(), fs0.numpy()
    for _ in range(steps):  # the discrete recursion on train and test points
        f, fs = f - lr * K @ (f - y.numpy()), fs - lr * Ks @ (f - y.numpy())
    out = predict.gradient_descent_mse(k, y, lr, steps=steps, k_test_train=ks, fx_train_0=f0,
                                       fx_test_0=fs0)
    np.testing.assert_allclose(out.train, f, atol=1e-10)
    np.testing.assert_allclose(out.test, fs, atol=1e-10)
    limit = predict.gradient_descent_mse(k, y, lr, k_test_train=ks)  # t = inf from zeros
    np.testing.assert_allclose(limit.train, y, atol=1e-9)
    np.testing.assert_allclose(limit.test, Ks @ np.linalg.solve(K, y.numpy()), atol=1e-8)


def test_full_kernel_of_a_per_unit_one_gives_the_same_dynamics():
    k, ks = kernel(5, 2, 4)
    y = targets(5, 3, 5)
    full, full_s = (torch.einsum("ij,ab->ijab", a, torch.eye(3, dtype=a.dtype)) for a in (k, ks))
    per_unit = predict.gradient_descent_mse(k, y, 0.4, t=[0.5, 3.0], k_test_train=ks)
    joint = predict.gradient_descent_mse(full, y, 0.4, t=[0.5, 3.0], k_test_train=full_s)
    torch.testing.assert_close(joint.train, per_unit.train, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(joint.test, per_unit.test, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("full", [False, True])
def test_mse_flow_equals_the_closed_form(full):
    k, ks = kernel(8, 3, 6)
    y, f0 = targets(8, 2, 7), targets(8, 2, 8)
    if full:  # a kernel coupling output units
        mix = torch.tensor([[1.0, 0.3], [0.3, 0.5]], dtype=torch.float64)
        k, ks = (torch.einsum("ij,ab->ijab", a, mix) for a in (k, ks))
    t = torch.tensor([[0.0, 0.7], [4.0, 30.0]])
    own_mse = lambda f, targets: predict.mse(f, targets)  # a loss of one's own: by the solver
    ode = predict.gradient_descent(own_mse, k, y, 0.5, t, k_test_train=ks, fx_train_0=f0,
                                   rtol=1e-11, atol=1e-13)
    exact = predict.gradient_descent_mse(k, y, 0.5, t, k_test_train=ks, fx_train_0=f0)
    assert ode.train.shape == (2, 2, 8, 2) and ode.test.shape == (2, 2, 3, 2)
    torch.testing.assert_close(ode.train, exact.train, rtol=0, atol=1e-8)
    torch.testing.assert_close(ode.test, exact.test, rtol=0, atol=1e-8)


def euler(step_fn, state, dt, t):
    for _ in range(round(t / dt)):
        state = step_fn(state, dt)
    return state


def test_cross_entropy_flow_matches_small_explicit_steps():
    """Euler's method has global error c h + O(h^2): E(h) - E(h/2) estimates the error of E(h/2),
    so the ODE solution (rtol 1e-9) must lie within 1.5 times that distance of E(h/2), and
    Richardson's 2 E(h/2) - E(h) within a few percent of it."""
    k, ks = kernel(6, 2, 9)
    y = F.one_hot(torch.tensor([0, 1, 2, 0, 1, 2]), 3).double()
    ce = lambda f, y: F.cross_entropy(f, y, reduction="sum")
    lr, t = 0.8, 3.0
    ode = predict.gradient_descent(ce, k, y, lr, t, k_test_train=ks, rtol=1e-9, atol=1e-12)

    def step(state, dt):  # train and test outputs, one explicit step of the flow
        f, fs = state
        g = torch.softmax(f, 1) - y  # the gradient of the summed cross-entropy
        return f - dt * lr * k @ g, fs - dt * lr * ks @ g

    zero = (torch.zeros(6, 3, dtype=torch.float64), torch.zeros(2, 3, dtype=torch.float64))
    (coarse, coarse_s), (fine, fine_s) = (euler(step, zero, dt, t) for dt in (1e-2, 5e-3))
    for got, c, f in ((ode.train, coarse, fine), (ode.test, coarse_s, fine_s)):
        gap = (c - f).abs().max()
        assert (got - f).abs().max() <= 1.5 * gap
        assert (got - (2 * f - c)).abs().max() <= 0.05 * gap


def stiff_kernel(n, m, seed):
    """A joint PSD kernel whose train block has a bulk of eigenvalues in about [0.3, 2] and one
    near n (a constant component, as NTKs have): at half the stable learning rate its flow is
    stiff by a factor ~ 50. (train-train, test-train), float64."""
    a = torch.from_numpy(np.random.default_rng(seed).normal(size=(n + m, 4 * (n + m))))
    k = a @ a.T / a.shape[1] + 1.0
    return k[:n, :n], k[n:, :n]


def chebyshev_steps(monkeypatch):
    """The sizes of the Runge-Kutta-Chebyshev steps tried from now on (a list that grows)."""
    sizes, step = [], chebyshev.step
    monkeypatch.setattr(chebyshev, "step", lambda *args: sizes.append(args[4]) or step(*args))
    return sizes


@pytest.mark.parametrize("dtype, rtol", [(torch.float64, 1e-7), (torch.float32, 1e-5)])
def test_own_mse_takes_chebyshev_steps_to_the_closed_form_at_long_times(monkeypatch, dtype, rtol):
    """lr lambda_max = 1 and t up to 1e4: Dormand-Prince alone needs 6 evaluations per 3.3 of
    time there (18,000). The flow is linear and contractive: each step's local error (at most
    rtol |y|) is damped by the later steps rather than added up, so the error stays within a few
    rtol |y| (0.1 in float64, 1.4 in float32 here); asserted within 10 rtol |y|."""
    k, ks = stiff_kernel(20, 4, 30)
    y = targets(20, 2, 31)
    lr, t = 0.5 * predict.max_learning_rate(k), [1e2, 1e3, 1e4]
    evaluations = []
    own_mse = lambda f, targets: evaluations.append(1) or predict.mse(f, targets)
    sizes = chebyshev_steps(monkeypatch)
    out = predict.gradient_descent(own_mse, k.to(dtype), y.to(dtype), lr, t,
                                   k_test_train=ks.to(dtype), rtol=rtol)
    exact = predict.gradient_descent_mse(k, y, lr, t, k_test_train=ks)
    assert out.train.dtype == out.test.dtype == dtype
    for got, want in ((out.train, exact.train), (out.test, exact.test)):
        assert (got.double() - want).abs().max() <= 10 * rtol * want.abs().max()
    assert max(sizes, default=0) > 10 * 3.3  # steps 10x beyond Dormand-Prince's stable ones
    assert len(evaluations) < 0.2 * 6 * t[-1] / 3.3


def test_float32_at_a_tolerance_near_its_rounding_takes_no_chebyshev_steps(monkeypatch):
    """A Chebyshev step's error estimate carries rounding amplified ``h rho`` times; with
    rtol = 1e-7 (float32's eps is 1.2e-7) it would exceed the tolerance, so all steps are
    Dormand-Prince ones, and the outputs meet the closed form to float32's rounding (2e-7 of
    them here, asserted within 1e-5)."""
    k, _ = stiff_kernel(20, 0, 32)
    y = targets(20, 2, 33)
    lr, t = 0.5 * predict.max_learning_rate(k), [30.0, 100.0]
    sizes = chebyshev_steps(monkeypatch)
    own_mse = lambda f, targets: predict.mse(f, targets)
    out = predict.gradient_descent(own_mse, k.float(), y.float(), lr, t)
    assert sizes == []
    exact = predict.gradient_descent_mse(k, y, lr, t).train
    assert (out.train.double() - exact).abs().max() <= 1e-5 * exact.abs().max()


def test_cross_entropy_with_chebyshev_steps_matches_dormand_prince_alone(monkeypatch):
    """The reference: the same flow written out, by Dormand-Prince steps only at rtol 1e-11.
    Without a contraction to damp them (the outputs keep growing), local errors of rtol |y| add
    up over the steps: the distance is 0.8 rtol |f| here; asserted within 10 rtol |f|."""
    k, ks = stiff_kernel(20, 4, 30)
    y = F.one_hot(torch.from_numpy(np.random.default_rng(32).integers(0, 3, 20)), 3).double()
    lr, t, rtol = 0.5 * predict.max_learning_rate(k, loss_curvature=0.5), [1e2, 1e3, 1e4], 1e-7
    ce = lambda f, y: F.cross_entropy(f, y, reduction="sum")
    sizes = chebyshev_steps(monkeypatch)
    out = predict.gradient_descent(ce, k, y, lr, t, k_test_train=ks, rtol=rtol)
    assert len(sizes) > 0

    def flow(time, state):  # (f, G): the summed cross-entropy's gradient is softmax(f) - y
        g = torch.softmax(state[0], 1) - y
        return torch.stack((-lr * k @ g, g))

    ref = ode.solve(flow, torch.zeros(2, 20, 3, dtype=torch.float64), t, rtol=1e-11, atol=1e-14)
    for got, want in ((out.train, ref[:, 0]), (out.test, -lr * ks @ ref[:, 1])):
        assert (got - want).abs().max() <= 10 * rtol * want.abs().max()


@pytest.mark.parametrize("loss", ["double well", "huber"])
def test_nonconvex_and_kinked_losses_with_chebyshev_steps_match_dormand_prince_alone(monkeypatch,
                                                                                     loss):
    """The double well 1/4 ((f - y)^2 - 1)^2 curves down where |f - y| < 1/sqrt(3) (the flow
    starts there): the flow's eigenvalues are real but some positive; Huber's curvature jumps
    from 1 to 0. The error control holds either way: within 10 rtol |f| of Dormand-Prince steps
    at rtol 1e-10 (0.06 and 3.5 rtol |f| here)."""
    k, ks = stiff_kernel(20, 4, 30)
    y = targets(20, 2, 31)
    fn, gradient, curvature = {
        "double well": (lambda f, y: 0.25 * (((f - y) ** 2 - 1) ** 2).sum(),
                        lambda f: ((f - y) ** 2 - 1) * (f - y), 2.0),
        "huber": (lambda f, y: F.huber_loss(f, y, reduction="sum", delta=0.5),
                  lambda f: torch.clamp(f - y, -0.5, 0.5), 1.0)}[loss]
    lr, t, rtol = 0.5 * predict.max_learning_rate(k, loss_curvature=curvature), [10.0, 1e3], 1e-7
    sizes = chebyshev_steps(monkeypatch)
    out = predict.gradient_descent(fn, k, y, lr, t, k_test_train=ks, rtol=rtol)
    assert len(sizes) > 0

    def flow(time, state):
        g = gradient(state[0])
        return torch.stack((-lr * k @ g, g))

    ref = ode.solve(flow, torch.zeros(2, 20, 2, dtype=torch.float64), t, rtol=1e-10, atol=1e-13)
    for got, want in ((out.train, ref[:, 0]), (out.test, -lr * ks @ ref[:, 1])):
        assert (got - want).abs().max() <= 10 * rtol * want.abs().max()


def test_momentum_flow_is_the_limit_of_the_heavy_ball_recursion():
    """Heavy ball with step h (learning rate lr h^2, momentum 1 - (1 - b) h) is a first-order
    method for f'' + (1 - b) f' = -lr K grad L: halving h halves its distance to the ODE."""
    k, ks = kernel(5, 2, 10)
    y, lr, b, t = targets(5, 2, 11), 0.3, 0.8, 4.0
    f0, fs0 = targets(5, 2, 12), targets(2, 2, 13)
    ode = predict.gradient_descent(predict.mse, k, y, lr, t, momentum=b, k_test_train=ks,
                                   fx_train_0=f0, fx_test_0=fs0, rtol=1e-10, atol=1e-12)

    def heavy_ball(h):
        f, fs = f0, fs0
        v, vs = torch.zeros_like(f), torch.zeros_like(fs)
        for _ in range(round(t / h)):
            g = f - y
            v, vs = (1 - (1 - b) * h) * v - lr * h * h * k @ g, (1 - (1 - b) * h) * vs - lr * h * h * ks @ g
            f, fs = f + v, fs + vs
        return f, fs

    errs = [max((ode.train - f).abs().max(), (ode.test - fs).abs().max())
            for f, fs in map(heavy_ball, (1 / 100, 1 / 200))]
    assert 1.7 < errs[0] / errs[1] < 2.3
    assert errs[1] < 0.02 * ode.train.abs().max()
    # the plain recursion (h = 1) is the discrete training itself; with momentum it is closest to
    # the flow at small learning rates: within 5% here after 40 steps
    slow = predict.gradient_descent(predict.mse, k, y, 0.01, 40.0, momentum=b)
    f, v = torch.zeros(5, 2, dtype=torch.float64), torch.zeros(5, 2, dtype=torch.float64)
    for _ in range(40):
        v = b * v - 0.01 * k @ (f - y)
        f = f + v
    assert (slow.train - f).abs().max() < 0.05 * f.abs().max()


@pytest.mark.parametrize("momentum", [0.0, 0.6])
def test_max_learning_rate_is_where_discrete_steps_start_to_diverge(momentum):
    k, _ = kernel(6, 0, 12)
    y = targets(6, 1, 13)
    limit = predict.max_learning_rate(k, momentum=momentum)
    assert limit == pytest.approx(2 * (1 + momentum) / np.linalg.eigvalsh(k.numpy())[-1])

    def final_error(lr):
        f, v = torch.zeros(6, 1, dtype=torch.float64), torch.zeros(6, 1, dtype=torch.float64)
        for _ in range(3000):
            v = momentum * v - lr * k @ (f - y)
            f = f + v
        return (f - y).abs().max().item()

    assert final_error(0.98 * limit) < 1e-3 and final_error(1.02 * limit) > 1e3
    half = predict.max_learning_rate(k, loss_curvature=0.5, momentum=momentum)
    assert half == pytest.approx(2 * limit)


def test_a_learning_rate_beyond_the_limit_warns_naming_it():
    k, _ = kernel(5, 0, 14)
    limit = predict.max_learning_rate(k)
    with pytest.warns(errors.LearningRateWarning, match=f"max_learning_rate .* = {limit:.4g}"):
        predict.gradient_descent_mse(k, targets(5, 1, 0), 1.1 * limit, steps=10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        predict.gradient_descent_mse(k, targets(5, 1, 0), 0.9 * limit, steps=10)
        predict.gradient_descent_mse(k, targets(5, 1, 0), 10 * limit, t=10.0)  # continuous time


def test_bad_kernels_and_targets_are_refused_naming_the_argument():
    k, ks = kernel(4, 2, 15)
    y = targets(4, 2, 16)
    nan = k.clone()
    nan[0, 1] = nan[1, 0] = math.nan
    bad = [(dict(k_train_train=nan), "k_train_train has non-finite entries"),
           (dict(k_train_train=k + torch.triu(torch.ones_like(k), 1)), "k_train_train is not symmetric"),
           (dict(k_train_train=k - 2 * torch.eye(4, dtype=k.dtype) * k.diagonal().max()),
            "k_train_train is not positive semi-definite"),
           (dict(y_train=y[:3]), r"y_train must be a tensor \(n,\) or \(n, O\) with n = 4"),
           (dict(k_test_train=ks[:, :3]), r"k_test_train must be \(2, 4\)"),
           (dict(fx_train_0=torch.zeros(4, 3)), r"fx_train_0 must be \(4, 2\)"),
           (dict(k_train_train=k[:, :3]), r"must be \(n, n\) or \(n, n, O, O\)")]
    for change, message in bad:
        args = dict(k_train_train=k, y_train=y, k_test_train=ks) | change
        with pytest.raises(errors.InputError, match=message):
            predict.gradient_descent_mse(learning_rate=0.1, t=1.0, **args)
    full = torch.einsum("ij,ab->ijab", k, torch.eye(2, dtype=k.dtype))
    with pytest.raises(errors.InputError, match=r"y_train must be \(4, 2\) for k_train_train"):
        predict.gradient_descent(predict.mse, full, y[:, :1], 0.1, 1.0)
    with pytest.raises(errors.InputError,
                       match=r"t=inf \(or None, the default\) needs loss=ntbridge.predict.mse"):
        predict.gradient_descent(lambda f, y: F.cross_entropy(f, y), k, y, 0.1, math.inf)
    with pytest.raises(errors.InputError, match="steps counts steps and must be whole"):
        predict.gradient_descent_mse(k, y, 0.1, steps=2.5)
    with pytest.raises(errors.InputError, match="momentum must be in"):
        predict.gradient_descent(predict.mse, k, y, 0.1, 1.0, momentum=1.0)


def test_closed_form_differentiates_in_the_kernel_and_the_targets():
    k, ks = kernel(4, 2, 17)
    joint = torch.cat([k, ks]).clone().requires_grad_()
    y = targets(4, 2, 18).requires_grad_()

    def fn(joint, y):
        kk = (joint[:4] + joint[:4].T) / 2
        out = predict.gradient_descent_mse(kk, y, 0.5, t=[1.0, 3.0], k_test_train=joint[4:])
        return out.train, out.test

    assert torch.autograd.gradcheck(fn, (joint, y))
