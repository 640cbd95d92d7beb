"""Where computed tiles go: memory (a torch tensor on a device or the host) or a ``.npy`` file.

Both stores take torch tiles through one interface, ``put(i, j, leaves)`` (a tile above the
diagonal of a symmetric kernel is mirrored into its transpose position), ``done`` (the tiles
already there) and ``result()`` (the whole kernel's leaves, as torch tensors).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from typing import Any, Callable

import jax
import numpy as np
import torch

from ..errors import InputError, MemoryBudgetError
from .distributed import barrier
from .plan import Tiling

Perm = Callable[[int], tuple[int, ...]]  # perm(ndim): the axes exchanging x1 and x2


def _mirror(tile: torch.Tensor, perm: Perm) -> torch.Tensor:
    return tile.permute(perm(tile.ndim))


class MemoryStore:
    """Tiles assembled into tensors on ``device``; a kernel that is one whole tile is handed over
    as it is (no copy)."""

    def __init__(self, tiling: Tiling, shapes: list[tuple], dtypes: list, device: torch.device,
                 perm: Perm):
        self.tiling, self.perm, self.device = tiling, perm, device
        self.shapes, self.dtypes = shapes, dtypes
        self.leaves: list[torch.Tensor] | None = None
        self.done: set = set()

    def put(self, i: int, j: int, leaves: list[torch.Tensor]) -> None:
        t = self.tiling
        if t.whole and all(leaf.device == self.device for leaf in leaves):
            self.leaves = leaves
        else:
            if self.leaves is None:
                self.leaves = [torch.empty(s, dtype=d, device=self.device)
                               for s, d in zip(self.shapes, self.dtypes)]
            for buf, leaf in zip(self.leaves, leaves):
                buf[t.rows(i), t.cols(j)] = leaf
                if t.symmetric and i != j:
                    buf[t.cols(j), t.rows(i)] = _mirror(leaf, self.perm)
        self.done.add((i, j))

    def result(self) -> list[torch.Tensor]:
        return self.leaves


def fingerprint(*parts: Any) -> str:
    """A hash of arrays, tensors, strings and numbers: what computed a kernel file's tiles."""
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, torch.Tensor):
            part = part.detach().cpu().numpy()
        if hasattr(part, "shape") and hasattr(part, "dtype"):
            a = np.asarray(part)
            h.update(f"{a.shape}{a.dtype}".encode())
            h.update(np.ascontiguousarray(a).tobytes())
        else:
            h.update(repr(part).encode())
    return h.hexdigest()


class FileStore:
    """A ``.npy`` memory map written tile by tile, and the record of the tiles done.

    The record (``<out>.tiles.json``; one per process under ``jax.distributed``) holds a fingerprint
    of what computes the kernel; a file made for anything else is refused, never reused. Under
    ``jax.distributed`` the processes wait for process 0 to create the file, at a barrier of
    ``request`` (:func:`~.distributed.request_name`).
    """

    def __init__(self, path: str, tiling: Tiling, shape: tuple, dtype, meta: dict, perm: Perm,
                 request: str):
        self.path, self.meta, self.tiling, self.perm = str(path), meta, tiling, perm
        pid, count = jax.process_index(), jax.process_count()
        suffix = "" if count == 1 else f"-{pid}-of-{count}"
        self.record = f"{self.path}.tiles{suffix}.json"
        if pid == 0 and not os.path.exists(self.path):
            self._write_record([])
            self._create(dtype, shape)
        barrier(request, "out-created")
        self.done = self._read_done()
        self.map = np.lib.format.open_memmap(self.path, mode="r+")
        if self.map.shape != shape or self.map.dtype != dtype:
            raise InputError(f"out={self.path!r} holds a {self.map.dtype} array of shape "
                             f"{self.map.shape}, not the {np.dtype(dtype)} {shape} kernel asked for; "
                             f"remove it or pass another path.")

    def _create(self, dtype, shape: tuple) -> None:
        """The kernel's file (sparse: its blocks are allocated as tiles are written), or, if it
        cannot be made (a file system's size limit, a disk filled meanwhile), nothing left behind
        and :class:`~ntbridge.errors.MemoryBudgetError`."""
        try:
            np.lib.format.open_memmap(self.path, mode="w+", dtype=dtype, shape=shape).flush()
        except OSError as e:
            for path in (self.path, self.record):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path)
            raise MemoryBudgetError(
                f"out={self.path!r}: the {np.dtype(dtype)} kernel of shape {shape} cannot be made "
                f"there ({e}); pass out= a path on a file system that takes it, or use fewer "
                f"examples in x1 and x2.") from e

    def _read_done(self) -> set:
        directory, name = os.path.split(os.path.abspath(self.path))
        records = [os.path.join(directory, f) for f in os.listdir(directory)
                   if f.startswith(name + ".tiles") and f.endswith(".json")]
        done = set()
        for record in records:
            try:
                with open(record) as f:
                    content = json.load(f)
            except (OSError, ValueError):
                content = {}
            if content.get("meta") != self.meta:
                theirs = content.get("meta") or {}
                differ = ", ".join(k for k in self.meta if theirs.get(k) != self.meta[k])
                raise InputError(
                    f"out={self.path!r} was written for a different model, input or options "
                    f"({differ} differ; or not by ntbridge: {os.path.basename(record)} does not "
                    f"match); remove the file and its .tiles*.json record, or pass another path.")
            done |= {tuple(t) for t in content["done"]}
        if not records:
            raise InputError(f"out={self.path!r} exists but has no tile record, so its content "
                             f"cannot be trusted; remove it or pass another path.")
        return done

    def _write_record(self, done) -> None:
        tmp = f"{self.record}.tmp"
        with open(tmp, "w") as f:
            json.dump({"meta": self.meta, "done": sorted(done)}, f)
        os.replace(tmp, self.record)

    def put(self, i: int, j: int, leaves: list[torch.Tensor]) -> None:
        t, tile = self.tiling, leaves[0].cpu()
        self.map[t.rows(i), t.cols(j)] = tile.numpy()
        if t.symmetric and i != j:
            self.map[t.cols(j), t.rows(i)] = _mirror(tile, self.perm).numpy()
        self.map.flush()
        self.done.add((i, j))
        self._write_record(self.done)

    def result(self) -> list[torch.Tensor]:
        """The kernel, copy-on-write: a user's writes to it never reach the file (a later call
        resumes from the file as computed)."""
        return [torch.from_numpy(np.lib.format.open_memmap(self.path, mode="c"))]
