"""``a, b = h.chunk(2, -1)`` in a traced ``forward`` (also ``torch.chunk(h, 2, dim=-1)``): the
chunk call is claimed, and each item read from it becomes a :class:`~..indexing.Chunk` of ``h``
(SwiGLU's ``F.silu(a) * b``: the chunks of one Linear's output are independent factors,
:mod:`.independence`)."""

from __future__ import annotations

import operator

import torch
from torch import fx

from ..indexing import Chunk
from .nodes import Trace, pattern
from .tracer import describe


def chunk_call(node) -> tuple[fx.Node, int, int] | None:
    """``(x, chunks, dim)`` of ``x.chunk(chunks, dim)`` or ``torch.chunk(x, chunks, dim)``."""
    if not isinstance(node, fx.Node) or not (
            (node.op == "call_method" and node.target == "chunk")
            or (node.op == "call_function" and node.target is torch.chunk)):
        return None
    args = {**dict(zip(("input", "chunks", "dim"), node.args)), **node.kwargs}
    x, chunks, dim = args.get("input"), args.get("chunks"), args.get("dim", 0)
    if not isinstance(x, fx.Node) or not all(isinstance(a, int) for a in (chunks, dim)):
        return None
    return x, chunks, dim


@pattern
def chunk_pattern(node: fx.Node, t: Trace) -> bool:
    """The chunk call (claimed: its items are read by ``getitem``), and ``chunks[i]``."""
    if chunk_call(node) is not None:
        t.convert_chains(node)
        return True
    if node.op != "call_function" or node.target is not operator.getitem or (
            found := chunk_call(node.args[0])) is None or not isinstance(node.args[1], int):
        return False
    x, chunks, dim = found
    t.add(node, node.name, Chunk(node.args[1] % chunks, chunks, dim),
          (t.source(x, describe(node)),), describe(node))
    return True
