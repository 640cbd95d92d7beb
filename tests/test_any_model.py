"""The public empirical entry points on models no converter covers (the torch.export zoo).

``empirical_ntk`` against torch.func's jacobian contraction, ``empirical_nngp`` against the
outputs' products, ``monte_carlo`` against a torch-side loop over the same re-initialisations, the
path reported by ``return_info``, token ids, tiling, the translation's cache, and the analytic
kernels' refusals. Each model is built once per dtype (a module-level cache), so its translation
is exported once.
"""

from __future__ import annotations

import copy

import jax
import pytest
import torch
from torch import nn

import ntbridge
from ntbridge.converters.export import translation as translated
from ntbridge import sample_seed
from ntbridge.errors import UnsupportedLayerError

from export_zoo import ZOO, example
from helpers import max_relative_error
from reference import full_ntk

NTK_RTOL = {torch.float64: 1e-10, torch.float32: 1e-5}


# the LSTM by "structured" (its shared weights fall back to Jacobians), the attention in float32;
# the transformer (slow to export and compile) in tests/test_export.py's test of the same name
CASES = [(name, "jacobian") for name in ZOO if name not in ("lstm", "attention", "transformer")] + [
    ("resnet", "structured"), ("lstm", "structured"), ("custom", "structured"),
    ("embedding", "ntvp"), ("custom", "auto")]


@pytest.mark.slow
@pytest.mark.parametrize("name, implementation", CASES)
def test_empirical_ntk_matches_torch_func(name, implementation):
    model, x1, x2 = example(name)
    k, info = ntbridge.empirical_ntk(model, x1, x2, trace_axes=(), implementation=implementation,
                                     return_info=True)
    expected = full_ntk(model, x1, x2, batch=True)  # independent examples: the joint batch's rows
    assert k.dtype == torch.float64 and k.shape == expected.shape
    assert max_relative_error(k, expected) <= NTK_RTOL[torch.float64]
    path = "torch" if implementation == "auto" else "torch.export"  # see test_first_calls.py
    assert info.path == path and f"path={path!r}" in repr(info)


def test_structured_applies_to_translated_linear_and_conv_steps():
    """The structured plan covers the convolutions and the head of the ResNet; the LSTM's
    recurrent weight is shared by its time steps and left to Jacobians."""
    from ntbridge.empirical.structured import structured_plan

    plans = {}
    for name in ("resnet", "lstm"):
        model, x1, _ = example(name)
        with jax.enable_x64(True):  # float64's, as empirical_ntk's: the translation cached there
            graph = translated.empirical_graph(model, x1, {})
        nodes, chosen = structured_plan(graph)
        plans[name] = {p for i in chosen for p in nodes[i].param_names}
    assert {"conv1.weight", "conv2.weight", "down.weight", "fc.weight", "fc.bias"} <= plans["resnet"]
    assert "out.weight" in plans["lstm"] and "rnn.weight_hh_l0" not in plans["lstm"]


@pytest.mark.slow
def test_float32_and_auto():
    model, x1, x2 = example("attention", torch.float32)
    k, info = ntbridge.empirical_ntk(model, x1, x2, trace_axes=(), return_info=True)
    assert k.dtype == torch.float32 and info.path == "torch.export"
    assert info.implementation in ("jacobian", "ntvp", "structured")
    assert max_relative_error(k, full_ntk(model, x1, x2, batch=True)) <= NTK_RTOL[torch.float32]


def test_converted_models_keep_the_layer_path():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).double()
    _, info = ntbridge.empirical_ntk(model, torch.randn(3, 4, dtype=torch.float64),
                                     return_info=True)
    assert info.path == "layers"


def test_token_ids_and_nngp():
    """Integer ids into nn.Embedding: the NTK (w.r.t. the parameters) and the outputs' products."""
    model, ids1, ids2 = example("embedding")
    assert ids1.dtype == torch.int64
    k = ntbridge.empirical_ntk(model, ids1, ids2, trace_axes=())
    assert k.dtype == torch.float64
    assert max_relative_error(k, full_ntk(model, ids1, ids2, batch=True)) <= NTK_RTOL[torch.float64]
    with torch.no_grad():
        f1, f2 = model(ids1), model(ids2)
    nngp = ntbridge.empirical_nngp(model, ids1, ids2, trace_axes=())
    assert max_relative_error(nngp, torch.einsum("ai,bj->abij", f1, f2)) <= 1e-12
    traced = ntbridge.empirical_nngp(model, ids1)
    assert max_relative_error(traced, f1 @ f1.T / f1.shape[1]) <= 1e-12 and torch.equal(traced, traced.T)


def test_tiles_equal_the_whole():
    model, x1, x2 = example("custom")
    x1 = torch.cat([x1, x2])
    whole = ntbridge.empirical_ntk(model, x1, x2, trace_axes=(), implementation="jacobian")
    tiled = ntbridge.empirical_ntk(model, x1, x2, trace_axes=(), implementation="jacobian",
                                   batch_size=2)
    torch.testing.assert_close(tiled, whole, rtol=1e-12, atol=1e-14)
    symmetric = ntbridge.empirical_nngp(model, x1, batch_size=2)
    assert torch.equal(symmetric, symmetric.T)
    torch.testing.assert_close(symmetric, ntbridge.empirical_nngp(model, x1), rtol=1e-12, atol=0)


def test_translation_is_exported_once_and_reads_current_weights(monkeypatch):
    model, x1, x2 = copy.deepcopy(example("custom"))
    exports, translate = [], translated.translate
    monkeypatch.setattr(translated, "translate", lambda *args: exports.append(1) or translate(*args))
    first = ntbridge.empirical_ntk(model, x1, x2, implementation="jacobian")
    with torch.no_grad():
        model.linear.weight.mul_(2.0)  # in place
    model.linear.bias = nn.Parameter(model.linear.bias.detach() + 1.0)  # a new tensor
    second = ntbridge.empirical_ntk(model, x1, x2, implementation="jacobian")
    expected = full_ntk(model, x1, x2, batch=True).diagonal(dim1=2, dim2=3).mean(-1)
    assert len(exports) == 1
    assert max_relative_error(second, expected) <= NTK_RTOL[torch.float64]
    assert max_relative_error(first, expected) > 1e-3


def reference_monte_carlo(model: nn.Module, x1: torch.Tensor, n_samples: int, seed: int):
    """The mean and standard error of torch.func's traced NTK over re-initialisations drawn as
    ``ntbridge.empirical.reinit`` documents (reset_parameters, submodules first)."""
    sample, kernels = copy.deepcopy(model), []
    for s in range(n_samples):
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(sample_seed(seed, s))
            for m in reversed(list(sample.modules())):
                if list(m.parameters(recurse=False)):
                    m.reset_parameters()
        kernels.append(full_ntk(sample, x1, x1, batch=True).diagonal(dim1=2, dim2=3).mean(-1))
    k = torch.stack(kernels)
    return k.mean(0), k.std(0) / n_samples ** 0.5


@pytest.mark.slow
def test_monte_carlo_reinitialises_with_reset_parameters():
    model, ids, _ = example("embedding")
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    estimates = list(ntbridge.monte_carlo(model, ids, n_samples=[1, 3], seed=5))
    mean, error = reference_monte_carlo(model, ids, 3, seed=5)
    assert [e.n_samples for e in estimates] == [1, 3]
    assert max_relative_error(estimates[-1].mean, mean) <= 1e-10
    assert max_relative_error(estimates[-1].standard_error, error) <= 1e-8
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in weights.items())  # untouched
    nngp = ntbridge.monte_carlo(model, ids, n_samples=2, get="nngp")
    assert nngp.mean.shape == (3, 3) and torch.equal(nngp.mean, nngp.mean.T)


def test_analytic_kernels_refuse_a_module_without_a_rule():
    model = nn.Sequential(nn.GRU(4, 6, batch_first=True)).eval()
    x = torch.randn(3, 5, 4)
    for kernel in (ntbridge.ntk, ntbridge.nngp, ntbridge.kernel):
        with pytest.raises(UnsupportedLayerError, match=r"^module 0 '0' \(GRU\) has no "
                                                        r"infinite-width kernel rule.*empirical_ntk"):
            kernel(model, x)


def test_train_mode_is_refused_for_translated_models():
    model, x1, _ = example("transformer")
    model.train()
    try:
        with pytest.raises(UnsupportedLayerError, match=r"module 'encoder.layers.0.self_attn' "
                                                        r"\(MultiheadAttention\) is in training mode"
                                                        r".*model.eval\(\)"):
            ntbridge.empirical_ntk(model, x1)
    finally:
        model.eval()
