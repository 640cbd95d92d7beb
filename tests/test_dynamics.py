"""linearize and taylor_expand against direct torch.func expansions (float64)."""

import copy

import pytest
import torch
from torch import nn
from torch.func import functional_call, jacrev, jvp
from torch.nn.attention import SDPBackend, sdpa_kernel

import ntbridge
from ntbridge import errors, predict


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 16), nn.GELU(),
                         nn.Linear(16, 2)).double()


def cnn(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.BatchNorm2d(4), nn.Flatten(),
                         nn.Linear(4 * 4 * 4, 3)).double().eval()


def perturb(expansion, scale, seed=1):
    """Move the expansion's parameters by ``scale`` times a random direction; returns it by name."""
    g = torch.Generator().manual_seed(seed)
    step = {}
    with torch.no_grad():
        for name, p in expansion.params.named_parameters():
            step[name] = scale * torch.randn(p.shape, generator=g, dtype=p.dtype)
            p += step[name]
    return step


def model_fn(model, x):
    buffers = dict(model.named_buffers())
    return lambda p: functional_call(model, {**p, **buffers}, (x,))


class Attention(nn.Module):
    """A model only torch.export translates (attention, a learned query): beyond the converters."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Linear(3, 8), nn.Linear(8, 2)
        self.attention = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):  # x (N, T, 3)
        h = self.embed(x)
        return self.head(self.attention(h, h, h, need_weights=False)[0].mean(1))


def attention(seed=0):
    """In training mode (no dropout here): eval mode takes torch's fused attention, which has no
    forward-mode derivative (see test_an_operation_without_forward_mode_is_named)."""
    torch.manual_seed(seed)
    return Attention().double().train()


@pytest.mark.parametrize("build, shape", [(mlp, (5, 3)), (cnn, (5, 1, 6, 6)),
                                          (attention, (5, 4, 3))])
def test_linearize_is_the_jvp_expansion(build, shape):
    model = build()
    x = torch.randn(shape, dtype=torch.float64)
    before = copy.deepcopy(model.state_dict())
    lin = ntbridge.linearize(model)
    torch.testing.assert_close(lin(x), model(x), rtol=0, atol=1e-12)
    step = perturb(lin, 0.1)
    p0 = {n: p.detach() for n, p in model.named_parameters()}
    with sdpa_kernel(SDPBackend.MATH):  # torch's attention with forward-mode derivatives
        f0, df = jvp(model_fn(model, x), (p0,), (step,))
    torch.testing.assert_close(lin(x), f0 + df, rtol=1e-10, atol=1e-10)
    for name, value in model.state_dict().items():  # the model is untouched
        assert torch.equal(value, before[name])
    assert {n for n, _ in lin.named_parameters()} == {f"params.{n}" for n in p0}


def test_an_operation_without_forward_mode_is_named():
    lin = ntbridge.linearize(attention().eval())
    with pytest.raises(errors.UnsupportedLayerError, match="_native_multi_head_attention.*train"):
        lin(torch.randn(2, 4, 3, dtype=torch.float64))


def test_linearized_gradients_are_the_models_jacobian():
    model, x = mlp(), torch.randn(4, 3, dtype=torch.float64)
    lin = ntbridge.linearize(model)
    perturb(lin, 0.3)
    lin(x).sum().backward()  # a linear function: its gradient is J(p0)^T 1 wherever p is
    model(x).sum().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(lin.params.get_parameter(name).grad, p.grad, rtol=1e-12,
                                   atol=1e-12)


def test_degree_two_is_the_second_order_expansion():
    model, x = mlp(), torch.randn(5, 3, dtype=torch.float64)
    quad = ntbridge.taylor_expand(model, 2)
    step = perturb(quad, 0.2)
    p0 = {n: p.detach() for n, p in model.named_parameters()}
    fn = model_fn(model, x)
    # the second derivative along the step by reverse mode over reverse mode, a different route
    along = lambda s: fn({n: p0[n] + s * step[n] for n in p0})
    s0 = torch.zeros((), dtype=torch.float64)
    expected = along(s0) + jacrev(along)(s0) + jacrev(jacrev(along))(s0) / 2
    torch.testing.assert_close(quad(x), expected, rtol=1e-10, atol=1e-10)


def test_expansions_of_a_polynomial_model_are_exact_from_its_degree_on():
    """A two-layer linear network is bilinear in its parameters: degree 2 equals it everywhere,
    degree 1 does not."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.Linear(8, 2)).double()
    x = torch.randn(4, 3, dtype=torch.float64)
    lin, quad, cubic = (ntbridge.taylor_expand(model, k) for k in (1, 2, 3))
    for expansion in (lin, quad, cubic):
        step = perturb(expansion, 0.5)
    moved = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in moved.named_parameters():
            p += step[name]
    torch.testing.assert_close(quad(x), moved(x), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(cubic(x), moved(x), rtol=1e-12, atol=1e-12)
    assert (lin(x) - moved(x)).abs().max() > 1e-3


def test_sgd_on_the_linearized_model_follows_the_closed_form_on_its_empirical_ntk():
    """Full-batch SGD on 1/2 sum |f - y|^2 moves a linear model's outputs by -lr K (f - y)
    exactly, with K its empirical NTK over output units (trace_axes=())."""
    model = mlp()
    x, x_test = torch.randn(10, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
    y = torch.randn(10, 2, dtype=torch.float64)
    k = ntbridge.empirical_ntk(model, x, trace_axes=())
    k_test = ntbridge.empirical_ntk(model, x_test, x, trace_axes=())
    lr, steps = 0.5 * predict.max_learning_rate(k), 25
    with torch.no_grad():
        f0, f0_test = model(x), model(x_test)
    lin = ntbridge.linearize(model)
    opt = torch.optim.SGD(lin.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        (0.5 * ((lin(x) - y) ** 2).sum()).backward()
        opt.step()
    out = predict.gradient_descent_mse(k, y, lr, steps=steps, k_test_train=k_test, fx_train_0=f0,
                                       fx_test_0=f0_test)
    with torch.no_grad():
        torch.testing.assert_close(lin(x), out.train, rtol=0, atol=1e-8)
        torch.testing.assert_close(lin(x_test), out.test, rtol=0, atol=1e-8)
        assert (lin(x) - f0).abs().max() > 0.1  # it did move


def test_expansions_follow_the_module_api():
    model = nn.Sequential(nn.Linear(3, 8), nn.Dropout(0.5), nn.Linear(8, 1)).double()
    lin = ntbridge.linearize(model).eval()
    x = torch.randn(6, 3, dtype=torch.float64)
    torch.testing.assert_close(lin(x), model.eval()(x))
    assert model.training is False and lin._function.training is False
    assert set(lin.state_dict()) == {f"{kind}.{n}" for kind in ("params", "reference")
                                     for n, _ in model.named_parameters()}
    with pytest.raises(errors.InputError, match="degree must be an int >= 1"):
        ntbridge.taylor_expand(model, 0)
    with pytest.raises(errors.InputTypeError, match="returned int too"):
        ntbridge.linearize(Outputs(with_int=True))(x)


def test_expansions_follow_their_module_to_any_device_and_dtype():
    """Every tensor an expansion uses moves with ``.to``: on the meta device (a stand-in for CUDA
    that any machine has) a tensor left behind on the CPU would raise."""
    model, x = cnn(), torch.randn(4, 1, 6, 6, dtype=torch.float64)
    lin = ntbridge.linearize(model).to("meta")
    out = lin(x.to("meta"))
    out.square().sum().backward()
    assert out.device.type == "meta" and out.shape == (4, 3)
    assert all(p.grad.device.type == "meta" for p in lin.params.parameters())
    single = ntbridge.linearize(model).float()
    torch.testing.assert_close(single(x.float()), model.float()(x.float()))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_expansions_on_cuda_equal_those_on_the_cpu():
    model, x = cnn(), torch.randn(4, 1, 6, 6, dtype=torch.float64)
    lin = ntbridge.linearize(model)
    step = perturb(lin, 0.1)
    gpu = ntbridge.linearize(copy.deepcopy(model).cuda())
    with torch.no_grad():
        for name, p in gpu.params.named_parameters():
            p += step[name].cuda()
    out = gpu(x.cuda())
    out.square().sum().backward()
    assert out.device.type == "cuda"
    torch.testing.assert_close(out.cpu(), lin(x), rtol=0, atol=1e-12)


class Outputs(nn.Module):
    """A model returning a dict of tensors (and an int, with ``with_int``)."""

    def __init__(self, with_int=False):
        super().__init__()
        self.a, self.b, self.with_int = nn.Linear(3, 4).double(), nn.Linear(4, 1).double(), with_int

    def forward(self, x):
        h = torch.tanh(self.a(x))
        out = {"features": h, "head": [self.b(h)]}
        return {**out, "count": 3} if self.with_int else out


def test_expansions_of_several_outputs_expand_each():
    model, x = Outputs(), torch.randn(5, 3, dtype=torch.float64)
    quad = ntbridge.taylor_expand(model, 2)
    step = perturb(quad, 0.1)
    p0 = dict(model.named_parameters())
    f = lambda p: functional_call(model, p, (x,))["head"][0]  # noqa: E731
    df = lambda p: jvp(f, (p,), (step,))[1]  # noqa: E731
    second = jvp(df, (p0,), (step,))[1]
    expected = f(p0) + df(p0) + second / 2
    out = quad(x)
    assert set(out) == {"features", "head"} and out["features"].shape == (5, 4)
    torch.testing.assert_close(out["head"][0], expected, rtol=0, atol=1e-12)


@pytest.mark.slow
def test_expansions_compile_to_one_graph():
    model, x = mlp(), torch.randn(7, 3, dtype=torch.float64)
    lin = ntbridge.linearize(model)
    perturb(lin, 0.1)
    compiled = torch.compile(lin, backend="aot_eager", fullgraph=True)
    eager, out = lin(x), compiled(x)
    torch.testing.assert_close(out, eager, rtol=0, atol=1e-12)
    grads = torch.autograd.grad(out.square().sum(), list(lin.parameters()))
    expected = torch.autograd.grad(eager.square().sum(), list(lin.parameters()))
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e, rtol=0, atol=1e-12)
