"""The ``"torch.func"`` strategy: the empirical NTK computed torch-side, with ``torch.func``'s
per-example Jacobians (``vmap(jacrev)`` of ``functional_call``), contracted one parameter at a
time under the same axes rules as the JAX strategies (:mod:`.axes`).

Nothing is exported, translated or compiled, so its first call costs what its work costs; the
``"auto"`` choice of the pipeline (:mod:`.payback`) takes it where a compiled program could not
pay its compilation back. Jacobians are formed for blocks of examples whose Jacobian holds at most
``budget`` bytes.

Example:
    >>> k = torch_ntk(model, x1, x2, Axes.of(2, (-1,), ()))         # (N1, N2)
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch.func import functional_call, jacrev, vmap

from ..tiling.arrays import symmetrize
from .axes import Axes, contract_subscripts

JACOBIAN_BYTES = 2 ** 28  # bytes of the Jacobians of one block of examples


def output_ndim(model: torch.nn.Module, x: torch.Tensor) -> int:
    """The rank of ``model``'s output (batch axis included) on one example of ``x``."""
    with torch.no_grad():
        return model(x[:1]).ndim


def jacobian_fn(model: torch.nn.Module) -> Callable[[torch.Tensor], dict[str, torch.Tensor]]:
    """``jac(x)``: ``{name: (n, *out, *param_shape)}``, each example's Jacobian w.r.t. the
    model's parameters at their current values (buffers as they are)."""
    params = {name: p.detach() for name, p in model.named_parameters()}
    buffers = dict(model.named_buffers())
    one = lambda p, xi: functional_call(model, (p, buffers), (xi[None],))[0]
    per_example = vmap(jacrev(one), in_dims=(None, 0))
    return lambda x: per_example(params, x)


def _block_rows(model: torch.nn.Module, out_units: int, budget: int) -> int:
    """Examples per block whose Jacobians fit in ``budget`` bytes."""
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    return max(1, budget // max(1, size * out_units))


def _contract(j1: dict, j2: dict, axes: Axes) -> torch.Tensor:
    """``sum_p`` of the contraction of ``j1[p] (n1, *out, *p)`` with ``j2[p]`` (axes rules)."""
    total = None
    for name, a in j1.items():
        spec = contract_subscripts(a.ndim - axes.out_ndim, axes)
        k = torch.einsum(spec, a, j2[name]) / axes.scale(a.shape[:axes.out_ndim])
        total = k if total is None else total + k
    return total


def torch_ntk(model: torch.nn.Module, x1: torch.Tensor, x2: torch.Tensor | None, axes: Axes,
              budget: int = JACOBIAN_BYTES) -> torch.Tensor:
    """The empirical NTK of ``model`` at its weights, ``(N1, N2, *kept)`` as the JAX strategies
    give it (see the package doc); exactly symmetric when ``x2`` is None. No autograd history.

    Args:
      model: the torch model (eval mode where its forward is random in training mode).
      x1, x2: ``(N1, ...)``, ``(N2, ...)`` inputs (x2 None for x2 = x1).
      axes: the output axes rules, for outputs of rank ``axes.out_ndim``.
      budget: bytes of the Jacobians of one block of examples.
    """
    xb = x1 if x2 is None else x2
    with torch.no_grad():
        out_units = math.prod(model(x1[:1]).shape[1:])
        rows = _block_rows(model, out_units, budget)
        jac = jacobian_fn(model)
        blocks2 = [xb[s:s + rows] for s in range(0, len(xb), rows)]
        held = [jac(b) for b in blocks2] if len(blocks2) <= 4 else None  # else recomputed
        parts = []
        for s in range(0, len(x1), rows):
            j1 = held[s // rows] if held and x2 is None else jac(x1[s:s + rows])
            parts.append(torch.cat([_contract(j1, held[n] if held else jac(b), axes)
                                    for n, b in enumerate(blocks2)], dim=1))
        k = torch.cat(parts, dim=0)
        return k if x2 is not None else symmetrize(k, axes.swap_perm(k.ndim))
