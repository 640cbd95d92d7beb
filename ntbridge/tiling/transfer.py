"""Tiles between torch and JAX: the inputs' row and column blocks, padded and stacked one tile
per device, and the stacked outputs read back per device as torch tensors, without copies."""

from __future__ import annotations

import jax
import torch
from jax.sharding import NamedSharding

from ..dlpack import copy_to_jax, to_torch
from .plan import Tiling


def stack(tiles: list[torch.Tensor], sharding: NamedSharding, devices: list) -> jax.Array:
    """Torch tiles (padded to one size) as one JAX array ``(devices, b, ...)``, a tile per device."""
    tiles = tiles + tiles[-1:] * (len(devices) - len(tiles))
    # copies owned by JAX, cheap beside the kernel: with tiles aliasing torch's memory, processes
    # aborted at exit now and then (benchmarks/README.md)
    shards = [copy_to_jax(t.unsqueeze(0), d) for t, d in zip(tiles, devices)]
    return jax.make_array_from_single_device_arrays((len(devices), *tiles[0].shape), sharding,
                                                    shards)


def pad(x: torch.Tensor, rows: slice, size: int) -> torch.Tensor:
    """Rows ``rows`` of x, padded to ``size`` by repeating the last row."""
    tile = x[rows]
    if tile.shape[0] < size:
        tile = torch.cat([tile, tile[-1:].expand(size - tile.shape[0], *tile.shape[1:])])
    return tile


def tile_inputs(x1: torch.Tensor, xb: torch.Tensor, tiling: Tiling, group: list[tuple[int, int]],
                sharding: NamedSharding, devices: list) -> tuple[jax.Array, jax.Array]:
    """The stacks ``(devices, b1, ...)`` and ``(devices, b2, ...)`` of the row blocks of ``x1`` and
    the column blocks of ``xb`` (x2, or x1 again) of the tiles ``group``, one tile per device."""
    return (stack([pad(x1, tiling.rows(i), tiling.b1) for i, _ in group], sharding, devices),
            stack([pad(xb, tiling.cols(j), tiling.b2) for _, j in group], sharding, devices))


def per_device(leaf: jax.Array) -> list[torch.Tensor]:
    """The device-local blocks of a stacked output, in stack order, as torch tensors (no copy)."""
    shards = sorted(leaf.addressable_shards, key=lambda s: s.index[0].start or 0)
    return [to_torch(s.data)[0] for s in shards]
