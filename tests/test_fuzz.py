"""Property-based tests over randomly generated models (hypothesis).

Each drawn model is an ``nn.Sequential`` (depth 1-6) of supported modules, or one of a few torch.fx
residual/concat shapes, with random widths, convolution geometry and batch sizes. Properties:

* ``apply_fn`` reproduces ``model(x)`` (float32, relative error <= 1e-5);
* where the architecture has an analytic kernel, the NNGP and NTK with x2 = x1 are finite, exactly
  symmetric and PSD (float32: smallest eigenvalue >= -1e-5 * largest); where it has none (a
  nonlinearity whose input is not Gaussian, max pooling) the refusal is an UnsupportedLayerError;
* the empirical NTK (any strategy) equals the torch.func reference;
* tiling (batch_size) and device_count do not change either kernel.

The default profile (tests/conftest.py) is fast and derandomized; HYPOTHESIS_PROFILE=long searches
longer.
"""

import dataclasses

import jax
import pytest
import torch
from hypothesis import given, strategies as st
from torch import nn

import ntbridge
from ntbridge.dlpack import precision, to_jax, to_torch
from ntbridge.errors import InputError, UnsupportedLayerError
from tests import reference

ACTIVATIONS = [nn.ReLU, lambda: nn.LeakyReLU(0.2), nn.GELU, lambda: nn.GELU("tanh"), nn.Tanh,
               nn.Sigmoid, nn.SiLU, nn.ELU, nn.Softplus, nn.Hardtanh, nn.ReLU6, nn.Mish,
               nn.Softsign, nn.Hardswish, nn.LogSigmoid, nn.CELU, nn.SELU]


@dataclasses.dataclass
class Case:
    """A drawn model, its input and whether its architecture has an analytic kernel."""

    model: nn.Module
    x: torch.Tensor
    analytic: bool


def _shape_after(layers, x) -> tuple | None:
    """The per-example output shape of ``layers`` on ``x``, or None if torch refuses them."""
    try:
        with torch.no_grad():
            return tuple(nn.Sequential(*layers)(x).shape[1:])
    except RuntimeError:
        return None


@st.composite
def sequentials(draw) -> Case:
    """An ``nn.Sequential`` of 1-6 modules on (N, d), (N, C, L) or (N, C, H, W) inputs."""
    n = draw(st.integers(1, 4))
    spatial = draw(st.integers(0, 2))
    shape = (draw(st.integers(1, 4)), *[draw(st.integers(3, 7)) for _ in range(spatial)])
    x = torch.randn(n, *shape, generator=torch.Generator().manual_seed(draw(st.integers(0, 99))))
    layers, state, analytic = [], "other", True
    for _ in range(draw(st.integers(1, 6))):
        current = _shape_after(layers, x)
        kind = draw(st.sampled_from(["affine", "affine", "activation", "layernorm", "dropout"]
                                    + ["avgpool", "maxpool"] * (len(current) > 1)))
        if kind == "affine" and len(current) == 1:
            layer = nn.Linear(current[0], draw(st.integers(1, 6)), bias=draw(st.booleans()))
        elif kind == "affine":
            conv = (nn.Conv1d, nn.Conv2d)[len(current) - 2]
            groups = draw(st.sampled_from([g for g in (1, 2, 3) if current[0] % g == 0]))
            layer = conv(current[0], groups * draw(st.integers(1, 2)), draw(st.integers(1, 3)),
                         stride=draw(st.integers(1, 2)), padding=draw(st.integers(0, 1)),
                         dilation=draw(st.integers(1, 2)), groups=groups, bias=draw(st.booleans()))
        elif kind == "activation":
            layer = draw(st.sampled_from(ACTIVATIONS))()
        elif kind == "layernorm":
            layer = nn.LayerNorm(current)
        elif kind == "dropout":
            layer = nn.Dropout(draw(st.sampled_from([0.0, 0.5])))
        else:
            pool = {"avgpool": (nn.AvgPool1d, nn.AvgPool2d), "maxpool": (nn.MaxPool1d, nn.MaxPool2d)}
            size = draw(st.integers(1, 2))
            layer = pool[kind][len(current) - 2](size, stride=draw(st.integers(1, 2)),
                                                 padding=draw(st.integers(0, size // 2)))
        if _shape_after([*layers, layer], x) is None:
            continue  # e.g. a convolution wider than its input
        layers.append(layer)
        # what the input is: Gaussian, an elementwise map of a Gaussian ("pointwise", whose
        # windows MaxPool's rule draws), samples of sources (after MaxPool) or none of these
        analytic &= {"activation": state != "other", "layernorm": state == "gaussian",
                     "maxpool": state in ("gaussian", "pointwise")}.get(kind, True)
        state = {"affine": "gaussian", "maxpool": "sampled", "dropout": state,
                 "layernorm": state, "avgpool": "gaussian" if state == "gaussian" else "other",
                 "activation": "pointwise" if state in ("gaussian", "pointwise") else "sampled",
                 }[kind]
    current = _shape_after(layers, x)
    if len(current) > 1:  # a head: flatten (or global average pool), then a Linear
        if draw(st.booleans()):
            layers.append((nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d)[len(current) - 2](1))
        layers += [nn.Flatten(), nn.LazyLinear(draw(st.integers(1, 3)))]
    model = nn.Sequential(*layers).eval()
    with torch.no_grad():
        model(x)  # materializes the LazyLinear
    return Case(model, x, analytic)


class Residual(nn.Module):
    """``h = Linear(x)``; ``h + Linear(relu(h))``; a Linear head."""

    def __init__(self, d, w, out):
        super().__init__()
        self.a, self.b, self.head = nn.Linear(d, w), nn.Linear(w, w), nn.Linear(w, out)

    def forward(self, x):
        h = self.a(x)
        return self.head(h + self.b(torch.relu(h)))


class Concat(nn.Module):
    """Two Linear branches, ReLU and Tanh, concatenated, a Linear head (a concatenation only feeds
    affine layers in the analytic kernel)."""

    def __init__(self, d, w, out):
        super().__init__()
        self.a, self.b, self.head = nn.Linear(d, w), nn.Linear(d, w + 1), nn.Linear(2 * w + 1, out)

    def forward(self, x):
        return self.head(torch.cat([torch.relu(self.a(x)), torch.tanh(self.b(x))], dim=1))


class ConvResidual(nn.Module):
    """``c = Conv1d(x)``; ``c + Conv1d(tanh(c))``; flatten; a Linear head."""

    def __init__(self, d, w, out):
        super().__init__()
        self.a = nn.Conv1d(d, w, 3, padding=1)
        self.b = nn.Conv1d(w, w, 3, padding=1)
        self.head = nn.Linear(5 * w, out)

    def forward(self, x):
        c = self.a(x)
        return self.head((c + self.b(torch.tanh(c))).flatten(1))


@st.composite
def residuals(draw) -> Case:
    cls = draw(st.sampled_from([Residual, Concat, ConvResidual]))
    d, w, out = draw(st.integers(1, 4)), draw(st.integers(1, 5)), draw(st.integers(1, 3))
    shape = (d, 5) if cls is ConvResidual else (d,)
    x = torch.randn(draw(st.integers(1, 4)), *shape,
                    generator=torch.Generator().manual_seed(draw(st.integers(0, 99))))
    return Case(cls(d, w, out).eval(), x, True)


models = st.one_of(sequentials(), sequentials(), residuals())
batching = st.tuples(st.sampled_from([None, 1, 2]), st.sampled_from([-1, 1, 2]))


@pytest.mark.slow
@given(models)
def test_apply_fn_reproduces_the_model(case):
    graph = ntbridge.convert(case.model)
    with torch.no_grad():
        expected = case.model(case.x)
    with precision(torch.float32):
        got = to_torch(jax.jit(graph.apply_fn)(graph.params, to_jax(case.x)))
    assert got.shape == expected.shape
    scale = expected.abs().max().clamp_min(torch.finfo(torch.float32).tiny)
    assert (got - expected).abs().max() <= 1e-5 * scale


@given(models, batching)
def test_analytic_kernel_is_finite_symmetric_psd_and_independent_of_tiling(case, tiles):
    if not case.analytic:
        with pytest.raises(UnsupportedLayerError):
            ntbridge.kernel(case.model, case.x)
        return
    k = ntbridge.kernel(case.model, case.x)
    for name, a in zip(k._fields, k):
        assert a.shape == (len(case.x),) * 2 and a.dtype == torch.float32
        assert torch.isfinite(a).all(), name
        assert torch.equal(a, a.T), name
        eig = torch.linalg.eigvalsh(a.double())
        assert eig[0] >= -1e-5 * eig[-1].abs(), (name, eig)
    # float64: tiles and devices change the order of operations only (rounding ~1e-16 per step)
    batch_size, device_count = tiles
    x = case.x.double()
    whole = ntbridge.kernel(case.model, x, batch_size=0, device_count=1)
    tiled = ntbridge.kernel(case.model, x, batch_size=batch_size, device_count=device_count)
    for a, b in zip(tiled, whole):
        assert torch.equal(a, a.T)
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12 * b.abs().max().item())


@pytest.mark.slow
@given(models, batching, st.sampled_from(["auto", "jacobian", "ntvp", "structured"]),
       st.booleans())
def test_empirical_ntk_equals_torch_func_at_any_tiling(case, tiles, implementation, same):
    model = case.model.double()
    x1 = case.x.double()
    x2 = None if same else x1.flip(0)[: max(1, len(x1) - 1)] + 0.5
    batch_size, device_count = tiles
    if not list(model.parameters()):
        with pytest.raises(InputError, match="no parameters"):
            ntbridge.empirical_ntk(model, x1, x2)
        return
    got = ntbridge.empirical_ntk(model, x1, x2, implementation=implementation,
                                 batch_size=batch_size, device_count=device_count)
    expected = reference.empirical_ntk(model, x1, x1 if x2 is None else x2)
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-12 * expected.abs().max().item())
    if same:
        assert torch.equal(got, got.T)


# Regressions: defects the fuzzer found, kept as fixed examples.

@pytest.mark.parametrize("implementation", ["jacobian", "structured"])
def test_grouped_convolution_empirical_ntk_under_tiling(implementation):
    """Grouped convolutions' weight Jacobians raised NotImplementedError inside the tiled runner."""
    model = nn.Sequential(nn.Conv1d(2, 4, 2, padding=1, dilation=2, groups=2), nn.Flatten(),
                          nn.Linear(20, 2)).double()
    x = torch.randn(3, 2, 5, dtype=torch.float64)
    got = ntbridge.empirical_ntk(model, x, implementation=implementation, batch_size=2)
    torch.testing.assert_close(got, reference.empirical_ntk(model, x, x), rtol=1e-9, atol=0)


def test_empirical_kernels_tiled_over_several_devices():
    """Parameters living on one device were passed to a computation replicated over several."""
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2)).double()
    x = torch.randn(5, 3, dtype=torch.float64)
    got = ntbridge.empirical_ntk(model, x, batch_size=2, device_count=2)
    torch.testing.assert_close(got, reference.empirical_ntk(model, x, x), rtol=1e-9, atol=0)
    with torch.no_grad():
        f = model(x)
    torch.testing.assert_close(ntbridge.empirical_nngp(model, x, batch_size=2, device_count=4),
                               f @ f.T / 2, rtol=1e-12, atol=0)
