"""``implementation="auto"`` on models without a converter: the compile weighed against the work
(``ntbridge.empirical.payback``), the torch-side strategy (``torch.func``) against the compiled
ones, the choice reported, the switch to a compiled program once it pays back, and gradients of a
torch-side kernel."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ntbridge
from ntbridge import first_calls
from ntbridge.empirical import STRATEGIES, payback
from ntbridge.empirical.axes import Axes
from ntbridge.empirical import torch_func
from ntbridge.empirical.torch_func import jacobian_fn, torch_ntk

from export_zoo import example
from helpers import max_relative_error
from reference import full_ntk


@pytest.fixture(autouse=True)
def _fresh_records():
    payback.clear()
    yield
    payback.clear()


AXES = [dict(trace_axes=(-1,)), dict(trace_axes=()), dict(trace_axes=(), diagonal_axes=(-1,))]


def _reference(model, x1, x2, trace_axes, diagonal_axes=()):
    """torch.func's jacobian contraction (tests/reference.py) under the axes rules."""
    full = full_ntk(model, x1, x1 if x2 is None else x2)  # (N1, N2, O, O)
    if trace_axes:
        return full.diagonal(0, 2, 3).mean(-1)
    return full.diagonal(0, 2, 3) if diagonal_axes else full


@torch.no_grad()
def test_torch_side_equals_the_compiled_strategy():
    model, x1, x2 = example("custom")  # float64
    k, info = ntbridge.empirical_ntk(model, x1, x2, trace_axes=(), return_info=True)
    assert info.implementation == "torch.func" and info.path == "torch"
    want = ntbridge.empirical_ntk(model, x1, x2, trace_axes=(), implementation="jacobian")
    assert k.shape == want.shape == (3, 2, 4, 4) and k.dtype == torch.float64
    assert max_relative_error(k, want) <= 1e-10


@torch.no_grad()
@pytest.mark.parametrize("axes", AXES)
def test_torch_side_axes_and_symmetry(axes):
    model, x1, x2 = example("custom")
    for b in (x2, None):
        k, info = ntbridge.empirical_ntk(model, x1, b, return_info=True, **axes)
        assert info.implementation == "torch.func"
        assert max_relative_error(k, _reference(model, x1, b, **axes)) <= 1e-10
        if b is None:  # exactly symmetric
            perm = Axes.of(2, axes["trace_axes"], axes.get("diagonal_axes", ())).swap_perm(k.ndim)
            assert torch.equal(k, k.permute(perm))


@pytest.mark.parametrize("held", [True, False])
def test_blocks_of_examples_do_not_change_the_kernel(held, monkeypatch):
    model, x1, _ = example("custom")
    x = torch.cat([x1, x1 + 0.5])  # 6 examples: with budget=1, blocks of one
    if not held:  # x2's Jacobians recomputed for each block of x1
        monkeypatch.setattr(torch_func, "HELD_BYTES", 1)
    axes = Axes.of(2, (), ())
    whole = torch_ntk(model, x, x1, axes)
    assert max_relative_error(torch_ntk(model, x, x1, axes, budget=1), whole) <= 1e-12
    known = jacobian_fn(model)(x[:3])  # the first rows' Jacobians, given
    for budget in (1, None):
        opts = {} if budget is None else {"budget": budget}
        assert max_relative_error(torch_ntk(model, x, x1, axes, known=known, **opts), whole) <= 1e-12
    sym = torch_ntk(model, x, None, axes, budget=1, known=known)
    assert max_relative_error(sym, torch_ntk(model, x, x, axes)) <= 1e-12
    assert torch.equal(sym, sym.permute(axes.swap_perm(sym.ndim)))


@torch.no_grad()
@pytest.mark.parametrize("closer", [False, True])
def test_the_choice_is_reported_with_its_estimates(closer, monkeypatch):
    """From the one-forward bound, or (where the bound does not settle it) from Jacobians of the
    first examples timed, which the kernel then reuses."""
    model, x1, x2 = example("custom")
    if closer:
        monkeypatch.setattr(payback, "torch_bound", lambda *a: 1e9)
        monkeypatch.setattr(payback, "SECONDS_PER_TENSOR", 1e6)
    k, info = ntbridge.empirical_ntk(model, x1, x2, trace_axes=(), return_info=True)
    assert set(info.costs) == {"torch.func", "compile"}
    assert "cannot pay back" in info.reason and "torch.func needs about" in info.reason
    assert info.costs["torch.func"]["estimated_s"] < info.costs["compile"]["estimated_s"]
    assert max_relative_error(k, _reference(model, x1, x2, ())) <= 1e-10


def test_the_compile_is_chosen_once_torch_time_would_exceed_it(monkeypatch):
    """Rent, then buy: torch-side while the calls' torch.func time stays below the compile's
    estimate, compiled from the call that would pass it, that program reused, and left for
    torch.func again where it proves slower."""
    model, x1, x2 = example("custom")
    clock = iter(range(100))  # each call's torch-side time measured as 1 s
    monkeypatch.setattr(first_calls, "time", type("Clock", (), {"perf_counter": lambda: next(clock)}))
    monkeypatch.setattr(payback, "torch_bound", lambda *a: 1.0)
    monkeypatch.setattr(payback, "torch_seconds", lambda *a: (1.0, None))
    monkeypatch.setattr(payback, "SECONDS_PER_TENSOR", 1.25)  # 2 tensors: 2.5 s to compile
    chosen = [ntbridge.empirical_ntk(model, x1, x2, return_info=True)[1] for _ in range(4)]
    assert [i.implementation for i in chosen[:2]] == ["torch.func"] * 2
    assert chosen[2].implementation in STRATEGIES and "pays back" in chosen[2].reason
    assert chosen[2].path == "torch.export" and "compile" in chosen[2].costs
    assert chosen[3].implementation in STRATEGIES and "is compiled" in chosen[3].reason
    (record,) = payback._RECORDS.values()  # a compiled program slower than torch.func: left
    record.steady = {shapes: 100.0 for shapes in record.steady}
    _, info = ntbridge.empirical_ntk(model, x1, x2, return_info=True)
    assert info.implementation == "torch.func" and "compiled program's last call" in info.reason


def test_requests_that_are_not_weighed_take_the_pipeline():
    model, x1, x2 = example("custom")
    for options in (dict(by_layer=True), dict(batch_size=2), dict(implementation="jacobian")):
        _, info = ntbridge.empirical_ntk(model, x1, x2, return_info=True, **options)
        assert info.implementation in STRATEGIES and info.path == "torch.export"
    converted = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    _, info = ntbridge.empirical_ntk(converted, torch.randn(3, 3, dtype=torch.float64),
                                     return_info=True)
    assert info.path == "layers"


def test_gradients_of_a_torch_side_kernel_are_the_pipelines():
    model, x1, x2 = example("custom")
    x = x1.clone().requires_grad_(True)
    grads, infos = [], []
    for implementation in ("auto", "jacobian"):
        model.zero_grad()
        x.grad = None
        k, info = ntbridge.empirical_ntk(model, x, x2, implementation=implementation,
                                         return_info=True)
        infos.append(info)
        (k ** 2).sum().backward()
        grads.append([x.grad.clone(), *[p.grad.clone() for p in model.parameters()]])
    assert [i.implementation for i in infos] == ["torch.func", "jacobian"]
    for a, b in zip(*grads):
        assert max_relative_error(a, b) <= 1e-10


class _Special(nn.Module):
    def forward(self, h):
        return torch.special.i0(h)  # no translation to JAX


@torch.no_grad()
def test_a_model_that_cannot_be_translated_stays_torch_side(monkeypatch):
    monkeypatch.setattr(payback, "SECONDS_PER_TENSOR", 0.0)  # compiling always "pays back"
    model = nn.Sequential(nn.Linear(3, 4), _Special(), nn.Linear(4, 2)).double()
    x = torch.randn(3, 3, dtype=torch.float64)
    k, info = ntbridge.empirical_ntk(model, x, return_info=True)
    assert info.implementation == "torch.func" and "no compiled program" in info.reason
    assert max_relative_error(k, _reference(model, x, None, (-1,))) <= 1e-10
