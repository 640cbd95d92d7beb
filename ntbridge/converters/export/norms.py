"""RMSNorm written out in an exported graph (Hugging Face's ``LlamaRMSNorm``: ``x *
torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)``, then ``weight * ...``), recognised as one
``nn.RMSNorm`` for the analytic walk (:mod:`.analytic`).

The walk meets ``x ** 2`` as an elementwise function of ``x`` (:class:`~.pointwise.Pointwise`);
its mean over the last axis is a :class:`MeanSquare`, ``eps`` added and ``rsqrt`` taken an
:class:`InvRms`, and ``x`` times that a :class:`Normed` value: it becomes the node of an
``nn.RMSNorm`` holding the model's weight where a weight of the features multiplies it next,
else one without a weight (the walk converts it where it is read). Casts (``.to(float32)`` and
back) keep each value.

Example:
    >>> [n.name for n in export_nodes(llama, ids, Options())][:2]     # analytic.export_nodes
    ['embed_tokens', 'layers.0.input_layernorm']
"""

from __future__ import annotations

import dataclasses

import torch
from torch import fx

from ...errors import UnsupportedLayerError
from ..normalization import rms_norm_of
from .operations import ALIASES
from .pointwise import Pointwise
from .translator import _where
from .values import Param, Seq, dims


@dataclasses.dataclass(frozen=True)
class MeanSquare:
    """``mean(x**2, -1, keepdim=True) + eps`` of the converted tensor ``source``."""

    source: int
    eps: float = 0.0


@dataclasses.dataclass(frozen=True)
class InvRms:
    """``rsqrt(mean(x**2, -1, keepdim=True) + eps)`` of the converted tensor ``source``."""

    source: int
    eps: float


@dataclasses.dataclass(frozen=True)
class Normed:
    """``x * rsqrt(mean(x**2, -1, keepdim=True) + eps)`` of the converted tensor ``source``, not
    yet converted; ``node``: the graph node computing it."""

    source: int
    eps: float
    node: fx.Node


def _is_square(value: Pointwise) -> bool:
    grid = torch.tensor([-2.5, -1.0, 0.5, 3.0], dtype=torch.float64)
    return torch.allclose(value.torch_fn(grid), grid * grid, rtol=1e-15, atol=0)


def _over_last_axis(node: fx.Node, args: tuple) -> bool:
    rank = len(dims(node.args[0]))
    axes = args[1] if isinstance(args[1], (list, tuple)) else (args[1],)
    return [a % rank for a in axes] == [rank - 1] and len(args) > 2 and bool(args[2])


def _refuse(node: fx.Node, what: str) -> UnsupportedLayerError:
    return UnsupportedLayerError(
        f"{_where(node)}: {what}. The recognised form of a written-out RMSNorm is Llama's: "
        f"x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps), then * weight (a parameter "
        f"of the features); nn.RMSNorm works too.")


def norm_op(walk, name: str, node: fx.Node, args: tuple):
    """The value of ATen operation ``name`` on the steps of an RMSNorm (module doc), or the
    converted node of the norm and its weight; None if it is none of them."""
    first, other = (args + (None, None))[:2]
    if name == "mean" and isinstance(first, Pointwise) and _is_square(first) and \
            _over_last_axis(node, args):
        return MeanSquare(first.source)
    if isinstance(first, MeanSquare):
        if name == "add" and isinstance(other, (int, float)) and not isinstance(other, bool):
            return dataclasses.replace(first, eps=first.eps + other)
        if name == "rsqrt":
            return InvRms(first.source, first.eps)
        if name in ALIASES:
            return first
        raise _refuse(node, f"{name} of a mean of squares")
    norms = [a for a in (first, other) if isinstance(a, (InvRms, Normed))]
    if not norms:
        return None
    norm, rest = norms[0], other if first is norms[0] else first
    if name in ALIASES and norm is first:
        return norm
    if isinstance(norm, InvRms):
        if name == "mul" and rest == Seq(norm.source):
            return Normed(norm.source, norm.eps, node)
        raise _refuse(node, f"{name} of rsqrt(mean(x ** 2) + eps) other than x times it")
    width = dims(node)[-1]
    if name == "mul" and isinstance(rest, Param) and tuple(rest.tensor.shape) == (width,):
        owner, _ = walk.owner(rest)
        local = rest.name.rpartition(".")[2]
        module = rms_norm_of(rest.tensor, norm.eps)
        return walk.add(owner if local == "weight" else "", module, (norm.source,), node)
    return None
