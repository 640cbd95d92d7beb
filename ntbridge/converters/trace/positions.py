"""Positional embeddings added to a sequence in a traced ``forward``, and learned tokens joining
it: the nodes that make them (the modules standing for them are :mod:`..positions`'). (The heads
``x.mean(1)`` and ``x[:, i]`` are :mod:`..indexing`'s, whose rules read sequences too.)

``P`` is a parameter of the model, ``(L, d)`` or ``(1, L, d)``, added whole (``x + self.pos``,
``self.pos[None]``) or by its first T rows (``self.pos[:T]``, ``self.pos[None, :T]``,
``self.pos[:, :T]``), or the rows an ``nn.Embedding`` of positions gives ``torch.arange(T)``
(``x + self.wpe(torch.arange(T, device=ids.device))``). A learned token is a parameter ``(1, 1,
d)`` expanded to the batch, ``self.cls.expand(x.shape[0], -1, -1)`` (or ``.repeat(N, 1, 1)``),
then concatenated with the tokens (``torch.cat([cls, h], dim=1)``).
"""

from __future__ import annotations

import operator
from typing import NamedTuple

import torch
from torch import fx, nn

from ...errors import UnsupportedLayerError
from ..positions import AddPositions, LearnedToken
from .equivalents import as_sizes, is_batch_size, is_shape


class PositionsView(NamedTuple):
    """Positions taken in ``forward``: the model's parameter ``name`` (qualified) and its value
    ``tensor``, whole or (``prefix``) its first T rows; ``init_std`` as :class:`AddPositions`'."""

    name: str
    tensor: torch.Tensor
    prefix: bool
    init_std: float | None = None


def _rows(entry) -> bool:
    """Whether an index entry is ``:T`` (T an int or an input's size) or ``:``."""
    return (isinstance(entry, slice) and entry.start in (None, 0) and entry.step in (None, 1)
            and (entry.stop is None or isinstance(entry.stop, int) or is_shape(entry.stop)))


def _unsqueezed(node: fx.Node):
    """``(base, key)`` of ``base[key]`` or of ``base.unsqueeze(0)`` (key ``(None,)``), else None."""
    if node.op == "call_method" and node.target == "unsqueeze" and node.args[1:] == (0,):
        return node.args[0], (None,)
    if node.op == "call_function" and node.target is operator.getitem:
        base, key = node.args
        return base, key if isinstance(key, tuple) else (key,)
    return None


def is_arange(node: fx.Node, aranges: set) -> bool:
    """Whether ``node`` is ``torch.arange(T)`` or ``torch.arange(0, T)`` (T an int or an input's
    size; any dtype and device), or ``.unsqueeze(0)`` / ``[None]`` of one (``aranges``)."""
    if node.op == "call_function" and node.target is torch.arange:
        ends = node.args[1:] if len(node.args) == 2 and node.args[0] == 0 else node.args
        return (len(ends) == 1 and (isinstance(ends[0], int) or is_shape(ends[0]))
                and set(node.kwargs) <= {"dtype", "device"})
    found = _unsqueezed(node)
    return found is not None and found[1] == (None,) and found[0] in aranges


def is_arange_value(value) -> bool:
    """Whether a constant is ``torch.arange(T)`` (or ``[None]`` of it): ``torch.arange(6)`` of an
    int, which fx computes while tracing."""
    return (isinstance(value, torch.Tensor) and not value.is_floating_point()
            and (value.ndim == 1 or (value.ndim == 2 and value.shape[0] == 1))
            and torch.equal(value.reshape(-1), torch.arange(value.numel())))


def _embedded_positions(node: fx.Node, model: nn.Module, aranges: set) -> PositionsView | None:
    """For ``embedding(torch.arange(T))`` of an ``nn.Embedding`` of the model: its first T rows."""
    if node.op != "call_module" or len(node.args) != 1 or node.args[0] not in aranges:
        return None
    module = model.get_submodule(node.target)
    if not isinstance(module, nn.Embedding):
        return None
    if module.padding_idx is not None or module.max_norm is not None:
        raise UnsupportedLayerError(
            f"'{node.target}' (nn.Embedding) embeds the positions torch.arange(T) with "
            f"{'padding_idx' if module.max_norm is None else 'max_norm'}, which has no kernel "
            f"rule for positions; drop it.")
    return PositionsView(f"{node.target}.weight", module.weight, True, 1.0)


def position_view(node: fx.Node, attrs: dict, model: nn.Module,
                  aranges: set) -> PositionsView | None:
    """For ``P[:T]``, ``P[None, :T]``, ``P[:, :T]`` (``P`` of shape ``(1, L, d)``), ``P[None]``
    or ``P.unsqueeze(0)`` of a tensor ``P`` of the model (``attrs``), or an ``nn.Embedding`` of
    ``torch.arange(T)`` (``aranges``, :func:`is_arange`): what it views; else None."""
    if (found := _unsqueezed(node)) is None:
        return _embedded_positions(node, model, aranges)
    base, key = found
    if base not in attrs or attrs[base].ndim not in (2, 3):
        return None
    while key and (key[-1] is Ellipsis or key[-1] == slice(None)):
        key = key[:-1]  # trailing ':' and '...' select everything
    leading = (None,) if attrs[base].ndim == 2 else (slice(None),)
    if key in ((), leading):
        return PositionsView(base.target, attrs[base], False)
    if len(key) in (1, 2) and key[:-1] in ((), leading) and _rows(key[-1]):
        return PositionsView(base.target, attrs[base], key[-1].stop is not None)
    return None


def _view(a, attrs: dict, views: dict) -> PositionsView | None:
    """``a`` as positions: a view of :func:`position_view`, or a tensor of the model whole."""
    if a in views:
        return views[a]
    return PositionsView(a.target, attrs[a], False) if a in attrs else None


def is_positions(node: fx.Node, attrs: dict, params: dict, views: dict) -> bool:
    """Whether ``node`` adds a parameter ``(T, d)`` or ``(1, T, d)`` of the model (or a view of
    its leading rows, :func:`position_view`) to a tensor."""
    adds = ((node.op == "call_function" and node.target in (operator.add, torch.add))
            or (node.op == "call_method" and node.target == "add"))
    if not adds or len(node.args) != 2 or node.kwargs:
        return False
    found = [v for a in node.args if (v := _view(a, attrs, views)) is not None]
    return (len(found) == 1 and found[0].name in params
            and (found[0].tensor.ndim == 2 or (found[0].tensor.ndim == 3
                                               and found[0].tensor.shape[0] == 1)))


def positions(node: fx.Node, attrs: dict, views: dict) -> tuple[str, AddPositions, fx.Node]:
    """For a node of :func:`is_positions`: the qualified name of the parameter's owner, the
    :class:`AddPositions` module holding it (under its own name), and the sequence it adds to."""
    x, p = sorted(node.args[:2], key=lambda a: a in attrs or a in views)
    view = _view(p, attrs, views)
    owner, _, local = view.name.rpartition(".")
    return owner, AddPositions(local, view.tensor, view.prefix, view.init_std), x


def learned_token(node: fx.Node, attrs: dict, params: dict) -> tuple[str, LearnedToken] | None:
    """For ``P.expand(N, -1, -1)`` or ``P.repeat(N, 1, 1)`` (N a batch size) of a parameter ``P``
    ``(1, 1, d)`` of the model: the qualified name of its owner and the :class:`LearnedToken`
    holding it; else None."""
    if node.op != "call_method" or node.target not in ("expand", "repeat") or node.kwargs:
        return None
    p, *sizes = node.args
    sizes = as_sizes(sizes)
    if (p not in attrs or p.target not in params or attrs[p].ndim != 3
            or attrs[p].shape[:2] != (1, 1) or len(sizes) != 3):
        return None
    kept = (-1, *attrs[p].shape[1:]) if node.target == "expand" else (1,)  # sizes that keep it
    if not is_batch_size(sizes[0]) or any(size not in kept for size in sizes[1:]):
        return None
    owner, _, local = p.target.rpartition(".")
    return owner, LearnedToken(local, attrs[p])
