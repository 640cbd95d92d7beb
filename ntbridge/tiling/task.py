"""What a tiled computation is (:class:`Task`: a kernel computation apart from the inputs' values)
and how it was tiled (:class:`TilingInfo`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Hashable, NamedTuple

import jax

from .stores import Perm


class TilingInfo(NamedTuple):
    """How a kernel was tiled: ``tiles`` (all of them), ``computed`` (by this call: a resumed
    ``out=`` file computes only the missing ones), ``tile`` (rows, columns of a tile),
    ``tile_bytes`` (one call of the tile program, XLA's memory analysis) and ``budget`` (the
    memory the plan allowed it)."""

    tiles: int
    computed: int
    tile: tuple[int, int]
    tile_bytes: int
    budget: float


@dataclasses.dataclass(frozen=True)
class Task:
    """A kernel computation, apart from the inputs' values.

    Attributes:
      computation: what fixes ``fn`` (kind, architecture signature, options), hashable: with the
        shapes and dtypes of the arguments it keys the compiled programs.
      fn: ``fn(args, a1, a2_or_None)``, traceable and batch independent, returning a pytree of
        ``(n1, n2, ...)`` arrays; with ``a2=None`` the kernel of ``a1`` with itself.
      perm: ``perm(ndim)``, the axes permutation exchanging x1 and x2 in a leaf of rank ``ndim``.
      args: a pytree of arrays given to every tile (e.g. parameters), replicated on the devices.
      pairwise: whether each pair's entry depends on that pair alone; if not (training-mode
        Dropout: an example with itself differs from two equal examples), a kernel with x2 = x1
        is computed as one tile.
      exactly_symmetric: ``exactly_symmetric(a1)``, whether ``fn(args, a1, None)`` of a tile like
        ``a1`` (a shape and dtype) is already exactly symmetric; such a whole symmetric kernel in
        one tile is not symmetrized again.
      program_kind: ``program_kind(a1)``, which of ntbridge's sets of XLA options its programs for
        tiles like ``a1`` take (a key of :data:`ntbridge.devices.PROGRAM_OPTIONS`); fixed by
        ``computation`` and the inputs' shape.
      compute_bound: whether each pair's entry costs much work in little memory (numerical
        expectations, e.g. attention's): see :meth:`Batching.candidate_sizes`.
      kernels: how many ``(n1, n2, ...)`` arrays ``fn`` returns, or fewer: the least the result
        holds, whose size is checked from the inputs' shapes before any program is compiled.
    """

    computation: Hashable
    fn: Callable[[Any, jax.Array, jax.Array | None], Any] = dataclasses.field(compare=False)
    perm: Perm = dataclasses.field(compare=False)
    args: Any = dataclasses.field(default=None, compare=False)
    pairwise: bool = dataclasses.field(default=True, compare=False)
    exactly_symmetric: Callable[[jax.ShapeDtypeStruct], bool] = dataclasses.field(
        default=lambda a1: False, compare=False)
    program_kind: Callable[[jax.ShapeDtypeStruct], str] = dataclasses.field(
        default=lambda a1: "default", compare=False)
    compute_bound: bool = dataclasses.field(default=False, compare=False)
    kernels: int = dataclasses.field(default=1, compare=False)
