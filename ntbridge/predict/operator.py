"""A kernel matrix as a linear operator read in row blocks: the only way the iterative solvers
(:mod:`.cg`, :mod:`.lanczos`) touch a kernel.

The kernel may be far larger than memory: ``ntbridge.kernel(..., out="k.npy")`` returns a tensor
that maps its file, and a product with it reads one block of rows at a time, so that no
``(n, n)`` temporary is ever made (``k + s I`` or ``k.to(float64)`` of the whole matrix would
make one). The diagonal shift ``s`` is added to each block's product on the fly.

Example:
    >>> a = KernelOperator(torch.ones(4, 4), shift=0.5, block_rows=2)
    >>> a.matmul(torch.ones(4, 1)).ravel()                # (K + 0.5 I) @ 1, read in 2 blocks
    tensor([4.5000, 4.5000, 4.5000, 4.5000], dtype=torch.float64)
"""

from __future__ import annotations

import torch

from ..errors import InputError

#: Bytes of one block of kernel rows, in the dtype the products are computed in: 8 MiB (a block
#: converted from float32 is reused from the processor's cache by its product, and the blocks
#: stay a small part of the memory a solve uses).
BLOCK_BYTES = 8 * 2**20


def block_rows_for(columns: int, itemsize: int, block_rows: int | None = None) -> int:
    """Rows per block: ``block_rows`` if given, else as many as fit in :data:`BLOCK_BYTES`."""
    if block_rows is not None:
        if int(block_rows) != block_rows or block_rows < 1:
            raise InputError(f"block_rows must be a positive integer, got {block_rows!r}.")
        return int(block_rows)
    return max(1, BLOCK_BYTES // max(1, columns * itemsize))


def blocks(k: torch.Tensor, dtype: torch.dtype, rows: int):
    """``(start, block)`` for each block of ``rows`` rows of ``k``, in ``dtype``: a view of ``k``
    when no conversion is needed, else copied into one reused buffer (no allocation per block)."""
    buffer = None
    for start in range(0, k.shape[0], rows):
        block = k[start:start + rows]
        if block.dtype != dtype:
            if buffer is None:
                buffer = torch.empty(rows, k.shape[1], dtype=dtype, device=k.device)
            block = buffer[:block.shape[0]].copy_(block)
        yield start, block


def matmul_rows(k: torch.Tensor, x: torch.Tensor, block_rows: int | None = None,
                shift: float = 0.0) -> torch.Tensor:
    """``(k + shift I) @ x`` for a matrix ``k (m, n)`` (in memory or mapped from disk; square when
    ``shift`` is not 0) and ``x (n, c)``, in ``x``'s dtype, reading ``k`` one block of rows at a
    time (the shift is added to each block's product)."""
    rows = block_rows_for(k.shape[1], x.element_size(), block_rows)
    out = torch.empty(k.shape[0], x.shape[1], dtype=x.dtype, device=x.device)
    for start, block in blocks(k, x.dtype, rows):
        stop = start + block.shape[0]
        if shift:
            torch.addmm(x[start:stop], block, x, beta=shift, out=out[start:stop])
        else:
            torch.mm(block, x, out=out[start:stop])
    return out


class KernelOperator:
    """``A = k + shift * I`` for a symmetric kernel ``k (n, n)``, applied block by block.

    Args:
      k: the kernel ``(n, n)``, a tensor in memory or mapped from a file; never copied whole.
      shift: the diagonal regularisation ``s`` (absolute, >= 0).
      dtype: the dtype the products are computed in, float64 by default whatever ``k``'s dtype
        (a float32 kernel's blocks are converted as they are read: its products cost about 2x
        float32's, and conjugate gradients reach tolerances where, in float32 arithmetic, their
        true residual stalls near 1e-4: ``benchmarks/README.md``).
      block_rows: rows per block (default: :data:`BLOCK_BYTES` of them).

    Attributes:
      blocks_read: how many row blocks the products have read so far (for memory checks).
      products: how many products ``A @ x`` have been computed.
    """

    def __init__(self, k: torch.Tensor, shift: float = 0.0, *, dtype: torch.dtype = torch.float64,
                 block_rows: int | None = None):
        if k.ndim != 2 or k.shape[0] != k.shape[1]:
            raise InputError(f"the kernel must be square (n, n), got {tuple(k.shape)}.")
        self.k, self.shift, self.dtype, self.n = k, float(shift), dtype, k.shape[0]
        self.rows = block_rows_for(self.n, torch.finfo(dtype).bits // 8, block_rows)
        self.blocks_read = 0
        self.products = 0

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """``(k + s I) @ x`` for ``x (n, c)``, in :attr:`dtype`."""
        out = matmul_rows(self.k, x.to(self.k.device, self.dtype), self.rows, self.shift)
        self.blocks_read += -(-self.n // self.rows)
        self.products += 1
        return out

    def diagonal(self) -> torch.Tensor:
        """``diag(k) + s`` ``(n,)``."""
        return self.k.diagonal().to(self.dtype) + self.shift

    def rows_of(self, index: torch.Tensor) -> torch.Tensor:
        """The rows ``k[index]`` ``(len(index), n)`` without the shift (for the preconditioner)."""
        return self.k[index].to(self.dtype)
