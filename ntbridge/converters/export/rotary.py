"""Rotary position embeddings of attention heads in an exported graph (Llama's
``apply_rotary_pos_emb``: ``q * cos + rotate_half(q) * sin``, ``rotate_half(x) = cat(-x[..., d/2:],
x[..., :d/2])``), recognised as the heads rotated by the frequencies the constants ``cos`` and
``sin`` hold, for the walk of :mod:`.heads`.

Each step is a :class:`Turn` of the heads: a half of their channels (``slice``, its sign flipped by
``neg``), their ``rotate_half`` (``cat``), either times a constant ``(T, D)`` table (``mul``). The
sum of the heads times ``cos`` and their ``rotate_half`` times ``sin`` is the heads rotated
(:func:`rotary_op` returns them with ``frequencies`` set) where the tables are
``cos(t w)``, ``sin(t w)`` of positions ``t = 0 .. T-1`` and one frequency ``w`` per pair of
channels ``(i, i + d/2)``; other tables are refused.

Example:
    >>> turn = rotary_op("slice", node, (heads, 3, 0, 4))   # Heads (N, H, T, 8)
    >>> turn.part
    'lo'
"""

from __future__ import annotations

import dataclasses

import torch

from ...errors import UnsupportedLayerError
from .values import Const, Heads, dims


@dataclasses.dataclass(frozen=True)
class Turn:
    """A step of rotating ``heads`` (a :class:`~.heads.Heads`): ``part`` is ``"lo"``/``"hi"`` (the
    first or second half of the channels, times ``sign``), ``"rotated"`` (``rotate_half``) or
    ``"whole"``; ``table``: the constant ``(T, D)`` multiplying it (None: none yet)."""

    heads: object
    part: str
    sign: int = 1
    table: torch.Tensor | None = None


def _refuse(what: str) -> UnsupportedLayerError:
    return UnsupportedLayerError(
        f"{what}: not a rotary position embedding recognised here. The recognised form is "
        f"Llama's: q * cos + rotate_half(q) * sin (the same for k), rotate_half(x) = "
        f"torch.cat((-x[..., d/2:], x[..., :d/2]), -1), cos and sin constants (T, d) of the "
        f"positions 0 .. T-1 (cos(t w), sin(t w), each frequency w for channels i and i + d/2).")


def _table(heads, value) -> torch.Tensor | None:
    """``value`` as a ``(T, D)`` table broadcast over the heads' other axes (None: not such a
    constant)."""
    if not isinstance(value, Const) or not isinstance(value.value, torch.Tensor):
        return None
    c, axes = value.value, heads.axes
    if c.dim() > len(axes):
        return None
    c = c.reshape((1,) * (len(axes) - c.dim()) + tuple(c.shape))
    if any(size != 1 for a, size in zip(axes, c.shape) if a not in ("T", "D")):
        return None
    c = c[tuple(slice(None) if a in ("T", "D") else 0 for a in axes)]
    if axes.index("T") > axes.index("D"):
        c = c.T
    size = lambda a: heads.shape[axes.index(a)]
    return torch.broadcast_to(c, (size("T"), size("D"))).double()


def frequencies(cos: torch.Tensor, sin: torch.Tensor) -> tuple[float, ...] | None:
    """The frequencies ``w`` with ``cos = cos(t w)``, ``sin = sin(t w)`` (``(T, D)`` tables, the
    frequency of channel ``i`` that of ``i + D/2``), read at position 1; None if the tables are
    not such. Tolerance: the angles ``t w`` rounded in float32 (Hugging Face computes them so)."""
    t, d = cos.shape
    half = d // 2
    w = torch.atan2(sin[1, :half], cos[1, :half]) if t > 1 else torch.zeros(half).double()
    angles = torch.arange(t, dtype=torch.float64)[:, None] * w
    angles = torch.cat([angles, angles], -1)
    atol = 1e-6 + t * 2.0 ** -23
    if d % 2 or not (torch.allclose(cos, angles.cos(), rtol=0, atol=atol)
                     and torch.allclose(sin, angles.sin(), rtol=0, atol=atol)):
        return None
    return tuple(w.tolist())


def _sum(a: Turn, b: Turn):
    """``heads * cos + rotate_half(heads) * sin``: the heads rotated."""
    if a.part == "rotated":
        a, b = b, a
    if not (a.part == "whole" and b.part == "rotated" and a.heads == b.heads
            and a.table is not None and b.table is not None):
        raise _refuse("a sum of parts of attention heads")
    found = frequencies(a.table, b.table)
    if found is None:
        raise _refuse("heads times constants that are not cos(t w) and sin(t w) of the positions")
    return dataclasses.replace(a.heads, frequencies=found)


def _times(x, other):
    """``x`` (heads or their ``rotate_half``) times the constant ``other``; None if ``x`` is heads
    and ``other`` no ``(T, D)`` table (another use of the heads)."""
    heads = x if isinstance(x, Heads) else x.heads
    table = _table(heads, other)
    if isinstance(x, Heads):
        return None if table is None or x.frequencies is not None else Turn(x, "whole",
                                                                              table=table)
    if table is None or x.part != "rotated" or x.table is not None:
        raise _refuse("a part of attention heads multiplied by another value than cos or sin")
    return dataclasses.replace(x, table=table)


def rotary_op(name: str, node, args: tuple):
    """The value of operation ``name`` on heads or a :class:`Turn` of them (module doc); None if
    it is no step of a rotary embedding."""
    value = args[0]
    if name == "slice" and isinstance(value, Heads) and value.frequencies is None:
        d = value.axes.index("D")
        size = value.shape[d]
        if args[1] % len(value.axes) != d or size % 2:
            return None
        if tuple(args[2:4]) == (0, size // 2):
            return Turn(value, "lo")
        if args[2] == size // 2 and args[3] >= size:
            return Turn(value, "hi")
        return None
    if name == "mul" and len(args) == 2:
        x = [a for a in args if isinstance(a, (Heads, Turn))]
        if len(x) == 1:
            return _times(x[0], args[1] if args[0] is x[0] else args[0])
    parts = value if isinstance(value, (list, tuple)) else args[:2]
    if not any(isinstance(a, Turn) for a in parts):
        return None
    if name == "neg" and value.part in ("lo", "hi"):
        return dataclasses.replace(value, sign=-value.sign)
    last = len(dims(node)) - 1
    if name == "cat" and len(value) == 2 and (args[1] if len(args) > 1 else 0) % (last + 1) == last:
        hi, lo = value
        if (isinstance(hi, Turn) and isinstance(lo, Turn) and hi.heads == lo.heads
                and (hi.part, hi.sign, lo.part, lo.sign) == ("hi", -1, "lo", 1)):
            return Turn(hi.heads, "rotated")
    if name == "add" and len(args) >= 2 and all(isinstance(a, Turn) for a in args[:2]):
        return _sum(*args[:2])
    raise _refuse(f"{name} of a part of attention heads")
