"""Hand-written RMSNorm in a traced ``forward``, as one ``nn.RMSNorm`` (:func:`rms_norm`), and the
dtype casts around it (:func:`cast_source`).

The recognised form is Llama's: ``x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)``, then
optionally ``* w`` (``w * ...``) with ``w`` a parameter of the model, the square also written
``x ** 2``, ``x * x`` or ``torch.square(x)``, the casts ``x.to(torch.float32)``, ``x.float()``,
``x.to(input_dtype)`` anywhere in between (the kernel is the same in any precision). Any other
product of a parameter with one scale per channel and a tensor, ``gamma * x`` (ConvNeXt's layer
scale), is a :class:`~..normalization.ChannelScale` (:func:`channel_scale_pattern`).

Example:
    >>> class Norm(nn.Module):                                   # Llama's LlamaRMSNorm
    ...     def forward(self, x):
    ...         h = x.to(torch.float32)
    ...         h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
    ...         return self.weight * h.to(x.dtype)
"""

from __future__ import annotations

import dataclasses
import operator

import torch
from torch import fx, nn

from ..normalization import ChannelScale, rms_norm_of
from .equivalents import is_shape
from .nodes import Trace, pattern
from .tracer import describe

_CASTS = ("to", "float", "double", "half", "bfloat16", "type_as", "type")
_PRODUCTS = (operator.mul, torch.mul, "mul")
_SUMS = (operator.add, torch.add, "add")
_MEANS = (torch.mean, "mean")
_DEPTH = 8  # the most nodes from the first of an RMSNorm to its last (casts and weight included)


@dataclasses.dataclass(frozen=True)
class RMSNormMatch:
    """A hand-written RMSNorm: its input ``x``, ``eps``, the weight's qualified name (None: no
    weight), the fx nodes it spans (``members``) and the one computing its output (``last``)."""

    x: fx.Node
    eps: float
    weight: str | None
    members: frozenset
    last: fx.Node


def cast_source(node: fx.Node) -> fx.Node | None:
    """The tensor that ``node`` casts to another dtype (``x.to(torch.float32)``, ``x.float()``,
    ``x.to(y.dtype)``, ``x.type_as(y)``); None if ``node`` is no such cast."""
    if node.op != "call_method" or node.target not in _CASTS or not isinstance(node.args[0],
                                                                               fx.Node):
        return None
    others = [*node.args[1:], *node.kwargs.values()]
    if node.target == "type_as" or all(isinstance(a, (torch.dtype, bool)) or is_shape(a)
                                       for a in others):
        return node.args[0]
    return None


def _uncast(a):
    while isinstance(a, fx.Node) and (source := cast_source(a)) is not None:
        a = source
    return a


def _is(node, targets: tuple) -> bool:
    """Whether ``node`` calls one of ``targets`` (functions, or method names)."""
    return (isinstance(node, fx.Node) and node.op in ("call_function", "call_method")
            and node.target in targets)


def _factors(node) -> tuple | None:
    """The two factors of a product node, else None."""
    if not _is(node, _PRODUCTS) or node.kwargs or len(node.args) != 2:
        return None
    return node.args


def _squared(node) -> fx.Node | None:
    """``y`` of ``y.pow(2)``, ``y ** 2``, ``torch.square(y)``, ``y * y`` (casts skipped)."""
    node = _uncast(node)
    if not isinstance(node, fx.Node) or node.kwargs:
        return None
    if node.target in (operator.pow, torch.pow, "pow") and node.args[1:] == (2,):
        return _uncast(node.args[0])
    if node.target in (torch.square, "square") and len(node.args) == 1:
        return _uncast(node.args[0])
    factors = _factors(node)
    if factors and _uncast(factors[0]) is _uncast(factors[1]):
        return _uncast(factors[0])
    return None


def _last_axis_mean(node) -> fx.Node | None:
    """``q`` of ``q.mean(-1, keepdim=True)`` (or ``torch.mean(q, dim=-1, keepdim=True)``)."""
    node = _uncast(node)
    if not _is(node, _MEANS):
        return None
    args = {**dict(zip(("input", "dim", "keepdim"), node.args)), **node.kwargs}
    return args["input"] if args.get("dim") in (-1, (-1,), [-1]) and args.get("keepdim") else None


def _inverse_root(node) -> tuple[fx.Node, float] | None:
    """``(y, eps)`` of ``torch.rsqrt(mean(y**2, -1, keepdim=True) + eps)``."""
    node = _uncast(node)
    if not _is(node, (torch.rsqrt, "rsqrt")) or len(node.args) != 1:
        return None
    total = _uncast(node.args[0])
    if not _is(total, _SUMS) or total.kwargs or len(total.args) != 2:
        return None
    mean, eps = sorted(total.args, key=lambda a: not isinstance(a, fx.Node))
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not isinstance(mean, fx.Node):
        return None
    q = _last_axis_mean(mean)
    y = None if q is None else _squared(q)
    return None if y is None else (y, float(eps))


def _normalized(node) -> tuple[fx.Node, float] | None:
    """``(x, eps)`` of ``x * rsqrt(mean(x**2, -1, keepdim=True) + eps)`` (either order)."""
    factors = _factors(_uncast(node))
    for a, b in ([factors, factors[::-1]] if factors else []):
        found = _inverse_root(b)
        if found is not None and _uncast(a) is found[0]:
            return found
    return None


def _between(last: fx.Node, x: fx.Node) -> frozenset:
    """The nodes computing ``last`` from ``x``, ``last`` included, ``x`` not."""
    members, todo = set(), [last]
    while todo:
        n = todo.pop()
        if n is x or n in members or not isinstance(n, fx.Node):
            continue
        members.add(n)
        todo.extend(n.all_input_nodes)
    return frozenset(members)


def rms_norm(node: fx.Node, params: dict[str, nn.Parameter]) -> RMSNormMatch | None:
    """The RMSNorm ending at ``node`` (the product by the weight, or the normalized input when no
    weight multiplies it), else None. Its nodes but the last must have no other users.
    ``params``: the model's parameters by qualified name."""
    factors = _factors(node)
    match = None
    for a, w in ([factors, factors[::-1]] if factors else []):
        if isinstance(w, fx.Node) and w.op == "get_attr" and w.target in params and (
                found := _normalized(a)) is not None:
            match = RMSNormMatch(found[0], found[1], w.target,
                                 _between(node, found[0]) - {w}, node)
    if match is None and (found := _normalized(node)) is not None:
        match = RMSNormMatch(found[0], found[1], None, _between(node, found[0]), node)
    if match is None or any(set(m.users) - match.members for m in match.members - {node}):
        return None
    return match


def enclosing_rms_norm(node: fx.Node, params: dict[str, nn.Parameter]) -> RMSNormMatch | None:
    """The largest RMSNorm (with its weight, where one follows) that ``node`` is part of, found
    among the nodes a few steps after it; else None."""
    found, level, seen = [], [node], {node}
    for _ in range(_DEPTH):
        found += [m for n in level if (m := rms_norm(n, params)) and node in m.members]
        level = [u for n in level for u in n.users if u not in seen]
        seen.update(level)
    return max(found, key=lambda m: len(m.members), default=None)


def rms_norm_module(match: RMSNormMatch, params: dict[str, nn.Parameter]) -> tuple[nn.RMSNorm, str]:
    """The ``nn.RMSNorm`` computing ``match`` (holding the model's weight itself) and its node's
    name: the weight's owner (its key is then the weight's own qualified name)."""
    if match.weight is None:
        return rms_norm_of(None, match.eps), match.last.name
    owner, _, local = match.weight.rpartition(".")
    module = rms_norm_of(params[match.weight], match.eps)
    return module, owner if owner and local == "weight" else match.last.name


@pattern
def rms_norm_pattern(node: fx.Node, t: Trace) -> bool:
    """The node pattern of a hand-written RMSNorm: its nodes claimed, one ``nn.RMSNorm`` at its
    last, fed by its input."""
    if node.op not in ("call_function", "call_method") or (
            match := enclosing_rms_norm(node, t.params)) is None:
        return False
    t.convert_chains(node)
    if node is match.last:
        module, name = rms_norm_module(match, t.params)
        t.add(node, name, module, (t.source(match.x, describe(node)),), describe(node))
    return True


@pattern
def channel_scale_pattern(node: fx.Node, t: Trace) -> bool:
    """``gamma * x`` (or ``x * gamma``) of a parameter ``gamma`` of the model of shape ``(C, 1,
    ..., 1)`` or ``(C,)``: one :class:`~..normalization.ChannelScale`, named as ``gamma``'s
    owner."""
    if (factors := _factors(node)) is None:
        return False
    found = [a for a in factors if isinstance(a, fx.Node) and a.op == "get_attr"
             and a.target in t.params]
    gamma = t.params[found[0].target] if len(found) == 1 else None
    if gamma is None or gamma.ndim == 0 or any(size != 1 for size in gamma.shape[1:]):
        return False
    x = next(a for a in factors if a is not found[0])
    owner, _, local = found[0].target.rpartition(".")
    t.add(node, owner, ChannelScale(local, gamma), (t.source(x, describe(node)),),
          describe(node))
    return True
