"""The ``"torch.func"`` strategy: the empirical NTK computed torch-side, with ``torch.func``'s
per-example Jacobians (``vmap(jacrev)`` of ``functional_call``), contracted one parameter at a
time under the same axes rules as the JAX strategies (:mod:`.axes`).

Nothing is exported, translated or compiled, so its first call costs what its work costs; the
``"auto"`` choice of the pipeline (:mod:`.payback`) takes it where a compiled program could not
pay its compilation back. Jacobians are formed for blocks of examples whose Jacobian holds at most
``budget`` bytes; x2's are held for every block of x1 up to :data:`HELD_BYTES`, else
recomputed.

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

JACOBIAN_BYTES = 2 ** 31  # bytes of the Jacobians of one block of examples
HELD_BYTES = 2 ** 32  # x2's Jacobians are held (not recomputed per block of x1) up to this size


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


def _jacobian_bytes(model: torch.nn.Module, out_units: int) -> int:
    """The bytes of one example's Jacobian."""
    return max(1, out_units * sum(p.numel() * p.element_size() for p in model.parameters()))


def _contract(j1: dict, j2: dict, axes: Axes) -> torch.Tensor:
    """``sum_p`` of the contraction of ``j1[p] (n1, *out, *p)`` with ``j2[p]`` (axes rules)."""
    total = None
    for name, a in j1.items():
        spec = contract_subscripts(a.ndim - axes.out_ndim, axes)
        k = torch.einsum(spec, a, j2[name]) / axes.scale(a.shape[:axes.out_ndim])
        total = k if total is None else total + k
    return total


def _known_rows(jac: Callable, x: torch.Tensor, known: dict | None) -> Callable:
    """``rows(s, e)``: the Jacobians of ``x[s:e]``, those of its first rows taken from
    ``known`` (the Jacobians of ``x[:n]``, e.g. computed while estimating the work)."""
    n = 0 if not known else len(next(iter(known.values())))

    def rows(s: int, e: int) -> dict:
        e = min(e, len(x))
        if s >= n:
            return jac(x[s:e])
        head = {name: a[s:min(e, n)] for name, a in known.items()}
        if e <= n:
            return head
        tail = jac(x[n:e])
        return {name: torch.cat([a, tail[name]]) for name, a in head.items()}

    return rows


def torch_ntk(model: torch.nn.Module, x1: torch.Tensor, x2: torch.Tensor | None, axes: Axes,
              budget: int = JACOBIAN_BYTES, known: dict | None = None) -> torch.Tensor:
    """The empirical NTK of ``model`` at its weights, ``(N1, N2, *kept)`` as the JAX strategies
    give it (see the package doc); exactly symmetric when ``x2`` is None. No autograd history.

    Args:
      model: the torch model (eval mode where its forward is random in training mode).
      x1, x2: ``(N1, ...)``, ``(N2, ...)`` inputs (x2 None for x2 = x1).
      axes: the output axes rules, for outputs of rank ``axes.out_ndim``.
      budget: bytes of the Jacobians of one block of examples.
      known: the Jacobians of the first examples of x1 (:func:`jacobian_fn`'s), if computed.
    """
    xb = x1 if x2 is None else x2
    with torch.no_grad():
        out_units = math.prod(model(x1[:1]).shape[1:])
        each = _jacobian_bytes(model, out_units)
        rows = max(1, budget // each)
        jac = jacobian_fn(model)
        rows1 = _known_rows(jac, x1, known)
        starts2 = range(0, len(xb), rows)
        block2 = (lambda s: rows1(s, s + rows)) if x2 is None else (lambda s: jac(xb[s:s + rows]))
        held = [block2(s) for s in starts2] if len(xb) * each <= HELD_BYTES else None
        parts = []
        for s in range(0, len(x1), rows):
            j1 = held[s // rows] if held and x2 is None else rows1(s, s + rows)
            parts.append(torch.cat([_contract(j1, held[n] if held else block2(t), axes)
                                    for n, t in enumerate(starts2)], dim=1))
        k = torch.cat(parts, dim=0)
        return k if x2 is not None else symmetrize(k, axes.swap_perm(k.ndim))
