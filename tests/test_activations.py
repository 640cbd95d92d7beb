"""Activations: closed forms and quadrature against independent integrals, translations against
torch, Monte-Carlo over random inits, and robustness (x1 == x2, zero inputs)."""

import math

import jax
import numpy as np
import pytest
import torch
from numpy.polynomial.hermite_e import hermegauss
from torch import nn

import ntbridge
from ntbridge import errors
from ntbridge.dlpack import to_jax
from ntbridge.stax import ab_relu_rule
from ntbridge.stax.activations import erf_rule, erf_self_rule, gelu_rule, sin_rule, sin_self_rule
from ntbridge.stax.arccos import (ab_relu_self_rule, rectified_monomial_rule,
                                  rectified_monomial_self_rule, sign_rule, sign_self_rule)
from ntbridge.stax.polar import POLAR, polar_rule, radial_rule, tanh_sinh
from ntbridge.stax.quadrature import smooth_rule

from montecarlo import assert_within_standard_error, sample_kernels

CASES = [(1.3, 0.7, 0.4), (1.0, 2.0, -1.1), (0.5, 0.5, 0.499), (0.8, 0.8, 0.8), (2.0, 0.3, 0.0)]


def gauss_hermite(f, q1, q2, c, degree=120):
    """E[f(u) f(v)] by an independent numpy Gauss-Hermite rule in float64 (smooth f only)."""
    z, w = hermegauss(degree)
    w = w / w.sum()
    u = math.sqrt(q1) * z[:, None]
    r = c / math.sqrt(q1)
    v = r * z[:, None] + math.sqrt(max(q2 - r * r, 0)) * z[None, :]
    return np.einsum("i,j,i,ij->", w, w, f(u)[:, 0], f(v))


def rule64(rule, cases):
    """``rule`` at every ``(q1, q2, c)`` of ``cases`` in float64, in one program: a ``(nngp, dot)``
    pair of floats per case."""
    q1, q2, c = (np.array(v) for v in zip(*cases))
    with jax.enable_x64(True):
        return list(zip(*(np.asarray(a).tolist() for a in jax.jit(rule)(c, q1, q2))))


def phi(x):
    from scipy.special import erf
    return 0.5 * (1 + erf(x / math.sqrt(2)))


SMOOTH_CLOSED_FORMS = {
    "gelu": (gelu_rule, lambda x: x * phi(x),
             lambda x: phi(x) + x * np.exp(-x * x / 2) / math.sqrt(2 * math.pi)),
    "erf": (erf_rule(1.5, 0.7, 0.3), lambda x: 1.5 * __import__("scipy.special").special.erf(0.7 * x) + 0.3,
            lambda x: 1.5 * 0.7 * 2 / math.sqrt(math.pi) * np.exp(-0.49 * x * x)),
    "sin": (sin_rule(1.2, 0.8, 0.3), lambda x: 1.2 * np.sin(0.8 * x + 0.3),
            lambda x: 1.2 * 0.8 * np.cos(0.8 * x + 0.3)),
}


@pytest.mark.parametrize("name", sorted(SMOOTH_CLOSED_FORMS))
def test_smooth_closed_forms_match_float64_quadrature(name):
    rule, f, df = SMOOTH_CLOSED_FORMS[name]
    for (q1, q2, c), (nngp, dot) in zip(CASES, rule64(rule, CASES)):
        np.testing.assert_allclose(nngp, gauss_hermite(f, q1, q2, c), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(dot, gauss_hermite(df, q1, q2, c), rtol=1e-9, atol=1e-12)


SELF_RULES = {
    "relu": (ab_relu_rule(0.0, 1.0), ab_relu_self_rule(0.0, 1.0)),
    "leaky": (ab_relu_rule(0.2, 1.0), ab_relu_self_rule(0.2, 1.0)),
    "abs": (ab_relu_rule(-1.0, 1.0), ab_relu_self_rule(-1.0, 1.0)),
    **{f"monomial{k}": (rectified_monomial_rule(k), rectified_monomial_self_rule(k))
       for k in (1, 2, 3)},
    "erf": (erf_rule(1.5, 0.7, 0.3), erf_self_rule(1.5, 0.7, 0.3)),
    "sign": (sign_rule, sign_self_rule),
    "sin": (sin_rule(1.2, 0.8, 0.3), sin_self_rule(1.2, 0.8, 0.3)),
}


@pytest.mark.slow
@pytest.mark.parametrize("dtype,rtol", [("float32", 1e-5), ("float64", 1e-10)])
@pytest.mark.parametrize("name", sorted(SELF_RULES))
def test_self_rules_are_the_rules_at_cosine_one(name, dtype, rtol):
    """A self rule equals its rule's NNGP at c = q1 = q2 = q, and its gradient is finite, down to
    q = 0."""
    rule, self_rule = SELF_RULES[name]
    evaluate = lambda q: (self_rule(q), rule(q, q, q)[0], jax.grad(lambda q: self_rule(q).sum())(q))
    with jax.enable_x64(dtype == "float64"):
        q = jax.numpy.asarray(np.concatenate([[0.0], np.logspace(-3, 1, 41)]), dtype)
        own, nngp, grad = jax.jit(evaluate)(q)  # one program
        assert own.dtype == q.dtype and own.shape == q.shape
        np.testing.assert_allclose(np.asarray(own), np.asarray(nngp), rtol=rtol, atol=0)
        assert np.isfinite(np.asarray(grad)).all()


def test_leaky_relu_and_sign_match_independent_integrals():
    """leaky(x) = 0.2 x + 0.8 relu(x): E[u relu(v)] = c / 2 (Stein), E[relu relu] by numpy's arccos
    kernel; orthant probabilities p = P(u > 0, v > 0) from scipy's bivariate normal cdf."""
    from scipy import stats
    leaky, signs = rule64(ab_relu_rule(0.2, 1.0), CASES), rule64(sign_rule, CASES)
    for (q1, q2, c), (nngp, dot), (sign, sign_dot) in zip(CASES, leaky, signs):
        t = np.arccos(np.clip(c / math.sqrt(q1 * q2), -1, 1))
        relu_relu = math.sqrt(q1 * q2) * (np.sin(t) + (np.pi - t) * np.cos(t)) / (2 * np.pi)
        np.testing.assert_allclose(nngp, 0.04 * c + 0.32 * c / 2 + 0.64 * relu_relu, rtol=1e-12)
        p = stats.multivariate_normal([0, 0], [[q1, c + 1e-300], [c, q2]], allow_singular=True).cdf([0, 0])
        np.testing.assert_allclose(dot, 1.04 * p + 0.4 * (0.5 - p), rtol=1e-5)
        np.testing.assert_allclose(sign, 4 * p - 1, rtol=1e-5, atol=1e-6)
        assert sign_dot == 0


def test_relu_float32_angles_and_rule_within_1e5_of_float64():
    """float32's polynomial angles match float64 arccos on the same cosines to 1e-6 relative (sin t
    and pi - t both, down to cos = +-1); the rule itself to 1e-5 where the angle is well-conditioned
    (near cos = +-1 any float32 evaluation inherits the rounding of c / sqrt(q1 q2))."""
    from ntbridge.stax.arccos import _angles
    cos = np.concatenate([np.linspace(-1, 1, 20001), 1 - np.logspace(-7, 0, 300),
                          -1 + np.logspace(-7, 0, 300)]).astype(np.float32)
    sin32, rest32 = jax.jit(_angles)(jax.numpy.asarray(cos))
    cos64 = cos.astype(np.float64)
    np.testing.assert_allclose(np.asarray(sin32), np.sqrt(1 - cos64 ** 2), rtol=1e-6, atol=0)
    np.testing.assert_allclose(np.asarray(rest32), np.arccos(-cos64), rtol=1e-6, atol=0)

    c = cos[np.abs(cos) < 0.99] * np.float32(1.7)  # d(pi - t)/d cos = 1 / sin t: conditioned
    relu = jax.jit(ab_relu_rule(0.0, 1.0))
    nngp32, dot32 = relu(c, np.float32(1.7), np.float32(1.7))
    with jax.enable_x64(True):
        nngp64, dot64 = relu(c.astype(np.float64), np.float64(np.float32(1.7)),
                             np.float64(np.float32(1.7)))
    assert nngp32.dtype == np.float32
    np.testing.assert_allclose(np.asarray(nngp32), np.asarray(nngp64), rtol=1e-5, atol=1e-5 * 1.7)
    np.testing.assert_allclose(np.asarray(dot32), np.asarray(dot64), rtol=1e-5, atol=0)



def test_relu_float64_angles_within_a_few_ulps_of_numpy():
    """float64's polynomial arc-cosine is within 2 ulps of numpy's over [-1, 1] (down to the ends,
    where pi - t is exactly 0 and pi); sin t within 4 ulps of sqrt(1 - cos^2) where the latter is
    accurate (|cos| <= 1/2), and exactly 0 at +-1."""
    from ntbridge.stax.arccos import _angles
    tails = np.logspace(-16, 0, 400)
    cos = np.concatenate([np.linspace(-1, 1, 20001), 1 - tails, -1 + tails])
    with jax.enable_x64(True):
        sin, rest = map(np.asarray, jax.jit(_angles)(jax.numpy.asarray(cos)))
    assert sin.dtype == np.float64
    ulps = lambda got, want: np.max(np.abs(got - want) / np.spacing(np.abs(want)))
    inner = cos > -1  # at -1 pi - t is 0, where ulps are of no use: checked exactly below
    assert ulps(rest[inner], np.arccos(-cos[inner])) <= 2
    assert np.all(rest[cos == -1] == 0) and np.all(rest[cos == 1] == math.pi)
    assert np.all(rest[cos == 0] == math.pi / 2)
    middle = np.abs(cos) <= 0.5
    assert ulps(sin[middle], np.sqrt(1 - cos[middle] ** 2)) <= 4
    assert np.all(sin[np.abs(cos) == 1] == 0)


def test_float64_arccos_table_is_its_chebyshev_interpolant():
    """_ACOS_SQUARED_64 is the degree-19 Chebyshev interpolant of arccos(a)^2 / (1 - a) on [0, 1]
    in powers of t = 2a - 1, recomputed here in 50-digit arithmetic."""
    mpmath = pytest.importorskip("mpmath")
    from ntbridge.stax.arccos import _ACOS_SQUARED_64
    with mpmath.workdps(50):
        n = len(_ACOS_SQUARED_64)
        angles = [mpmath.pi * (k + mpmath.mpf(1) / 2) / n for k in range(n)]
        values = [mpmath.acos(a) ** 2 / (1 - a)
                  for a in ((mpmath.cos(x) + 1) / 2 for x in angles)]
        chebyshev = [(1 if j == 0 else 2) * mpmath.fsum(v * mpmath.cos(j * x)
                                                        for v, x in zip(values, angles)) / n
                     for j in range(n)]
        powers, previous, current = [mpmath.mpf(0)] * n, [mpmath.mpf(1)], [0, mpmath.mpf(1)]
        for c in chebyshev:  # T_j in powers of t, by T_(j+1) = 2 t T_j - T_(j-1)
            for i, p in enumerate(previous):
                powers[i] += c * p
            previous, current = current, [2 * p - q for p, q in
                                          zip([0] + current, previous + [0, 0])]
        table = np.array([float(p) for p in powers[::-1]])
    np.testing.assert_array_max_ulp(np.array(_ACOS_SQUARED_64), table, maxulp=1)

def test_fc_relu_network_float32_within_1e5_of_float64():
    model = nn.Sequential(nn.Linear(30, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))
    x = torch.randn(64, 30)
    k32, k64 = ntbridge.kernel(model, x), ntbridge.kernel(model, x.double())
    for a, b in zip(k32, k64):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=0)


# ---------------------------------------------------------------- quadrature

QUADRATURE = {
    "tanh": (np.tanh, lambda x: 1 - np.tanh(x) ** 2, jax.numpy.tanh),
    "sigmoid": (lambda x: 1 / (1 + np.exp(-x)), lambda x: np.exp(-x) / (1 + np.exp(-x)) ** 2,
                jax.nn.sigmoid),
    "softplus": (lambda x: np.log1p(np.exp(x)), lambda x: 1 / (1 + np.exp(-x)), jax.nn.softplus),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(QUADRATURE))
def test_quadrature_rule_matches_high_degree_gauss_hermite(name):
    f, df, jf = QUADRATURE[name]
    rule = smooth_rule(jf)
    cases = CASES + [(3.0, 2.0, 2.4), (4.0, 4.0, -4.0)]
    for (q1, q2, c), (nngp, dot) in zip(cases, rule64(rule, cases)):
        for got, g in ((nngp, f), (dot, df)):
            scale = math.sqrt(gauss_hermite(lambda x: g(x) ** 2, q1, q1, q1, 150)
                              * gauss_hermite(lambda x: g(x) ** 2, q2, q2, q2, 150))
            assert abs(got - gauss_hermite(g, q1, q2, c, 150)) <= 1e-4 * scale, (name, q1, q2, c)


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")  # roundoff at 1e-14
@pytest.mark.parametrize("dtype,atol", [(np.dtype(np.float32), 1e-6), (np.dtype(np.float64), 1e-9)])
def test_polar_rule_nodes(dtype, atol):
    """The radial rule at any scale of a singularity near R = 0 (``E (1 + a R)^-2`` against adaptive
    integration); tanh-sinh: x^k on [-1, 1] to the dtype's rounding."""
    from scipy import integrate
    radial, angular = POLAR[dtype]
    r, w = radial_rule(*radial)
    for a in (0.0, 0.1, 1.0, 10.0, 100.0, 1000.0):
        g = lambda x: (1 + a * x) ** -2.0
        exact = integrate.quad(lambda x: g(x) * x * math.exp(-x * x / 2), 0, 40, epsabs=1e-14,
                               epsrel=1e-14, limit=500, points=[1 / a] if a else None)[0]
        assert abs(np.sum(w * g(r)) - exact) <= atol, a
    x, w = tanh_sinh(*angular)
    k = np.arange(9)
    np.testing.assert_allclose((w * x ** k[:, None]).sum(1), (1 + (-1.0) ** k) / (k + 1),
                               atol=100 * np.finfo(dtype).eps)


POLAR_POINTS = [(0.3, 0.3, 0.6), (1.0, 1.0, -1.0), (1.0, 1.0, 0.0), (4.0, 4.0, 1.0),
                (10.0, 10.0, 0.999), (0.3, 4.0, 0.5), (2.0, 0.5, -0.3)]


@pytest.mark.slow
@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-8), (np.float32, 2e-5)])
def test_polar_rule_matches_closed_forms_with_a_kink_or_a_jump_at_zero(dtype, rtol):
    """LeakyReLU (a kink) and sign (a jump; derivative 0) against their float64 closed forms,
    relative to ``sqrt(E f(u)^2 E f(v)^2)``."""
    q1, q2, rho = (np.array(v) for v in zip(*POLAR_POINTS))
    c = rho * np.sqrt(q1 * q2)
    for fn, closed in ((lambda x: jax.numpy.where(x > 0, x, 0.2 * x), ab_relu_rule(0.2, 1.0)),
                       (jax.numpy.sign, sign_rule)):
        with jax.enable_x64(True):
            expected = [np.asarray(a) for a in closed(c, q1, q2)]
            scales = [np.sqrt(np.asarray(a) * np.asarray(b))
                      for a, b in zip(closed(q1, q1, q1), closed(q2, q2, q2))]
        with jax.enable_x64(dtype == np.float64):
            args = [a.astype(dtype) for a in (c, q1, q2)]
            got = [np.asarray(a) for a in jax.jit(polar_rule(fn))(*args)]
        assert all(a.dtype == dtype for a in got)
        for g, e, size in zip(got, expected, scales):
            assert np.all(np.abs(g - e) <= rtol * size), (g, e)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_polar_rule_and_its_gradients_are_finite_at_degenerate_inputs(dtype):
    """Zero variances, correlations +-1 and 0, a large variance (Softsign)."""
    q1 = np.array([0.0, 0.0, 1.0, 2.0, 2.0, 3.0, 400.0], dtype)
    q2 = np.array([0.0, 1.0, 0.0, 2.0, 2.0, 5.0, 400.0], dtype)
    c = np.array([0.0, 0.0, 0.0, 2.0, -2.0, 0.0, 399.0], dtype)
    rule = polar_rule(lambda x: x / (1.0 + jax.numpy.abs(x)))

    def values_and_grads(*args):  # one program: the gradient of the outputs' sum, by VJP
        values, vjp = jax.vjp(rule, *args)
        return values, vjp(tuple(jax.numpy.ones_like(a) for a in values))

    with jax.enable_x64(dtype == np.float64):
        values, grads = jax.jit(values_and_grads)(c, q1, q2)
    assert all(np.isfinite(np.asarray(a)).all() for a in (*values, *grads))


# ---------------------------------------------------------------- translations

MODULES = [nn.ReLU(), nn.LeakyReLU(0.2), nn.RReLU().eval(), nn.GELU(), nn.GELU("tanh"), nn.Tanh(),
           nn.Sigmoid(), nn.SiLU(), nn.ELU(0.7), nn.CELU(1.3), nn.SELU(), nn.Softplus(2.0, 5.0),
           nn.Mish(), nn.Hardtanh(-0.5, 2.0), nn.ReLU6(), nn.Hardswish(), nn.Hardsigmoid(),
           nn.LogSigmoid(), nn.Softsign(), nn.Tanhshrink(), nn.Softshrink(0.3), nn.Hardshrink(0.4),
           nn.Threshold(0.1, -2.0), nn.Softmax(-1), nn.LogSoftmax(1)]


@pytest.mark.slow
@pytest.mark.parametrize("module", MODULES, ids=lambda m: repr(m))
@pytest.mark.parametrize("dtype,rtol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_apply_fn_equals_module(module, dtype, rtol):
    x = (torch.linspace(-8, 8, 401, dtype=dtype) + 0.013).reshape(1, -1).repeat(3, 1) * torch.tensor(
        [[1.0], [0.3], [1.7]], dtype=dtype)
    graph = ntbridge.convert(module)
    with ntbridge.dlpack.precision(dtype):
        got = torch.from_dlpack(graph.apply_fn(graph.params, to_jax(x)))
    torch.testing.assert_close(got, module(x), rtol=rtol, atol=rtol * module(x).abs().max().item())


# ---------------------------------------------------------------- Monte-Carlo

FAMILIES = [nn.LeakyReLU(0.2), nn.GELU(), nn.Tanh(), nn.ELU(), nn.Softplus()]


@pytest.mark.slow
@pytest.mark.parametrize("act", FAMILIES, ids=lambda m: type(m).__name__)
def test_one_hidden_layer_matches_monte_carlo(act):
    # One hidden layer: the expected empirical kernels equal the analytic ones at any width.
    x = torch.randn(4, 3, dtype=torch.float64)
    model = nn.Sequential(nn.Linear(3, 64), act, nn.Linear(64, 64)).double()
    for parameterization in ("standard", "ntk"):
        nngp, ntk = sample_kernels(model, x, 200, parameterization, chunk=50)
        k = ntbridge.kernel(model, x, parameterization=parameterization)
        assert_within_standard_error(nngp, k.nngp, "NNGP")
        assert_within_standard_error(ntk, k.ntk, f"NTK ({parameterization})")


@pytest.mark.slow
def test_two_hidden_layers_tanh_gelu_match_monte_carlo():
    # Two layers: the bias is O(1/width), about 2e-3 relative here, below one standard error. The
    # NTK's noise is the hidden layers': over 2 output units its standard error is that over 4
    # (0.72% and 0.73% of its largest entry; GELU -> SiLU is 14 standard errors off, not 15), at
    # half the Jacobians' cost.
    x = torch.randn(4, 3, dtype=torch.float64)
    model = nn.Sequential(nn.Linear(3, 512), nn.Tanh(), nn.Linear(512, 512), nn.GELU(),
                          nn.Linear(512, 64)).double()
    nngp, ntk = sample_kernels(model, x, 100, chunk=20, ntk_outputs=2)
    k = ntbridge.kernel(model, x)
    assert_within_standard_error(nngp, k.nngp, "NNGP")
    assert_within_standard_error(ntk, k.ntk, "NTK")


# ---------------------------------------------------------------- robustness and errors

@pytest.mark.slow
@pytest.mark.parametrize("act", [nn.ReLU(), nn.LeakyReLU(0.1), nn.GELU(), nn.Tanh(), nn.Hardtanh()],
                         ids=lambda m: type(m).__name__)
def test_finite_symmetric_psd_at_duplicates_and_zero_inputs(act):
    model = nn.Sequential(nn.Linear(5, 32, bias=False), act, nn.Linear(32, 32, bias=False), act,
                          nn.Linear(32, 1, bias=False))
    x = torch.randn(6, 5)
    x[1], x[2], x[3] = x[0], 0.0, -x[0]
    for k in ntbridge.kernel(model, x):
        assert torch.isfinite(k).all()
        assert torch.equal(k, k.T)
        assert torch.linalg.eigvalsh(k.double()).min() >= -1e-5 * k.abs().max()
    k2 = ntbridge.kernel(model, x[:3], x[2:])
    assert all(torch.isfinite(v).all() for v in k2)


def test_softmax_has_forward_but_no_kernel():
    model = nn.Sequential(nn.Linear(3, 8), nn.Softmax(-1))
    with pytest.raises(errors.UnsupportedLayerError, match=r"module 1 '1' \(Softmax\).*empirical_ntk"):
        ntbridge.ntk(model, torch.randn(2, 3))
    with pytest.raises(errors.UnsupportedLayerError, match="dim=-1"):
        ntbridge.convert(nn.Softmax())


def test_rrelu_in_training_mode_is_refused():
    with pytest.raises(errors.UnsupportedLayerError, match=r"model.eval\(\)"):
        ntbridge.convert(nn.RReLU())


@pytest.mark.parametrize("k", [1, 2, 3])
def test_rectified_monomials_match_independent_integrals(k):
    """E[relu(u)^k relu(v)^k] and E[f'(u) f'(v)] by adaptive 2D integration in float64."""
    from scipy import integrate, stats
    q1, q2, c = 1.3, 0.7, 0.4
    density = stats.multivariate_normal([0, 0], [[q1, c], [c, q2]]).pdf
    layer = ntbridge.stax.RectifiedMonomial(k)
    with jax.enable_x64(True):
        kern = ntbridge.stax.input_kernel(np.zeros((1, 1)), None, compute_ntk=True,
                                          diagonal_spatial=True)
        kern = kern.replace(nngp=np.array([[c]]), ntk=np.array([[1.0]]), cov1=np.array([q1]),
                            cov2=np.array([q2]), x1_is_x2=False, is_gaussian=True)
        out = layer.kernel_fn(kern)
    for value, g in ((out.nngp, lambda u, v: (u * v) ** k),
                     (out.ntk, lambda u, v: k * k * (u * v) ** (k - 1))):
        expected, _ = integrate.dblquad(lambda v, u: g(u, v) * density([u, v]), 0, 12, 0, 12,
                                        epsabs=1e-12, epsrel=1e-10)
        np.testing.assert_allclose(float(value[0, 0]), expected, rtol=1e-7)
