"""Independent references computed with torch itself (torch.func), not with ntbridge."""

import torch
from torch.func import functional_call, jacrev, vmap


def jacobians(model, x):
    """Per-example Jacobians of ``model`` at its current weights: name -> (N, *out, *param)."""
    params = {k: v.detach() for k, v in model.named_parameters()}
    single = lambda p, xi: functional_call(model, p, (xi[None],))[0]
    return vmap(jacrev(single), in_dims=(None, 0))(params, x)


def empirical_ntk(model, x1, x2, trace=True):
    """sum_p J1 J2^T: ``(N1, N2)`` averaged over outputs if ``trace``, else ``(N1, N2, O, O)``."""
    j1, j2 = jacobians(model, x1), jacobians(model, x2)
    out = 0
    for name in j1:
        a, b = j1[name].flatten(2), j2[name].flatten(2)
        out = out + torch.einsum("nop,mqp->nmoq", a, b)
    if trace:
        return torch.diagonal(out, dim1=2, dim2=3).mean(-1)
    return out
