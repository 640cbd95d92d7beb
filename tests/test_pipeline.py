"""The request pipeline's shape: typed specs, one builder per spec type, a prepared request that
runs several kernels without converting the model again, the protocol empirical code reads a
graph through, and the tiling telemetry returned by the call."""

from __future__ import annotations

import dataclasses
import typing

import pytest
import torch
from torch import nn

import ntbridge
from ntbridge import pipeline, specs
from ntbridge.converters.export import translation as translated
from ntbridge.empirical import Initialisable, ModelGraph
from ntbridge.errors import InputError, InputTypeError
from ntbridge.tiling import distributed

MODEL = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
X = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))


class Cumulative(nn.Module):  # no converter: the empirical kernels translate it
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(4, 8)

    def forward(self, x):
        return torch.cumsum(self.a(x), -1) * torch.sigmoid(self.b(x))


def test_every_spec_type_has_one_builder():
    assert set(pipeline.BUILDERS) == set(typing.get_args(specs.Spec))


@pytest.mark.parametrize("make, error, match", [
    (lambda: specs.Analytic("ntkk"), InputError, "get must be"),
    (lambda: specs.Analytic(()), InputError, "get must be"),
    (lambda: specs.EmpiricalNTK("fast"), InputError, "implementation must be one of"),
    (lambda: specs.EmpiricalNNGP(trace_axes="x"), InputError, "trace_axes must be a tuple"),
    (lambda: specs.MonteCarlo("both"), InputError, "get must be 'ntk' or 'nngp'"),
    (lambda: specs.MonteCarlo(seed=1.5), InputTypeError, "seed must be an int"),
])
def test_specs_refuse_bad_fields(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_specs_are_frozen_and_normalized():
    spec = specs.EmpiricalNTK(trace_axes=[-1], diagonal_axes=range(0))
    assert (spec.trace_axes, spec.diagonal_axes) == ((-1,), ())
    assert specs.Analytic(["nngp", "ntk"]).get == ("nngp", "ntk")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.by_layer = True
    assert hash(spec) == hash(specs.EmpiricalNTK(trace_axes=(-1,)))


def test_a_prepared_request_runs_other_kernels_without_converting_again(monkeypatch):
    calls = []
    convert = pipeline.convert
    monkeypatch.setattr(pipeline, "convert", lambda *a, **k: calls.append(1) or convert(*a, **k))
    prepared = pipeline.prepare(pipeline.Request(MODEL, X, None, specs.Analytic("ntk")))
    ntk = pipeline.execute(prepared)
    nngp = pipeline.execute(prepared, specs.Analytic("nngp"))
    assert len(calls) == 1
    torch.testing.assert_close(ntk.result, ntbridge.ntk(MODEL, X), rtol=0, atol=0)
    torch.testing.assert_close(nngp.result, ntbridge.nngp(MODEL, X), rtol=0, atol=0)
    assert ntk.graph is prepared.graph and ntk.tiling.tiles == 1


@pytest.mark.slow
def test_monte_carlo_converts_the_model_once(monkeypatch):
    calls = []
    convert = translated.convert  # empirical requests convert through the translated route
    monkeypatch.setattr(translated, "convert", lambda *a, **k: calls.append(1) or convert(*a, **k))
    estimates = list(ntbridge.monte_carlo(MODEL, X, n_samples=[1, 2, 4], get="nngp"))
    assert [e.n_samples for e in estimates] == [1, 2, 4] and len(calls) == 1


def test_graphs_meet_the_empirical_protocols():
    converted = ntbridge.convert(MODEL)
    exported = translated.empirical_graph(Cumulative().eval(), X, {})
    assert exported.path == "torch.export"
    assert isinstance(converted, Initialisable) and isinstance(exported, ModelGraph)
    assert not isinstance(exported, Initialisable)  # monte_carlo re-initialises it torch-side


def test_tiling_information_is_returned_by_the_call():
    k, info = ntbridge.ntk(MODEL, torch.randn(10, 4), batch_size=4, return_info=True)
    assert k.shape == (10, 10)
    assert (info.tiles, info.computed, info.tile) == (6, 6, (4, 4))  # 3 x 3 blocks, upper half
    assert 0 < info.tile_bytes <= info.budget
    kernels, info = ntbridge.kernel(MODEL, X, torch.randn(3, 4), return_info=True)
    assert isinstance(kernels, ntbridge.Kernels) and info.tile == (6, 3)


def test_request_names_are_shared_values_of_the_request():
    a = distributed.request_name("analytic", 10, 10, 4, True)
    assert a == distributed.request_name("analytic", 10, 10, 4, True)
    assert a != distributed.request_name("analytic", 10, 10, 5, True)


def test_a_moved_key_value_store_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(distributed, "distributed_client", lambda: object())
    with pytest.raises(ntbridge.errors.ProcessError, match="no longer offers jax.distributed"):
        distributed.client()
