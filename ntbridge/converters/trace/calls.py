"""The calls of transformer modules in a traced ``forward``: attention's, encoders' and decoders'
arguments, and their output. (Positions added to a sequence are :mod:`.positions`'.)

``attn(x, x, x, attn_mask=self.mask, need_weights=False)[0]`` becomes one node fed by ``x``
(``attn(x, memory, memory)``, cross-attention: by ``x`` and ``memory``; a decoder's ``(tgt,
memory)`` and ``nn.Transformer``'s ``(src, tgt)``: by both), its
other arguments handed to the converter (``Context.call``); a mask must be a tensor of the model
(a buffer, or a parameter) rather than one computed in ``forward``, except a key padding mask made
of the model's token ids, ``key_padding_mask=(ids == pad)``: the node is then fed by ``x`` and the
ids, and the converter gets :class:`~..attention.PaddingIds`.
"""

from __future__ import annotations

import inspect
import operator

import torch
from torch import fx, nn

from ...errors import UnsupportedLayerError
from ..attention import PaddingIds

ATTENTION_MODULES = (nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerEncoder,
                     nn.TransformerDecoderLayer, nn.TransformerDecoder, nn.Transformer)
_TENSOR_ARGS = {nn.MultiheadAttention: ("query", "key", "value"),
                nn.TransformerEncoderLayer: ("src",), nn.TransformerEncoder: ("src",),
                nn.TransformerDecoderLayer: ("tgt", "memory"),
                nn.TransformerDecoder: ("tgt", "memory"), nn.Transformer: ("src", "tgt")}


def padding_ids(node: fx.Node) -> PaddingIds | None:
    """``node`` as :class:`PaddingIds` if it compares the model's input with an integer."""
    compares = ((node.op == "call_function" and node.target in (operator.eq, torch.eq))
                or (node.op == "call_method" and node.target == "eq"))
    if not compares or len(node.args) != 2 or node.kwargs:
        return None
    ids = [a for a in node.args if isinstance(a, fx.Node) and a.op == "placeholder"]
    pad = [a for a in node.args if isinstance(a, int) and not isinstance(a, bool)]
    return PaddingIds(pad[0], ids[0]) if ids and pad else None


def _constant(value, attrs: dict, name: str, where: str):
    """A call's argument as the converter gets it: a tensor of the model, a number, or None."""
    if isinstance(value, fx.Node):
        if value in attrs:
            return attrs[value]
        raise UnsupportedLayerError(
            f"{where}: its {name} is computed in forward; only masks that are tensors of the model "
            f"are supported (register it: self.register_buffer('mask', ...), and pass self.mask).")
    return value


def attention_call(module: nn.Module, node: fx.Node, attrs: dict, where: str):
    """``([the input node], {argument: value})`` of a traced call of an attention module."""
    kind = next(t for t in _TENSOR_ARGS if isinstance(module, t))
    try:
        bound = inspect.signature(module.forward).bind(*node.args, **node.kwargs)
    except TypeError as e:
        raise UnsupportedLayerError(f"{where}: unsupported arguments ({e}).") from None
    tensors = [bound.arguments[n] for n in _TENSOR_ARGS[kind]]
    call = {n: _constant(v, attrs, n, where) for n, v in bound.arguments.items()
            if n not in _TENSOR_ARGS[kind]}
    if kind is nn.MultiheadAttention and tensors[0] is not tensors[1]:
        if tensors[1] is not tensors[2]:
            raise UnsupportedLayerError(
                f"{where} is called with different keys and values: no kernel rule here; "
                f"self-attention attn(x, x, x) and cross-attention attn(x, memory, memory) are "
                f"supported.")
        call["cross"] = True
        tensors = tensors[:2]
    elif kind is nn.MultiheadAttention:
        tensors = tensors[:1]
    ids = {v.ids for v in call.values() if isinstance(v, PaddingIds)}
    return [*tensors, *ids], call


def attention_output(node: fx.Node, calls: set) -> fx.Node | None:
    """The attention call whose output ``node`` is (``out[0]``), or None; ``out[1]`` (the
    attention weights) used downstream is refused."""
    if not (node.op == "call_function" and node.target is operator.getitem
            and node.args[0] in calls):
        return None
    if node.args[1] != 0:
        raise UnsupportedLayerError(
            f"'{node.args[0].target}': the attention weights (output [1], need_weights=True) are "
            f"used downstream; they have no kernel rule. Use only the output [0] "
            f"(and pass need_weights=False).")
    return node.args[0]
