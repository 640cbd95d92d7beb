"""Self-attention in an exported graph, in every spelling, recognised as one attention rule.

The walk (:mod:`.analytic`) hands each operation on a projection not yet converted
(:class:`~.values.Proj`) or on what follows from one to :func:`head_op`, which follows the
tensor's axes by their meaning (``N`` examples, ``T`` tokens, ``F`` features, ``H`` heads, ``D``
channels of a head, ``R`` copies of a key head): ``split``/``chunk`` of a fused projection,
``view``/``reshape``/``unflatten`` into heads, ``transpose``/``permute``, ``repeat_kv``'s
``unsqueeze``/``expand``/``reshape`` (grouped-query attention), then either
``scaled_dot_product_attention`` or ``q @ k^T``, a scale, masks (``masked_fill`` of a constant
boolean mask, an added constant mask), ``softmax`` and ``@ v``; the heads merged back and the
output projection make one :class:`~.standins.ExportedAttention` node (:func:`attention`).
Anything else on these values is refused with :data:`RECOGNISED`, the form that converts.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ...errors import UnsupportedLayerError
from .rotary import Turn, rotary_op
from .standins import ExportedAttention, Projection
from .values import Const, Heads, Padding, Proj, both, dims, regroup

RECOGNISED = (
    "The recognised form of self-attention: queries, keys and values projected from one sequence "
    "x (N, T, d) by separate Linear layers or one fused projection split with .split(d, -1) or "
    ".chunk(3, -1); heads by view/reshape/unflatten to (N, T, H, d_head) and transpose(1, 2) or "
    "permute(0, 2, 1, 3) (keys and values repeated for grouped-query heads, repeat_kv); then "
    "F.scaled_dot_product_attention(q, k, v, attn_mask=a constant (T, T) mask or the keys that "
    "may be attended, (ids != pad)[:, None, None, :], alone or & a constant mask, is_causal=..., "
    "enable_gqa=..., scale=...) or softmax((q @ k.transpose(-2, -1)) * a constant scale with "
    "masked_fill(a constant mask, -inf) or + a constant mask, dim=-1) @ v "
    "(and a key padding mask of the model's token ids, masked_fill((ids == pad)[:, None, None, :], "
    "-inf)); "
    "the heads merged by transpose(1, 2) and reshape(N, T, d); then one output projection.")
FILL = -1e30  # masked entries: -inf, or the dtype's lowest number (Hugging Face's masks)


@dataclasses.dataclass(frozen=True)
class Logits:
    """``scale * q k^T`` of query and key heads, and the keys each query may see."""

    q: Heads
    k: Heads
    scale: float
    allowed: torch.Tensor | None
    weights: bool = False  # after the softmax
    padding: int | None = None  # keys whose id is this one are masked


@dataclasses.dataclass(frozen=True)
class Mixed:
    """The attention's output ``softmax(...) v`` laid out by ``axes``, before its projection."""

    q: Heads
    k: Heads
    v: Heads
    scale: float | None  # None: scaled_dot_product_attention's default, 1/sqrt(d_head)
    allowed: torch.Tensor | None
    axes: tuple[str, ...]
    padding: int | None = None


HEAD_VALUES = (Proj, Heads, Logits, Mixed, Turn)
_VIEWS = {"view", "reshape", "_unsafe_view", "unflatten"}
_SAME = {"contiguous", "clone", "alias", "detach", "dropout", "_to_copy", "to", "type_as"}


def _refuse(what: str) -> UnsupportedLayerError:
    return UnsupportedLayerError(f"{what}, which is not a spelling of self-attention recognised "
                                 f"here. {RECOGNISED}")


def _laid_out(value, axes: tuple[str, ...], shape: tuple, group: int):
    """``value`` with new axes (same kind); a projection's tokens and features as they were (not
    rotated), the projection itself."""
    if isinstance(value, Mixed):
        return dataclasses.replace(value, axes=axes)
    if axes in (("N", "T", "F"), ("NT", "F")) and group == 1 and value.frequencies is None:
        return value.proj
    return dataclasses.replace(value, axes=axes, shape=shape, group=group)


def _as_heads(value, shape: tuple = ()):
    """A projection as :class:`Heads` of axes ``(N, T, F)``, or ``(NT, F)`` for rows."""
    if not isinstance(value, Proj):
        return value
    return Heads(value, ("NT", "F") if len(shape) == 2 else ("N", "T", "F"), shape)


def _layout(name: str, node, value, args) -> object | None:
    """The value after a view, transpose, permute, unsqueeze or expand (None: not one)."""
    before = dims(node.args[0])
    value = _as_heads(value, before)
    if not isinstance(value, (Heads, Mixed)):
        return None
    axes, shape = value.axes, dims(node)
    group = getattr(value, "group", 1)
    if name in _VIEWS:
        found = regroup(axes, before, shape, group)
        if found is None:
            raise _refuse(f"a reshape from {before} to {shape} of axes {axes}")
        return _laid_out(value, found[0], shape, found[1])
    if name == "transpose":
        a, b = (d % len(axes) for d in args[1:3])
        new = list(axes)
        new[a], new[b] = new[b], new[a]
        return _laid_out(value, tuple(new), shape, group)
    if name == "permute":
        return _laid_out(value, tuple(axes[d % len(axes)] for d in args[1]), shape, group)
    if name == "unsqueeze":
        d = args[1] % (len(axes) + 1)
        return _laid_out(value, axes[:d] + ("1",) + axes[d:], shape, group)
    if name == "expand":
        new = tuple("R" if a == "1" and s != 1 else a for a, s in zip(axes, shape))
        return _laid_out(value, new, shape, group)
    return None


def _split(name: str, value: Proj, args, node) -> tuple | None:
    """The shares of a fused projection's ``split``/``chunk`` along its features."""
    dim, n = args[2] if len(args) > 2 else 0, value.hi - value.lo
    if dim % 3 != 2 and dim != -1:
        raise _refuse(f"{name} of a projection along its axis {dim}")
    if name == "chunk":
        sizes = [math.ceil(n / args[1])] * args[1]
    else:
        sizes = list(args[1]) if isinstance(args[1], (list, tuple)) else [args[1]] * math.ceil(
            n / args[1])
    starts = [value.lo + sum(sizes[:i]) for i in range(len(sizes))]
    return tuple(dataclasses.replace(value, lo=s, hi=min(s + k, value.hi))
                 for s, k in zip(starts, sizes))


def constant_mask(mask, t: int) -> torch.Tensor | None:
    """The ``(T, T)`` keys each query may see, from a constant boolean "may see" mask or additive
    float mask that broadcasts over examples and heads; None where every key is allowed."""
    if mask is None:
        return None
    m = torch.as_tensor(mask)
    allowed = m if m.dtype == torch.bool else m > FILL
    if m.dtype != torch.bool and ((m > FILL) & (m != 0)).any():
        raise _refuse("an additive attention mask with finite values other than 0 (a bias of the "
                      "logits)")
    rows = torch.broadcast_to(allowed, (*allowed.shape[:-2], t, t)).reshape(-1, t, t)
    if not (rows == rows[:1]).all():
        raise _refuse("an attention mask that differs across examples or heads (a padding mask "
                      "of each example, or per-head masks)")
    return None if bool(rows[0].all()) else rows[0]


def _logits_op(name: str, value: Logits, args, kwargs) -> Logits | None:
    """Scales, masks and the softmax of logits."""
    other = args[1] if len(args) > 1 else None
    number = isinstance(other, (int, float)) and not isinstance(other, bool)
    t = value.q.shape[value.q.axes.index("T")]
    if name in ("mul", "div") and number and not value.weights:
        return dataclasses.replace(value, scale=value.scale * (other if name == "mul" else 1 / other))
    if name == "masked_fill" and isinstance(other, Padding) and not value.weights:
        if not (isinstance(args[2], (int, float)) and args[2] <= FILL) or other.attend:
            raise _refuse(f"masked_fill of the logits with {args[2]!r} where "
                          f"ids {'!=' if other.attend else '=='} {other.id} (not -inf where "
                          f"ids == pad)")
        return _padded(value, other)
    if name == "add" and isinstance(other, Padding) and other.additive and not value.weights:
        return _padded(value, other)
    if name == "masked_fill" and isinstance(other, Const) and not value.weights:
        if not (isinstance(args[2], (int, float)) and args[2] <= FILL):
            raise _refuse(f"masked_fill of the logits with {args[2]!r} (not -inf)")
        allowed = constant_mask(~torch.as_tensor(other.value).bool(), t)
        return dataclasses.replace(value, allowed=both(value.allowed, allowed))
    if name == "add" and isinstance(other, Const) and not value.weights:
        allowed = constant_mask(other.value, t)
        return dataclasses.replace(value, allowed=both(value.allowed, allowed))
    if name in ("softmax", "_softmax") and args[1] in (-1, 3) and not value.weights:
        return dataclasses.replace(value, weights=True)
    if name in _SAME and value.weights:
        return value
    return None


def _padded(value: Logits, mask: Padding) -> Logits:
    """``value`` masked by the keys whose id is ``mask.id`` (and its constant mask)."""
    if value.padding not in (None, mask.id):
        raise _refuse(f"logits masked where ids == {value.padding} and where ids == {mask.id}")
    return dataclasses.replace(value, padding=mask.id, allowed=both(value.allowed, mask.allowed))


def _matmul(a, b) -> Logits | Mixed | None:
    if isinstance(a, Heads) and isinstance(b, Heads) and a.axes[-2:] == ("T", "D") and \
            b.axes[-2:] == ("D", "T"):
        return Logits(a, b, 1.0, None)
    if isinstance(a, Logits) and a.weights and isinstance(b, Heads) and b.axes[-2:] == ("T", "D"):
        return Mixed(a.q, a.k, b, a.scale, a.allowed, a.q.axes, a.padding)
    return None


def _sdpa(args, kwargs) -> Mixed:
    names = ("attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    given = {**dict(zip(names, args[3:])), **kwargs}
    q, k, v = args[:3]
    if not all(isinstance(a, Heads) for a in (q, k, v)):
        raise _refuse("scaled_dot_product_attention of tensors that are not heads of projections")
    mask, t = given.get("attn_mask"), q.shape[q.axes.index("T")]
    padding = mask.id if isinstance(mask, Padding) and mask.attend else None  # ids != pad
    if mask is not None and padding is None and not isinstance(mask, Const):
        raise _refuse("scaled_dot_product_attention with a mask computed from the inputs other "
                      "than (ids != pad)[:, None, None, :]")
    allowed = None if mask is None else mask.allowed if padding is not None else \
        constant_mask(mask.value, t)
    if given.get("is_causal"):
        allowed = both(allowed, torch.ones(t, t, dtype=torch.bool).tril())
    if given.get("dropout_p", 0.0):
        raise _refuse("attention dropout in training mode (call model.eval())")
    return Mixed(q, k, v, given.get("scale"), allowed, q.axes, padding)


def head_op(name: str, node, args: tuple, kwargs: dict):
    """The value of operation ``name`` (an ATen op's name) on ``args`` where one of them is an
    attention's step (:data:`HEAD_VALUES`); None if it is the output projection (the walk builds
    the node, :func:`attention`), or a projection used as a plain Linear layer (the walk converts
    it). Raises UnsupportedLayerError with :data:`RECOGNISED` for any other use."""
    value = args[0]
    if name in ("linear", "addmm"):
        return None
    if (found := rotary_op(name, node, args)) is not None:
        return found
    if name in ("split", "split_with_sizes", "chunk") and isinstance(value, Proj):
        return _split(name, value, args, node)
    if name == "matmul":
        heads = [_as_heads(a, dims(n)) for a, n in zip(args[:2], node.args[:2])]
        if (found := _matmul(*heads)) is not None:
            return found
    elif name == "scaled_dot_product_attention":
        return _sdpa(args, kwargs)
    elif isinstance(value, Logits):
        if (found := _logits_op(name, value, args, kwargs)) is not None:
            return found
    elif name == "cat" and len(value) == 2 and isinstance(value[0], Const) and \
            value[0].value.numel() == 0:
        return value[1]  # an empty cache's keys before the new ones
    elif name in _SAME or (name == "slice" and args[2:4] in ((0, 2 ** 63 - 1), (None, None))):
        return value
    elif (found := _layout(name, node, value, args)) is not None:
        return found
    plain = not any(isinstance(a, (Heads, Logits, Mixed)) for a in args)
    if plain and name not in _VIEWS | {"transpose", "permute"}:
        return None  # a projection used as a plain Linear layer
    if name == "mul" and any(isinstance(a, Const) for a in args):
        raise _refuse("heads multiplied by a constant other than a rotary embedding's cos or sin "
                      "table (T, d_head) of the positions")
    raise _refuse(f"{name} of {type(value).__name__.lower()} values")


def _kv_heads(heads: Heads, head_dim: int) -> int:
    return (heads.proj.hi - heads.proj.lo) // head_dim


def attention(mixed: Mixed, out: Proj) -> tuple[ExportedAttention, str, int]:
    """The attention node of ``mixed`` projected by ``out``: the module, its name (the qualified
    name its projections' modules share) and the converted node it reads (with a key padding
    mask, the token ids too)."""
    q, k, v = mixed.q, mixed.k, mixed.v
    if mixed.axes not in (("N", "T", "F"), ("NT", "F")):
        raise _refuse(f"an output projection of heads laid out as {mixed.axes}")
    if len({q.proj.source, k.proj.source, v.proj.source}) != 1:
        raise UnsupportedLayerError("the queries and the keys or values are projected from "
                                    "different sequences: cross-attention has no kernel rule "
                                    "here; only self-attention is supported. " + RECOGNISED)
    d = q.shape[q.axes.index("D")]
    h, g = _kv_heads(q, d), _kv_heads(k, d)
    fan_in = out.weight.tensor.shape[0 if out.transposed else 1]
    if g != _kv_heads(v, d) or h % g or h * d != fan_in:
        raise _refuse(f"{h} query heads and {g} key heads of {d} channels, projected from "
                      f"{fan_in} features")
    if q.frequencies != k.frequencies or v.frequencies is not None:
        raise _refuse("rotary embeddings of the queries and keys that differ, or of the values")
    logit_scale = 1.0 if mixed.scale is None else mixed.scale * d ** 0.5  # over 1/sqrt(d)
    projections = [q.proj, k.proj, v.proj, out]
    owners = [p.owner.split(".") for p in projections]
    common = []
    for parts in zip(*owners):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    prefix = ".".join(common)
    rel = lambda name: name[len(prefix) + 1:] if prefix else name
    params = {rel(p.name): p.tensor for pr in projections for p in (pr.weight, pr.bias) if p}
    shares = [Projection(pr.owner, rel(pr.weight.name), pr.bias and rel(pr.bias.name),
                         pr.transposed, pr.lo, pr.hi) for pr in projections]
    module = ExportedAttention(params, *shares, h, g, d, mixed.allowed, mixed.padding,
                                logit_scale, q.frequencies)
    return module, prefix, q.proj.source
