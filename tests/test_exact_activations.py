"""Every quadrature activation's kernel against adaptive integration split at its kinks.

The reference is written here independently of ntbridge: each activation and its derivative in
plain Python (checked against torch's module and autograd), and ``E[f(u) g(v)]`` as nested
scipy ``quad`` (the inner expectation conditional on ``u``), split at the kinks in both variables.
Its own convergence is checked by tightening its tolerance. Errors are relative to
``sqrt(E f(u)^2 E f(v)^2)``, the kernel's scale (its value at correlation 1 for equal variances).
"""

import functools
import math

import jax
import numpy as np
import pytest
import torch
from torch import nn

from ntbridge.converters.activations import twin
from ntbridge.stax.activations import numerical_rule

from reference import expectation, scale


def _sp(x, beta=1.0, threshold=20.0):
    return x if beta * x > threshold else math.log1p(math.exp(beta * x)) / beta


def _sigmoid(x):
    return 0.5 * (1 + math.tanh(x / 2))


SELU_A, SELU_L = 1.6732632423543772, 1.0507009873554805

# module, f, f' (autodiff's: 0 on flat pieces, the jumps carry no delta term), kinks
CASES = [
    (nn.Tanh(), math.tanh, lambda x: 1 - math.tanh(x) ** 2, ()),
    (nn.Sigmoid(), _sigmoid, lambda x: _sigmoid(x) * (1 - _sigmoid(x)), ()),
    (nn.SiLU(), lambda x: x * _sigmoid(x), lambda x: _sigmoid(x) * (1 + x * (1 - _sigmoid(x))), ()),
    (nn.ELU(0.7), lambda x: x if x > 0 else 0.7 * math.expm1(x),
     lambda x: 1.0 if x > 0 else 0.7 * math.exp(x), (0,)),
    (nn.CELU(0.5), lambda x: x if x > 0 else 0.5 * math.expm1(x / 0.5),
     lambda x: 1.0 if x > 0 else math.exp(x / 0.5), (0,)),
    (nn.SELU(), lambda x: SELU_L * (x if x > 0 else SELU_A * math.expm1(x)),
     lambda x: SELU_L * (1.0 if x > 0 else SELU_A * math.exp(x)), (0,)),
    (nn.Softplus(2.0, 5.0), lambda x: _sp(x, 2.0, 5.0),
     lambda x: 1.0 if x > 2.5 else _sigmoid(2 * x), (2.5,)),
    (nn.Mish(), lambda x: x * math.tanh(_sp(x)),
     lambda x: math.tanh(_sp(x)) + x * _sigmoid(x) * (1 - math.tanh(_sp(x)) ** 2), (20,)),
    (nn.Hardtanh(-0.5, 2.0), lambda x: min(max(x, -0.5), 2.0),
     lambda x: 1.0 if -0.5 < x < 2.0 else 0.0, (-0.5, 2.0)),
    (nn.ReLU6(), lambda x: min(max(x, 0.0), 6.0), lambda x: 1.0 if 0 < x < 6 else 0.0, (0, 6)),
    (nn.Hardswish(), lambda x: x * min(max(x + 3, 0.0), 6.0) / 6,
     lambda x: 0.0 if x < -3 else (1.0 if x > 3 else (2 * x + 3) / 6), (-3, 3)),
    (nn.Hardsigmoid(), lambda x: min(max(x + 3, 0.0), 6.0) / 6,
     lambda x: 1 / 6 if -3 < x < 3 else 0.0, (-3, 3)),
    (nn.LogSigmoid(), lambda x: -_sp(-x), lambda x: _sigmoid(-x), ()),
    (nn.Softsign(), lambda x: x / (1 + abs(x)), lambda x: 1 / (1 + abs(x)) ** 2, (0,)),
    (nn.Tanhshrink(), lambda x: x - math.tanh(x), lambda x: math.tanh(x) ** 2, ()),
    (nn.Softshrink(0.3), lambda x: x - 0.3 if x > 0.3 else (x + 0.3 if x < -0.3 else 0.0),
     lambda x: 1.0 if abs(x) > 0.3 else 0.0, (-0.3, 0.3)),
    (nn.Hardshrink(0.4), lambda x: x if abs(x) > 0.4 else 0.0,
     lambda x: 1.0 if abs(x) > 0.4 else 0.0, (-0.4, 0.4)),
    (nn.Threshold(0.1, -2.0), lambda x: x if x > 0.1 else -2.0,
     lambda x: 1.0 if x > 0.1 else 0.0, (0.1,)),
]
IDS = [repr(case[0]) for case in CASES]
# (q1, q2, correlation): variances small and large, correlations -1, 0, +1 and near 1
POINTS = [(0.3, 0.3, 0.6), (1.0, 1.0, -1.0), (1.0, 1.0, 0.0), (4.0, 4.0, 1.0), (10.0, 10.0, 0.999),
          (0.3, 4.0, 0.5)]
@functools.cache
def references(i):
    """point -> ((NNGP, its scale), (E f' f', its scale)) of case ``i``, computed once."""
    _, f, df, kinks = CASES[i]
    out = {}
    for q1, q2, rho in POINTS:
        c = rho * math.sqrt(q1 * q2)
        out[q1, q2, rho] = tuple((expectation(g, g, q1, q2, c, kinks), scale(g, q1, q2, kinks))
                                 for g in (f, df))
    return out


@pytest.mark.parametrize("i", range(len(CASES)), ids=IDS)
def test_reference_functions_are_torchs(i):
    module, f, df, _ = CASES[i]
    x = torch.linspace(-7, 7, 1401, dtype=torch.float64).add(0.0013).requires_grad_()
    y = module(x)
    (dy,) = torch.autograd.grad(y.sum(), x)
    np.testing.assert_allclose([f(v) for v in x.tolist()], y.detach().numpy(), rtol=1e-13, atol=1e-13)
    # torch's Hardsigmoid backward multiplies by 1/6 rounded to float32 (3e-8 relative)
    np.testing.assert_allclose([df(v) for v in x.tolist()], dy.numpy(), rtol=3e-8, atol=1e-13)


def test_reference_converges():
    """Tightening the tolerance 100-fold moves the reference by far less than 1e-8 of the scale."""
    for _, f, df, kinks in CASES[::3]:
        for g in (f, df):
            loose, tight = (expectation(g, g, 10.0, 10.0, 9.99, kinks, tol) for tol in (1e-11, 1e-13))
            assert abs(loose - tight) <= 1e-11 * scale(g, 10.0, 10.0, kinks)


@pytest.mark.slow
def test_kernel_rules_match_reference():
    """Every case's rule at every point, in float64 and float32: all cases in one program per dtype
    (a program per case and dtype, 36 in all, compile about 1.5 times as long)."""
    rules = [numerical_rule(*twin(case[0])) for case in CASES]
    evaluate = jax.jit(lambda *args: [rule(*args) for rule in rules])
    for dtype, rtol in ((np.float64, 1e-8), (np.float32, 2e-5)):
        q1, q2, rho = (np.array(v, dtype) for v in zip(*POINTS))
        c = rho * np.sqrt(q1 * q2)
        with jax.enable_x64(dtype == np.float64):
            results = jax.device_get(evaluate(c, q1, q2))
        for i, got in enumerate(results):
            assert all(a.dtype == dtype for a in got), IDS[i]
            for k, point in enumerate(POINTS):
                for name, value, (expected, size) in zip(("NNGP", "E f'f'"), (got[0][k], got[1][k]),
                                                         references(i)[point]):
                    assert abs(value - expected) <= rtol * size, (IDS[i], dtype, name, point, value,
                                                                  expected)


PIECEWISE = [i for i, case in enumerate(CASES) if twin(case[0]).pieces is not None]


@pytest.mark.parametrize("i", PIECEWISE, ids=[IDS[i] for i in PIECEWISE])
def test_declared_pieces_are_the_function_and_its_derivative(i):
    """The pieces (and their derivative) the rule integrates are the forward pass's function (and
    autodiff's derivative), away from the kinks themselves."""
    fn, pieces = twin(CASES[i][0]).fn, twin(CASES[i][0]).pieces
    x = np.linspace(-7, 7, 1401) + 0.0013
    with jax.enable_x64(True):
        value, slope = jax.jvp(fn, (x,), (np.ones_like(x),))
        np.testing.assert_allclose(pieces(x), value, rtol=1e-14, atol=1e-14)
        np.testing.assert_allclose(pieces.derivative()(x), slope, rtol=1e-14, atol=1e-14)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_piecewise_rule_and_its_gradients_are_finite_at_degenerate_inputs(dtype):
    """Zero variances, correlations +-1 and 0, a large variance: values and gradients finite."""
    q1 = np.array([0.0, 0.0, 1.0, 2.0, 2.0, 3.0, 400.0], dtype)
    q2 = np.array([0.0, 1.0, 0.0, 2.0, 2.0, 5.0, 400.0], dtype)
    c = np.array([0.0, 0.0, 0.0, 2.0, -2.0, 0.0, 399.0], dtype)
    for module in (nn.CELU(0.5),):  # an exponential piece (may overflow) and a kink
        rule = numerical_rule(*twin(module))

        def values_and_grads(*args):  # one program: the gradient of the outputs' sum, by VJP
            values, vjp = jax.vjp(rule, *args)
            return values, vjp(tuple(jax.numpy.ones_like(a) for a in values))

        with jax.enable_x64(dtype == np.float64):
            values, grads = jax.jit(values_and_grads)(c, q1, q2)
        assert all(np.isfinite(np.asarray(a)).all() for a in (*values, *grads)), module
