"""Models that are not nn.Sequential, traced with torch.fx: residual sums, concatenations,
functional calls, nested submodules; the combinators they become; what cannot be traced."""

import jax
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ntbridge
from ntbridge import errors, stax
from ntbridge.converters.trace import equivalents
from ntbridge.converters.trace.tracer import trace
from ntbridge.dlpack import precision, to_jax, to_torch

from helpers import frobenius_relative_error
from montecarlo import assert_within_standard_error, sample_kernels
from reference import empirical_ntk

TOL = {torch.float32: 1e-5, torch.float64: 1e-12}


def apply(model, x):
    with precision(x.dtype):
        g = ntbridge.convert(model)
        return to_torch(jax.jit(g.apply_fn)(g.params, to_jax(x)))


class ResNet(nn.Module):
    """h = inp(x); h = h + fc2(relu(fc1(h))); out(relu(h))."""

    def __init__(self, d=4, width=64, d_out=2):
        super().__init__()
        self.inp, self.out = nn.Linear(d, width), nn.Linear(width, d_out)
        self.fc1, self.fc2 = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x):
        h = self.inp(x)
        h = h + self.fc2(F.relu(self.fc1(h)))
        return self.out(torch.relu(h))


class DenseNet(nn.Module):
    """a = relu(fc1(x)); b = relu(fc2(a)); out(cat([a, b], 1)): a concat of unequal widths."""

    def __init__(self, d=4, w1=32, w2=64, d_out=2):
        super().__init__()
        self.fc1, self.fc2, self.out = nn.Linear(d, w1), nn.Linear(w1, w2), nn.Linear(w1 + w2, d_out)

    def forward(self, x):
        a = self.fc1(x).relu()
        b = F.relu(self.fc2(a))
        return self.out(torch.cat([a, b], dim=1))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("make", [ResNet, DenseNet])
def test_forward_and_empirical_ntk_match_torch(make, dtype):
    model = make().to(dtype)
    x1, x2 = torch.randn(6, 4, dtype=dtype), torch.randn(3, 4, dtype=dtype)
    assert frobenius_relative_error(apply(model, x1), model(x1).detach()) <= TOL[dtype]
    got = ntbridge.empirical_ntk(model, x1, x2)
    assert got.dtype == dtype and frobenius_relative_error(got, empirical_ntk(model, x1, x2)) <= TOL[dtype]


def test_resnet_nodes_names_and_dag():
    g = ntbridge.convert(ResNet())
    assert [(n.name, type(n.module).__name__, n.inputs) for n in g.layers] == [
        ("inp", "Linear", (-1,)), ("fc1", "Linear", (0,)), ("relu", "ReLU", (1,)),
        ("fc2", "Linear", (2,)), ("add", "Add", (0, 3)), ("relu_1", "ReLU", (4,)),
        ("out", "Linear", (5,))]
    assert set(g.params) == {k for k, _ in ResNet().named_parameters()}


@pytest.mark.slow
@pytest.mark.parametrize("make", [lambda: ResNet(width=128, d_out=128),
                                  lambda: DenseNet(w1=64, w2=128, d_out=128)])
def test_analytic_kernels_match_monte_carlo(make, samples=200):
    # The ReLU after the sum (or fc2's input) makes the expectation exact only as widths grow; the
    # O(1/width) bias, under 1% relative here, stays below one standard error (about 1.5%).
    x = torch.randn(5, 4, dtype=torch.float64)
    model = make().double()
    nngp_samples, ntk_samples = sample_kernels(model, x, samples)
    k = ntbridge.kernel(model, x)
    assert_within_standard_error(nngp_samples, k.nngp, "NNGP")
    assert_within_standard_error(ntk_samples, k.ntk, "NTK")


def test_residual_kernel_is_the_sum_of_the_branches_kernels():
    class Skip(nn.Module):  # x + fc2(relu(fc1(x))): the input branch adds x x^T / d, no NTK
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))

        def forward(self, x):
            return x + self.body(x)

    model = Skip().double()
    x = torch.randn(5, 4, dtype=torch.float64)
    body = ntbridge.kernel(model.body, x)
    k = ntbridge.kernel(model, x)
    torch.testing.assert_close(k.nngp, body.nngp + x @ x.T / 4, rtol=1e-12, atol=0)
    torch.testing.assert_close(k.ntk, body.ntk, rtol=1e-12, atol=0)
    assert [n.name for n in ntbridge.convert(model).layers] == ["body.0", "body.1", "body.2", "add"]


def test_concat_kernel_is_the_channel_weighted_average_and_dim_minus_one_is_dim_one():
    class Cat(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.dim, self.a, self.b = dim, nn.Linear(4, 3), nn.Linear(4, 5)

        def forward(self, x):
            return torch.cat((self.a(x), self.b(x).relu()), self.dim)

    x = torch.randn(6, 4, dtype=torch.float64)
    k = ntbridge.kernel(Cat(1).double(), x)
    ka = ntbridge.kernel(nn.Sequential(nn.Linear(4, 3)), x)
    kb = ntbridge.kernel(nn.Sequential(nn.Linear(4, 5), nn.ReLU()), x)
    for name in ("nngp", "ntk"):
        expected = (3 * getattr(ka, name) + 5 * getattr(kb, name)) / 8
        torch.testing.assert_close(getattr(k, name), expected, rtol=1e-12, atol=0)
    torch.testing.assert_close(ntbridge.ntk(Cat(-1).double(), x), k.ntk, rtol=0, atol=0)


def test_scalar_multiplication_scales_kernels_by_its_square():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x):
            return 3 * (self.fc(x) / 2)

    model = Scaled().double()
    x = torch.randn(5, 4, dtype=torch.float64)
    assert frobenius_relative_error(apply(model, x), model(x).detach()) <= 1e-12
    for get in ("nngp", "ntk"):
        plain = ntbridge.kernel(nn.Sequential(model.fc), x, get=get)
        torch.testing.assert_close(ntbridge.kernel(model, x, get=get), 2.25 * plain, rtol=1e-12, atol=0)


@pytest.mark.slow
def test_nested_submodules_and_a_sequential_of_blocks():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.seq = nn.Sequential(nn.ReLU(), nn.Linear(8, 8))

        def forward(self, x):
            return x + self.seq(self.fc(x))

    model = nn.Sequential(nn.Linear(4, 8), Block(), Block(), nn.ReLU(), nn.Linear(8, 1)).double()
    g = ntbridge.convert(model)
    assert [n.name for n in g.layers] == ["0", "1.fc", "1.seq.0", "1.seq.1", "add", "2.fc",
                                          "2.seq.0", "2.seq.1", "add_1", "3", "4"]
    x = torch.randn(5, 4, dtype=torch.float64)
    assert frobenius_relative_error(apply(model, x), model(x).detach()) <= 1e-12
    assert frobenius_relative_error(ntbridge.empirical_ntk(model, x), empirical_ntk(model, x, x)) <= 1e-12
    assert torch.isfinite(ntbridge.ntk(model, x)).all()


def traced(fn):
    """The (module, inputs) equivalents of the nodes of ``forward = fn``."""

    class M(nn.Module):
        def forward(self, x):
            return fn(x)

    graph = trace(M())
    return [equivalents.equivalent(n) for n in graph.nodes
            if n.op in ("call_function", "call_method") and not equivalents.is_shape(n)]


@pytest.mark.parametrize("fn,expected", [
    (torch.relu, nn.ReLU()), (F.relu, nn.ReLU()), (lambda x: x.relu(), nn.ReLU()),
    (lambda x: F.gelu(x, approximate="tanh"), nn.GELU("tanh")), (F.gelu, nn.GELU()),
    (torch.tanh, nn.Tanh()), (lambda x: x.tanh(), nn.Tanh()), (torch.sigmoid, nn.Sigmoid()),
    (lambda x: F.avg_pool2d(x, 2, padding=1, count_include_pad=False),
     nn.AvgPool2d(2, padding=1, count_include_pad=False)),
    (lambda x: F.adaptive_avg_pool2d(x, (1, 2)), nn.AdaptiveAvgPool2d((1, 2))),
    (lambda x: torch.flatten(x, 1), nn.Flatten()), (lambda x: x.flatten(1), nn.Flatten()),
    (lambda x: x.flatten(2, 3), nn.Flatten(2, 3)),
    (lambda x: x.view(x.size(0), -1), nn.Flatten()), (lambda x: x.reshape(x.shape[0], -1), nn.Flatten()),
    (lambda x: x.reshape((x.size()[0], -1)), nn.Flatten()),
    (lambda x: 2 * x, equivalents.Scale(2.0)), (lambda x: x.mul(0.5), equivalents.Scale(0.5)),
    (lambda x: x / 4, equivalents.Scale(0.25)),
])
def test_functional_calls_map_to_equivalent_modules(fn, expected):
    [(module, inputs)] = traced(fn)
    assert repr(module) == repr(expected) and len(inputs) == 1


def test_sums_and_concats_map_to_fan_in_modules():
    [(add, inputs)] = traced(lambda x: torch.add(x, x))
    assert isinstance(add, equivalents.Add) and len(inputs) == 2
    [_, (cat, inputs)] = traced(lambda x: torch.cat([x, x.relu(), x], 1))
    assert repr(cat) == repr(equivalents.Concat(1)) and len(inputs) == 3
    [(cat, inputs)] = traced(lambda x: torch.concatenate((x, x), axis=-1))
    assert repr(cat) == repr(equivalents.Concat(-1)) and len(inputs) == 2


@pytest.mark.parametrize("fn,operation,message", [
    (lambda x: torch.add(x, 1, alpha=2), "torch.add", "addition of constants"),
    (lambda x: x / x, "operator.truediv", "quotient of two tensors"),
    (lambda x: torch.flatten(x), "torch.flatten", "mixes the examples"),
    (lambda x: x.view(-1, 4), "Tensor.view", "flatten each"),
    (torch.log, "torch.log", "'log' has no equivalent module.*register"),
    (lambda x: x[:, None], "operator.getitem", "index None: only constant ints"),
    (lambda x: torch.sigmoid(x, out=None), "torch.sigmoid", "unsupported arguments"),
])
def test_unsupported_functional_calls_are_named(fn, operation, message):
    class M(nn.Module):
        def forward(self, x):
            return fn(x)

    with pytest.raises(errors.UnsupportedLayerError, match=rf"^{operation} in M\.forward: .*{message}"):
        ntbridge.convert(M())


def test_a_fixed_tensor_added_to_features_is_refused():
    """A buffer added to the features (a sinusoidal positional encoding) breaks the rules' zero
    mean: refused, pointing to learned positions."""

    class Sinusoidal(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("pe", torch.sin(torch.arange(12.0)).reshape(3, 4))

        def forward(self, x):
            return x + self.pe

    with pytest.raises(errors.UnsupportedLayerError, match="fixed tensor.*learned positional"):
        ntbridge.convert(Sinusoidal())


def test_a_buffer_sliced_by_the_input_length_is_refused_saying_why():
    """PyTorch's tutorial positional encoding, ``x + self.pe[:x.size(1)]``: torch.fx cannot slice a
    buffer by a traced size; the error says so and points to learned positions."""

    class TutorialEncoding(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("pe", torch.sin(torch.arange(40.0)).reshape(1, 10, 4))

        def forward(self, x):
            return x + self.pe[:, :x.size(1)]

    with pytest.raises(errors.ConversionError,
                       match=r"slice indices.*sliced by a size of the input.*nn\.Embedding"):
        ntbridge.convert(nn.Sequential(nn.Linear(4, 4), TutorialEncoding()))


class Cumsum(nn.Module):
    def forward(self, x):
        return torch.cumsum(x, 1)


def test_errors_in_nested_modules_name_the_users_module_and_operation():
    """Not the traced node's position ('module 2' is the last Linear here) but where it is written."""
    model = nn.Sequential(nn.Linear(3, 4), nn.Sequential(nn.ReLU(), Cumsum()), nn.Linear(4, 1))
    with pytest.raises(errors.UnsupportedLayerError,
                       match=r"^torch\.cumsum in module '1\.1' \(Cumsum\): .*'cumsum' has no equivalent"):
        ntbridge.convert(model)


def test_kernel_errors_of_functional_calls_name_the_users_module():
    class Residual(nn.Module):
        def forward(self, h):
            return h + torch.relu(h)

    model = nn.Sequential(nn.Linear(3, 4), nn.Sequential(nn.Tanh(), nn.Linear(4, 4), Residual()))
    graph = ntbridge.convert(model)
    assert [n.where for n in graph.layers][-2:] == [
        "torch.relu in module '1.2' (Residual)", "operator.add in module '1.2' (Residual)"]
    with pytest.raises(errors.UnsupportedLayerError, match=r"^operator\.add in module '1\.2' \(Residual\): "
                                                           r"the branches .* may be correlated"):
        ntbridge.ntk(model, torch.randn(2, 3))


GUARDED = [
    (lambda x: F.gelu(x, approximate="tanh"), nn.GELU("tanh"), (3, 4)),
    (torch.tanh, nn.Tanh(), (3, 4)), (torch.sigmoid, nn.Sigmoid(), (3, 4)),
    (lambda x: F.avg_pool2d(x, 2), nn.AvgPool2d(2), (3, 2, 4, 4)),
    (lambda x: F.adaptive_avg_pool2d(x, 1), nn.AdaptiveAvgPool2d(1), (3, 2, 4, 4)),
    (lambda x: x.view(x.size(0), -1), nn.Flatten(), (3, 2, 2, 2)),
    (lambda x: torch.flatten(x, 1), nn.Flatten(), (3, 2, 2, 2)),
]


@pytest.mark.parametrize("fn,module,shape", GUARDED)
def test_functional_calls_run_end_to_end(fn, module, shape):

    class M(nn.Module):
        def forward(self, x):
            return fn(x)

    x = torch.randn(*shape, dtype=torch.float64)
    assert frobenius_relative_error(apply(M(), x), fn(x)) <= 1e-12
    assert frobenius_relative_error(apply(module, x), fn(x)) <= 1e-12


def two_linear(forward):
    """A model with Linear(4, 4) layers ``fc`` and ``fc2`` and the given ``forward(self, x)``."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.fc2 = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            return forward(self, x)

    return M()


@pytest.mark.slow
@pytest.mark.parametrize("forward", [
    lambda self, x: (lambda h: h + torch.relu(h))(self.fc(x)),   # both branches functions of h
    lambda self, x: (lambda h: h + h)(self.fc(x)),
    lambda self, x: (lambda h: h + 2 * h)(self.fc(x)),
    lambda self, x: x + torch.relu(self.fc(x)),                  # the input is not zero-mean
    lambda self, x: (lambda h: h + self.fc2(h).relu())(self.fc(x)),
])
def test_correlated_sums_refuse_the_analytic_kernel_only(forward):
    model, x = two_linear(forward), torch.randn(3, 4)
    with pytest.raises(errors.UnsupportedLayerError,
                       match=r"^(operator|torch)\.add in M\.forward: .*correlated.*empirical_ntk"):
        ntbridge.ntk(model, x)
    assert frobenius_relative_error(apply(model, x), model(x).detach()) <= 1e-5
    assert frobenius_relative_error(ntbridge.empirical_ntk(model, x), empirical_ntk(model, x, x)) <= 1e-5


@pytest.mark.parametrize("forward", [
    lambda self, x: x + self.fc(x),
    lambda self, x: self.fc(x) + self.fc2(x),
    lambda self, x: (lambda h: h + self.fc2(h.relu()) / 2)(self.fc(x)),
    lambda self, x: (lambda h: self.fc2(h) + h)(self.fc(x)),
])
def test_uncorrelated_sums_have_an_analytic_kernel(forward):
    assert torch.isfinite(ntbridge.ntk(two_linear(forward), torch.randn(3, 4))).all()


def test_untraceable_models_and_forms_fx_cannot_convert():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x) if x.sum() > 0 else x

    with pytest.raises(errors.ConversionError,
                       match=r"could not trace Branchy.*control flow.*nn.Sequential.*register_converter"):
        ntbridge.ntk(Branchy(), torch.randn(3, 4))

    class TwoInputs(nn.Module):
        def forward(self, x, y):
            return x + y

    with pytest.raises(errors.ConversionError, match=r"computes with forward's second input 'y'\. "
                                                     r"ntbridge models take one tensor"):
        ntbridge.convert(TwoInputs())

    class RawParameter(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(4, 4))

        def forward(self, x):
            return x @ self.weight

    with pytest.raises(errors.UnsupportedLayerError, match="uses the tensor 'weight' directly"):
        ntbridge.convert(RawParameter())

    class InputScale(nn.Module):  # a scale per channel of the input's channels, not i.i.d.
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(4))

        def forward(self, x):
            return x * self.scale

    with pytest.raises(errors.UnsupportedLayerError, match="i.i.d. channels"):
        ntbridge.nngp(InputScale(), torch.randn(3, 4))

    class TwoArguments(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x, x)

    with pytest.raises(errors.ConversionError, match=r"'fc' \(Linear\) is called with 2 arguments"):
        ntbridge.convert(TwoArguments())

    class Pair(nn.Module):
        def forward(self, x):
            return x, x

    with pytest.raises(errors.ConversionError, match="return one tensor"):
        ntbridge.convert(Pair())


def test_identity_forward_and_unsupported_leaf_in_a_traced_model():
    class Same(nn.Module):
        def forward(self, x):
            return x

    x = torch.randn(3, 4, dtype=torch.float64)
    torch.testing.assert_close(ntbridge.nngp(Same(), x), x @ x.T / 4, rtol=1e-12, atol=0)

    class WithLSTM(nn.Module):
        def __init__(self):
            super().__init__()
            self.cell = nn.LSTMCell(4, 4)

        def forward(self, x):
            return self.cell(x)[0]

    with pytest.raises(errors.UnsupportedLayerError, match=r"module 0 'cell' \(LSTMCell\) has no infinite-width kernel rule"):
        ntbridge.convert(WithLSTM())


def test_signature_distinguishes_wiring_and_is_stable():
    class Wired(nn.Module):
        def __init__(self, skip):
            super().__init__()
            self.skip, self.fc1, self.fc2 = skip, nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            h = self.fc1(x)
            return (h if self.skip else x) + self.fc2(h)

    a, b = Wired(True), Wired(False)
    assert ntbridge.convert(a).signature == ntbridge.convert(a).signature
    assert ntbridge.convert(a).signature != ntbridge.convert(b).signature


# ------------------------------------------------------------ the stax combinators themselves

def test_stax_fan_out_parallel_fan_in_equal_the_dag_form():
    import jax
    import jax.numpy as jnp

    dense = stax.Dense(4, 4, W_std=1.3, b_std=0.2)
    chained = stax.serial(stax.FanOut(2), stax.parallel(stax.Identity(), dense), stax.FanInSum())
    wired = stax.dag([dense, stax.FanInSum()], [(stax.INPUT,), (stax.INPUT, 0)])
    x = jax.random.normal(jax.random.key(0), (5, 4))
    shape, params = chained.init_fn(jax.random.key(1), x.shape)
    assert shape == (5, 4)
    wired_params = (params[1][1], {})
    assert jnp.array_equal(chained.apply_fn(params, x), wired.apply_fn(wired_params, x))
    k = stax.input_kernel(x, None, compute_ntk=True, diagonal_spatial=True)
    for a, b in ((chained.kernel_fn(k).nngp, wired.kernel_fn(k).nngp),
                 (chained.kernel_fn(k).ntk, wired.kernel_fn(k).ntk)):
        assert jnp.array_equal(a, b)
    with pytest.raises(errors.ShapeError, match="must agree"):
        stax.FanInSum().init_fn(None, ((5, 4), (5, 3)))
    concat = stax.FanInConcat(1)
    assert concat.init_fn(None, ((5, 4, 2), (5, 3, 2)))[0] == (5, 7, 2)
    with pytest.raises(errors.ShapeError, match="except on axis 1"):
        concat.init_fn(None, ((5, 4, 2), (5, 3, 3)))
