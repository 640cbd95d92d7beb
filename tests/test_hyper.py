"""Analytic kernels differentiable in their hyper-parameters (W_std, b_std as torch tensors):
gradients against central finite differences and against the closed-form ReLU (arc-cosine)
kernel differentiated by torch autograd, tiles and dtypes, one compiled program for every value,
a GP marginal-likelihood fit on scikit-learn's diabetes data, and bad values.

Tolerances: central differences with step h in float64 err by ``h**2 |f'''| / 6 ~ 1e-12`` plus
round-off ``eps |f| / h ~ 1e-10`` relative, so 1e-6 holds with a wide margin. The closed form
and ntbridge evaluate the same formulas in another order: their gradients agree to float64
round-off amplified by ``1 / sin(theta)`` of the arc-cosine (distinct random points keep
``sin(theta)`` away from 0), well inside 1e-9.
"""

import math

import pytest
import torch
from torch import nn

import ntbridge
from ntbridge import errors, programs
from helpers import mlp

f64 = dict(dtype=torch.float64)
WIDTHS = (3, 16, 16)  # in_features, then the hidden widths of the ReLU MLP


def relu_mlp():
    return mlp(WIDTHS[0], WIDTHS[1:], 1).double()


def relu_kernels(x1, x2, W, b):
    """Closed-form NNGP and NTK (standard parameterization) of :func:`relu_mlp` in torch ops, with
    per-layer standard deviations ``W[l]``, ``b[l]`` (tensors: autograd differentiates them);
    ``x2=None`` for x1 with itself. The arc-cosine's derivative is singular at theta = 0, so the
    diagonal of x1 with itself takes its limit (theta = 0) separately."""
    same = torch.eye(len(x1), dtype=torch.bool) if x2 is None else torch.tensor(False)
    x2 = x1 if x2 is None else x2
    nngp, q1, q2 = x1 @ x2.T / x1.shape[1], (x1 * x1).mean(1), (x2 * x2).mean(1)
    ntk = torch.zeros_like(nngp)
    for layer, fan_in in enumerate(WIDTHS):
        if layer:  # ReLU of the Gaussian pre-activations: Cho & Saul's arc-cosine kernel
            s = torch.sqrt(q1[:, None] * q2[None, :])
            theta = torch.where(same, 0.0, torch.arccos(torch.where(same, 0.0, nngp / s)))
            ntk = ntk * (math.pi - theta) / (2 * math.pi)
            nngp = s * (torch.sin(theta) + (math.pi - theta) * torch.cos(theta)) / (2 * math.pi)
            q1, q2 = q1 / 2, q2 / 2
        ntk = fan_in * nngp + 1 + W[layer] ** 2 * ntk
        nngp, q1, q2 = (W[layer] ** 2 * v + b[layer] ** 2 for v in (nngp, q1, q2))
    return nngp, ntk


def stds(W, b):
    """ntbridge's options for per-layer standard deviations of :func:`relu_mlp`."""
    names = ("0", "2", "4")
    return dict(W_std=dict(zip(names, W)), b_std=dict(zip(names, b)))


def leaves(*values):
    return [torch.tensor(v, **f64, requires_grad=True) for v in values]


@pytest.mark.slow
def test_gradients_match_the_closed_form_relu_kernel():
    x1, x2 = torch.randn(5, 3, **f64), torch.randn(4, 3, **f64)
    W, b = leaves(1.3, 0.8, 1.1), leaves(0.2, 0.4, 0.1)
    got = ntbridge.kernel(relu_mlp(), x1, x2, **stds(W, b))
    expected = relu_kernels(x1, x2, W, b)
    for k, ref in zip(got, expected):
        torch.testing.assert_close(k, ref, rtol=1e-12, atol=0)
    weights = torch.randn(2, 5, 4, **f64)  # a generic cotangent for each kernel
    loss = lambda ks: sum((w * k).sum() for w, k in zip(weights, ks))
    ours = torch.autograd.grad(loss(got), [*W, *b])
    theirs = torch.autograd.grad(loss(expected), [*W, *b])
    torch.testing.assert_close(torch.stack(ours), torch.stack(theirs), rtol=1e-9, atol=0)


def central_difference(f, values, h=1e-6):
    """``d f / d values[i]`` for each ``i`` by central differences (floats in, floats out)."""
    out = []
    for i in range(len(values)):
        step = lambda s: f([v + s * h * (j == i) for j, v in enumerate(values)])
        out.append((step(1) - step(-1)) / (2 * h))
    return torch.tensor(out, **f64)


CASES = {  # name -> (model, x1, x2 or None, batch_size)
    "mlp-x2": (relu_mlp, (6, 3), (4, 3), None),
    "mlp-symmetric-tiles": (relu_mlp, (9, 3), None, 4),
    "cnn-tiles": (lambda: nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(),
                                        nn.Conv2d(4, 4, 3), nn.Flatten(), nn.Linear(16, 1)).double(),
                  (5, 2, 4, 4), (3, 2, 4, 4), 2),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES.values(), ids=CASES)
def test_gradients_match_finite_differences(case):
    make, s1, s2, batch_size = case
    model = make()
    names = [n for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    x1, x2 = torch.randn(s1, **f64), None if s2 is None else torch.randn(s2, **f64)
    weights = torch.randn(2, s1[0], s1[0] if s2 is None else s2[0], **f64)
    values = [1.2 + 0.1 * i for i in range(len(names))] + [0.3 + 0.1 * i for i in range(len(names))]

    def loss(v):  # a generic linear function of the NNGP and the NTK
        W, b = v[:len(names)], v[len(names):]
        k = ntbridge.kernel(model, x1, x2, W_std=dict(zip(names, W)), b_std=dict(zip(names, b)),
                            batch_size=batch_size)
        return (weights[0] * k.nngp).sum() + (weights[1] * k.ntk).sum()

    tensors = leaves(*values)
    got = torch.stack(torch.autograd.grad(loss(tensors), tensors))
    expected = central_difference(lambda v: loss(v).item(), values)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=0)


@pytest.mark.slow
def test_tiles_and_float32_give_the_same_gradient():
    model, x = relu_mlp(), torch.randn(10, 3, **f64)
    grads = {}
    for dtype, batch_size in ((torch.float64, None), (torch.float64, 3), (torch.float32, 4)):
        W = torch.tensor(1.4, dtype=dtype, requires_grad=True)
        b = torch.tensor(0.3, dtype=dtype, requires_grad=True)
        k = ntbridge.ntk(model.to(dtype), x.to(dtype), W_std=W, b_std=b, batch_size=batch_size)
        k.square().sum().backward()
        assert W.grad.dtype == dtype and W.grad.shape == ()
        grads[dtype, batch_size] = torch.stack([W.grad, b.grad]).double()
    reference = grads[torch.float64, None]
    torch.testing.assert_close(grads[torch.float64, 3], reference, rtol=1e-12, atol=0)
    torch.testing.assert_close(grads[torch.float32, 4], reference, rtol=1e-5, atol=0)


@pytest.mark.slow
def test_one_program_serves_every_value(monkeypatch):
    model, x = relu_mlp(), torch.randn(6, 3, **f64)
    compiled = []
    real = programs.compile
    monkeypatch.setattr(programs, "compile", lambda key, *a, **kw: compiled.append(key) or
                        real(key, *a, **kw))
    for value in (1.0, 1.7, torch.tensor(0.9, **f64, requires_grad=True)):
        k = ntbridge.ntk(model, x, W_std=value, b_std=0.2)
        if isinstance(value, torch.Tensor):
            k.sum().backward()
    purposes = [key.purpose for key in compiled]
    assert purposes.count("tiles") <= 1 and purposes.count("tile vjp") <= 1, purposes
    # and the values are not constants of that program: each gives its own kernel
    assert not torch.allclose(ntbridge.ntk(model, x, W_std=1.0, b_std=0.2),
                              ntbridge.ntk(model, x, W_std=1.7, b_std=0.2))


def test_floats_and_tensors_agree_and_floats_carry_no_history():
    model, x = relu_mlp(), torch.randn(6, 3, **f64)
    plain = ntbridge.nngp(model, x, W_std=1.3, b_std={"0": 0.1, "2": 0.2, "4": 0.3})
    tensor = ntbridge.nngp(model, x, W_std=torch.tensor(1.3, **f64, requires_grad=True),
                           b_std={"0": 0.1, "2": torch.tensor([0.2], **f64), "4": 0.3})
    assert not plain.requires_grad and tensor.requires_grad
    torch.testing.assert_close(tensor, plain, rtol=0, atol=0)


@pytest.mark.parametrize("value, error, match", [
    (torch.tensor(-0.5), errors.InputError, r"W_std\['2'\] must be finite and non-negative"),
    (torch.tensor(float("inf")), errors.InputError, r"W_std\['2'\] must be finite.*got inf"),
    (torch.tensor([1.0, 2.0]), errors.InputTypeError, r"W_std\['2'\] is a tensor of shape \(2,\)"),
    (torch.tensor(1), errors.InputTypeError, r"dtype torch.int64; pass a floating-point scalar"),
    (-1.0, errors.InputError, r"W_std\['2'\] must be finite and non-negative.*softplus"),
])
def test_bad_values_are_refused(value, error, match):
    with pytest.raises(error, match=match):
        ntbridge.ntk(relu_mlp(), torch.randn(4, 3, **f64), W_std={"2": value})


def negative_log_likelihood(k, y, noise):
    """The GP's negative log marginal likelihood per example, kernel ``k + noise**2 I``."""
    n = len(y)
    chol = torch.linalg.cholesky(k + noise ** 2 * torch.eye(n, **f64))
    alpha = torch.cholesky_solve(y[:, None], chol)[:, 0]
    return (0.5 * y @ alpha + torch.log(torch.diagonal(chol)).sum()) / n + 0.5 * math.log(2 * math.pi)


def fit(kernel_of, x, y):
    """W_std, b_std (shared by the layers) and the noise maximising the marginal likelihood of
    the NNGP ``kernel_of(W, b)`` by L-BFGS on their logarithms; returns them and the loss."""
    raw = torch.tensor([0.0, -1.0, -1.0], **f64, requires_grad=True)
    optimizer = torch.optim.LBFGS([raw], max_iter=60, tolerance_grad=1e-9, tolerance_change=1e-14,
                                  line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        W, b, noise = raw.exp()
        loss = negative_log_likelihood(kernel_of(W, b), y, noise)
        loss.backward()
        return loss

    first = closure().item()
    optimizer.step(closure)
    loss = closure()
    return raw.detach().exp(), first, loss.item(), raw.grad.abs().max().item()


@pytest.mark.slow
def test_marginal_likelihood_fit_on_diabetes_matches_the_closed_form():
    from sklearn.datasets import load_diabetes

    x, y = (torch.tensor(a, **f64) for a in load_diabetes(return_X_y=True))
    x, y = x[:200, :3], y[:200]  # three features, as the MLP's input
    x, y = (x - x.mean(0)) / x.std(0), (y - y.mean()) / y.std()
    model = relu_mlp()
    ours = fit(lambda W, b: ntbridge.nngp(model, x, W_std=W, b_std=b), x, y)
    reference = fit(lambda W, b: relu_kernels(x, None, [W] * 3, [b] * 3)[0], x, y)
    params, first, loss, grad = ours
    assert grad < 1e-6 and loss < first - 0.05  # converged, and fitting mattered
    torch.testing.assert_close(params, reference[0], rtol=1e-5, atol=0)
    assert abs(loss - reference[2]) < 1e-8
