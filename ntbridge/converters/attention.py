"""The converter of ``nn.MultiheadAttention`` (self-attention; cross-attention where a decoder
calls it, :mod:`.decoder`) on sequences ``(N, T, d)`` (encoder layers and stacks: :mod:`.encoder`;
token embeddings: :mod:`.embedding`): its projections' standard deviations, the masks of a traced
call (:class:`PaddingIds`) and the check of the layout it reads."""

from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp
import torch
from torch import fx, nn

from .. import stax
from ..compat import same_embed_dim
from ..errors import UnsupportedLayerError
from ..stax.attention import CrossAttention, SelfAttention, Stds
from .registry import Context, register, rms

# torch's initialisation of MultiheadAttention: xavier_uniform_ of in_proj_weight (3E, E), variance
# 2 / (E + 3E), i.e. W_std**2 = 1/2 for queries, keys, values; out_proj as nn.Linear, 1/3; zero biases
TORCH_ATTENTION_STDS = (0.5 ** 0.5, 0.5 ** 0.5, 0.5 ** 0.5, 3 ** -0.5)


class PaddingIds(NamedTuple):
    """``ids == id`` of the model's input ``ids`` (the node ``ids``): a key padding mask, as a
    traced call hands it to the converter (:mod:`.trace.calls`)."""

    id: int
    ids: fx.Node


def _attention_stds(module: nn.MultiheadAttention, ctx: Context) -> Stds:
    """The projections' standard deviations (``init`` option, as ``Context.affine`` for Linear)."""
    e, o = module.embed_dim, ctx.options
    has_bias = module.in_proj_bias is not None
    if o.init == "torch":
        W, b = list(TORCH_ATTENTION_STDS), [0.0] * 4
        if ctx.in_transformer:  # out_proj re-drawn by xavier_uniform_ too: W_std**2 = 2E / 2E
            W[3] = 1.0
    else:
        weights = [*module.in_proj_weight.chunk(3), module.out_proj.weight]
        W = [rms(w) * e ** 0.5 for w in weights]
        b = [rms(t) for t in (*module.in_proj_bias.chunk(3), module.out_proj.bias)] if has_bias \
            else [0.0] * 4
    W_exp, b_exp = o.explicit(o.W_std, ctx.name), o.explicit(o.b_std, ctx.name)
    W = W if W_exp is None else [float(W_exp)] * 4
    b = b if b_exp is None else [float(b_exp)] * 4
    ctx.hyper = {"W_std": tuple(W), "b_std": tuple(b) if has_bias else None}
    return Stds(*W, *(b if has_bias else [None] * 4))


def additive_mask(mask, where: str, cross: bool = False) -> jnp.ndarray | None:
    """torch's ``attn_mask`` ``(T, T)`` (``(T, S)`` for ``cross``-attention) as an additive float
    mask (boolean True: not allowed)."""
    if mask is None:
        return None
    form = "(T, S)" if cross else "(T, T)"
    if not isinstance(mask, torch.Tensor) or mask.ndim != 2 or not (
            cross or mask.shape[0] == mask.shape[1]):
        raise UnsupportedLayerError(
            f"{where}: attn_mask must be one {form} tensor shared by the batch (a causal or other "
            f"fixed mask), got {getattr(mask, 'shape', mask)!r}; per-example or per-head masks "
            f"(3-d) have no kernel rule here.")
    m = mask.detach().cpu()
    m = torch.where(m, -math.inf, 0.0) if m.dtype == torch.bool else m.double()
    return jnp.asarray(m.numpy())


def check_layout(batch_first: bool, ctx: Context, where: str) -> None:
    """The layout a module reads must be its input's: batch-first ``(N, T, E)``, or time-major
    ``(T, N, E)`` after a transpose in ``forward`` (``ctx.call['time_major']``, :mod:`.trace.time_major`)."""
    time_major = bool((ctx.call or {}).get("time_major"))
    if batch_first == time_major:
        given, read = (("(T, N, E)", "batch_first=True") if time_major
                       else ("(N, T, E)", "batch_first=False"))
        raise UnsupportedLayerError(
            f"{where} has {read} but gets sequences {given}: ntbridge's inputs are batch-first "
            f"(N, T, E); with batch_first=False, transpose them in forward (x.transpose(0, 1)) "
            f"before the module and back after it.")


def _call_mask(ctx: Context, where: str):
    """The (T, T) additive mask of a traced attention call's keyword arguments (None: none), and
    the padding id of its key padding mask (None: none)."""
    call = ctx.call or {}
    padding = call.get("key_padding_mask")
    if padding is not None and not isinstance(padding, PaddingIds):
        raise UnsupportedLayerError(
            f"{where}: key_padding_mask must be computed in forward from the model's token ids, "
            f"key_padding_mask=(ids == pad_id) (a per-example mask follows its examples through "
            f"the kernel); got a tensor of the model.")
    mask = call.get("attn_mask")
    if call.get("is_causal") and mask is None:
        raise UnsupportedLayerError(f"{where}: is_causal=True needs the causal mask itself as "
                                    f"well (torch treats it as a hint); pass mask=...")
    return additive_mask(mask, where, bool(call.get("cross"))), \
        None if padding is None else padding.id


@register(nn.MultiheadAttention)
def _attention(module: nn.MultiheadAttention, ctx: Context) -> stax.Layer:
    where = f"MultiheadAttention '{ctx.name}'"
    if not same_embed_dim(module):
        raise UnsupportedLayerError(f"{where} has kdim/vdim different from embed_dim: that is "
                                    f"cross-attention, which has no kernel rule here (only "
                                    f"self-attention, attn(x, x, x)).")
    for option in ("bias_k", "bias_v"):
        if getattr(module, option) is not None:
            raise UnsupportedLayerError(f"{where} uses add_bias_kv=True, which is not supported; "
                                        f"build it without add_bias_kv.")
    if module.add_zero_attn:
        raise UnsupportedLayerError(f"{where} uses add_zero_attn=True, which is not supported.")
    if module.training and module.dropout > 0:
        raise UnsupportedLayerError(f"{where} drops attention weights in training mode "
                                    f"(dropout={module.dropout}); call model.eval().")
    check_layout(module.batch_first, ctx, where)
    mask, padding_id = _call_mask(ctx, where)
    rule = stax.Rule(points=ctx.options.attention_points)
    if (ctx.call or {}).get("cross"):
        if ctx.options.attention == "linear":
            raise UnsupportedLayerError(f"{where}: attention='linear' ties keys to queries, which "
                                        f"cross-attention cannot (they read other sequences).")
        return CrossAttention(module.embed_dim, module.num_heads, _attention_stds(module, ctx),
                              parameterization=ctx.parameterization, mask=mask, rule=rule)
    return SelfAttention(module.embed_dim, module.num_heads, _attention_stds(module, ctx),
                         parameterization=ctx.parameterization, mask=mask,
                         linear_scaling=ctx.options.attention == "linear", padding_id=padding_id,
                         rule=rule)
