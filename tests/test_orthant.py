"""Gaussian orthant probabilities and the closed-form kernel of ReLU, LeakyReLU and Abs after
eval-mode BatchNorm with shifts (``stax.orthant``).

References written independently of the rule under test: the orthant probability as Plackett's
one-dimensional integral in 30-digit arithmetic (mpmath), and each channel's terms by the
piecewise rule (``stax.piecewise``: a closed-form inner expectation, one outer Gauss-Legendre
rule), which sees ``u -> f(A u + D)`` as a function of the Gaussian ``u`` with a kink at ``-D/A``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ntbridge.stax.orthant import _channel_terms, _groups, orthant, quadrant_moments
from ntbridge.stax.piecewise import Piece, Pieces, piecewise_rule
from ntbridge.stax.quadrature import correlation
from ntbridge.stax.sources import ChannelMap


@pytest.fixture(autouse=True)
def _x64():
    """float64 in this module's tests only (the references are float64)."""
    with jax.enable_x64(True):
        yield


RHOS = [-1.0, -0.9999999, -0.99, -0.93, -0.92, -0.5, 0.0, 0.3, 0.9, 0.925, 0.97, 0.9999999, 1.0]
THRESHOLDS = [(0.3, 0.3), (0.3, 0.3 + 1e-6), (1.5, 1.49), (-2.0, -2.1), (0.0, 0.0), (3.0, -3.0),
              (-0.5, 0.5), (6.0, 5.0)]


def plackett(h: float, k: float, rho: float) -> float:
    """``P(Z1 > h, Z2 > k)`` as ``Phi(-h) Phi(-k)`` plus the bivariate density integrated over
    correlations from 0 to ``rho``, at 30 digits (at +-1 by the limits)."""
    mpmath = pytest.importorskip("mpmath")
    with mpmath.workdps(30):
        h, k = mpmath.mpf(h), mpmath.mpf(k)
        tail = lambda x: mpmath.erfc(x / mpmath.sqrt(2)) / 2
        if abs(rho) == 1:
            return float(tail(max(h, k)) if rho > 0 else max(0, tail(h) - tail(-k)))
        density = lambda r: mpmath.exp(-(h * h - 2 * r * h * k + k * k) / (2 * (1 - r * r))) / (
            2 * mpmath.pi * mpmath.sqrt(1 - r * r))
        return float(tail(h) * tail(k) + mpmath.quad(density, [0, mpmath.mpf(rho)]))


def test_orthant_matches_plackett_integral_in_both_regimes_and_at_the_limits():
    (h, k), rho = np.array(THRESHOLDS * len(RHOS)).T, np.repeat(RHOS, len(THRESHOLDS))
    got = np.asarray(jax.jit(orthant)(h, k, rho))
    want = np.array([plackett(*case) for case in zip(h, k, rho)])
    assert np.abs(got - want).max() < 1e-14, (h, k, rho)[np.abs(got - want).argmax()]


def test_quadrant_moments_at_correlation_one_are_those_of_one_normal():
    """``Z2 = Z1``: ``P = Phi(-m)``, ``E[Z; Z > m] = phi(m)``, ``E[Z**2; Z > m] = Phi(-m) + m
    phi(m)``, with ``m = max(h, k)``; the formulas' ratios ``0 / 0`` are their limits."""
    from scipy.stats import norm

    h, k = np.array(THRESHOLDS).T
    m = np.maximum(h, k)
    got = jax.jit(quadrant_moments)(h, k, np.ones_like(h))
    want = (norm.sf(m), norm.pdf(m), norm.pdf(m), norm.sf(m) + m * norm.pdf(m))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-7)  # 1 - rho**2's floor: sqrt(eps)


def reference_terms(c, q1, q2, a, d, mu, s, slopes):
    """Channels' terms (arrays of one shape) by the piecewise rule: ``f(A u + D)`` as pieces in
    ``u``; the own NTK terms of a trained gamma and beta."""
    lower = jnp.where(a > 0, slopes[0], slopes[1])
    upper = jnp.where(a > 0, slopes[1], slopes[0])
    as_pieces = lambda make: Pieces((-d / a,), (make(lower), make(upper)))
    value = as_pieces(lambda slope: Piece((slope * d, slope * a)))
    own = as_pieces(lambda slope: Piece((-slope * mu / s, slope / s)))   # f'(y) (u - mu) / s
    dot = as_pieces(lambda slope: Piece((slope,)))
    nngp, carried = piecewise_rule(value)(c, q1, q2)
    return nngp, carried, piecewise_rule(own)(c, q1, q2)[0] + piecewise_rule(dot)(c, q1, q2)[0]


# entries (c, q1, q2): correlations 0.6, 1, -0.7, 0, 1 - 1e-6, -1
ENTRIES = np.array([(0.6, 1.0, 2.0), (1.0, 1.0, 1.0), (-0.7, 0.5, 1.0), (0.0, 2.0, 0.3),
                    (0.999999 * np.sqrt(3.0), 1.0, 3.0), (-np.sqrt(2.0), 2.0, 1.0)])


@pytest.mark.slow  # 2 s or more
@pytest.mark.parametrize("slopes", [(0.01, 1.0), (-1.0, 1.0)], ids=["LeakyReLU", "Abs"])
def test_channel_terms_match_the_piecewise_rule(slopes):
    """Channels with negative and positive scales, shifts both ways, trained gamma and beta, at
    correlations +-1 and 0: float64 within 1e-10 of the reference, float32 within 1e-5, relative
    to each term's scale; NNGP, carried NTK factor and own NTK terms."""
    rng = np.random.default_rng(0)
    constants = [rng.uniform(lo, hi, 8) for lo, hi in ((-2, 2), (-1.5, 1.5), (-1, 1), (0.5, 2))]
    entry, channel = np.meshgrid(np.arange(len(ENTRIES)), np.arange(8), indexing="ij")
    (c, q1, q2), (a, d, mu, s) = ENTRIES[entry.ravel()].T, [v[channel.ravel()] for v in constants]
    want = jax.jit(reference_terms, static_argnums=7)(c, q1, q2, a, d, mu, s, slopes)
    cmap = ChannelMap((), (), (), (), gamma=True, beta=True)   # flags only: constants as arrays
    units = (a * a * np.sqrt(q1 * q2) + d * d, a * a, np.sqrt(q1 * q2) / s ** 2 + 1)
    for dtype, tol in ((jnp.float64, 1e-10), (jnp.float32, 1e-5)):
        group = [jnp.asarray(v, dtype) for v in (0 * a, a, d, mu / s, 1 / s)]
        terms = jax.jit(lambda *e: _channel_terms(*correlation(*e), group, slopes, cmap))
        got = terms(*(jnp.asarray(v, dtype) for v in (c, q1, q2)))
        for name, g, w, unit in zip(("nngp", "carried", "own"), got, want, units):
            error = np.abs(np.asarray(g, np.float64) - np.asarray(w)) / unit
            assert error.max() < tol, (dtype, name, ENTRIES[entry.ravel()[error.argmax()]])


def test_channels_with_equal_constants_are_grouped():
    cmap = ChannelMap(a=(1.0, -1.0, 2.0, 1.0), d=(0.5, 0.5, 0.1, 0.5), mu=(0.0,) * 4,
                      s=(1.0,) * 4, gamma=False, beta=True)
    groups = _groups(cmap)   # without gamma only |A| and D matter: three channels are one group
    np.testing.assert_allclose(groups[:, :3], [[0.75, 1.0, 0.5], [0.25, 2.0, 0.1]])


def test_a_channel_of_zero_scale_is_a_constant():
    """``gamma = 0``: ``y = D``, so ``E[f(y) f(y')] = f(D)**2``; gamma's term is ``f'(D)**2 E[(u -
    mu)(u' - mu)] / s**2``; likewise at zero input variances."""
    cmap = ChannelMap((), (), (), (), gamma=True, beta=False)
    for big_d, slope in ((0.7, 1.0), (-0.7, 0.01)):
        group = jnp.array([1.0, 0.0, big_d, 0.2, 0.5])  # share, A, D, mu / s, 1 / s
        entry = correlation(*(jnp.array(v) for v in (0.3, 1.0, 2.0)))
        nngp, carried, own = _channel_terms(*entry, group, (0.01, 1.0), cmap)
        np.testing.assert_allclose([nngp, carried, own],
                                   [(slope * big_d) ** 2, 0.0, slope ** 2 * (0.3 * 0.25 + 0.04)],
                                   rtol=1e-12)


@pytest.mark.slow  # 2 s or more
def test_gradients_are_finite_at_degenerate_entries():
    """Correlations +-1, zero variances, zero covariance."""
    cmap = ChannelMap((1.5,), (-0.4,), (0.3,), (1.2,), gamma=True, beta=True)
    group = jnp.asarray(_groups(cmap)[0])
    total = lambda *e: sum(_channel_terms(*correlation(*e), group, (0.01, 1.0), cmap))
    entries = np.array([(1.0, 1.0, 1.0), (-1.0, 1.0, 1.0), (0.0, 0.0, 1.0), (0.0, 0.0, 0.0),
                        (0.5, 0.25, 1.0)]).T
    grads = jax.jit(jax.vmap(jax.grad(total, argnums=(0, 1, 2))))(*entries)
    assert np.isfinite(np.asarray(grads)).all(), grads
