"""Independent references, not computed with ntbridge: Jacobians from torch itself (torch.func), and
Gaussian expectations by scipy's adaptive quadrature."""

import math

import torch
from scipy import integrate
from torch.func import functional_call, jacrev, vmap


def jacobians(model, x, names=None, batch=False):
    """Jacobians of ``model`` at its current weights: name -> ``(N, *out, *param)``.

    Per example (each example alone through the model), or, with ``batch``, of the whole batch's
    output (examples that interact, e.g. BatchNorm in train mode). ``names``: only these parameters.
    """
    params = {k: v.detach() for k, v in model.named_parameters() if names is None or k in names}
    if batch:
        return jacrev(lambda p: functional_call(model, p, (x,), strict=False))(params)
    single = lambda p, xi: functional_call(model, p, (xi[None],), strict=False)[0]
    return vmap(jacrev(single), in_dims=(None, 0))(params, x)


def full_ntk(model, x1, x2, names=None, batch=False):
    """``sum_p J1 J2^T`` of shape ``(N1, N2, *out, *out)``; with ``batch``, of the joint batch
    ``cat(x1, x2)``."""
    if batch:
        j = jacobians(model, torch.cat([x1, x2]), names, batch=True)
        j1, j2 = ({k: v[:len(x1)] for k, v in j.items()}, {k: v[len(x1):] for k, v in j.items()})
    else:
        j1, j2 = jacobians(model, x1, names), jacobians(model, x2, names)
    out = 0
    for name in j1:
        a, b = j1[name], j2[name]
        out_ndim = a.ndim - model.get_parameter(name).ndim
        a, b = a.flatten(out_ndim), b.flatten(out_ndim)
        k = torch.tensordot(a, b, dims=([a.ndim - 1], [b.ndim - 1]))  # (N1, *out, N2, *out)
        out = out + k.movedim(out_ndim, 1)
    return out


def empirical_ntk(model, x1, x2, trace=True):
    """sum_p J1 J2^T: ``(N1, N2)`` averaged over outputs if ``trace``, else ``(N1, N2, O, O)``."""
    out = full_ntk(model, x1, x2)
    if trace:
        return torch.diagonal(out, dim1=2, dim2=3).mean(-1)
    return out


def channel_averaged_ntk(model, x1, x2):
    """The NTK of a model whose outputs are ``(N, C, *S)``, averaged over output channels, in the
    analytic kernel's layout ``(N1, N2, S1, S1', S2, S2', ...)`` (a numpy array)."""
    full = full_ntk(model, x1, x2)  # (N1, N2, C, *S, C, *S)
    ndim = (full.ndim - 4) // 2
    diag = torch.diagonal(full, dim1=2, dim2=3 + ndim).mean(-1)  # (N1, N2, *S, *S)
    return diag.permute(0, 1, *[i for d in range(ndim) for i in (2 + d, 2 + ndim + d)]).numpy()


# ------------------------------------------------------------ Gaussian expectations by quadrature
WIDTH = 12.0  # in standard deviations: the normal density beyond is below 1e-31


def _pdf(z):
    return math.exp(-z * z / 2) / math.sqrt(2 * math.pi)


def _mean(g, m, sd, kinks, tol):
    """E[g(m + sd z)] for a standard normal z."""
    if sd == 0:
        return g(m)
    points = sorted({(k - m) / sd for k in kinks if abs(k - m) < WIDTH * sd}) or None
    return integrate.quad(lambda z: g(m + sd * z) * _pdf(z), -WIDTH, WIDTH, points=points,
                          epsabs=tol, epsrel=tol, limit=500)[0]


def expectation(f, g, q1, q2, c, kinks, tol=1e-13):
    """E[f(u) g(v)], (u, v) centred Gaussian: v given u is N(a u, q2 - a c) with a = c / q1."""
    a, root = c / q1, math.sqrt(q1)
    sd = math.sqrt(max(q2 - a * c, 0.0))
    points = {k / root for k in kinks} | ({k / (a * root) for k in kinks} if a else set())
    points = sorted(p for p in points if abs(p) < WIDTH) or None
    outer = lambda z: f(root * z) * _pdf(z) * _mean(g, a * root * z, sd, kinks, tol)
    return integrate.quad(outer, -WIDTH, WIDTH, points=points, epsabs=tol, epsrel=tol, limit=500)[0]


def scale(f, q1, q2, kinks):
    """``sqrt(E f(u)^2 E f(v)^2)``: the scale of ``E[f(u) f(v)]`` (its value at correlation 1 for
    equal variances)."""
    return math.sqrt(_mean(lambda x: f(x) ** 2, 0, math.sqrt(q1), kinks, 1e-13)
                     * _mean(lambda x: f(x) ** 2, 0, math.sqrt(q2), kinks, 1e-13))
