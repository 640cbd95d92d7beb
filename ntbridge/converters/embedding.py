"""The converter of ``nn.Embedding`` (token ids to sequences ``(N, T, d)``), and the checks of
the token ids a model reads with one."""

from __future__ import annotations

import torch
from torch import nn

from .. import stax
from ..errors import InputError, InputTypeError, UnsupportedLayerError
from ..stax.embedding import Embedding
from .registry import Context, register, rms


@register(nn.Embedding)
def _embedding(module: nn.Embedding, ctx: Context) -> stax.Layer:
    if module.max_norm is not None:
        raise UnsupportedLayerError("nn.Embedding(max_norm=...) renormalises its rows on use; "
                                    "the analytic kernel has no rule for it (drop max_norm).")
    o = ctx.options
    std = _rows_rms(module) if o.init != "torch" else (  # torch's init: N(0, 1)
        1.0 if ctx.library_std is None else ctx.library_std)
    explicit = o.explicit(o.W_std, ctx.name)
    std = std if explicit is None else float(explicit)
    ctx.hyper = {"W_std": std}
    return Embedding(module.num_embeddings, module.embedding_dim, W_std=std,
                     padding_idx=module.padding_idx, parameterization=o.parameterization)


def _rows_rms(module: nn.Embedding) -> float:
    """The root mean square of the embedding's weights, the padding row left out."""
    w = module.weight
    if module.padding_idx is not None:
        w = torch.cat([w[:module.padding_idx], w[module.padding_idx + 1:]])
    return rms(w)


def id_readers(graph) -> list:
    """The nodes of ``graph`` (a converted or translated model) reading token ids: nn.Embedding
    modules fed by the model's input."""
    return [n for n in getattr(graph, "layers", ())
            if isinstance(getattr(n, "module", None), nn.Embedding) and n.inputs == (stax.INPUT,)]


def check_ids(graph, x1: torch.Tensor, x2: torch.Tensor | None, empirical: bool) -> None:
    """Token ids must be read by an ``nn.Embedding`` (analytic kernels) and within its range."""
    readers = id_readers(graph)
    if not readers:
        if empirical:
            return
        raise InputTypeError(
            f"x1 has dtype {x1.dtype} (token ids?), but the model does not read them with an "
            f"nn.Embedding as its first module: pass floating-point inputs (x1.float()), or embed "
            f"the ids first.")
    n = readers[0]
    for name, x in (("x1", x1), ("x2", x2)):
        if x is not None and x.numel() and (int(x.min()) < 0
                                            or int(x.max()) >= n.module.num_embeddings):
            raise InputError(
                f"{name} holds token ids from {int(x.min())} to {int(x.max())}, outside the range "
                f"[0, {n.module.num_embeddings}) of {n.where}; map them into the vocabulary "
                f"(e.g. an unknown-token id).")
