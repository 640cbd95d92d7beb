"""A tile computed by several calls of its program side by side, one per CPU core.

XLA runs the loop of a tile computed in blocks (:mod:`.blocks`) on one core: it spreads over its
threads only the fusions outside loops. On a CPU of several cores, :func:`parts` asks the task how
calls of one program can share a tile (``Task.parts``; for blocks, disjoint sets of blocks, each
call writing its own into a tile of zeros), and :func:`call` runs those calls on as many threads
(a running program does not hold Python's lock) and adds their tiles: every entry is written by one
call, the others hold zero there, so the sum is exactly the tile one call would have computed.

Example:
    >>> tiles = call(executable, args, parts(task, (a1, None), devices), stacks)
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np
import torch

from ..devices import usable_cores
from ..dlpack import to_torch

_POOL: list[ThreadPoolExecutor] = []  # made on first use


def parts(task, operands: tuple, devices: list) -> list[np.ndarray]:
    """The ``part`` arguments of the calls that compute one tile like ``operands`` (``(a1,
    a2_or_None)``) side by side, a core each (the cores shared among the CPU ``devices``); empty
    when one call computes it (one core per device, other platforms, tasks that do not split)."""
    if devices[0].platform != "cpu":
        return []
    return task.parts(*operands, usable_cores() // len(devices))


def per_device(leaf: jax.Array) -> list[torch.Tensor]:
    """The device-local blocks of a stacked output, in stack order, as torch tensors (no copy)."""
    shards = sorted(leaf.addressable_shards, key=lambda s: s.index[0].start or 0)
    return [to_torch(s.data)[0] for s in shards]


def call(executable, args, parts: list, stacks: tuple) -> list[list[torch.Tensor]]:
    """Per leaf of the program's output, per device, the torch tile of ``executable((args, part),
    *stacks)``: one call with ``part=None`` without ``parts``, else the sum of the calls of each of
    ``parts`` (placed on the devices), run side by side."""
    one = lambda part: [per_device(leaf) for leaf in jax.tree.leaves(executable((args, part),
                                                                                *stacks))]
    if not parts:
        return one(None)
    if not _POOL:
        _POOL.append(ThreadPoolExecutor(usable_cores(), thread_name_prefix="ntbridge-core"))
    first, *rest = _POOL[0].map(one, parts)
    for other in rest:
        for tiles, others in zip(first, other):
            for tile, more in zip(tiles, others):  # on the host, in this thread (see all_finite)
                np.add(tile.numpy(), more.numpy(), out=tile.numpy())
    return first
