"""The compiled programs of a task's tiles: one per tile shape, devices and options, run with
``shard_map`` (one tile on each device), and the reuse of one compiled for another size.

A program takes a stack of tiles (one per device) and returns, per tile, the kernel's leaves. One
program serves every tiling of two inputs by tiles of its shapes; a whole kernel of x1 with itself
has its own (:func:`tile_fn`). A size of the inputs asked for the first time may run a program
compiled for another size, its tiles padded (:func:`reused`); a size asked again gets its own.

Example:
    >>> program = compiled(task, Tiling(8, 8, 8, True), Batching(), x1)
    >>> program.tile_bytes > 0
    True
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
from ..dlpack import abstract
from ..progress import Bar
from .plan import Batching, Tiling
from .task import Task


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
    """The program key of ``task`` for ``tiling``, ``devices`` and ``abstract_arguments``: one
    program for every tiling of two inputs' tiles of these shapes (:func:`tile_fn`)."""
    return programs.ProgramKey.of("tiles", (task.computation, tiling.symmetric and tiling.whole),
                                  arguments, devices)


def compiled(task: Task, tiling: Tiling, opts: Batching, x1: torch.Tensor) -> Program:
    """The compiled program of ``task`` for ``tiling``'s tiles of inputs like ``x1`` (cached)."""
    devices = tiling.devices(opts)
    arguments = abstract_arguments(task, tiling, devices, x1)
    key = _key(task, tiling, devices, arguments)
    return programs.cached(key, lambda: _build(task, tiling, devices, arguments, opts, key, x1))


def _tile_shapes(task: Task) -> set[tuple[int, int, int]]:
    """``(devices, b1, b2)`` of each tile program compiled for ``task``'s computation."""
    shapes = set()
    for key, _ in programs.entries("tiles"):
        if key.computation[0] == task.computation:
            *_, ((devices, b1, *_), _), ((_, b2, *_), _) = key.arguments[1]
            shapes.add((devices, b1, b2))
    return shapes


PAD_WORK = 2.0  # a padded tiling's pairs at most this many times the inputs'


def reused(task: Task, x1: torch.Tensor, n2: int, symmetric: bool, opts: Batching,
           tile: tuple[int, int] | None) -> tuple[Tiling, Program] | None:
    """For a size of the inputs (``x1``'s rows, ``n2``) asked for the first time, a tiling by a
    program of ``task`` already compiled for another size: one tile of more examples, or several
    tiles of fewer, on the devices it was compiled for, edge tiles padded, with at most
    :data:`PAD_WORK` times the pairs (x2 = None: tiles of as many rows as columns, or a program of
    a whole kernel of x1 with itself). A first call at a new size then compiles nothing. A size
    asked for again gets its own program (None). With the ``tile`` of a forward computation (a
    backward pass), that forward's padded tiling, if it was one whole tile."""
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
    found = []
    for count, b1, b2 in _tile_shapes(task):
        tiling = Tiling(n1, n2, max(b1, b2), symmetric, padded=(b1, b2), most_devices=count)
        work, devices = len(tiling.tiles) * b1 * b2, tiling.devices(opts)
        if (work > PAD_WORK * n1 * n2 or len(devices) != count
                or (symmetric and not tiling.whole and b1 != b2)):
            continue
        arguments = abstract_arguments(task, tiling, devices, x1)
        program = programs.get(_key(task, tiling, devices, arguments))
        if program is not None:
            found.append((work, len(tiling.tiles), tiling, program))
    if not found:
        return None
    *_, tiling, program = min(found, key=lambda candidate: candidate[:2])
    return tiling, program


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
        return _analysed(programs.compile(
            key, lambda: _program(task, devices, tiling).lower(*arguments), devices,
            options_kind(task, tiling, x1)))
