"""Converters of ``nn.TransformerEncoderLayer`` and ``nn.TransformerEncoder``, as sequences
``(N, T, d)``.

An encoder layer is one stax network of its submodules' layers and the residual sums (post-norm
``x = norm1(x + sa(x)); x = norm2(x + ff(x))``, or pre-norm ``x = x + sa(norm1(x)); x = x +
ff(norm2(x))`` with ``norm_first``; ``ff = linear2(dropout(activation(linear1(x))))``), its
parameters keyed by their qualified names within the module. The calls' masks come from
``ctx.call`` (the keyword arguments of a traced call, see :mod:`.trace`). An encoder's layers that
hold equal weights (torch's deep copies of one layer) get the kernel of such copies
(:mod:`ntbridge.stax.tied`).
"""

from __future__ import annotations

import re

import torch
from torch import nn

from .. import stax
from ..errors import UnsupportedLayerError
from ..stax.tied import Branch, Norm, tied
from .attention import PaddingIds, check_layout
from .functional import FUNCTIONS
from .registry import Context, as_float, find_converter, register
from .reuse import copies


def sub_layer(module: nn.Module, name: str, ctx: Context, call: dict | None = None) -> stax.Layer:
    """The stax layer of submodule ``module`` (qualified ``ctx.name + '.' + name``)."""
    sub = Context(f"{ctx.name}.{name}" if ctx.name else name, ctx.index, ctx.options, call=call)
    converter = find_converter(module)
    if converter is None:
        raise UnsupportedLayerError(f"{sub.name} ({type(module).__name__}) has no kernel rule.")
    layer = converter(module, sub)
    ctx.hyper.update({f"{name}.{k}": v for k, v in sub.hyper.items()})
    return layer


def nested(parts: list[tuple[str, stax.Layer]], inputs: list[tuple[int, ...]]) -> stax.Layer:
    """A ``dag`` of ``parts`` (prefix, layer) whose params are one dict keyed ``prefix.name``."""
    net = stax.dag([layer for _, layer in parts], inputs)
    prefixes = [p + "." for p, _ in parts]

    def split(params):
        return tuple({k[len(p):]: v for k, v in params.items() if k.startswith(p)}
                     for p in prefixes)

    def init_fn(key, shape):
        out, per = net.init_fn(key, shape)
        return out, {p + k: v for p, lp in zip(prefixes, per) for k, v in lp.items()}

    return net._replace(init_fn=init_fn, apply_fn=lambda params, x: net.apply_fn(split(params), x))


FEED_FORWARD = ("linear1", "activation", "dropout", "linear2")  # an encoder's or decoder's layer's


def _activation(module: nn.TransformerEncoderLayer, ctx: Context) -> stax.Layer:
    act = module.activation
    act = FUNCTIONS[act]() if act in FUNCTIONS else act
    if not isinstance(act, nn.Module):
        raise UnsupportedLayerError(f"{ctx.name}: activation {act!r} is not supported; use "
                                    f"'relu', 'gelu' or an activation module.")
    return sub_layer(act, "activation", ctx)


class Parts:
    """The parts of a :func:`nested` network, added in execution order. A network whose input is
    a tuple (an encoder's ``(x, ids)`` when its call has a key padding mask; a decoder's ``(x,
    memory)``) picks its entries first: ``inputs_of``, the nodes of the entries ``names``
    (``(INPUT,)`` without names)."""

    def __init__(self, names: tuple[str, ...] = ()):
        self.parts, self.inputs = [], []
        self.inputs_of = tuple(self.add(f"~{n}", stax.Pick(j), stax.INPUT)
                               for j, n in enumerate(names)) or (stax.INPUT,)

    def add(self, name: str, layer: stax.Layer, *sources: int) -> int:
        self.parts.append((name, layer))
        self.inputs.append(sources)
        return len(self.parts) - 1

    def with_others(self, name: str, layer: stax.Layer, h: int) -> int:
        """Add a part reading ``h`` and the network's other inputs, where it takes them (the
        token ids of an encoder's attention, a decoder's memory)."""
        return self.add(name, layer, h, *self.inputs_of[1:])

    def feed_forward(self, module: nn.Module, ctx: Context, h: int) -> int:
        """Add an encoder's or decoder's layer's ``linear2(dropout(activation(linear1(h))))``."""
        for name in FEED_FORWARD:
            layer = _activation(module, ctx) if name == "activation" else sub_layer(
                getattr(module, name), name, ctx)
            h = self.add(name, layer, h)
        return h

    def network(self) -> stax.Layer:
        return nested(self.parts, self.inputs)


def encoder_parts(module: nn.TransformerEncoderLayer, ctx: Context, call: dict | None) -> Parts:
    """The parts of one encoder layer's stax network (module doc)."""
    sa = sub_layer(module.self_attn, "self_attn", ctx, call)
    norm1, norm2 = sub_layer(module.norm1, "norm1", ctx), sub_layer(module.norm2, "norm2", ctx)
    padded = isinstance((call or {}).get("key_padding_mask"), PaddingIds)
    net = Parts(("x", "ids") if padded else ())
    add = lambda i, a, b: net.add(f"~add{i}", stax.FanInSum(), a, b)
    x = net.inputs_of[0]
    if module.norm_first:
        h = add(0, x, net.with_others("self_attn", sa, net.add("norm1", norm1, x)))
        add(1, h, net.feed_forward(module, ctx, net.add("norm2", norm2, h)))
    else:
        h = net.add("norm1", norm1, add(0, x, net.with_others("self_attn", sa, x)))
        net.add("norm2", norm2, add(1, h, net.feed_forward(module, ctx, h)))
    return net


def encoder_layer(module: nn.TransformerEncoderLayer, ctx: Context, call: dict | None):
    """The stax network of one encoder layer (module doc)."""
    return encoder_parts(module, ctx, call).network()


def _encoder_call(ctx: Context) -> dict:
    call = dict(ctx.call or {})
    return {"attn_mask": call.get("src_mask", call.get("mask")),
            "key_padding_mask": call.get("src_key_padding_mask"),
            "is_causal": call.get("is_causal"), "time_major": call.get("time_major")}


@register(nn.TransformerEncoderLayer)
def _encoder_layer(module: nn.TransformerEncoderLayer, ctx: Context) -> stax.Layer:
    check_layout(module.self_attn.batch_first, ctx, f"TransformerEncoderLayer '{ctx.name}'")
    return encoder_layer(module, ctx, _encoder_call(ctx))


@register(nn.TransformerEncoder)
def _encoder(module: nn.TransformerEncoder, ctx: Context) -> stax.Layer:
    call = _encoder_call(ctx)
    padded = isinstance(call["key_padding_mask"], PaddingIds)
    net = Parts(("x", "ids") if padded else ())
    layout = lambda first: ([("norm1", "self_attn"), ("norm2", *FEED_FORWARD)] if first.norm_first
                            else [("self_attn",), "norm1", FEED_FORWARD, "norm2"])
    return stack(module, ctx, net, lambda layer, sub: encoder_parts(layer, sub, call), layout)


def stack(module: nn.Module, ctx: Context, net: Parts, parts_of, layout_of) -> stax.Layer:
    """The network of an encoder's or decoder's layers (``parts_of(layer, ctx)``: a layer's
    :class:`Parts`) and final norm, reading ``net``'s inputs (every layer reads the first, and
    the others as they are: the token ids, or the memory); the kernel of torch's copies of one
    layer where they hold equal weights (``layout_of(first layer)``: see :func:`tied_layers`)."""
    h, bodies = net.inputs_of[0], []
    for j, layer in enumerate(module.layers):
        name = f"layers.{j}"
        sub = Context(f"{ctx.name}.{name}" if ctx.name else name, ctx.index, ctx.options)
        check_layout(layer.self_attn.batch_first, ctx, sub.name)
        bodies.append((parts_of(layer, sub), sub.hyper))
        h = net.with_others(name, bodies[-1][0].network(), h)
        ctx.hyper.update({f"{name}.{k}": v for k, v in sub.hyper.items()})
    if module.norm is not None:
        net.add("norm", sub_layer(module.norm, "norm", ctx), h)
    network = net.network()
    ctx.hyper["shared_weights"] = shared = shares_weights(module, ctx)
    if not shared:
        return network
    first = module.layers[0]
    return tied_layers(first, net, bodies, network, layout_of(first))


def shares_weights(module: nn.Module, ctx: Context) -> bool:
    """Whether the stack's layers hold one set of weights, as torch's deep copies of one layer
    do until trained (``shared_weights="auto"``): every parameter of every layer equal to the first
    layer's. Layers whose random weights all differ are independent; a mix is refused. In an
    ``nn.Transformer``, which re-draws every weight matrix, the layers are independent (their
    biases stay torch's copies: the kernel leaves out their correlation across layers, terms of
    the order of the biases' variance ``1 / (3 fan_in)``)."""
    if ctx.options.shared_weights == "independent" or ctx.in_transformer:
        return False
    same = copies(module.layers)
    if len(same) > 1:
        raise UnsupportedLayerError(
            f"{ctx.name or 'the model'} ({type(module).__name__}): some of its layers' weights "
            f"equal the first layer's and some do not, so neither the kernel of layers sharing "
            f"weights (torch's clones, before training) nor that of independent layers is this "
            f"model's. Pass shared_weights='independent' for the latter, or re-initialise every "
            f"layer.")
    return same == {True}


def tied_layers(first: nn.Module, net: Parts, bodies: list, network: stax.Layer,
                layout: list[tuple[str, ...] | str]) -> stax.Layer:
    """``network`` of encoder or decoder layers sharing their weights
    (:mod:`ntbridge.stax.tied`); ``layout``: one layer's steps, each the names of its parts in a
    residual branch (a tuple) or of a post-norm LayerNorm (a string)."""
    (body, hyper), index = bodies[0], {name: i for i, (name, _) in enumerate(net.parts)}
    values = lambda h: repr({k: as_float(v) if isinstance(v, torch.Tensor) else v
                             for k, v in h.items()})
    for _, other in bodies[1:]:
        if values(other) != values(hyper):
            raise UnsupportedLayerError(
                f"the layers of a stack of {type(first).__name__}s share their weights, so they "
                f"share their variances too, but W_std/b_std give them different ones ({hyper} "
                f"and {other}); give every layer the same, or pass shared_weights='independent'.")
    at = index["layers.0"]
    parts = {name: (i, layer, len(body.inputs[i]) == 2)  # the layers reading (h, ids or memory)
             for i, (name, layer) in enumerate(body.parts)}

    def branch(names: tuple[str, ...]) -> Branch:
        used = tuple(parts[name] for name in names)

        def rule(k, other, stack_hyper):
            for i, layer, with_other in used:
                fn = stax.with_hyper(layer, stack_hyper[at][i])
                k = fn((k, other)) if with_other else fn(k)
            return k
        return Branch(rule)

    def norm(name: str) -> Norm:
        weight, bias = hyper[f"{name}.weight"], hyper[f"{name}.bias"]
        if any(v is not None and v != v for v in (weight, bias)):
            raise UnsupportedLayerError(f"{name}'s affine parameters vary across entries: no "
                                        f"kernel rule (use ntbridge.empirical_ntk).")
        return Norm(getattr(first, name).eps, weight, bias)

    steps = [norm(step) if isinstance(step, str) else branch(step) for step in layout]

    last = index.get("norm")
    final = None if last is None else net.parts[last][1]

    def finish(k, stack_hyper):
        return k if final is None else stax.with_hyper(final, stack_hyper[last])(k)

    def init_fn(key, shape):  # one draw for every layer, as torch's copies
        out, params = network.init_fn(key, shape)
        first_layer = lambda k: re.sub(r"^layers\.\d+\.", "layers.0.", k)
        return out, {k: params[first_layer(k)] for k in params}

    return tied(network._replace(init_fn=init_fn), steps, len(bodies), finish)
