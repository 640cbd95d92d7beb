"""One compiled program per tiling, run over the tiles: ``shard_map`` puts one tile on each device.

The program of a :class:`Task` takes a stack of tiles (one per device) and returns, per tile, the
kernel's leaves, checked finite after it (``ntbridge.dlpack.all_finite``). The tiles on the
diagonal of a kernel with x2 = x1 are symmetrized after it, in torch
(:func:`~ntbridge.tiling.arrays.symmetrize`: exactly), unless the program did it. Everything around
the program is torch and numpy (slicing and padding the inputs, assembling the result), so a
request dispatches no JAX work besides its programs. A size of the inputs asked for the first time
may run a whole-tile program compiled for more examples, its inputs padded (:func:`_padded`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, NamedTuple

import jax
import numpy as np
import torch
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .. import programs
from ..devices import small_program
from ..dlpack import abstract, all_finite
from ..errors import InputError, MemoryBudgetError
from ..progress import Bar
from .arrays import symmetrize
from . import distributed
from .plan import Batching, Tiling, entry_bytes, result_budget
from .stores import FileStore, MemoryStore, fingerprint
from .task import Task, TilingInfo
from .transfer import per_device, tile_inputs


def tile_fn(task: Task, tiling: Tiling) -> Callable:
    """``fn(args, a1, a2)`` of one tile ``a1 (b1, ...)``, ``a2 (b2, ...)``: ``task.fn``, with
    ``a2=None`` when the tile is a whole symmetric kernel."""
    one_symmetric_tile = tiling.symmetric and tiling.whole
    return lambda args, a1, a2: task.fn(args, a1, None if one_symmetric_tile else a2)


def shardings(devices: list) -> tuple[NamedSharding, NamedSharding]:
    """``(stacks, replicated)``: one slice of a leading axis per device, and a whole copy on each."""
    return _shardings(tuple(devices))


@functools.cache  # a mesh costs milliseconds to build: once per set of devices
def _shardings(devices: tuple) -> tuple[NamedSharding, NamedSharding]:
    mesh = Mesh(np.array(devices), ("tiles",))
    return NamedSharding(mesh, PartitionSpec("tiles")), NamedSharding(mesh, PartitionSpec())


def sharded(local: Callable, devices: list, n_stacked: int) -> Callable:
    """``jit(shard_map(local))``: ``local(args, *stacks)`` runs on each device with ``args``
    replicated and its own slice ``(1, ...)`` of each of the ``n_stacked`` stacks ``(devices,
    ...)``; its outputs are stacked along a leading device axis."""
    stacks, replicated = shardings(devices)
    mapped = jax.shard_map(local, mesh=stacks.mesh, in_specs=(replicated.spec,
                                                              *[stacks.spec] * n_stacked),
                           out_specs=stacks.spec, check_vma=False)
    return jax.jit(mapped, in_shardings=(replicated, *[stacks] * n_stacked), out_shardings=stacks)


def _program(task: Task, devices: list, tiling: Tiling) -> Callable:
    """The program of ``task``'s tiles over stacks of tiles ``(devices, b, ...)``: each tile's
    kernel. (Whether it is finite is checked in torch: read inside the program, XLA computed the
    kernel's last fusions twice.)"""
    fn = tile_fn(task, tiling)

    def local(args, a1, a2):  # this device's tile: a1 (1, b1, ...), a2 (1, b2, ...)
        return jax.tree.map(lambda leaf: leaf[None], fn(args, a1[0], a2[0]))

    return sharded(local, devices, 2)


def abstract_arguments(task: Task, tiling: Tiling, devices: list, x1: torch.Tensor) -> tuple:
    """The shapes and dtypes of the tile program's arguments: ``(args, a1 stack, a2 stack)``."""
    tiles = lambda b: jax.ShapeDtypeStruct((len(devices), b, *x1.shape[1:]), abstract(x1).dtype)
    args = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), task.args)
    return args, tiles(tiling.b1), tiles(tiling.b2)


class Program(NamedTuple):
    """A compiled tile program and the memory one call of it needs (XLA's analysis: arguments,
    outputs and temporaries, all devices together)."""

    executable: Any
    tile_bytes: int


def _analysed(executable) -> Program:
    m = executable.memory_analysis()
    return Program(executable, 0 if m is None else (m.argument_size_in_bytes
                                                    + m.output_size_in_bytes + m.temp_size_in_bytes))


def _key(task: Task, tiling: Tiling, devices: list, arguments: tuple) -> programs.ProgramKey:
    """The program key of ``task`` for ``tiling``, ``devices`` and ``abstract_arguments``."""
    return programs.ProgramKey.of("tiles", (task.computation, tiling.symmetric, tiling.whole),
                                  arguments, devices)


def compiled(task: Task, tiling: Tiling, opts: Batching, x1: torch.Tensor) -> Program:
    """The compiled program of ``task`` for ``tiling``'s tiles of inputs like ``x1`` (cached)."""
    devices = tiling.devices(opts)
    arguments = abstract_arguments(task, tiling, devices, x1)
    key = _key(task, tiling, devices, arguments)
    return programs.cached(key, lambda: _build(task, tiling, devices, arguments, opts, key, x1))


def _without_tile_sizes(key: programs.ProgramKey) -> tuple[tuple, tuple[int, int]]:
    """A tile program's key without its tiles' sizes ``b1, b2`` (the stacks' second axis), and
    those sizes."""
    tree, (*args, (s1, d1), (s2, d2)) = key.arguments
    rest = (key.computation, key.x64, key.devices, tree, tuple(args), (s1[0], *s1[2:]), d1,
            (s2[0], *s2[2:]), d2)
    return rest, (s1[1], s2[1])


PAD_WORK = 2.0  # a padded tile's pairs at most this many times the inputs'


def _padded(task: Task, x1: torch.Tensor, n2: int, symmetric: bool, opts: Batching,
            tile: tuple[int, int] | None) -> tuple[Tiling, Program] | None:
    """For a size of the inputs (``x1``'s rows, ``n2``) asked for the first time, a whole-tile
    program of ``task`` already compiled for more examples, its tile padded (as edge tiles are),
    with at most :data:`PAD_WORK` times the pairs: a first call at a new size then compiles
    nothing. A size asked for again gets its own program (None). With the ``tile`` of a forward
    computation (a backward pass), that forward's padded tiling, if it was one."""
    n1 = x1.shape[0]
    if tile is not None:
        if tile[0] <= n1 and tile[1] <= n2:
            return None
        tiling = Tiling(n1, n2, max(tile), symmetric, padded=tile)
        return tiling, compiled(task, tiling, opts, x1)
    exact = Tiling(n1, n2, max(n1, n2), symmetric)
    devices = exact.devices(opts)
    key = _key(task, exact, devices, abstract_arguments(task, exact, devices, x1))
    whole_first = opts.candidate_sizes(max(n1, n2), task.compute_bound)[0] == max(n1, n2)
    alone = jax.process_count() == 1  # processes must agree on the tiling
    if not (task.pairwise and whole_first and alone) or programs.get(key) is not None:
        return None
    asked = dataclasses.replace(key, purpose="size asked")
    if programs.get(asked) is not None:
        return None
    programs.cached(asked, lambda: True)
    like, _ = _without_tile_sizes(key)
    larger = [(sizes, program) for other, program in programs.entries("tiles")
              for rest, sizes in [_without_tile_sizes(other)]
              if rest == like and sizes[0] >= n1 and sizes[1] >= n2
              and sizes[0] * sizes[1] <= PAD_WORK * n1 * n2]
    if not larger:
        return None
    (b1, b2), program = min(larger, key=lambda found: math.prod(found[0]))
    return Tiling(n1, n2, max(b1, b2), symmetric, padded=(b1, b2)), program


def options_kind(task: Task, tiling: Tiling, x1: torch.Tensor) -> str:
    """The kind of XLA options (:data:`ntbridge.devices.PROGRAM_OPTIONS`) of ``task``'s programs
    for ``tiling``'s tiles of inputs like ``x1``: "small" for a small tile
    (:func:`ntbridge.devices.small_program`), else the task's own kind."""
    if small_program(tiling.b1 * tiling.b2, math.prod(x1.shape[1:])):
        return "small"
    return task.program_kind(abstract(x1))


def _build(task: Task, tiling: Tiling, devices: list, arguments: tuple, opts: Batching,
           key: programs.ProgramKey, x1: torch.Tensor) -> Program:
    """The tile program compiled (or loaded from the persistent cache), timed as a stage."""
    name = task.computation[0].replace("_", " ")
    with Bar(None, f"ntbridge: compiling the {name} program ({tiling.b1} x {tiling.b2} tiles)",
             progress=opts.progress, leave=False):
        lower = lambda: _program(task, devices, tiling).lower(*arguments)
        return _analysed(programs.compile(key, lower, devices, options_kind(task, tiling, x1)))


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
    repeats (:func:`_padded`)."""
    n1 = x1.shape[0]
    reused = _padded(task, x1, n2, symmetric, opts, tile)
    if reused is not None:
        budget = result_budget(n1, n2, _entry(reused[1]), opts)
        if reused[1].tile_bytes <= budget:
            return (*reused, budget)
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
