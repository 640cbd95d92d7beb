"""Key padding masks computed from the model's token ids in an exported graph.

``ids == pad`` (or ``ids != pad``) of the model's input is a :class:`~.values.Padding`, followed
through the operations that keep it one: views keeping the examples first and the keys last,
negation, Hugging Face's ``mask[arange(N)[:, None, None, None], arange(T)[None, None, None, :]]``,
``&`` with a constant mask (a causal one) and ``where(mask, 0, lowest)`` into an additive mask.
That is how ``model(ids, attention_mask=ids != pad)`` reaches the attention of BERT, GPT-2 and
Llama, with ``"sdpa"`` and ``"eager"`` alike. The attention (:mod:`.heads`) takes the result.

Example (GPT-2's ``attention_mask = ids != 0`` on its way to SDPA's ``attn_mask``):
    ``ne(ids, 0)`` is ``Padding(0, attend=True)``; ``to``, ``view`` and ``index`` by example and
    key keep it; ``& causal`` (a constant ``(1, 1, T, T)``) makes it ``Padding(0, True,
    allowed=causal (T, T))``, which ``expand`` keeps and the attention reads.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import fx

from ...errors import UnsupportedLayerError
from ...stax import INPUT
from .heads import FILL, constant_mask
from .translator import _where
from .values import Const, Padding, Seq, both, dims

_VIEWS = {"unsqueeze", "view", "reshape", "slice", "expand", "to", "_to_copy", "alias"}
_AND = {"__and__", "bitwise_and", "logical_and"}


def padding_op(name: str, node: fx.Node, args: tuple) -> Padding | None:
    """The value of operation ``name`` if it makes or keeps a key padding mask; None if it takes
    none. Raises UnsupportedLayerError for any other use of one."""
    if name in ("eq", "ne") and len(args) == 2 and args[0] == Seq(INPUT) and \
            isinstance(args[1], int):
        return Padding(args[1], attend=name == "ne")
    taken = args[:2] if name in _AND else args[:1]  # the logits + a mask: the attention's
    mask = next((a for a in taken if isinstance(a, Padding)), None)
    if mask is None:
        return None
    found = _follow(name, node, mask, args)
    if found is None:
        raise UnsupportedLayerError(
            f"{_where(node)}: a key padding mask of the token ids (ids == pad) is used other than "
            f"as keys[:, None, None, :] masking the logits, or ids != pad (with views, "
            f"Hugging Face's index and & of a constant mask) as scaled_dot_product_attention's "
            f"attn_mask or an additive mask.")
    return found


def _follow(name: str, node: fx.Node, mask: Padding, args: tuple) -> Padding | None:
    shape, before = dims(node), dims(node.args[0])
    if name in ("bitwise_not", "logical_not") and mask.allowed is None and not mask.additive:
        return dataclasses.replace(mask, attend=not mask.attend)
    if name in _VIEWS and _keeps_keys(name, before, shape):
        return mask
    if name == "index" and _whole_rows(args[1], before):
        return mask
    if name in _AND and mask.attend and not mask.additive:
        other = args[1] if args[0] is mask else args[0]
        if isinstance(other, Const):
            return dataclasses.replace(mask, allowed=both(mask.allowed, constant_mask(
                other.value, shape[-1])))
    if name == "where" and mask.attend and not mask.additive and \
            _number(args[1]) == 0 and _number(args[2]) <= FILL:
        return dataclasses.replace(mask, additive=True)
    return None


def _keeps_keys(name: str, before: tuple, after: tuple) -> bool:
    """Whether a view from ``before`` to ``after`` keeps the examples first, the keys last and
    the queries (if any) before them: it only adds, drops or (``expand``) broadcasts axes of 1."""
    if after[:1] != before[:1] or after[-1:] != before[-1:]:
        return False
    return name == "expand" or [d for d in after if d != 1] == [d for d in before if d != 1]


def _whole_rows(indices, before: tuple) -> bool:
    """Whether ``mask[indices]`` of a mask ``(N, T)`` takes each example's whole row in order:
    ``[arange(N)[:, None, ...], arange(T)[None, ..., :]]``, which only adds axes of 1."""
    if len(before) != 2 or len(indices) != 2 or not all(isinstance(i, Const) for i in indices):
        return False
    rows, keys = (torch.as_tensor(i.value) for i in indices)
    along = lambda i, axis: i.shape[axis] == i.numel() and bool(
        (i.flatten() == torch.arange(i.numel())).all())
    return keys.numel() == before[-1] and along(keys, -1) and rows.ndim == keys.ndim and \
        along(rows, 0)


def _number(value) -> float:
    """A Python number or a constant 0-d tensor as a float (nan for anything else)."""
    value = value.value if isinstance(value, Const) else value
    if isinstance(value, torch.Tensor) and value.ndim == 0:
        value = value.item()
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else float("nan")
