"""A task's kernel tile by tile: the plan (tiles whose program fits in memory), the run of the
program over the tiles (:mod:`.compiled`), and the result assembled.

Each tile's leaves are checked finite after the program (``ntbridge.dlpack.all_finite``). The
tiles on the diagonal of a kernel with x2 = x1 are symmetrized after it, in torch
(:func:`~ntbridge.tiling.arrays.symmetrize`: exactly), unless the program did it. Everything
around the program is torch and numpy (slicing and padding the inputs, assembling the result),
so a request dispatches no JAX work besides its programs.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import torch

from ..dlpack import abstract, all_finite
from ..errors import InputError, MemoryBudgetError
from ..progress import Bar
from .arrays import symmetrize
from . import distributed
from .compiled import Program, compiled, reused, shardings
from .plan import Batching, Tiling, entry_bytes, result_budget
from .stores import FileStore, MemoryStore, fingerprint
from .task import Task, TilingInfo
from .transfer import per_device, tile_inputs


def _least_entry(task: Task, x1: torch.Tensor) -> list[jax.ShapeDtypeStruct]:
    """The least one entry (a pair of examples) of ``task``'s kernel holds, known from shapes and
    dtypes alone: one value in each of its ``task.kernels`` arrays, float64 for float64 inputs,
    else at least float32 (token ids' kernels take the widest float enabled)."""
    dtype = np.float64 if x1.dtype == torch.float64 else np.float32
    return [jax.ShapeDtypeStruct((1, 1), dtype)] * task.kernels


def _entry(program: Program) -> list[jax.ShapeDtypeStruct]:
    """One entry of the kernel of a tile ``program`` (its outputs' leaves, ``(1, 1, ...)``)."""
    return [jax.ShapeDtypeStruct((1, 1, *leaf.shape[3:]), leaf.dtype)
            for leaf in jax.tree.leaves(program.executable.out_info)]


def plan(task: Task, x1: torch.Tensor, n2: int, symmetric: bool, opts: Batching,
         tile: tuple[int, int] | None = None) -> tuple[Tiling, Program, float]:
    """The tiling (and its compiled program, and the memory budget it fits in) whose tiles fit in
    memory, checked before anything is allocated: the result's least size from shapes alone,
    before any program is compiled (:func:`~.plan.result_budget`; its exact size once the first
    program says), then each tile size whose outputs can fit from XLA's memory analysis of the
    program that will run. ``tile``: the tile sizes of the forward computation a backward pass
    repeats (:func:`~.compiled.reused`)."""
    n1 = x1.shape[0]
    found = reused(task, x1, n2, symmetric, opts, tile)
    if found is not None:
        budget = result_budget(n1, n2, _entry(found[1]), opts)
        if found[1].tile_bytes <= budget:
            return (*found, budget)
    entry, exact_entry = _least_entry(task, x1), False
    budget = result_budget(n1, n2, entry, opts, least=True)
    sizes = opts.candidate_sizes(max(n1, n2), task.compute_bound)
    if symmetric and not task.pairwise:
        if opts.batch_size and opts.batch_size < n1:
            raise InputError(
                f"batch_size={opts.batch_size}: this kernel of x1 with itself cannot be tiled (the "
                f"training-mode Dropout terms of an example with itself); pass batch_size=None, or "
                f"call model.eval().")
        sizes = [n1]
    for b in sizes:
        tiling = Tiling(n1, n2, b, symmetric)
        count = len(tiling.devices(opts))
        need, exact = count * tiling.b1 * tiling.b2 * entry_bytes(entry), False  # outputs alone
        if need <= budget:  # else not worth compiling
            program = compiled(task, tiling, opts, x1)
            if not exact_entry:
                entry, exact_entry = _entry(program), True
                budget = result_budget(n1, n2, entry, opts)
            need, exact = program.tile_bytes, True
            if need <= budget:
                return tiling, program, budget
    raise MemoryBudgetError(
        f"one tile of {b} x {b} examples needs {'' if exact else 'at least '}"
        f"{need / count / 2**30:.2f} GiB per device, more than the {budget / count / 2**30:.2f} "
        f"GiB free; use fewer or smaller inputs, a cheaper kernel (e.g. a Flatten head instead of "
        f"global pooling), or a larger device.")


def _check_finite(tile: list[torch.Tensor], rows: slice, cols: slice) -> None:
    """Raise InputError unless every entry of the tile's leaves is finite."""
    if not all(all_finite(t) for t in tile):
        dtype = str(tile[0].dtype).removeprefix("torch.")
        raise InputError(
            f"kernel entries [{rows.start}:{rows.stop}, {cols.start}:{cols.stop}] are not finite "
            f"although the inputs are: a value overflowed {dtype} inside the computation, "
            f"or the model's weights are not finite. Rescale the inputs (e.g. standardize them), "
            f"or compute in float64 (model.double() and float64 inputs).")


def compute(task: Task, x1: torch.Tensor, x2: torch.Tensor | None,
            opts: Batching) -> tuple[Any, TilingInfo]:
    """``task`` evaluated on ``x1`` (and ``x2``; None for x2 = x1), tile by tile per ``opts``.

    Returns the pytree of ``task.fn`` with ``(N1, N2, ...)`` torch tensors (on x1's device, on the
    host with ``store_on_device=False``, or over the memory map of ``opts.out``) and how it was
    tiled.
    """
    symmetric, xb = x2 is None, x1 if x2 is None else x2
    n1, n2 = x1.shape[0], xb.shape[0]
    tiling, program, budget = plan(task, x1, n2, symmetric, opts)
    symmetrized = tiling.symmetric and not (tiling.whole and tiling.padded is None
                                            and task.exactly_symmetric(abstract(x1)))
    leaves, treedef = jax.tree.flatten(program.executable.out_info)
    shapes = [(n1, n2, *leaf.shape[3:]) for leaf in leaves]
    dtypes = [getattr(torch, str(leaf.dtype)) for leaf in leaves]
    request = distributed.request_name(task.computation[0], n1, n2, tiling.b, symmetric, shapes,
                                       opts.out is None)
    if opts.out is not None:
        meta = {"inputs": fingerprint(x1, x2), "computation": fingerprint(task.computation),
                "hyper-parameters": fingerprint(*jax.tree.leaves(task.args)),
                "tile": [tiling.b1, tiling.b2], "processes": jax.process_count()}
        store = FileStore(opts.out, tiling, shapes[0], leaves[0].dtype, meta, task.perm, request)
    else:
        device = x1.device if opts.store_on_device else torch.device("cpu")
        store = MemoryStore(tiling, shapes, dtypes, device, task.perm)
    pid, count = jax.process_index(), jax.process_count()
    mine = [t for n, t in enumerate(tiling.tiles) if n % count == pid and t not in store.done]
    devices = tiling.devices(opts)
    sharding, replicated = shardings(devices)
    args = jax.device_put(task.args, replicated)
    computed = {}
    with Bar(len(mine), "ntbridge tiles", "tile", opts.progress) as bar:
        for start in range(0, len(mine), len(devices)):
            group = mine[start:start + len(devices)]
            out = program.executable(args, *tile_inputs(x1, xb, tiling, group, sharding, devices))
            blocks = [per_device(leaf) for leaf in jax.tree.leaves(out)]
            for k, (i, j) in enumerate(group):
                rows, cols = tiling.rows(i), tiling.cols(j)
                tile = [b[k][:rows.stop - rows.start, :cols.stop - cols.start] for b in blocks]
                _check_finite(tile, rows, cols)
                if symmetrized and i == j:
                    tile = [symmetrize(leaf, task.perm(leaf.ndim)) for leaf in tile]
                store.put(i, j, tile)
                computed[i, j] = tile
            bar.update(len(group))
    if count > 1 and isinstance(store, MemoryStore):
        distributed.exchange(request, tiling.tiles, computed, store.put)
    elif count > 1:
        distributed.barrier(request, "written")
    info = TilingInfo(len(tiling.tiles), len(mine), (tiling.b1, tiling.b2), program.tile_bytes,
                      budget)
    return jax.tree.unflatten(treedef, store.result()), info
