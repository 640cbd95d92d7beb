"""The backward pass of a tiled kernel: the sum of its tiles' VJPs.

Each tile ``(i, j)`` of the kernel is ``task.fn`` of a block of x1's rows and a block of x2's
columns; the gradient of the whole is the sum over tiles of the VJP of each tile's function at the
slice of the incoming gradient the tile produced. With x2 = None, a tile above the diagonal was
also mirrored into its transpose position (both slices are its cotangent) and a diagonal tile was
symmetrized (its cotangent is symmetrized too); both of its input blocks are rows of x1. Padding
rows get zero cotangents, so they contribute nothing.

The VJP program of a tiling is compiled and cached like the forward one (:mod:`ntbridge.programs`,
a key derived from the forward's), and runs one tile per device.

Example:
    >>> d_args, d_x1, d_x2 = vjp(task, x1, x2, opts, [grad_k], tracked=(0,), inputs=(True, True))
"""

from __future__ import annotations

from typing import Sequence

import jax
import torch

from .. import programs
from .arrays import restrict, symmetrize
from .plan import Batching, Tiling
from .compiled import abstract_arguments, options_kind, sharded, shardings, tile_fn
from .run import plan
from .task import Task
from .transfer import per_device, stack, tile_inputs


def _program(task: Task, tiling: Tiling, devices: list, tracked: tuple[int, ...],
             wrt: tuple[bool, bool]):
    """``jit(shard_map)`` of one tile's VJP: ``(args, a1, a2, cts) -> {"args": [d leaf],
    "x1": d a1, "x2": d a2}`` (per device), w.r.t. the ``tracked`` leaves of ``args`` and the
    input blocks flagged in ``wrt``."""
    fn = tile_fn(task, tiling)

    def local(args, a1, a2, cts):
        of_args, sub = restrict(lambda full, ab: fn(full, *ab), args, tracked)
        primal = {"args": sub, "x1": a1[0], "x2": a2[0]}
        primal = {name: v for name, v in primal.items() if name == "args" or wrt[name == "x2"]}
        kernel = lambda p: of_args(p["args"], (p.get("x1", a1[0]), p.get("x2", a2[0])))
        _, pullback = jax.vjp(kernel, primal)
        return jax.tree.map(lambda d: d[None], pullback(jax.tree.map(lambda c: c[0], cts))[0])

    return sharded(local, devices, 3)


def _compiled(task: Task, tiling: Tiling, opts: Batching, x1: torch.Tensor,
              tracked: tuple[int, ...], wrt: tuple[bool, bool], forward):
    devices = tiling.devices(opts)
    arguments = (*abstract_arguments(task, tiling, devices, x1), forward.executable.out_info)
    key = programs.ProgramKey.of("tile vjp", (task.computation, tiling.symmetric, tiling.whole,
                                              tracked, wrt), arguments, devices)
    return programs.cached(key, lambda: programs.compile(
        key, lambda: _program(task, tiling, devices, tracked, wrt).lower(*arguments), devices,
        options_kind(task, tiling, x1)))


def _cotangent(grad: torch.Tensor, tiling: Tiling, i: int, j: int, perm) -> torch.Tensor:
    """The cotangent of tile ``(i, j)``'s output ``(b1, b2, ...)`` from the whole kernel's
    gradient (zero on padding). ``perm`` exchanges x1 and x2 (an involution)."""
    rows, cols = tiling.rows(i), tiling.cols(j)
    ct = grad[rows, cols]
    if tiling.symmetric and i == j:
        ct = symmetrize(ct, perm(ct.ndim))
    elif tiling.symmetric:
        ct = ct + grad[cols, rows].permute(perm(ct.ndim))
    padded = ct.new_zeros((tiling.b1, tiling.b2, *ct.shape[2:]))
    padded[:ct.shape[0], :ct.shape[1]] = ct
    return padded


def vjp(task: Task, x1: torch.Tensor, x2: torch.Tensor | None, opts: Batching,
        grads: Sequence[torch.Tensor], tracked: tuple[int, ...], inputs: tuple[bool, bool],
        tile: tuple[int, int] | None = None):
    """The gradients of ``<grads, kernel>`` w.r.t. the ``tracked`` leaves of ``task.args`` (in
    ``jax.tree.leaves`` order) and w.r.t. x1 and x2 where ``inputs`` asks for them.

    Args:
      task, x1, x2, opts: as the forward :func:`~ntbridge.tiling.compute` got them.
      grads: the incoming gradient of each leaf of the kernel's pytree, ``(N1, N2, ...)``.
      tracked: indices of the leaves of ``task.args`` to differentiate.
      inputs: whether to differentiate w.r.t. x1 and x2 (with x2 = None, the first flag covers both
        slots).
      tile: the forward's tile sizes (``TilingInfo.tile``), whose tiling the backward repeats
        when the forward padded its inputs to a larger program's (None: planned anew).

    Returns:
      ``(d_args, d_x1, d_x2)``: a list of torch tensors shaped like the tracked leaves, and
      tensors shaped like x1 and x2 (None where not asked for), on x1's device.
    """
    symmetric, xb = x2 is None, x1 if x2 is None else x2
    tiling, forward, _ = plan(task, x1, xb.shape[0], symmetric, opts, tile)
    wrt = (inputs[0], inputs[0] and not tiling.whole) if symmetric else inputs
    program = _compiled(task, tiling, opts, x1, tracked, wrt, forward)
    devices = tiling.devices(opts)
    sharding, replicated = shardings(devices)
    args = jax.device_put(task.args, replicated)
    leaves = jax.tree.leaves(task.args)
    d_args = [torch.zeros(leaves[i].shape, dtype=x1.dtype, device=x1.device) for i in tracked]
    d_x1 = torch.zeros_like(x1) if inputs[0] else None
    d_x2 = torch.zeros_like(xb) if inputs[1] and not symmetric else None
    slot2 = d_x1 if symmetric else d_x2
    for start in range(0, len(tiling.tiles), len(devices)):
        group = tiling.tiles[start:start + len(devices)]
        cts = [stack([_cotangent(g.to(x1.device), tiling, i, j, task.perm) for i, j in group],
                     sharding, devices) for g in grads]
        out = program(args, *tile_inputs(x1, xb, tiling, group, sharding, devices),
                      jax.tree.unflatten(jax.tree.structure(forward.executable.out_info), cts))
        blocks = {name: [per_device(leaf) for leaf in jax.tree.leaves(part)]
                  for name, part in out.items()}
        for k, (i, j) in enumerate(group):
            rows, cols = tiling.rows(i), tiling.cols(j)
            for total, block in zip(d_args, blocks["args"]):
                total += block[k].to(total.device)
            if "x1" in blocks:
                d_x1[rows] += blocks["x1"][0][k][:rows.stop - rows.start].to(x1.device)
            if "x2" in blocks:
                slot2[cols] += blocks["x2"][0][k][:cols.stop - cols.start].to(x1.device)
    return d_args, d_x1, d_x2
