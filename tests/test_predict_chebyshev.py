"""The Runge-Kutta-Chebyshev method of ntbridge.predict.chebyshev: its stability polynomial, its
order, its spectral radius estimate, and the solver's stiff steps against exact solutions."""

import numpy as np
import pytest
import torch

from ntbridge.predict import chebyshev, ode


def polynomial(s, z):
    """The stability polynomial ``P_s(z)``: one step of ``y' = z y`` from 1 with ``h = 1``,
    elementwise over a tensor of ``z``."""
    return chebyshev.step(lambda t, y: z * y, 0.0, torch.ones_like(z), z, 1.0, s)[0]


def taylor(s):
    """``P_s``'s coefficients, exactly: the same step on coefficient vectors (``z y`` shifts)."""
    shift = lambda t, y: torch.cat([y.new_zeros(1), y[:-1]])
    one = torch.zeros(s + 2, dtype=torch.float64)
    one[0] = 1
    return chebyshev.step(shift, 0.0, one, shift(0.0, one), 1.0, s)[0]


@pytest.mark.parametrize("s", [2, 3, 4, 7, 20, 60, 300])
def test_stability_polynomial_is_second_order_and_bounded_on_its_interval(s):
    _, beta = chebyshev.coefficients(s)
    assert beta >= chebyshev.REACH * (s * s - 1)
    assert chebyshev.stages(chebyshev.REACH * (s * s - 1) * (1 - 1e-12)) <= s
    z = -torch.linspace(0, beta, 20_001, dtype=torch.float64)
    assert polynomial(s, z).abs().max() <= 1 + 1e-9
    # 1, 1, 1/2 as exp's (second order); the cubic coefficient c3 in [0, 1/6], so that
    # ESTIMATE_RATIO = 3 bounds 1 + 12 (1/6 - c3)
    c = taylor(s)
    assert c[:3].tolist() == pytest.approx([1, 1, 0.5], abs=1e-9)
    assert -1e-9 <= c[3] <= 1 / 6 + 1e-9
    assert 1 + 12 * (1 / 6 - c[3]) <= chebyshev.ESTIMATE_RATIO + 1e-9
    assert c[s + 1] == 0  # degree s
    assert chebyshev.coefficients(s)[0][-1].c == pytest.approx(1, abs=1e-12)  # lands on t + h


def forced(t, y):
    """A nonlinear, time-dependent, non-stiff right-hand side."""
    return torch.cos(t * y.new_tensor([1.0, 2.0, 0.5])) - y**3 + 0.5 * y


def test_fixed_steps_converge_at_second_order_with_an_error_estimate_of_third():
    """Halving the step divides the global error by 4 on a nonlinear non-autonomous problem
    (stage times matter there), and the local error estimate of one step by 8; the estimate is
    above the true local error, by less than 3x."""
    y0 = torch.tensor([0.3, -0.8, 1.2], dtype=torch.float64)
    t_end = 2.0
    exact = ode.solve(forced, y0, [t_end], rtol=1e-13, atol=1e-15)[0]

    def fixed(n, s=5):
        y, h = y0, t_end / n
        for i in range(n):
            y, _, _ = chebyshev.step(forced, i * h, y, forced(i * h, y), h, s)
        return (y - exact).abs().max().item()

    errors = [fixed(n) for n in (20, 40, 80)]
    assert 3.6 < errors[0] / errors[1] < 4.4 and 3.6 < errors[1] / errors[2] < 4.4
    estimates, local = [], []
    for h in (0.1, 0.05):
        new, _, estimate = chebyshev.step(forced, 0.0, y0, forced(0.0, y0), h, 5)
        estimates.append(estimate.abs().max().item())
        local.append((new - ode.solve(forced, y0, [h], rtol=1e-13, atol=1e-15)[0]).abs().max())
    assert 7.0 < estimates[0] / estimates[1] < 9.0
    # the estimate bounds the true local error: on y' = lambda y it is 1.65 times it for s = 5
    # (the defect of exact solutions, z^3 / 15, plus 0.8 of the error (1/6 - c3) z^3, c3 = 0.0885)
    assert all(0.3 < error / estimate < 1.0 for error, estimate in zip(local, estimates))


def test_spectral_radius_of_a_gradient_flow():
    """``-lr K H``: not symmetric, but with real eigenvalues; the estimate is 1.2 times the
    largest magnitude (within 1%)."""
    rng = np.random.default_rng(0)
    a = rng.normal(size=(30, 32))
    k = torch.from_numpy(a @ a.T / 32 + 1.0)
    h = torch.from_numpy(rng.uniform(0.2, 1.0, size=30))
    fun = lambda t, f: -0.01 * k @ (h * f)
    y = torch.from_numpy(rng.normal(size=30))
    rho = np.abs(np.linalg.eigvals(0.01 * k.numpy() * h.numpy())).max()
    radius = chebyshev.SpectralRadius()
    assert radius.estimate(fun, 0.0, y, fun(0.0, y)) == pytest.approx(1.2 * rho, rel=0.01)
    assert radius.evaluations <= 20
    again = radius.evaluations
    radius.estimate(fun, 1.0, y, fun(1.0, y))  # continues from the converged direction
    assert radius.evaluations - again <= 3


def stiff_linear(n=40, seed=0):
    """``y' = -A (y - b)``, ``A`` symmetric with eigenvalues from 1e-3 to 1e3, and its exact
    solution from 0."""
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(n, n)))
    lam = np.logspace(-3, 3, n)
    a = torch.from_numpy((q * lam) @ q.T)
    b = torch.from_numpy(np.random.default_rng(seed + 1).normal(size=n))
    exact = lambda t: b - torch.from_numpy(q @ (np.exp(-lam * t) * (q.T @ b.numpy())))
    return (lambda t, y: -a @ (y - b)), exact, lam[-1]


def test_stiff_linear_problem_takes_chebyshev_steps_and_meets_its_exact_solution(monkeypatch):
    """The flow is contractive (2-norm) and so is every stable step, so the global error is at
    most the sum of the local errors, each at most ``atol + rtol |y|`` in rms (the estimate
    exceeds a Chebyshev step's true error: ESTIMATE_RATIO's c3 <= 1/6 gives estimate / error
    >= 1.2); there are at most ``evaluations / 2`` steps. The stiff flow damps the local errors
    rather than adding them up: the error stays near ``rtol |y|`` (0.4 to 2 times it here), within
    10 times. Tolerance proportionality: 100x tighter tolerances cut the error at least 10x
    (second order: 100^(2/3) = 21.5)."""
    fun, exact, rho = stiff_linear()
    calls = {"fun": 0, "chebyshev": 0}

    def counted(t, y):
        calls["fun"] += 1
        return fun(t, y)

    step = chebyshev.step

    def chebyshev_step(*args):
        calls["chebyshev"] += 1
        return step(*args)

    monkeypatch.setattr(chebyshev, "step", chebyshev_step)
    times, errors, evaluations = [1.0, 10.0, 100.0], [], []
    y0 = torch.zeros(40, dtype=torch.float64)
    for rtol in (1e-5, 1e-7):
        calls.update(fun=0, chebyshev=0)
        ys = ode.solve(counted, y0, times, rtol=rtol, atol=1e-12, real_spectrum=True)
        error = max((ys[i] - exact(t)).pow(2).mean().sqrt().item() for i, t in enumerate(times))
        scale = max(exact(t).abs().max().item() for t in times)
        bound = calls["fun"] / 2 * (1e-12 + rtol * scale)
        assert error <= bound
        assert error <= 10 * rtol * scale
        assert calls["chebyshev"] > 0
        errors.append(error)
        evaluations.append(calls["fun"])
    # Dormand-Prince alone needs 6 evaluations per 3.3 / rho of time: 1.8e5 here
    assert evaluations[0] < 0.1 * 6 * times[-1] * rho / 3.3
    assert errors[0] / errors[1] >= 10
