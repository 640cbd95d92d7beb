"""The empirical NTK/NNGP equal plain torch.func references on the same weights, for every
strategy; per-layer contributions; auto's choice; examples that interact; bad input."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch import nn

import ntbridge
from ntbridge import stax
from ntbridge.empirical import STRATEGIES, StrategyInfo, empirical_ntk_fn
from ntbridge.empirical.structured import affine_tail
from ntbridge.errors import BatchStatisticsWarning, InputError, InputTypeError

from helpers import frobenius_relative_error
from reference import full_ntk

TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


def deep_mlp(dtype):
    return nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 32, bias=False), nn.ReLU(), nn.Linear(32, 3)).to(dtype)


def assert_by_layer(model, x1, x2, impl, dtype):
    """Full kernel per layer: each layer equals the reference restricted to its parameters, and
    they sum to the reference on all parameters."""
    parts = ntbridge.empirical_ntk(model, x1, x2, trace_axes=(), by_layer=True, implementation=impl)
    layers = {name.rsplit(".", 1)[0] for name, _ in model.named_parameters()}
    assert set(parts) == layers
    for name, part in parts.items():
        names = {n for n, _ in model.named_parameters() if n.rsplit(".", 1)[0] == name}
        assert part.dtype == dtype
        assert frobenius_relative_error(part, full_ntk(model, x1, x2, names)) <= TOL[dtype]
    assert frobenius_relative_error(sum(parts.values()), full_ntk(model, x1, x2)) <= TOL[dtype]


@pytest.mark.slow
@pytest.mark.parametrize("impl", STRATEGIES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_deep_mlp_matches_torch_func(impl, dtype):
    model = deep_mlp(dtype)
    x1, x2 = torch.randn(7, 6, dtype=dtype), torch.randn(4, 6, dtype=dtype)
    assert_by_layer(model, x1, x2, impl, dtype)
    full = full_ntk(model, x1, x2)
    if dtype == torch.float64:  # each dtype checks one more axes rule (compiles are slow)
        got = ntbridge.empirical_ntk(model, x1, x2, implementation=impl)
        assert got.shape == (7, 4)
        assert frobenius_relative_error(got, torch.diagonal(full, dim1=2, dim2=3).mean(-1)) <= TOL[dtype]
    else:
        diag = ntbridge.empirical_ntk(model, x1, x2, trace_axes=(), diagonal_axes=(-1,),
                                      implementation=impl)
        assert diag.shape == (7, 4, 3)
        assert frobenius_relative_error(diag, torch.diagonal(full, dim1=2, dim2=3)) <= TOL[dtype]


@pytest.mark.slow
@pytest.mark.parametrize("impl", STRATEGIES)
def test_many_outputs_on_two_axes(impl):
    """Outputs (N, 3, 12): a Linear on the last axis of (N, 3, 5) inputs, 36 output units."""
    model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 12))
    x1, x2 = torch.randn(5, 3, 5), torch.randn(3, 3, 5)
    full = full_ntk(model, x1, x2)  # (N1, N2, 3, 12, 3, 12)
    got = ntbridge.empirical_ntk(model, x1, x2, implementation=impl)
    assert frobenius_relative_error(got, torch.einsum("nmaobo->nmab", full) / 12) <= 1e-5
    got = ntbridge.empirical_ntk(model, x1, x2, trace_axes=(), diagonal_axes=(1,),
                                 implementation=impl)
    assert got.shape == (5, 3, 3, 12, 12)
    assert frobenius_relative_error(got, torch.einsum("nmaoap->nmaop", full)) <= 1e-5
    sym = ntbridge.empirical_ntk(model, x1, implementation=impl)
    assert torch.equal(sym, sym.permute(1, 0, 3, 2))
    assert frobenius_relative_error(sym, torch.einsum("nmaobo->nmab", full_ntk(model, x1, x1)) / 12) <= 1e-5


@pytest.mark.slow
def test_cnn_matches_torch_func():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(),
                          nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
    x1, x2 = torch.randn(3, 3, 8, 8), torch.randn(2, 3, 8, 8)
    full = full_ntk(model, x1, x2)
    for impl in STRATEGIES:
        assert frobenius_relative_error(ntbridge.empirical_ntk(model, x1, x2, trace_axes=(), implementation=impl),
                         full) <= 1e-5


CONVS = {  # stax.Conv arguments: 1D and 2D, stride, padding (zeros, "same", circular, reflect),
    # dilation, groups (grouped and depthwise), with and without bias
    "2d stride pad": dict(in_channels=3, out_channels=4, kernel_size=(3, 3), stride=2, padding=1),
    "2d dilated grouped circular": dict(in_channels=4, out_channels=6, kernel_size=(3, 2),
                                        dilation=(2, 1), groups=2, padding=2,
                                        padding_mode="circular"),
    "1d same reflect": dict(in_channels=2, out_channels=4, kernel_size=(3,), padding="same",
                            padding_mode="reflect"),
    "1d depthwise strided": dict(in_channels=4, out_channels=4, kernel_size=(2,), stride=2,
                                 groups=4, b_std=None),
}


@pytest.mark.parametrize("name", CONVS)
def test_conv_structure_is_the_weight_gradient(name):
    """sum_p outer(rows(g)[p], patches[p]) is the gradient of <g, conv(x)> (float64, exact)."""
    kwargs = {"W_std": 1.0, "b_std": 0.5, **CONVS[name]}
    conv = stax.Conv(**kwargs)
    names = []

    def both(params, x, g):  # the gradient and the structure's factors, in one program
        grads = jax.grad(lambda p: jnp.vdot(g, conv.apply_fn(p, x)))(params)
        rules = conv.structure(params, x)
        names.extend(rules)
        weight = jnp.einsum("npc,npk->ck", rules["weight"].rows(g), rules["weight"].patches)
        expected = jnp.moveaxis(grads["weight"], 1, -1).reshape(weight.shape)  # (out, J, in / G)
        bias = (rules["bias"].rows(g).sum((0, 1)), grads["bias"]) if "bias" in params else ()
        return weight, expected, bias

    # Gaussian draws by numpy: jax.random's float64 normal alone compiles for seconds
    rng = np.random.default_rng(0)
    draw = lambda s: rng.standard_normal(s.shape)
    with jax.enable_x64(True):
        shape = (2, kwargs["in_channels"], *(9, 8)[:len(kwargs["kernel_size"])])
        params = jax.tree.map(draw, jax.eval_shape(lambda: conv.init_fn(jax.random.key(0),
                                                                         shape)[1]))
        x = draw(jax.ShapeDtypeStruct(shape, jnp.float64))
        g = draw(jax.eval_shape(conv.apply_fn, params, x))
        weight, expected, bias = jax.jit(both)(params, x, g)
        assert set(names) == set(params)
        assert weight.dtype == jnp.float64
        assert np.allclose(weight, expected, rtol=1e-12, atol=1e-12)
        if "bias" in params:
            assert np.allclose(*bias, rtol=1e-12)


@pytest.mark.slow
def test_cnn_structured_matches_torch_func_by_layer():
    """2D, float64: stride, padding, dilation, groups, circular padding; every layer's share."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2, padding=1), nn.ReLU(),
                          nn.Conv2d(4, 6, (3, 2), dilation=(2, 1), groups=2, padding=2,
                                    padding_mode="circular"), nn.ReLU(),
                          nn.Flatten(), nn.Linear(6 * 5 * 7, 3)).double()
    x1, x2 = torch.randn(3, 3, 9, 8, dtype=torch.float64), torch.randn(2, 3, 9, 8, dtype=torch.float64)
    assert_by_layer(model, x1, x2, "structured", torch.float64)
    got = ntbridge.empirical_ntk(model, x1, x2, implementation="structured")
    want = torch.diagonal(full_ntk(model, x1, x2), dim1=2, dim2=3).mean(-1)
    assert frobenius_relative_error(got, want) <= TOL[torch.float64]


def test_cnn_1d_structured_matches_torch_func():
    """1D, float32: 'same' reflect padding, a strided depthwise conv without bias."""
    model = nn.Sequential(nn.Conv1d(2, 4, 3, padding="same", padding_mode="reflect"), nn.ReLU(),
                          nn.Conv1d(4, 4, 2, stride=2, groups=4, bias=False), nn.ReLU(),
                          nn.Flatten(), nn.Linear(4 * 4, 2))
    x1, x2 = torch.randn(4, 2, 9), torch.randn(3, 2, 9)
    assert_by_layer(model, x1, x2, "structured", torch.float32)
    got = ntbridge.empirical_ntk(model, x1, implementation="structured")
    want = torch.diagonal(full_ntk(model, x1, x1), dim1=2, dim2=3).mean(-1)
    assert frobenius_relative_error(got, want) <= TOL[torch.float32]


class _SkipToOutput(nn.Module):
    """fc2(relu(fc1(x))) + fc3(x): the affine tail (fc2, fc3, +) reads the input directly."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(5, 8), nn.Linear(8, 3), nn.Linear(5, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x))) + self.fc3(x)


AFFINE_TAILS = {  # name: (model, input shape, index of the first layer of the affine tail)
    "conv in the tail": (lambda: nn.Sequential(nn.Conv2d(2, 3, 3), nn.ReLU(),
                                               nn.Conv2d(3, 4, 3, padding=1), nn.Flatten(),
                                               nn.Linear(4 * 4 * 4, 3)), (2, 6, 6), 2),
    "all affine": (lambda: nn.Sequential(nn.Conv2d(2, 3, 3), nn.Flatten(), nn.Linear(48, 3)),
                   (2, 6, 6), 0),
    "skip to the output": (_SkipToOutput, (5,), 2),
    "no affine tail": (lambda: nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3),
                                             nn.Tanh()), (5,), 4),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", AFFINE_TAILS)
def test_affine_tail_cotangents(name):
    """The affine last layers' VJP, taken once for all examples, gives every layer's exact share."""
    make, shape, tail = AFFINE_TAILS[name]
    model = make().double()
    x1, x2 = torch.randn(3, *shape, dtype=torch.float64), torch.randn(2, *shape, dtype=torch.float64)
    assert affine_tail(ntbridge.convert(model).layers) == tail
    assert_by_layer(model, x1, x2, "structured", torch.float64)


def test_auto_ranks_without_compiling(monkeypatch):
    """auto estimates every candidate from its lowered program; none is compiled to choose."""
    graph = ntbridge.convert(deep_mlp(torch.float32))
    monkeypatch.setattr(jax.stages.Lowered, "compile",
                        lambda *args, **kwargs: pytest.fail("a candidate was compiled"))
    info = empirical_ntk_fn(graph, "auto").plan(graph.params, jnp.ones((4, 6)))[1]
    assert set(info.costs) == set(STRATEGIES)


def test_auto_without_a_lowered_cost_analysis(monkeypatch):
    """As on CUDA (a PJRT plug-in), the lowered program has no cost analysis: auto has the CPU
    client analyse the same program, and the estimates (so the choice) are the same."""
    graph = ntbridge.convert(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(),
                                           nn.Linear(4 * 6 * 6, 5)))
    x = jnp.ones((3, 3, 8, 8))
    expected = empirical_ntk_fn(graph, "auto").plan(graph.params, x, trace_axes=())[1]
    original, calls = jax.stages.Lowered.cost_analysis, []

    def on_platform_then_on_cpu(self):
        calls.append(self)
        return None if len(calls) % 2 else original(self)

    monkeypatch.setattr(jax.stages.Lowered, "cost_analysis", on_platform_then_on_cpu)
    ntbridge.programs.clear()  # the choice is cached: make it again
    info = empirical_ntk_fn(graph, "auto").plan(graph.params, x, trace_axes=())[1]
    assert len(calls) == 2 * len(STRATEGIES)
    assert info.costs == expected.costs and info.implementation == expected.implementation


def test_auto_reports_its_choice_and_caches_it():
    model = deep_mlp(torch.float32)
    x1, x2 = torch.randn(7, 6), torch.randn(4, 6)
    k, info = ntbridge.empirical_ntk(model, x1, x2, return_info=True)
    assert isinstance(info, StrategyInfo) and info.implementation in STRATEGIES
    assert set(info.costs) == set(STRATEGIES) and info.implementation in info.reason
    best = min(info.costs, key=lambda s: info.costs[s]["estimated_s"])
    assert info.implementation == best
    assert frobenius_relative_error(k, torch.einsum("nmoo->nm", full_ntk(model, x1, x2)) / 3) <= 1e-5
    assert ntbridge.empirical_ntk(model, x1 + 1, x2, return_info=True)[1] is info  # cached


def test_jax_level_bare_apply_fn():
    """A bare apply_fn and a params pytree: jacobian and ntvp; by_layer groups the top-level keys."""
    params = {"a": jnp.arange(6.0).reshape(2, 3) / 5, "b": jnp.array([0.5, -1.0])}
    apply_fn = lambda p, x: jnp.tanh(x @ p["a"].T) * p["b"]
    x1, x2 = jnp.linspace(-1, 1, 12).reshape(4, 3), jnp.ones((2, 3))
    j = lambda x: jax.vmap(jax.jacrev(lambda p, xi: apply_fn(p, xi[None])[0]), (None, 0))(params, x)
    want = jax.jit(lambda x1, x2: {k: jnp.einsum("no...,mp...->nmop", j(x1)[k], j(x2)[k])
                                   for k in params})(x1, x2)  # one program, not op by op
    for impl in ("jacobian", "ntvp", "auto"):
        parts, info = empirical_ntk_fn(apply_fn, impl)(params, x1, x2, trace_axes=(),
                                                        by_layer=True, return_info=True)
        assert info.implementation in ("jacobian", "ntvp")
        for name in params:
            assert jnp.allclose(parts[name], want[name], rtol=1e-5, atol=1e-6)
    with pytest.raises(InputError, match="structured"):
        empirical_ntk_fn(apply_fn, "structured")(params, x1, x2)


def test_batch_statistics_use_the_joint_batch():
    bn = nn.BatchNorm1d(8, track_running_stats=False)  # batch statistics in train and eval mode
    model = nn.Sequential(nn.Linear(4, 8), bn, nn.ReLU(), nn.Linear(8, 2)).double().eval()
    with torch.no_grad():
        model[1].weight.uniform_(0.5, 1.5)
        model[1].bias.uniform_(-0.5, 0.5)
    x1, x2 = torch.randn(5, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    k, info = ntbridge.empirical_ntk(model, x1, x2, trace_axes=(), return_info=True)
    assert info.implementation == "jacobian" and "interact" in info.reason
    assert frobenius_relative_error(k, full_ntk(model, x1, x2, batch=True)) <= 1e-10
    for impl in ("ntvp", "structured"):
        with pytest.raises(InputError, match="interact"):
            ntbridge.empirical_ntk(model, x1, x2, implementation=impl)
    f = model(torch.cat([x1, x2])).detach()
    assert frobenius_relative_error(ntbridge.empirical_nngp(model, x1, x2), f[:5] @ f[5:].T / 2) <= 1e-10


def test_batch_statistics_warn_naming_the_module():
    """Training-mode BatchNorm: a block of the kernel changes with the other examples of the call,
    so both empirical kernels warn at the caller's line, naming the module and the remedy."""
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2)).double()
    x1, x2 = torch.randn(5, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    message = (r"module '1' \(BatchNorm1d\) in training mode normalises with the batch's own "
               r"statistics, so this empirical kernel is that of the joint batch cat\(x1, x2\).*"
               r"Call model.eval\(\)")
    for fn in (ntbridge.empirical_ntk, ntbridge.empirical_nngp):
        with pytest.warns(BatchStatisticsWarning, match=message) as record:
            whole = fn(model, x1, x2)
        assert record[0].filename == __file__
        with pytest.warns(BatchStatisticsWarning):
            part = fn(model, x1, x2[:2])
        assert frobenius_relative_error(part, whole[:, :2]) > 1e-3  # the same pairs, another batch
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ntbridge.empirical_ntk(model.eval(), x1, x2)


def test_empirical_nngp_and_symmetry():
    model = deep_mlp(torch.float32)
    x = torch.randn(6, 6)
    full = ntbridge.empirical_ntk(model, x, trace_axes=())
    assert torch.equal(full, full.permute(1, 0, 3, 2))
    f = model(x).detach()
    assert frobenius_relative_error(ntbridge.empirical_nngp(model, x), f @ f.T / 3) <= 1e-5


def test_bad_input():
    model = deep_mlp(torch.float32)
    x = torch.randn(3, 6)
    for kwargs in ({"trace_axes": (2,)}, {"trace_axes": (0,)}, {"trace_axes": (-1, 1)},
                   {"trace_axes": (-1,), "diagonal_axes": (1,)}, {"diagonal_axes": (-3,)}):
        with pytest.raises(InputError, match="axes"):
            ntbridge.empirical_ntk(model, x, **kwargs)
    with pytest.raises(InputError, match="implementation"):
        ntbridge.empirical_ntk(model, x, implementation="fast")
    with pytest.raises(InputError, match="no parameters"):
        ntbridge.empirical_ntk(nn.Sequential(nn.ReLU()), x)
    with pytest.raises(ntbridge.errors.ShapeError, match="x1"):
        ntbridge.empirical_ntk(model, torch.randn(3, 5))
    with pytest.raises(InputTypeError, match="model.to"):
        ntbridge.empirical_ntk(model, x.double())


@pytest.mark.slow
@pytest.mark.parametrize("implementation", ["jacobian", "ntvp", "structured", "auto"])
def test_grouped_cnn_every_strategy_tiled_over_devices(implementation):
    model = nn.Sequential(nn.Conv1d(4, 8, 3, groups=2, padding=1), nn.ReLU(), nn.Flatten(),
                          nn.Linear(8 * 5, 3)).double()
    x1, x2 = torch.randn(5, 4, 5, dtype=torch.float64), torch.randn(3, 4, 5, dtype=torch.float64)
    expected = full_ntk(model, x1, x2)
    for options in ({}, {"batch_size": 2, "device_count": 2}):
        got = ntbridge.empirical_ntk(model, x1, x2, implementation=implementation, trace_axes=(),
                                     **options)
        assert frobenius_relative_error(got, expected) <= 1e-10
