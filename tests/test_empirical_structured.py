"""The structured strategy's shortcuts give the kernel of the plain path: x2 = None (per-example
factors formed once), traced output axes (contracted inside the layer products), and either
contraction order of a layer's contribution."""

import pytest
import torch
from torch import nn

import ntbridge
from ntbridge.empirical import structured

from helpers import frobenius_relative_error
from reference import full_ntk


def cnn():
    """Conv head (per-example cotangents), a Conv + Flatten + Linear affine tail (shared ones)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1),
                         nn.Flatten(), nn.Linear(4 * 6 * 6, 5)).double()


@pytest.mark.slow
@pytest.mark.parametrize("trace_axes", [(-1,), ()])
def test_x2_none_equals_x2_given(trace_axes):
    """x2 = None (one side, factors formed once) equals x2 = a copy of x1 (two sides), layer by
    layer; float64 so that only rounding separates them."""
    model, x = cnn(), torch.randn(4, 3, 8, 8, dtype=torch.float64)
    kw = dict(trace_axes=trace_axes, implementation="structured", by_layer=True)
    one = ntbridge.empirical_ntk(model, x, **kw)
    two = ntbridge.empirical_ntk(model, x, x.clone(), **kw)
    assert set(one) == set(two)
    for name in one:
        assert frobenius_relative_error(one[name], two[name]) <= 1e-12


@pytest.mark.slow
@pytest.mark.parametrize("x2_size", [None, 3])
def test_traced_kernel_is_the_mean_of_the_full_kernels_diagonal(x2_size):
    model, x1 = cnn(), torch.randn(4, 3, 8, 8, dtype=torch.float64)
    x2 = None if x2_size is None else torch.randn(x2_size, 3, 8, 8, dtype=torch.float64)
    traced = ntbridge.empirical_ntk(model, x1, x2, implementation="structured")
    full = ntbridge.empirical_ntk(model, x1, x2, trace_axes=(), implementation="structured")
    assert traced.shape == full.shape[:2]
    assert frobenius_relative_error(traced, torch.diagonal(full, dim1=2, dim2=3).mean(-1)) <= 1e-12


@pytest.fixture
def fresh_programs():
    """No compiled program from before the test is used, and none it compiled outlives it."""
    ntbridge.programs.clear()
    yield
    ntbridge.programs.clear()


@pytest.mark.slow
@pytest.mark.parametrize("gram", [True, False])
@pytest.mark.parametrize("x2_size", [None, 3])
def test_both_contraction_orders_match_torch_func(monkeypatch, fresh_programs, gram, x2_size):
    """Every layer's contribution by Gram products only, or by per-example factors only (float32),
    equals torch.func's Jacobian contraction, full and traced."""
    monkeypatch.setattr(structured, "_gram_is_cheaper", lambda *args: gram)
    model, x1 = cnn().float(), torch.randn(4, 3, 8, 8)
    x2 = None if x2_size is None else torch.randn(x2_size, 3, 8, 8)
    want = full_ntk(model, x1, x1 if x2 is None else x2)
    got = ntbridge.empirical_ntk(model, x1, x2, trace_axes=(), implementation="structured")
    assert frobenius_relative_error(got, want) <= 1e-5
    got = ntbridge.empirical_ntk(model, x1, x2, implementation="structured")
    assert frobenius_relative_error(got, torch.diagonal(want, dim1=2, dim2=3).mean(-1)) <= 1e-5
