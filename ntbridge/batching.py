"""Kernels evaluated tile by tile over (N1, N2), spread over devices and processes.

A kernel function ``fn(args, a1, a2_or_None) -> array (n1, n2, ...)`` (analytic or empirical,
batch independent) is evaluated on tiles of ``batch_size`` rows and columns. Any N1 and N2 work: the
last tile is padded by repeating its last example, and the padding is cut from the result. With
``x2=None`` only tiles on and above the diagonal are computed; diagonal tiles are symmetrized
outside the compiled kernel (where XLA cannot fuse the transpose into the kernel's producer and
round the two halves differently) and the others are mirrored, so the whole is exactly symmetric.

* Devices: each step evaluates ``device_count`` tiles at once, one per device: ``jax.shard_map``
  over a mesh of the devices runs the kernel function on each device's own tile (no ``vmap``).
* Processes: under ``jax.distributed``, each process computes every ``process_count``-th tile; the
  full kernel is then exchanged through the distributed key-value store (bounded waits: a process
  that dies makes the others raise :class:`~ntbridge.errors.ProcessError`), or each process writes
  its tiles to the shared ``out`` file.
* Disk: ``out="kernel.npy"`` writes a ``.npy`` file tile by tile through a memory map, with a
  sidecar ``kernel.npy.tiles.json`` recording the tiles done and a fingerprint of what computed
  them. A killed run started again with the same ``out`` computes only the missing tiles; a
  different model, input or option is refused, never mixed in.
* Memory: before any work, XLA's memory analysis of one compiled tile and the size of the result
  are compared with the free memory; without an explicit ``batch_size`` the largest tile that fits
  is chosen, and a request that cannot fit raises :class:`~ntbridge.errors.MemoryBudgetError`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import sys
import threading
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .errors import InputError, InputTypeError, MemoryBudgetError, ProcessError

PEER_TIMEOUT_S = float(os.environ.get("NTBRIDGE_PEER_TIMEOUT", "600"))
MEMORY_FRACTION = 0.8  # share of free memory a computation may plan to use
KernelFn = Callable[[Any, jax.Array, jax.Array | None], Any]  # fn(args, x1_tile, x2_tile_or_None)
LAST_RUN = threading.local()  # this thread's last compute(): .tiles (all) and .computed (by it)


@dataclasses.dataclass(frozen=True)
class Batching:
    """The batching options of every kernel entry point.

    Attributes:
      batch_size: tile size in examples; ``None`` (default) = no tiling unless the whole would not
        fit in memory, then the largest tile that fits; ``0`` = never tile.
      device_count: local devices to spread tiles over; ``-1`` = all.
      store_on_device: keep the result on the device (True) or gather tiles in host memory.
      progress: a tqdm bar; ``None`` = only for long runs attached to a terminal.
      out: a ``.npy`` path: the kernel is written there tile by tile (resumable) and returned as a
        tensor over a copy-on-write memory map of it (writing to it leaves the file as computed).
      platform: the platform of the inputs ("cpu", "gpu"), whose devices compute the tiles; set
        by :func:`compute` from x1 (``None``: JAX's default).
    """

    batch_size: int | None = None
    device_count: int = -1
    store_on_device: bool = True
    progress: bool | None = None
    out: str | os.PathLike | None = None
    platform: str | None = None

    def __post_init__(self):
        for name in ("batch_size", "device_count"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise InputTypeError(f"{name} must be an int, got {value!r}.")
        if self.batch_size is not None and self.batch_size < 0:
            raise InputError(f"batch_size must be >= 0 (0 = no tiling), got {self.batch_size}.")
        if self.device_count == 0 or self.device_count < -1:
            raise InputError(f"device_count must be -1 (all) or >= 1, got {self.device_count}.")
        if self.platform is not None and self.device_count > len(self.devices):
            raise InputError(f"device_count={self.device_count} but only {len(self.devices)} local "
                             f"{self.platform} devices exist; pass -1 for all.")
        if self.out is not None and not str(self.out).endswith(".npy"):
            raise InputError(f"out must be a path ending in .npy, got {str(self.out)!r}.")
        if self.out is not None and not os.path.isdir(os.path.dirname(os.path.abspath(self.out))):
            raise InputError(f"out={str(self.out)!r}: its directory does not exist; create it "
                             f"first (os.makedirs).")

    @property
    def devices(self) -> list:
        """The local devices of the inputs' platform (not JAX's default one: CPU inputs stay on the
        CPU of a GPU machine)."""
        devices = jax.local_devices(backend=self.platform)
        return devices if self.device_count == -1 else devices[:self.device_count]


def platform_of(x: jax.Array | jax.ShapeDtypeStruct) -> str:
    """The platform ("cpu", "gpu", ...) of the devices holding ``x``; JAX's default platform for
    an abstract value without a sharding."""
    sharding = getattr(x, "sharding", None)
    return jax.default_backend() if sharding is None else next(iter(sharding.device_set)).platform


def _free_bytes(device) -> int:
    """Free memory of ``device``: its allocator's limit, or the host's available memory."""
    stats = device.memory_stats() or {}
    if "bytes_limit" in stats:
        return stats["bytes_limit"] - stats.get("bytes_in_use", 0)
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _pad(x: jax.Array, start: int, size: int) -> jax.Array:
    """Rows ``start:start+size`` of x, padded by repeating the last row when x is too short."""
    tile = x[start:start + size]
    if tile.shape[0] < size:
        tile = jnp.concatenate([tile, jnp.repeat(tile[-1:], size - tile.shape[0], axis=0)])
    return tile


# XLA's CPU compiler hands matrix products, reductions and 2D convolutions to YNNPACK; its
# convolutions are slower than XLA's own for the batched convolutions of empirical NTKs
# (benchmarks/run.py, "CPU convolution" row), so ntbridge keeps the other two only.
CPU_COMPILER_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type":
                        "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_REDUCE"}


@functools.cache
def compiler_options(platform: str) -> dict[str, str]:
    """The XLA options of ntbridge's programs on ``platform``: :data:`CPU_COMPILER_OPTIONS` on
    CPUs whose XLA knows them (checked once by compiling a constant), else none."""
    if platform != "cpu":
        return {}
    try:
        jax.jit(lambda: 0.0, compiler_options=CPU_COMPILER_OPTIONS).lower().compile()
    except RuntimeError:  # an XLA without this option (XLA's name, and experimental)
        return {}
    return CPU_COMPILER_OPTIONS


class _Runner:
    """``fn`` jitted for stacks of tiles, one tile per device: ``shard_map`` over the stacked axis
    runs ``fn`` on each device's own tile (no ``vmap``, so any layer's batching rule is avoided);
    its ``args`` (e.g. parameters) are replicated on every device."""

    def __init__(self, fn: KernelFn, devices: list, symmetric_tile: bool):
        mesh = Mesh(np.array(devices), ("tiles",))
        tiles, whole = PartitionSpec("tiles"), PartitionSpec()
        self.sharding, self.replicated = NamedSharding(mesh, tiles), NamedSharding(mesh, whole)
        self.count = len(devices)

        def local(args, a1, a2):  # this device's tile: a1 (1, b1, ...), a2 (1, b2, ...)
            out = fn(args, a1[0], None if symmetric_tile else a2[0])
            return jax.tree.map(lambda leaf: leaf[None], out)

        mapped = jax.shard_map(local, mesh=mesh, in_specs=(whole, tiles, tiles), out_specs=tiles,
                               check_vma=False)
        self.jitted = jax.jit(mapped, in_shardings=(self.replicated, self.sharding, self.sharding),
                              out_shardings=self.sharding,
                              compiler_options=compiler_options(devices[0].platform))

    def compile(self, args, a1: jax.ShapeDtypeStruct, a2: jax.ShapeDtypeStruct):
        # The shardings come from the jit's in_shardings: abstract values that carry them too make
        # JAX's batching of grouped convolutions' weight gradients raise NotImplementedError.
        stack = lambda a: jax.ShapeDtypeStruct((self.count, *a.shape), a.dtype)
        args = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), args)
        return self.jitted.lower(args, stack(a1), stack(a2)).compile()

    def stack(self, tiles: list[jax.Array]) -> jax.Array:
        """The tiles stacked and spread over the devices (the last step may have fewer tiles)."""
        tiles = tiles + tiles[-1:] * (self.count - len(tiles))
        return jax.device_put(jnp.stack(tiles), self.sharding)


def fingerprint(*parts: Any) -> str:
    """A hash of arrays, strings and numbers: what computed a kernel file's tiles."""
    h = hashlib.sha256()
    for part in parts:
        if hasattr(part, "shape") and hasattr(part, "dtype"):
            a = np.asarray(part)
            h.update(f"{a.shape}{a.dtype}".encode())
            h.update(np.ascontiguousarray(a).tobytes())
        else:
            h.update(repr(part).encode())
    return h.hexdigest()


_RUNNERS: dict[tuple, _Runner] = {}
_EXECUTABLES: dict[tuple, Any] = {}
_CACHE_LOCK = threading.Lock()  # threads share the caches: each executable is compiled once


def _executable(fn: KernelFn, args, x1: jax.Array, tiling: "_Tiling", opts: "Batching"):
    """``(runner, compiled stacked-tile function, bytes per tile)`` for the tiles of ``tiling``,
    cached. A kernel that is one tile with x2 = x1 is computed as ``fn(args, x1, None)``; tiles of
    a larger kernel use the general ``fn(args, a1, a2)`` (diagonal tiles too, symmetrized after)."""
    devices = tiling.devices(opts)
    symmetric_tile = tiling.symmetric and len(tiling.tiles) == 1
    a1, a2 = (jax.ShapeDtypeStruct((b, *x1.shape[1:]), x1.dtype) for b in (tiling.b1, tiling.b2))
    arg_shapes = tuple((a.shape, str(a.dtype)) for a in jax.tree.leaves(args))
    key = (fn, tuple(devices), symmetric_tile, a1.shape, a2.shape, str(a1.dtype),
           jax.tree.structure(args), arg_shapes)
    with _CACHE_LOCK:
        if key not in _EXECUTABLES:
            if key[:3] not in _RUNNERS:
                _RUNNERS[key[:3]] = _Runner(fn, devices, symmetric_tile)
            runner = _RUNNERS[key[:3]]
            compiled = runner.compile(args, a1, a2)
            m = compiled.memory_analysis()
            per_tile = 0 if m is None else (m.argument_size_in_bytes + m.output_size_in_bytes
                                            + m.temp_size_in_bytes) // runner.count
            if len(_EXECUTABLES) > 64:
                _EXECUTABLES.pop(next(iter(_EXECUTABLES)))
            _EXECUTABLES[key] = (runner, compiled, per_tile)
        return _EXECUTABLES[key]


@dataclasses.dataclass
class _Tiling:
    """Tile sizes ``b1 x b2`` and the tiles ``(i, j)`` (row block, column block) to compute."""

    n1: int
    n2: int
    b: int
    symmetric: bool

    def __post_init__(self):
        self.b1, self.b2 = min(self.b, self.n1), min(self.b, self.n2)
        rows, cols = math.ceil(self.n1 / self.b1), math.ceil(self.n2 / self.b2)
        self.tiles = [(i, j) for i in range(rows) for j in range(cols)
                      if not self.symmetric or j >= i]

    def devices(self, opts: "Batching") -> list:
        """The devices the tiles are spread over: no more than there are tiles."""
        return opts.devices[:max(1, min(len(opts.devices), len(self.tiles)))]

    def rows(self, i: int) -> slice:
        return slice(i * self.b1, min((i + 1) * self.b1, self.n1))

    def cols(self, j: int) -> slice:
        return slice(j * self.b2, min((j + 1) * self.b2, self.n2))


def _check_finite(tile: list, rows: slice, cols: slice) -> None:
    """InputError unless every entry of the tile is finite (the inputs were checked to be)."""
    if not all(bool(jnp.isfinite(leaf).all()) for leaf in tile):
        raise InputError(
            f"kernel entries [{rows.start}:{rows.stop}, {cols.start}:{cols.stop}] are not finite "
            f"although the inputs are: a value overflowed {tile[0].dtype} inside the computation, "
            f"or the model's weights are not finite. Rescale the inputs (e.g. standardize them), "
            f"or compute in float64 (model.double() and float64 inputs).")


def _plan(fn: KernelFn, args, x1, x2, opts: Batching, leaf_bytes: int) -> _Tiling:
    """Choose the tile size (checking memory before anything is allocated)."""
    n1, n2 = x1.shape[0], (x1 if x2 is None else x2).shape[0]
    symmetric = x2 is None
    free = _free_bytes(opts.devices[0]) * MEMORY_FRACTION
    result = n1 * n2 * leaf_bytes
    if opts.out is None and result > free:
        raise MemoryBudgetError(
            f"the kernel ({n1} x {n2}, {result / 2**30:.2f} GiB) does not fit in the free memory "
            f"({free / 2**30:.2f} GiB usable); pass out='kernel.npy' to write it to disk tile by tile.")
    budget = free - (0 if opts.out is not None else result)
    if opts.batch_size:
        candidates = [opts.batch_size]
    elif opts.batch_size == 0:
        candidates = [max(n1, n2)]
    else:
        candidates = [max(n1, n2)]
        while candidates[-1] > 1:
            candidates.append(math.ceil(candidates[-1] / 2))
    for b in candidates:
        tiling = _Tiling(n1, n2, b, symmetric)
        per_tile = _executable(fn, args, x1, tiling, opts)[2]
        if per_tile * len(tiling.devices(opts)) <= budget:
            return tiling
    raise MemoryBudgetError(
        f"one tile of {candidates[-1]} x {candidates[-1]} examples needs {per_tile / 2**30:.2f} GiB "
        f"per device, more than the {budget / 2**30:.2f} GiB free; use fewer or smaller inputs, a "
        f"cheaper kernel (e.g. a Flatten head instead of global pooling), or a larger device.")


class _MemoryStore:
    """Tiles kept on the first device (assembled at the end) or in host memory."""

    def __init__(self, shapes: list[tuple], dtypes: list, device, on_device: bool):
        self.device, self.on_device = device, on_device
        self.blocks: dict[tuple[int, int], list] = {}
        self.host = None if on_device else [np.empty(s, d) for s, d in zip(shapes, dtypes)]
        self.done: set = set()

    def put(self, tiling: _Tiling, i: int, j: int, leaves: list, swap) -> None:
        if self.on_device:  # mirrored tiles are made when assembling
            self.blocks[i, j] = [jax.device_put(leaf, self.device) for leaf in leaves]
        else:
            for buf, leaf in zip(self.host, leaves):
                buf[tiling.rows(i), tiling.cols(j)] = np.asarray(leaf)
                if tiling.symmetric and i != j:
                    buf[tiling.cols(j), tiling.rows(i)] = np.asarray(swap(leaf))
        self.done.add((i, j))

    def result(self, tiling: _Tiling, swap) -> list:
        if not self.on_device:
            return self.host
        block = lambda i, j: self.blocks[i, j] if (i, j) in self.blocks else [
            swap(leaf) for leaf in self.blocks[j, i]]
        rows = max(i for i, _ in self.blocks) + 1
        cols = max(j for _, j in self.blocks) + 1
        if rows == cols == 1:
            return self.blocks[0, 0]
        return [jnp.concatenate([jnp.concatenate([block(i, j)[k] for j in range(cols)], axis=1)
                                 for i in range(rows)], axis=0)
                for k in range(len(self.blocks[0, 0]))]


class _FileStore:
    """A ``.npy`` memory map written tile by tile, and the record of the tiles done.

    The record (``<out>.tiles.json``; one per process under ``jax.distributed``) holds a fingerprint
    of what computes the kernel; a file made for anything else is refused, never reused.
    """

    def __init__(self, path: str, shape: tuple, dtype, meta: dict):
        self.path, self.meta = str(path), meta
        pid, count = jax.process_index(), jax.process_count()
        suffix = "" if count == 1 else f"-{pid}-of-{count}"
        self.record = f"{self.path}.tiles{suffix}.json"
        if pid == 0 and not os.path.exists(self.path):
            self._write_record([])
            np.lib.format.open_memmap(self.path, mode="w+", dtype=dtype, shape=shape).flush()
        _barrier("out-created")
        self.done = self._read_done()
        self.map = np.lib.format.open_memmap(self.path, mode="r+")
        if self.map.shape != shape or self.map.dtype != dtype:
            raise InputError(f"out={self.path!r} holds a {self.map.dtype} array of shape "
                             f"{self.map.shape}, not the {np.dtype(dtype)} {shape} kernel asked for; "
                             f"remove it or pass another path.")

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
                raise InputError(
                    f"out={self.path!r} was written for a different model, input or options (or not "
                    f"by ntbridge: {os.path.basename(record)} does not match); remove the file and "
                    f"its .tiles*.json record, or pass another path.")
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

    def put(self, tiling: _Tiling, i: int, j: int, leaves: list, swap) -> None:
        self.map[tiling.rows(i), tiling.cols(j)] = np.asarray(leaves[0])
        if tiling.symmetric and i != j:
            self.map[tiling.cols(j), tiling.rows(i)] = np.asarray(swap(leaves[0]))
        self.map.flush()
        self.done.add((i, j))
        self._write_record(self.done)

    def result(self) -> list:
        """The kernel, copy-on-write: a user's writes to it never reach the file (a later call
        resumes from the file as computed)."""
        return [np.lib.format.open_memmap(self.path, mode="c")]


def _client():
    from jax._src import distributed  # the key-value store and barriers of jax.distributed
    return distributed.global_state.client


_CALLS = [0]  # calls so far: the same count on every process of an SPMD program


def _barrier(name: str) -> None:
    if jax.process_count() == 1:
        return
    try:
        _client().wait_at_barrier(f"ntbridge-{_CALLS[0]}-{name}", int(PEER_TIMEOUT_S * 1000))
    except Exception as e:  # the client raises its own error types
        raise ProcessError(f"another process did not reach '{name}' within {PEER_TIMEOUT_S:.0f} s "
                           f"(it failed or is much slower): {e}") from None


def _exchange(tiling: _Tiling, store: _MemoryStore, leaves_of: dict, swap) -> None:
    """Give every process the tiles the others computed, through the distributed key-value store."""
    import io
    client, pid, count = _client(), jax.process_index(), jax.process_count()
    key = lambda i, j: f"ntbridge-{_CALLS[0]}-tile-{i}-{j}"
    for (i, j), leaves in leaves_of.items():
        buffer = io.BytesIO()
        np.savez(buffer, *[np.asarray(leaf) for leaf in leaves])
        client.key_value_set_bytes(key(i, j), buffer.getvalue())
    for n, (i, j) in enumerate(tiling.tiles):
        if n % count == pid:
            continue
        try:
            data = client.blocking_key_value_get_bytes(key(i, j), int(PEER_TIMEOUT_S * 1000))
        except Exception as e:
            raise ProcessError(f"process {n % count} did not deliver its tiles within "
                               f"{PEER_TIMEOUT_S:.0f} s (it failed or is much slower): {e}") from None
        arrays = np.load(io.BytesIO(data))
        store.put(tiling, i, j, [arrays[f"arr_{k}"] for k in range(len(arrays.files))], swap)
    _barrier("exchanged")


def compute(fn: KernelFn, x1: jax.Array, x2: jax.Array | None, opts: Batching, *, args=None,
            swap: Callable[[Any], Any], describe: tuple = ()) -> Any:
    """``fn(x1, x2)`` evaluated tile by tile per ``opts`` (see module doc).

    Args:
      fn: ``fn(args, a1, a2)``, a batch-independent kernel function returning a pytree of
        ``(n1, n2, ...)`` arrays; with ``a2=None`` it must return the exactly symmetric kernel of
        ``a1`` with itself. Keep the same ``fn`` object across calls: compilations are cached by it.
      args: a pytree of arrays passed to every tile (e.g. parameters), replicated on the devices.
      x1, x2: ``(N1, ...)`` and ``(N2, ...)`` inputs, x2 None for x2 = x1.
      swap: exchanges the roles of x1 and x2 in a tile (used to mirror tiles when x2 is None).
      describe: what else determines the result (model, parameters, options), for ``out`` files.

    Returns:
      The same pytree as ``fn``, of ``(N1, N2, ...)`` arrays: JAX arrays, numpy arrays in host
      memory (``store_on_device=False``), or the ``np.memmap`` of ``out``.
    """
    _CALLS[0] += 1
    opts = dataclasses.replace(opts, platform=platform_of(x1))
    struct = jax.eval_shape(fn, args, x1[:1], None if x2 is None else x2[:1])
    leaves, treedef = jax.tree.flatten(struct)
    n1, n2 = x1.shape[0], (x1 if x2 is None else x2).shape[0]
    shapes = [(n1, n2, *leaf.shape[2:]) for leaf in leaves]
    tiling = _plan(fn, args, x1, x2, opts, sum(math.prod(s[2:]) * leaf.dtype.itemsize
                                          for s, leaf in zip(shapes, leaves)))
    if opts.out is not None:
        if len(leaves) != 1:
            raise InputError("out= stores one kernel; ask for one (e.g. get='ntk').")
        meta = {"fingerprint": fingerprint(x1, x2, *describe), "tile": [tiling.b1, tiling.b2],
                "processes": jax.process_count()}
        store = _FileStore(opts.out, shapes[0], leaves[0].dtype, meta)
    else:
        store = _MemoryStore(shapes, [leaf.dtype for leaf in leaves], opts.devices[0],
                             opts.store_on_device and jax.process_count() == 1)
    pid, count = jax.process_index(), jax.process_count()
    mine = [t for n, t in enumerate(tiling.tiles) if n % count == pid and t not in store.done]
    LAST_RUN.tiles, LAST_RUN.computed = len(tiling.tiles), len(mine)
    show = opts.progress if opts.progress is not None else (len(mine) >= 16 and sys.stderr.isatty())
    from tqdm.auto import tqdm
    bar = tqdm(total=len(mine), desc="ntbridge tiles", unit="tile", disable=not show)
    xb = x1 if x2 is None else x2
    runner, compiled, _ = _executable(fn, args, x1, tiling, opts)
    args = jax.device_put(args, runner.replicated)
    computed = {}
    for start in range(0, len(mine), runner.count):
        group = mine[start:start + runner.count]
        out = compiled(args, runner.stack([_pad(x1, i * tiling.b1, tiling.b1) for i, _ in group]),
                       runner.stack([_pad(xb, j * tiling.b2, tiling.b2) for _, j in group]))
        for k, (i, j) in enumerate(group):
            rows, cols = tiling.rows(i), tiling.cols(j)
            tile = [leaf[k, :rows.stop - rows.start, :cols.stop - cols.start]
                    for leaf in jax.tree.leaves(out)]
            _check_finite(tile, rows, cols)
            if tiling.symmetric and i == j:  # eagerly, op by op: a + swap(a) is exactly symmetric
                tile = [(leaf + swap(leaf)) / 2 for leaf in tile]
            store.put(tiling, i, j, tile, swap)
            computed[i, j] = tile
        bar.update(len(group))
    bar.close()
    if count > 1 and isinstance(store, _MemoryStore):
        _exchange(tiling, store, computed, swap)
    elif count > 1:
        _barrier("written")
    result = store.result() if isinstance(store, _FileStore) else store.result(tiling, swap)
    return jax.tree.unflatten(treedef, result)
