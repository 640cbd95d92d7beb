"""Kernels that torch autograd differentiates: analytic kernels w.r.t. x1 and x2 (gradcheck, and a
closed form in torch ops, on and off the diagonal), empirical kernels w.r.t. inputs and parameters
against torch.func, tiles and devices, no history (nor VJP program) without grad, and no double
backward. Zero-copy of the forward with gradients: tests/test_dlpack.py."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, jacrev, vmap

import ntbridge
from ntbridge import errors, programs, stax
from helpers import mlp


f64 = dict(dtype=torch.float64)


class Erf(nn.Module):
    """``erf(x)``: no torch module has it; registered here with its closed-form rule."""

    def forward(self, x):
        return torch.special.erf(x)


ntbridge.register_converter(Erf)(lambda module, ctx: stax.Erf())


class Residual(nn.Module):
    """h = inp(x); out(relu(h + fc(relu(h)))), traced by torch.fx."""

    def __init__(self):
        super().__init__()
        self.inp, self.fc, self.out = nn.Linear(3, 8), nn.Linear(8, 8), nn.Linear(8, 1)

    def forward(self, x):
        h = self.inp(x)
        return self.out(F.relu(h + self.fc(F.relu(h))))


ARCHITECTURES = {  # name -> (model, one example's shape)
    "mlp-relu": (lambda: mlp(3, [8, 8], 1, act=nn.ReLU()), (3,)),
    "mlp-gelu": (lambda: mlp(3, [8, 8], 1, act=nn.GELU()), (3,)),
    "mlp-erf": (lambda: mlp(3, [8, 8], 1, act=Erf()), (3,)),
    "mlp-tanh": (lambda: nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1)), (3,)),
    "cnn-padding-pooling": (lambda: nn.Sequential(
        nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2), nn.Flatten(),
        nn.Linear(8, 1)), (1, 4, 4)),
    "layernorm": (lambda: nn.Sequential(nn.Linear(3, 8), nn.LayerNorm(8), nn.Linear(8, 8),
                                        nn.ReLU(), nn.Linear(8, 1)), (3,)),
    "fx-residual": (Residual, (3,)),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_analytic_gradcheck(name):
    """The NNGP and the NTK (one call, two outputs), with x2 and with x2 = None."""
    make, shape = ARCHITECTURES[name]
    model = make().double()
    x1 = torch.randn(3, *shape, **f64, requires_grad=True)
    x2 = torch.randn(2, *shape, **f64, requires_grad=True)
    kernel = lambda a, b=None: tuple(ntbridge.kernel(model, a, b))
    assert torch.autograd.gradcheck(kernel, (x1, x2), fast_mode=True)
    assert torch.autograd.gradcheck(kernel, (x1,), fast_mode=True)


W_STD, B_STD = 1.3, 0.4


def relu_ntk(x1, x2, bias: bool, same: bool = False):
    """The NTK of Linear -> ReLU -> Linear (parameterization "ntk") in torch ops: Cho & Saul's
    arc-cosine kernels. ``same``: x2 is x1, and the diagonal (angle 0) is written as such."""
    d, b2 = x1.shape[1], B_STD ** 2 if bias else 0.0
    k0 = W_STD ** 2 * x1 @ x2.T / d + b2
    q1 = W_STD ** 2 * (x1 * x1).sum(1)[:, None] / d + b2
    q2 = W_STD ** 2 * (x2 * x2).sum(1)[None, :] / d + b2
    diagonal = torch.eye(len(x1), dtype=torch.bool) if same else torch.zeros_like(k0, dtype=bool)
    t = torch.where(diagonal, 0.0, torch.arccos(torch.where(diagonal, 0.0, k0 / (q1 * q2).sqrt())))
    nngp = (q1 * q2).sqrt() * (torch.sin(t) + (math.pi - t) * torch.cos(t)) / (2 * math.pi)
    return W_STD ** 2 * (nngp + k0 * (math.pi - t) / (2 * math.pi)) + b2


def one_hidden_layer(bias: bool):
    model = nn.Sequential(nn.Linear(5, 7, bias=bias), nn.ReLU(), nn.Linear(7, 1, bias=bias))
    options = dict(parameterization="ntk", W_std=W_STD, b_std=B_STD if bias else None)
    return model.double(), options


def grads(fn, *tensors):
    return torch.autograd.grad(fn(*tensors), tensors)


@pytest.mark.slow
@pytest.mark.parametrize("bias", [True, False])
def test_relu_ntk_gradients_match_the_closed_form(bias):
    model, options = one_hidden_layer(bias)
    x1, x2 = torch.randn(3, 5, **f64, requires_grad=True), torch.randn(4, 5, **f64, requires_grad=True)
    w = torch.randn(3, 4, **f64)
    got = grads(lambda a, b: (w * ntbridge.ntk(model, a, b, **options)).sum(), x1, x2)
    want = grads(lambda a, b: (w * relu_ntk(a, b, bias)).sum(), x1, x2)
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, rtol=1e-8, atol=1e-12)
    # x2 = None: the diagonal's entries are functions of |x| alone (angle 0), differentiable
    ws = torch.randn(3, 3, **f64)
    got = grads(lambda a: (ws * ntbridge.ntk(model, a, **options)).sum(), x1)
    want = grads(lambda a: (ws * relu_ntk(a, a, bias, same=True)).sum(), x1)
    torch.testing.assert_close(got[0], want[0], rtol=1e-8, atol=1e-12)


def test_relu_ntk_gradient_at_x1_equal_x2_is_the_one_sided_limit():
    """At x2 = x1 (two tensors), K(x1, .) has a kink across directions that open an angle, and is
    differentiable along x1 itself: without biases it is homogeneous of degree 1 in x2, so the
    derivative along x1 is K(x1, x1) (Euler), and the gradient is ``K(x, x) x / |x|^2`` (the mean
    of the one-sided limits across the kink is 0)."""
    model, options = one_hidden_layer(bias=False)
    x1 = torch.randn(3, 5, **f64)
    x2 = x1.clone().requires_grad_()
    k = ntbridge.ntk(model, x1, x2, **options)
    (g,) = torch.autograd.grad(k.diagonal().sum(), x2)
    assert torch.isfinite(g).all()
    diagonal = relu_ntk(x1, x1, bias=False, same=True).diagonal()
    torch.testing.assert_close(g, diagonal[:, None] * x1 / (x1 * x1).sum(1, keepdim=True),
                               rtol=1e-8, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("name, dtype", [("mlp-relu", torch.float32), ("mlp-relu", torch.float64),
                                         ("mlp-tanh", torch.float32)])
def test_gradients_are_finite_on_the_diagonal_and_at_zero_inputs(name, dtype):
    """x2 = x1 (the arc-cosine angle and the quadrature's conditional deviation at 0) and a zero
    example without biases (square roots of zero variances): finite gradients."""
    make, shape = ARCHITECTURES[name]
    model = make().to(dtype)
    for layer in model.modules():
        if getattr(layer, "bias", None) is not None:
            layer.bias = None
    x1 = torch.randn(3, *shape, dtype=dtype)
    x1[1] = 0
    x2, x = x1.clone().requires_grad_(), x1.clone().requires_grad_()
    for k in ntbridge.kernel(model, x1, x2):
        assert torch.isfinite(torch.autograd.grad(k.sum(), x2)[0]).all()
    for k in ntbridge.kernel(model, x):
        assert torch.isfinite(torch.autograd.grad(k.sum(), x)[0]).all()


def conv_model():
    return nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.Tanh(), nn.Flatten(),
                         nn.Linear(3 * 4 * 4, 2)).double()


def torch_func_ntk(model, x1, x2, trace: bool):
    """The empirical NTK by torch.func (per-example Jacobians), differentiable by torch autograd
    w.r.t. x1, x2 and the parameters: ``(N1, N2)`` averaged over outputs, or ``(N1, N2, O, O)``."""
    params = dict(model.named_parameters())
    single = lambda p, xi: functional_call(model, p, (xi[None],))[0]
    j1, j2 = (vmap(jacrev(single), in_dims=(None, 0))(params, x) for x in (x1, x2))
    k = sum(torch.einsum("aop,bqp->aboq", j1[n].flatten(2), j2[n].flatten(2)) for n in params)
    return k.diagonal(dim1=2, dim2=3).mean(-1) if trace else k


def gradients(k, w, tensors):
    """``d <w, k> / d tensors``; zeros for tensors ``k`` does not depend on."""
    found = torch.autograd.grad((w * k).sum(), tensors, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for g, t in zip(found, tensors)]


@pytest.mark.slow
@pytest.mark.parametrize("implementation", ["jacobian", "ntvp", "structured"])
def test_empirical_ntk_gradients_match_torch_func(implementation):
    model = conv_model()
    x1 = torch.randn(3, 2, 4, 4, **f64, requires_grad=True)
    x2 = torch.randn(2, 2, 4, 4, **f64, requires_grad=True)
    params = list(model.parameters())
    for trace in (True, False):
        w = torch.randn(3, 2, *(() if trace else (2, 2)), **f64)
        k = ntbridge.empirical_ntk(model, x1, x2, implementation=implementation,
                                   trace_axes=(-1,) if trace else ())
        got = gradients(k, w, [x1, x2, *params])
        want = gradients(torch_func_ntk(model, x1, x2, trace), w, [x1, x2, *params])
        for g, r in zip(got, want):
            torch.testing.assert_close(g, r, rtol=1e-8, atol=1e-12)


class Cumulative(nn.Module):
    """No converter (torch.cumsum, a product with the input): empirical kernels translate it."""

    def __init__(self):
        super().__init__()
        self.a, self.head = nn.Linear(5, 8), nn.Linear(8, 2)

    def forward(self, x):
        return self.head(torch.tanh(torch.cumsum(self.a(x), dim=1)) * x.sum(1, keepdim=True))


@pytest.mark.slow
@pytest.mark.parametrize("implementation", ["jacobian", "structured"])
def test_gradients_of_a_translated_model_match_torch_func(implementation):
    model = Cumulative().double()
    x1 = torch.randn(3, 5, **f64, requires_grad=True)
    x2 = torch.randn(2, 5, **f64, requires_grad=True)
    params = list(model.parameters())
    w = torch.randn(3, 2, **f64)
    k, info = ntbridge.empirical_ntk(model, x1, x2, implementation=implementation,
                                     return_info=True)
    assert info.path == "torch.export"
    got = gradients(k, w, [x1, x2, *params])
    want = gradients(torch_func_ntk(model, x1, x2, True), w, [x1, x2, *params])
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, rtol=1e-8, atol=1e-12)


@pytest.mark.slow
def test_tiles_and_devices_give_the_untiled_gradients():
    """Tiles of 2 over 4 devices (padding, mirrored tiles of x2 = None, devices left idle) vs one
    tile: the same gradients, analytic (w.r.t. x1, x2) and empirical (and the parameters)."""
    model = mlp(3, [8], 1, act=nn.ReLU()).double()
    x1, x2 = torch.randn(5, 3, **f64, requires_grad=True), torch.randn(3, 3, **f64, requires_grad=True)
    params = list(model.parameters())
    w12, w11 = torch.randn(5, 3, **f64), torch.randn(5, 5, **f64)
    calls = [(lambda **kw: ntbridge.ntk(model, x1, x2, **kw), w12, [x1, x2]),
             (lambda **kw: ntbridge.nngp(model, x1, **kw), w11, [x1]),
             (lambda **kw: ntbridge.empirical_ntk(model, x1, x2, implementation="jacobian", **kw), w12,
              [x1, x2, *params]),
             (lambda **kw: ntbridge.empirical_ntk(model, x1, implementation="structured", **kw),
              w11, [x1, *params])]
    for call, w, tensors in calls:
        whole = gradients(call(batch_size=0), w, tensors)
        for g, r in zip(gradients(call(batch_size=2, device_count=4), w, tensors), whole):
            torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-14)


def vjp_programs() -> int:
    return sum(key.purpose == "tile vjp" for key in programs._ENTRIES)


@pytest.mark.slow
def test_no_history_and_no_vjp_program_without_gradients():
    model = mlp(3, [8, 8], 1, act=nn.ReLU())
    x = torch.randn(6, 3, requires_grad=True)
    programs.clear()
    with torch.no_grad():
        k = ntbridge.ntk(model, x)
        e = ntbridge.empirical_ntk(model, x)
    assert k.grad_fn is None and e.grad_fn is None and not k.requires_grad
    for p in model.parameters():
        p.requires_grad_(False)
    k = ntbridge.ntk(model, x.detach())
    e = ntbridge.empirical_ntk(model, x.detach())
    assert k.grad_fn is None and e.grad_fn is None and vjp_programs() == 0
    k = ntbridge.ntk(model, x)
    assert k.grad_fn is not None and vjp_programs() == 0  # compiled on the first backward only
    k.sum().backward()
    assert vjp_programs() == 1 and x.grad.shape == x.shape


def test_double_backward_is_refused():
    x = torch.randn(4, 3, **f64, requires_grad=True)
    k = ntbridge.ntk(mlp(3, [8, 8], 1, act=nn.ReLU()).double(), x)
    (g,) = torch.autograd.grad(k.sum(), x, create_graph=True)
    with pytest.raises(errors.GradientError, match="differentiable once"):
        g.sum().backward()
