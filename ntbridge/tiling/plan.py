"""The batching options of every entry point, and the tiles they lead to."""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import shutil

import jax

from ..devices import free_bytes
from ..errors import InputError, InputTypeError, MemoryBudgetError

MEMORY_FRACTION = 0.8  # share of free memory a computation may plan to use
PROGRESS_BLOCKS = 4  # row blocks of a compute-bound kernel whose progress is asked for


@dataclasses.dataclass(frozen=True)
class Batching:
    """The batching options of every kernel entry point.

    Attributes:
      batch_size: tile size in examples; ``None`` (default) = no tiling unless the whole would not
        fit in memory, then the largest tile that fits; ``0`` = never tile.
      device_count: local devices to spread tiles over; ``-1`` = all.
      store_on_device: keep the result on the device (True) or gather tiles in host memory.
      progress: a bar of tiles and a timer while compiling (:mod:`ntbridge.progress`); ``None`` =
        on a terminal, once the work has taken a couple of seconds.
      out: a ``.npy`` path: the kernel is written there tile by tile (resumable) and returned as a
        tensor over a copy-on-write memory map of it (writing to it leaves the file as computed).
      platform: the platform of the inputs ("cpu", "gpu"), whose devices compute the tiles; set
        from x1 when the request runs (``None``: JAX's default).

    Example:
        >>> Batching(batch_size=256, device_count=2)
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

    def candidate_sizes(self, n: int, compute_bound: bool = False) -> list[int]:
        """Tile sizes to try, largest first, for ``n`` examples on the longer side. A kernel whose
        pairs cost much work in little memory (``compute_bound``: numerical expectations, e.g.
        attention's) can take minutes in one tile: with ``progress=True`` and no ``batch_size``
        its tiles are of ``n / PROGRESS_BLOCKS`` examples at most, so that the bar moves (with x2
        = x1 about 25% more pairs computed than the single tile's triangle)."""
        if self.batch_size is not None:
            return [self.batch_size or n]
        sizes = [n]
        while sizes[-1] > 1:
            sizes.append(math.ceil(sizes[-1] / 2))
        if compute_bound and self.progress:
            sizes = [b for b in sizes if b <= math.ceil(n / PROGRESS_BLOCKS)]
        return sizes


@dataclasses.dataclass
class Tiling:
    """Tile sizes ``b1 x b2`` and the tiles ``(i, j)`` (row block, column block) to compute.

    With ``symmetric`` (x2 is x1), only tiles on and above the diagonal are listed.
    """

    n1: int
    n2: int
    b: int
    symmetric: bool
    padded: tuple[int, int] | None = None  # tiles of (b1, b2) rows, edges padded, if not (b, b)
    most_devices: int | None = None  # the devices of a program compiled for another size

    def __post_init__(self):
        self.b1, self.b2 = self.padded or (min(self.b, self.n1), min(self.b, self.n2))
        rows, cols = math.ceil(self.n1 / self.b1), math.ceil(self.n2 / self.b2)
        self.tiles = [(i, j) for i in range(rows) for j in range(cols)
                      if not self.symmetric or j >= i]

    @property
    def whole(self) -> bool:
        """One tile covering the whole kernel."""
        return len(self.tiles) == 1

    def devices(self, opts: Batching) -> list:
        """The devices the tiles are spread over: no more than there are tiles (or
        ``most_devices``)."""
        return opts.devices[:max(1, min(len(opts.devices), len(self.tiles),
                                        self.most_devices or len(self.tiles)))]

    def rows(self, i: int) -> slice:
        return slice(i * self.b1, min((i + 1) * self.b1, self.n1))

    def cols(self, j: int) -> slice:
        return slice(j * self.b2, min((j + 1) * self.b2, self.n2))


def entry_bytes(entry: list[jax.ShapeDtypeStruct]) -> int:
    """The bytes of one entry (a pair of examples) of a kernel whose leaves for one pair are
    ``entry`` (``(1, 1, ...)`` shapes and dtypes)."""
    return sum(math.prod(leaf.shape[2:]) * leaf.dtype.itemsize for leaf in entry)


def _gib(size: float) -> str:
    return f"{size / 2**30:,.2f} GiB"


def _describe(n1: int, n2: int, entry: list[jax.ShapeDtypeStruct]) -> str:
    """The result's arrays in words, e.g. ``2 kernels of 1000 x 1000 float32``."""
    kinds = collections.Counter(" x ".join(map(str, (n1, n2, *leaf.shape[2:]))) + f" {leaf.dtype}"
                                for leaf in entry)
    return ", ".join(f"{count} kernels of {kind}" if count > 1 else f"a kernel of {kind}"
                     for kind, count in kinds.items())


def _on_disk(path: str | os.PathLike) -> int:
    """The bytes an earlier run's kernel file at ``path`` already holds on disk (the file is
    sparse: the tiles written so far), 0 if there is none."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return 0
    blocks = getattr(stat, "st_blocks", None)
    return stat.st_size if blocks is None else blocks * 512


def result_budget(n1: int, n2: int, entry: list[jax.ShapeDtypeStruct], opts: Batching,
                  least: bool = False) -> float:
    """The memory the tiles may plan to use once the ``n1 x n2`` result (``entry``: its leaves
    for one pair of examples; with ``least``, the least they hold) has its place, checked from
    shapes alone before any work: in memory, or with ``opts.out`` on the disk of that file.

    Raises:
      MemoryBudgetError: the result fits neither in the free memory (without ``out``) nor on the
        free disk (with ``out``); nothing has been computed or written.
      InputError: ``out`` given for more than one kernel.
    """
    size, what = n1 * n2 * entry_bytes(entry), _describe(n1, n2, entry)
    gib = lambda b: ("at least " if least else "") + _gib(b)
    free = free_bytes(opts.devices[0]) * MEMORY_FRACTION
    if opts.out is None:
        if size > free:
            raise MemoryBudgetError(
                f"the result ({what}: {gib(size)}) does not fit in the free memory "
                f"({_gib(free)} usable); pass out='kernel.npy' to write it to disk tile by tile "
                f"(batch_size= sets the tiles), or use fewer examples in x1 and x2.")
        return free - size
    if len(entry) != 1:
        raise InputError(f"out= stores one kernel, and {what} were asked for; ask for one (e.g. "
                         f"get='ntk').")
    directory = os.path.dirname(os.path.abspath(opts.out))
    missing, available = size - _on_disk(opts.out), shutil.disk_usage(directory).free
    if missing > available:
        raise MemoryBudgetError(
            f"out={str(opts.out)!r}: the result ({what}: {gib(size)}) needs {gib(missing)} more "
            f"on that disk, which has {_gib(available)} free; free space there, pass out= a path "
            f"on a larger disk, or use fewer examples in x1 and x2.")
    return free
