"""Sequences in torch's time-major layout, ``(T, N, d)``, inside a traced ``forward``.

Models written for ``batch_first=False`` attention transpose their batch-first input and back::

    h = self.emb(ids).transpose(0, 1)        # (T, N, d)
    h = self.encoder(h)                      # nn.TransformerEncoder(batch_first=False layers)
    return self.head(h.mean(0))              # (N, d)

ntbridge's kernels keep the batch first, so such a stretch is converted batch-first: the
transposes become identities, the attention modules run as with ``batch_first=True``, the layers
acting on each token's features (Linear, LayerNorm of the last axis, Dropout, activations,
elementwise functions, sums) are unchanged, and the reductions and indexing of time-major tensors
move from axis 0 to axis 1 (:func:`batch_first_form`). Anything else on a time-major tensor is
refused by name.
"""

from __future__ import annotations

import torch
from torch import fx, nn

from ...errors import UnsupportedLayerError
from ..combinators import Add, Scale
from ..elementwise import Elementwise
from ..indexing import Index, Reduce
from ..products import Multiply
from .calls import ATTENTION_MODULES
from .equivalents import as_sizes

_NOT_PER_TOKEN = (nn.Softmax, nn.LogSoftmax, nn.Softmin, nn.Softmax2d, nn.PReLU,
                  nn.MultiheadAttention)


def swapped(node: fx.Node) -> fx.Node | None:
    """The tensor ``node`` swaps the first two axes of (``x.transpose(0, 1)``, ``x.permute(1, 0,
    2)``, ``torch.transpose(x, 0, 1)``, ``swapaxes``/``swapdims``), or None."""
    args = list(node.args) + list(node.kwargs.values())
    if node.op == "call_method" and node.target in ("transpose", "swapaxes", "swapdims"):
        return args[0] if sorted(args[1:]) == [0, 1] else None
    if node.op == "call_method" and node.target == "permute":
        return args[0] if as_sizes(args[1:]) == (1, 0, 2) else None
    if node.op == "call_function" and node.target in (torch.transpose, torch.swapaxes):
        return args[0] if sorted(args[1:]) == [0, 1] else None
    return None


def _per_token(module: nn.Module) -> bool:
    if isinstance(module, (nn.Linear, nn.Dropout, Add, Scale, Multiply, Elementwise)):
        return True
    if isinstance(module, nn.LayerNorm):
        return len(module.normalized_shape) == 1
    return (type(module).__module__ == "torch.nn.modules.activation"
            and not isinstance(module, _NOT_PER_TOKEN))


def _axis(d: int) -> int:
    """Axis ``d`` of a ``(T, N, d)`` tensor as an axis of its ``(N, T, d)`` form."""
    return {0: 1, 1: 0, -3: -2, -2: -3}.get(d, d)


def batch_first_form(module: nn.Module, where: str) -> tuple[nn.Module, bool]:
    """The module computing, on the batch-first form of a time-major input, the batch-first form
    of ``module``'s output, and whether that output is still time-major (its token axis kept)."""
    if isinstance(module, ATTENTION_MODULES) or _per_token(module):
        return module, True
    if isinstance(module, Reduce):
        dims = tuple(_axis(d) for d in module.dims)
        return Reduce(dims, module.keepdim, module.mean), module.keepdim or not {1, -2} & set(dims)
    if isinstance(module, Index) and Ellipsis not in module.key and len(module.key) <= 3:
        key = tuple(module.key) + (slice(None),) * (2 - len(module.key))
        return Index((key[1], key[0], *key[2:])), isinstance(key[0], slice)
    raise UnsupportedLayerError(
        f"{where} acts on a time-major sequence (T, N, d) (after x.transpose(0, 1), for "
        f"batch_first=False attention); only attention, layers of each token's features, "
        f"x.mean(0)/x.sum(0), x[i] and the transpose back are supported there. Build the model "
        f"with batch_first=True, or transpose back first.")
