"""Kernels evaluated tile by tile over (N1, N2), spread over devices and processes.

A :class:`Task` (a batch-independent kernel function ``fn(args, a1, a2_or_None)``) is evaluated on
tiles of ``batch_size`` rows and columns (:mod:`.plan`). Any N1 and N2 work: the last tile is
padded by repeating its last example, and the padding is cut from the result. With ``x2=None`` only
tiles on and above the diagonal are computed; diagonal tiles are symmetrized after the program (op
by op, in torch: :mod:`.arrays`) and the others are mirrored, so the whole is exactly symmetric
(:mod:`.run`). The backward pass of a kernel is the sum of the tiles' VJPs (:mod:`.backward`).

* Programs (:mod:`.compiled`): one per tile shape, devices and options. A size asked for the
  first time runs a program compiled for another size if one fits (one larger tile, or several
  smaller ones), its tiles padded; a size asked again gets its own.
* Devices: each step evaluates one tile per device: ``jax.shard_map`` over a mesh of the devices
  runs the kernel function on each device's own tile (no ``vmap``).
* Processes: under ``jax.distributed``, each process computes every ``process_count``-th tile; the
  full kernel is then exchanged through the distributed key-value store (:mod:`.distributed`), or
  each process writes its tiles to the shared ``out`` file.
* Storage (:mod:`.stores`): memory (a torch tensor on x1's device or the host), or
  ``out="kernel.npy"``: a ``.npy`` file written tile by tile through a memory map, with a sidecar
  ``kernel.npy.tiles.json`` recording the tiles done and a fingerprint of what computed them. A
  killed run started again with the same ``out`` computes only the missing tiles; a different model,
  input or option is refused, never mixed in.
* Memory: before any work, the size of the result, from shapes alone (the kernel function traced
  on one example, nothing compiled), is compared with the free memory, or with ``out`` with the
  free disk of that file; then XLA's memory analysis of the compiled tile program that will run
  with the memory left (tile sizes whose outputs alone cannot fit are not compiled). Without an
  explicit ``batch_size`` the largest tile that fits is chosen; a request that cannot fit raises
  :class:`~ntbridge.errors.MemoryBudgetError` in a time that does not grow with N, leaving no
  file behind.
"""

from .plan import Batching, Tiling
from .run import compute
from .task import Task, TilingInfo

__all__ = ["Batching", "Task", "Tiling", "TilingInfo", "compute"]
