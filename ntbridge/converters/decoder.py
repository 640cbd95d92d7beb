"""Converters of the modules that read two sequences, ``forward(tgt, memory)``:
``nn.TransformerDecoderLayer``, ``nn.TransformerDecoder`` and ``nn.Transformer`` (whose
``forward(src, tgt)`` encodes ``src`` into the memory); and the pair's inputs.

A decoder layer is one stax network, as an encoder layer (:mod:`.encoder`), with a
cross-attention block between self-attention and the feed-forward block: post-norm
``x = norm1(x + sa(x)); x = norm2(x + mha(x, memory)); x = norm3(x + ff(x))``, or pre-norm
(``norm_first``) ``x = x + sa(norm1(x)); x = x + mha(norm2(x), memory); x = x + ff(norm3(x))``.
Its cross-attention is :func:`~ntbridge.stax.CrossAttention`. The kernels take the pairs as
``x1=(tgt, memory)`` (``(src, tgt)`` for ``nn.Transformer``, as its forward), packed into one
tensor by :func:`~.sequence_pair.pack_sequences` and read back by
:class:`~.sequence_pair.PairPart`.

Initialisations: ``nn.Transformer`` re-draws every weight matrix of its layers from
``xavier_uniform_`` (``Options.xavier``); a decoder's layers that are torch's copies of one layer
(equal weights) get the kernel of such copies, as an encoder's (:mod:`ntbridge.stax.tied`).
"""

from __future__ import annotations

from torch import nn

from .. import stax
from ..errors import UnsupportedLayerError
from .attention import check_layout
from .encoder import FEED_FORWARD, Parts, stack, sub_layer
from .registry import Context, register


def _calls(call: dict | None) -> tuple[dict, dict]:
    """The self-attention's and the cross-attention's calls from a decoder's traced call."""
    call = call or {}
    if call.get("tgt_key_padding_mask") is not None or call.get(
            "memory_key_padding_mask") is not None:
        raise UnsupportedLayerError("key padding masks of a decoder's sequences have no kernel "
                                    "rule here; give the decoder sequences without padding.")
    both = {"time_major": call.get("time_major")}
    return ({"attn_mask": call.get("tgt_mask"), "is_causal": call.get("tgt_is_causal"), **both},
            {"attn_mask": call.get("memory_mask"), "is_causal": call.get("memory_is_causal"),
             "cross": True, **both})


def decoder_parts(module: nn.TransformerDecoderLayer, ctx: Context, call: dict | None) -> Parts:
    """The parts of one decoder layer's stax network, taking ``(x, memory)`` (module doc)."""
    sa_call, ca_call = _calls(call)
    sa = sub_layer(module.self_attn, "self_attn", ctx, sa_call)
    ca = sub_layer(module.multihead_attn, "multihead_attn", ctx, ca_call)
    norms = [sub_layer(getattr(module, f"norm{i}"), f"norm{i}", ctx) for i in (1, 2, 3)]
    net = Parts(("x", "memory"))
    x = net.inputs_of[0]
    add = lambda i, a, b: net.add(f"~add{i}", stax.FanInSum(), a, b)
    norm = lambda i, h: net.add(f"norm{i}", norms[i - 1], h)
    if module.norm_first:
        h = add(0, x, net.add("self_attn", sa, norm(1, x)))
        h = add(1, h, net.with_others("multihead_attn", ca, norm(2, h)))
        add(2, h, net.feed_forward(module, ctx, norm(3, h)))
    else:
        h = norm(1, add(0, x, net.add("self_attn", sa, x)))
        h = norm(2, add(1, h, net.with_others("multihead_attn", ca, h)))
        norm(3, add(2, h, net.feed_forward(module, ctx, h)))
    return net


@register(nn.TransformerDecoderLayer)
def _decoder_layer(module: nn.TransformerDecoderLayer, ctx: Context) -> stax.Layer:
    check_layout(module.self_attn.batch_first, ctx, f"TransformerDecoderLayer '{ctx.name}'")
    return decoder_parts(module, ctx, ctx.call).network()


@register(nn.TransformerDecoder)
def _decoder(module: nn.TransformerDecoder, ctx: Context) -> stax.Layer:
    layout = lambda first: (
        [("norm1", "self_attn"), ("norm2", "multihead_attn"), ("norm3", *FEED_FORWARD)]
        if first.norm_first else
        [("self_attn",), "norm1", ("multihead_attn",), "norm2", FEED_FORWARD, "norm3"])
    return stack(module, ctx, Parts(("x", "memory")),
                 lambda layer, sub: decoder_parts(layer, sub, ctx.call), layout)


@register(nn.Transformer)
def _transformer(module: nn.Transformer, ctx: Context) -> stax.Layer:
    call = ctx.call or {}
    net = Parts(("src", "tgt"))
    src, tgt = net.inputs_of
    encoder_call = {k: call.get(k) for k in ("src_mask", "src_key_padding_mask", "time_major")}
    encoder_call["is_causal"] = call.get("src_is_causal")
    memory = net.add("encoder", sub_layer(module.encoder, "encoder", ctx, encoder_call), src)
    net.add("decoder", sub_layer(module.decoder, "decoder", ctx, call), tgt, memory)
    return net.network()
