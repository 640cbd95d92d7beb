"""ntbridge.gpytorch: NNGP and NTK kernels of torch models inside GPyTorch and BoTorch.

They equal ntbridge's own kernels (float64 round-off), BoTorch's InfiniteWidthBNNKernel for ReLU
MLPs (within 1e-6: BoTorch clamps its arc-cosine's argument to ``1 - 1e-7``, which moves the
diagonal by about ``1e-7`` relative per layer), batch shapes, ``diag=True``, ScaleKernel, an
ExactGP's training loop, BoTorch's SingleTaskGP with its fitting and an acquisition's input
gradients, and conjugate-gradient training on scikit-learn's digits reaching the marginal
likelihood of the dense (Cholesky) computation.
"""

import functools
import math

import pytest
import torch
from torch import nn

gpytorch = pytest.importorskip("gpytorch")
import linear_operator  # noqa: E402  (installed with gpytorch)

from ntbridge import errors  # noqa: E402
import ntbridge  # noqa: E402
from ntbridge.gpytorch import NNGPKernel, NTKKernel, check_version  # noqa: E402
from helpers import mlp

f64 = dict(dtype=torch.float64)
BOTH = ("weight_std", "bias_std")  # the parameterization that learns both standard deviations


def kernel_of(cls, model, W, b, **options):
    k = cls(model, **options).double()
    k.weight_std, k.bias_std = W, b  # set in float64, so softplus round-trips to the value
    return k


@pytest.mark.parametrize("cls, get", [(NNGPKernel, "nngp"), (NTKKernel, "ntk")])
def test_kernels_equal_ntbridges_full_and_diagonal(cls, get):
    model = mlp(4, [64, 64], 1)
    x1, x2 = torch.randn(7, 4, **f64), torch.randn(3, 4, **f64)
    k = kernel_of(cls, model, 1.3, 0.2)
    expected = ntbridge.kernel(model, x1, x2, get, W_std=1.3, b_std=0.2)
    torch.testing.assert_close(k(x1, x2).to_dense(), expected, rtol=1e-13, atol=0)
    square = ntbridge.kernel(model, x1, None, get, W_std=1.3, b_std=0.2)
    torch.testing.assert_close(k(x1).to_dense(), square, rtol=1e-13, atol=0)
    k.diag_block = 3  # blocks of 3, 3 and 1 examples
    torch.testing.assert_close(k(x1, diag=True), square.diagonal(), rtol=1e-13, atol=0)


def test_nngp_equals_botorchs_infinite_width_bnn_kernel():
    """BoTorch's ``depth`` counts ReLU layers; its ``weight_var`` and ``bias_var`` are the
    squares of every layer's ``W_std`` and ``b_std`` (the first layer's included)."""
    kernels = pytest.importorskip("botorch.models.kernels")
    x1, x2 = torch.randn(6, 5, **f64), torch.randn(4, 5, **f64)
    for depth in (1, 3):
        theirs = kernels.InfiniteWidthBNNKernel(depth=depth).double()
        theirs.weight_var, theirs.bias_var = 1.4 ** 2, 0.3 ** 2
        ours = kernel_of(NNGPKernel, mlp(5, [32] * depth, 1), 1.4, 0.3)
        for args in ((x1, x2), (x1,)):
            torch.testing.assert_close(ours(*args).to_dense(), theirs(*args).to_dense(),
                                       rtol=1e-6, atol=0)
        torch.testing.assert_close(ours(x1, diag=True), theirs(x1, diag=True), rtol=1e-6, atol=0)


def test_batch_shape_gives_each_batch_its_standard_deviations():
    model = mlp(4, [64, 64], 1)
    k = kernel_of(NTKKernel, model, torch.tensor([1.0, 1.5]).view(2, 1, 1), 0.1,
                  batch_shape=torch.Size([2]))
    x1, x2 = torch.randn(2, 5, 4, **f64), torch.randn(3, 4, **f64)  # x2 broadcasts
    got, diag = k(x1, x2).to_dense(), k(x1, diag=True)
    assert got.shape == (2, 5, 3) and diag.shape == (2, 5)
    for i, W in enumerate((1.0, 1.5)):
        opts = dict(W_std=W, b_std=0.1)
        torch.testing.assert_close(got[i], ntbridge.ntk(model, x1[i], x2, **opts), rtol=1e-13, atol=0)
        torch.testing.assert_close(diag[i], ntbridge.ntk(model, x1[i], **opts).diagonal(),
                                   rtol=1e-13, atol=0)


def test_images_and_refusals():
    cnn = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(16, 1))
    x = torch.randn(3, 1, 4, 4, **f64)
    k = kernel_of(NNGPKernel, cnn, 1.2, 0.1, input_shape=(1, 4, 4))
    torch.testing.assert_close(k(x.flatten(1)).to_dense(), ntbridge.nngp(cnn, x, W_std=1.2, b_std=0.1),
                               rtol=1e-13, atol=0)
    with pytest.raises(errors.InputError, match="does not support last_dim_is_batch"):
        k.forward(x.flatten(1), x.flatten(1), last_dim_is_batch=True)
    with pytest.raises(errors.InputError, match="weight_std must be a positive finite float"):
        NNGPKernel(cnn, weight_std=0.0)
    with pytest.raises(errors.UnsupportedLayerError):
        NNGPKernel(nn.Sequential(nn.Linear(4, 4), nn.GRUCell(4, 4)))


def test_empty_inputs_give_empty_kernels_as_gpytorchs_own():
    x0, x = torch.zeros(0, 4, **f64), torch.randn(3, 4, **f64)
    for cls in (NNGPKernel, NTKKernel):
        k = kernel_of(cls, mlp(4, [64, 64], 1), 1.3, 0.2, batch_shape=torch.Size([2]))
        rbf = gpytorch.kernels.RBFKernel(batch_shape=torch.Size([2])).double()
        for args, kwargs in (((x0,), {}), ((x0, x), {}), ((x, x0), {}), ((x0,), dict(diag=True))):
            got, theirs = k(*args, **kwargs), rbf(*args, **kwargs)
            got, theirs = (t if torch.is_tensor(t) else t.to_dense() for t in (got, theirs))
            assert got.shape == theirs.shape and got.dtype == torch.float64, (args, got.shape)


def test_only_bias_std_is_learned_by_default():
    k = NTKKernel(mlp(4, [64, 64], 1), weight_std=1.5)
    assert not k.raw_weight_std.requires_grad and k.raw_bias_std.requires_grad
    assert [name for name, p in k.named_parameters() if p.requires_grad] == ["raw_bias_std"]
    assert NTKKernel(mlp(4, [64, 64], 1), learn=BOTH).double().raw_weight_std.requires_grad
    assert not NTKKernel(mlp(4, [64, 64], 1), learn=()).raw_bias_std.requires_grad
    for learn in ("bias_std", ("W_std",)):
        with pytest.raises(errors.InputError, match="learn must be a tuple of names from"):
            NTKKernel(mlp(4, [64, 64], 1), learn=learn)


@functools.cache  # the two slow tests below share the default's fit (1.5 s)
def fit_bowl(learn):
    """BoTorch's SingleTaskGP with a ScaleKernel(NTKKernel) fitted to a quadratic bowl on 16
    points of the unit cube (deterministic: seed 0, L-BFGS-B): (weight_std, bias_std,
    outputscale, noise, marginal log-likelihood per point)."""
    botorch = pytest.importorskip("botorch")
    torch.manual_seed(0)
    x = torch.rand(16, 3, **f64)
    y = (x - 0.5).square().sum(-1, keepdim=True)
    kernel = NTKKernel(mlp(3, [64, 64], 1), learn=learn)
    gp = botorch.models.SingleTaskGP(x, y, covar_module=gpytorch.kernels.ScaleKernel(kernel))
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(gp.likelihood, gp)
    botorch.fit_gpytorch_mll(mll)
    gp.train()
    return (kernel.weight_std.item(), kernel.bias_std.item(), gp.covar_module.outputscale.item(),
            gp.likelihood.noise.item(), mll(gp(x), gp.train_targets).item())


@pytest.mark.slow
def test_botorch_fit_of_the_default_parameterization_converges_to_sensible_values():
    """Measured: bias_std 0.41, outputscale 1.0, noise 0.0064. Learning weight_std too drifts to
    45, 28 and 2e-7 (the slow test below): these bounds fail there."""
    weight_std, bias_std, outputscale, noise, _ = fit_bowl(("bias_std",))
    assert weight_std == pytest.approx(1.0, rel=1e-6)  # fixed
    assert 0.1 < bias_std < 2 and 0.1 < outputscale < 10 and 1e-4 < noise < 0.1


@pytest.mark.slow
def test_learning_weight_std_too_drifts_without_gaining_likelihood():
    """The previous default: the standard deviations and the outputscale trade off (a ReLU
    network's kernel scales with them), the fit runs off to weight_std 45, bias_std 28 and
    outputscale 2e-7 for 0.01 nats per point more than the identifiable fit."""
    *drifted, drifted_mll = fit_bowl(BOTH)
    *fitted, fitted_mll = fit_bowl(("bias_std",))
    assert drifted[0] > 10 and drifted[2] < 1e-4  # what the default's bounds exclude
    assert 0 <= drifted_mll - fitted_mll < 0.02


@pytest.mark.parametrize("version", ["1.14.0", "2.0.0", "0.9"])
def test_untested_gpytorch_versions_are_refused(version):
    check_version(gpytorch.__version__)  # the installed one is tested
    with pytest.raises(errors.DependencyError, match=f"GPyTorch {version} is installed"):
        check_version(version)


class ExactGP(gpytorch.models.ExactGP):
    def __init__(self, x, y, covar):
        super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood())
        self.mean, self.covar = gpytorch.means.ZeroMean(), covar

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean(x), self.covar(x))


def dense_mll(model, x, y, W, b, scale, noise):
    """The exact marginal log-likelihood per example, by Cholesky, of ntbridge.ntk's kernel."""
    k = scale * ntbridge.ntk(model, x, W_std=W, b_std=b) + noise * torch.eye(len(y), **f64)
    return torch.distributions.MultivariateNormal(torch.zeros_like(y), k).log_prob(y) / len(y)


def train(gp, steps, lr=0.05):
    """GPyTorch's training loop: Adam on the negative marginal log-likelihood."""
    gp.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(gp.likelihood, gp)
    optimizer = torch.optim.Adam(gp.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = -mll(gp(*gp.train_inputs), gp.train_targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def hyper(gp):
    kernel = gp.covar.base_kernel
    return (kernel.weight_std.item(), kernel.bias_std.item(), gp.covar.outputscale.item(),
            gp.likelihood.noise.item())


@pytest.mark.slow
def test_exact_gp_training_loop_with_scale_kernel():
    torch.manual_seed(0)
    model = mlp(4, [64, 64], 1)
    x = torch.randn(40, 4, **f64)
    y = torch.sin(x @ torch.randn(4, **f64))
    gp = ExactGP(x, y, gpytorch.kernels.ScaleKernel(NTKKernel(model, learn=BOTH))).double()
    losses = train(gp, 15)
    assert losses[-1] < losses[0] - 0.1
    assert gp.covar.base_kernel.raw_weight_std.grad.abs() > 0  # the kernel's own hyper-parameters
    torch.testing.assert_close(-losses[-1], dense_mll(model, x, y, *hyper(gp)).item(),
                               rtol=0.05, atol=0)  # one Adam step apart
    gp.eval()
    with torch.no_grad():  # predictions: the kernel between test and training points
        mean = gp(torch.randn(5, 4, **f64)).mean
    assert mean.shape == (5,) and torch.isfinite(mean).all()


@pytest.mark.slow
def test_botorch_single_task_gp_fits_and_its_acquisition_differentiates():
    botorch = pytest.importorskip("botorch")
    torch.manual_seed(0)
    x = torch.rand(20, 3, **f64)
    y = (x - 0.5).square().sum(-1, keepdim=True)
    covar = gpytorch.kernels.ScaleKernel(NNGPKernel(mlp(3, [64, 64], 1)))
    gp = botorch.models.SingleTaskGP(x, y, covar_module=covar)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(gp.likelihood, gp)
    before = mll(gp(x), gp.train_targets).item()
    botorch.fit_gpytorch_mll(mll)
    gp.train()  # fitting leaves it in eval mode
    assert mll(gp(x), gp.train_targets).item() > before
    gp.eval()
    acquisition = botorch.acquisition.LogExpectedImprovement(gp, best_f=gp.train_targets.max())
    candidate = torch.rand(4, 1, 3, **f64, requires_grad=True)
    acquisition(candidate).sum().backward()
    assert candidate.grad.shape == candidate.shape and torch.isfinite(candidate.grad).all()


@pytest.mark.slow
def test_conjugate_gradients_on_digits_reach_the_dense_marginal_likelihood(monkeypatch):
    """500 of scikit-learn's digits, trained by CG and Lanczos (GPyTorch's fast computations,
    forced at this size by max_cholesky_size = 0; importing BoTorch turns them off; the CG calls
    counted) and by Cholesky: after the same Adam steps the exact marginal likelihoods agree. CG's
    gradients are stochastic (Hutchinson's trace estimates, 10 probes), so the hyper-parameters
    differ by a few per cent (measured: 2%); the likelihood, stationary near the optimum, by much
    less (measured: 2e-4 nats per example; asserted: 2e-3)."""
    from sklearn.datasets import load_digits

    x, y = (torch.tensor(a, **f64) for a in load_digits(return_X_y=True))
    x, y = x[:500] / 16, y[:500]
    y = (y - y.mean()) / y.std()
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
    solves = []
    real_cg = linear_operator.utils.linear_cg
    monkeypatch.setattr(linear_operator.utils, "linear_cg",
                        lambda *a, **kw: solves.append(1) or real_cg(*a, **kw))
    results = {}
    for name, fast, cholesky_up_to in (("cg", True, 0), ("dense", False, 10 ** 6)):
        torch.manual_seed(0)
        covar = NTKKernel(model, batch_size=500, learn=BOTH)
        gp = ExactGP(x, y, gpytorch.kernels.ScaleKernel(covar)).double()
        with gpytorch.settings.fast_computations(fast, fast, fast), \
                gpytorch.settings.max_cholesky_size(cholesky_up_to):
            train(gp, 20, lr=0.1)
        results[name] = hyper(gp), dense_mll(model, x, y, *hyper(gp)).item(), len(solves)
    (cg_hyper, cg_mll, cg_solves), (dense_hyper, dense_mll_, all_solves) = results.values()
    assert cg_solves > 0 and all_solves == cg_solves  # CG in the first run only
    assert abs(cg_mll - dense_mll_) < 2e-3, (cg_mll, dense_mll_)
    assert math.isclose(cg_hyper[0], dense_hyper[0], rel_tol=0.05)
