"""Monte-Carlo estimates of a torch architecture's NNGP and NTK over random Gaussian inits.

Independent of ntbridge: plain torch and torch.func. Affine modules (Linear, ConvNd) are redrawn
Gaussian with torch's default init variances (``Var(W) = W_STD**2 / fan_in``, ``Var(b) =
B_STD(fan_in)**2``); other parameters (e.g. LayerNorm's or BatchNorm's affine ones) keep their
current values and count in the NTK unscaled, in both parameterizations. Gaussian
rather than torch's uniform: the analytic kernel assumes Gaussian pre-activations, which the first
layer has exactly only for Gaussian weights.

In NTK parameterization each parameter ``theta = sigma * omega`` is trained through ``omega``, so
its NTK contribution is that of ``theta`` times ``sigma**2``: no separate model is needed.

:func:`fresh_kernels` instead builds fresh models by their own constructors, as torch initialises
them (uniform weights, ``nn.TransformerEncoder``'s copies of its layer), and :func:`z_scores`
compares a kernel with their mean in the samples' own standard errors.
"""

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.func import functional_call, jacrev, vmap

W_STD = 3 ** -0.5


def B_STD(fan_in):
    return (3 * fan_in) ** -0.5


def init_stds(model: nn.Module) -> dict[str, float]:
    """Standard deviation of each redrawn parameter, by its name in ``model.named_parameters()``."""
    stds = {}
    for name, m in model.named_modules():
        if isinstance(m, (nn.Linear, nn.modules.conv._ConvNd)):
            fan_in = m.weight[0].numel()
            prefix = f"{name}." if name else ""
            stds[prefix + "weight"] = W_STD / fan_in ** 0.5
            if m.bias is not None:
                stds[prefix + "bias"] = B_STD(fan_in)
    return stds


def sample_kernels(model: nn.Module, x: torch.Tensor, samples: int, parameterization="standard",
                   chunk=10, ntk_outputs=4, seed=1234):
    """Per-sample kernels ``(nngp, ntk)``, each ``(samples, N, N)``, of inputs ``x`` (a graph
    model's: a pair ``(x, adjacency)``).

    NNGP: ``f(x) f(x)^T`` averaged over all output units (``f`` flattened per example); NTK: the
    empirical NTK averaged over the first ``ntk_outputs`` output units (as good a sample, cheaper).
    Use many output units: the NNGP's own sample noise does not shrink with width.
    """
    gen = torch.Generator().manual_seed(seed)
    stds = init_stds(model)
    fixed = {k: v.detach() for k, v in model.named_parameters() if k not in stds}
    scale = {k: (s ** 2 if parameterization == "ntk" else 1.0) for k, s in stds.items()}
    inputs = x if isinstance(x, tuple) else (x,)  # a graph model's (x, adjacency), or x
    forward = lambda p, xs: functional_call(model, {**fixed, **p}, xs).flatten(1)
    nngps, ntks = [], []
    for _ in range(math.ceil(samples / chunk)):
        params = {k: s * torch.randn(chunk, *model.get_parameter(k).shape, generator=gen,
                                     dtype=inputs[0].dtype) for k, s in stds.items()}

        def one(p):
            f = forward(p, inputs)
            single = lambda pp, *xi: forward(pp, tuple(a[None] for a in xi))[0, :ntk_outputs]
            jac = vmap(jacrev(single), in_dims=(None, *[0] * len(inputs)))({**fixed, **p}, *inputs)
            ntk = sum(scale.get(k, 1.0) * torch.einsum("nop,mop->nm", j.flatten(2), j.flatten(2))
                      for k, j in jac.items())
            return f @ f.T / f.shape[1], ntk / min(ntk_outputs, f.shape[1])

        a, b = vmap(one, randomness="same")(params)
        nngps.append(a)
        ntks.append(b)
    return torch.cat(nngps)[:samples], torch.cat(ntks)[:samples]


def assert_within_standard_error(samples: torch.Tensor, exact: torch.Tensor, label: str,
                                 z_max: float = 5.0, power: float = 0.03):
    """Every entry of the sample mean within ``z_max`` standard errors of ``exact``.

    The standard error comes from the samples themselves. ``z_max = 5`` keeps the chance of a
    false failure negligible over all entries; the standard error must be below ``power`` times
    the kernel's largest entry, so that the check can fail on a real discrepancy.
    """
    mean, se = samples.mean(0), samples.std(0) / math.sqrt(samples.shape[0])
    z = (mean - exact) / se
    assert (se < power * exact.abs().max()).all(), f"{label}: too few samples to test anything"
    assert z.abs().max() < z_max, f"{label}: max |z| = {z.abs().max():.2f}\n{z}"


def check_architecture(build, parameterization, samples=100, ntk_outputs=2):
    """The analytic kernels of ``build() -> (model, input_shape)`` (float64, 3 inputs) agree with
    the Monte-Carlo estimate within 5 standard errors."""
    import ntbridge
    model, shape = build()
    model = model.double()
    x = torch.randn(3, *shape, dtype=torch.float64)
    nngp_samples, ntk_samples = sample_kernels(model, x, samples, parameterization, chunk=50,
                                               ntk_outputs=ntk_outputs)
    k = ntbridge.kernel(model, x, parameterization=parameterization)
    assert_within_standard_error(nngp_samples, k.nngp, "NNGP")
    assert_within_standard_error(ntk_samples, k.ntk, f"NTK ({parameterization})")


def fresh_kernels(build: Callable[[], nn.Module], x: torch.Tensor, samples: int,
                  seed: int = 0, ntk_outputs: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """The empirical NNGP and NTK of ``samples`` models ``build()`` (each built under
    ``torch.manual_seed(seed + s)``, then made float64), each ``(samples, N, N)``; ``x`` a tensor,
    or a tuple of them for a ``forward`` taking several.

    The model's output is ``(N, O)`` or a sequence ``(N, T, O)``, features last; a sequence's
    kernels keep every pair of tokens, ``(samples, N, N, T, T)``, as the analytic kernel does. NNGP:
    the output units' mean of ``f(x) f(x')``; NTK: ``sum_p df/dp df'/dp`` over every parameter, the
    mean over the first ``ntk_outputs`` units.
    """
    nngps, ntks = [], []
    for s in range(samples):
        torch.manual_seed(seed + s)
        model = build().double()
        params = list(model.parameters())
        out = model(*x) if isinstance(x, tuple) else model(x)  # a pair: forward(x, memory)
        n, units = out.shape[0], out.shape[-1]
        f = out.reshape(n, -1, units)  # (N, T, O), T = 1 without tokens
        nngps.append(torch.einsum("nto,mso->nmts", f, f).detach() / units)
        rows = f[..., :ntk_outputs].reshape(-1)  # their gradients in one batched backward pass
        grads = torch.autograd.grad(rows, params, torch.eye(len(rows), dtype=rows.dtype),
                                    is_grads_batched=True, materialize_grads=True)
        jac = torch.cat([g.reshape(len(rows), -1) for g in grads], 1)
        jac = jac.reshape(n, f.shape[1], ntk_outputs, -1)
        ntks.append(torch.einsum("ntop,msop->nmts", jac, jac) / ntk_outputs)
    nngp, ntk = torch.stack(nngps), torch.stack(ntks)
    return (nngp, ntk) if f.shape[1] > 1 else (nngp[..., 0, 0], ntk[..., 0, 0])


def standard_error(samples: torch.Tensor) -> torch.Tensor:
    """The standard error of the samples' mean (over the first axis), from their own spread."""
    return samples.std(0, correction=1) / math.sqrt(samples.shape[0])


def z_scores(samples: torch.Tensor, analytic: torch.Tensor, error: float = 0.0) -> torch.Tensor:
    """``|analytic - mean| / spread`` per entry: the spread is the samples' standard error (ddof=1)
    and the analytic kernel's own relative ``error`` times its largest entry, in quadrature."""
    spread = torch.sqrt(standard_error(samples) ** 2 + (error * analytic.abs().max()) ** 2)
    return (analytic - samples.mean(0)).abs() / spread
