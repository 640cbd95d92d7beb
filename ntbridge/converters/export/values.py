"""What the analytic walk over an exported graph (:mod:`.analytic`) knows of each of its values.

A value is a converted tensor (:class:`Seq`, features last), a constant computed from the model's
buffers and the sizes alone (:class:`Const`), a parameter not yet used by a recognised operation
(:class:`Param`), the rows of a parameter taken at constant indices (:class:`Rows`: positions), or
one of the steps of an attention being recognised (:mod:`.heads`: a projection not yet converted,
:class:`Proj`, its heads, the logits, the attention weights, the mixed values).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import fx, nn


@dataclasses.dataclass(frozen=True)
class Seq:
    """The output of converted node ``index`` (``stax.INPUT``: the model's input)."""

    index: int


@dataclasses.dataclass(frozen=True)
class Const:
    """A value computed from the model's buffers, constants and sizes alone."""

    value: object


@dataclasses.dataclass(frozen=True)
class Param:
    """The model's parameter ``name`` (qualified)."""

    name: str
    tensor: nn.Parameter


@dataclasses.dataclass(frozen=True)
class Rows:
    """``parameter[ids]`` for constant ``ids`` (an ``nn.Embedding`` of positions)."""

    param: Param
    ids: torch.Tensor


@dataclasses.dataclass(frozen=True, eq=False)
class Padding:
    """``ids == id`` of the model's token ids, viewed with the keys last: a key padding mask
    (``attend``: its negation, ``ids != id``, the keys that may be attended, of which a query
    sees only those a constant ``(T, T)`` mask ``allowed`` lets it, None: all; ``additive``: as
    an additive mask, 0 where attended and the lowest number elsewhere). See :mod:`.padding`."""

    id: int
    attend: bool = False
    allowed: torch.Tensor | None = None
    additive: bool = False


@dataclasses.dataclass(frozen=True)
class Proj:
    """``x W^T + b`` of the converted ``source`` (``transposed``: ``x W + b``, a weight stored
    ``(in, out)``), not yet converted: it becomes a Linear node unless an attention takes it.
    ``lo:hi``: the share of its output features taken so far (``split``/``chunk``)."""

    source: int
    weight: Param
    bias: Param | None
    transposed: bool
    lo: int
    hi: int
    node: fx.Node

    @property
    def owner(self) -> str:
        return self.weight.name.rpartition(".")[0]

    @property
    def out_features(self) -> int:
        w = self.weight.tensor
        return w.shape[1] if self.transposed else w.shape[0]


@dataclasses.dataclass(frozen=True)
class Heads:
    """A share of a projection laid out by ``axes`` (the names of :mod:`.heads`' module doc);
    ``group``: how many times each head is repeated (grouped-query attention); ``frequencies``:
    those of the rotary position embeddings that rotated them (:mod:`.rotary`; None: none)."""

    proj: Proj
    axes: tuple[str, ...]
    shape: tuple
    group: int = 1
    frequencies: tuple[float, ...] | None = None


def dims(node) -> tuple:
    """``node``'s shape from its metadata: ints, and the strings of sizes computed from the batch
    size (``'s0'``, ``'8*s0'``)."""
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    shape = getattr(val, "shape", None)
    return () if shape is None else tuple(int(d) if isinstance(d, int) else str(d) for d in shape)


def both(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    """The keys both ``a`` and ``b`` allow (None: every key)."""
    return a if b is None else b if a is None else a & b


def regroup(axes: tuple[str, ...], before: tuple, after: tuple, group: int):
    """The axes after a reshape from ``before`` to ``after`` (split or merge of one pair of
    adjacent axes: features into heads ``F -> (H, D)`` and back, examples and tokens into rows
    ``(N, T) -> NT`` and back, a head's copies into heads ``(H, R) -> H``; a head axis of 1 inserted
    or dropped alike), and the repeat count ``group`` times the copies merged; None if it is no
    such reshape."""
    if before == after:
        return axes, group
    i = 0
    while i < min(len(before), len(after)) and before[i] == after[i]:
        i += 1
    j = 0
    while j < min(len(before), len(after)) - i and before[-1 - j] == after[-1 - j]:
        j += 1
    if j and i + j == min(len(before), len(after)):  # an axis of 1 (one head) inserted or
        j -= 1  # dropped: the suffix matched the axis it splits from or merges into
    mid_in, mid_out = axes[i:len(axes) - j], after[i:len(after) - j]
    merges = {("H", "D"): "F", ("N", "T"): "NT", ("H", "R"): "H"}
    if len(mid_in) == 1 and len(mid_out) == 2:
        split = {"F": ("H", "D"), "NT": ("N", "T")}.get(mid_in[0])
        return (None if split is None else (axes[:i] + split + axes[len(axes) - j:], group))
    if len(mid_in) == 2 and len(mid_out) == 1 and tuple(mid_in) in merges:
        merged = merges[tuple(mid_in)]
        repeat = before[i + 1] if merged == "H" and mid_in[1] == "R" else 1
        return axes[:i] + (merged,) + axes[len(axes) - j:], group * repeat
    return None
