"""The operations on converted tensors of the analytic walk over an exported graph
(:mod:`.analytic`): each becomes the node of the module computing it (the model's own
``nn.Linear``, ``nn.Embedding`` or ``nn.LayerNorm``, found from their parameters; an activation's
module; a residual sum; positions added; a token selected or the tokens' mean), or a value the next
operations read (a projection not yet converted, the rows of a parameter, an alias).

Each handler is ``fn(walk, node, args, kwargs) -> value`` (:data:`HANDLERS`, by the ATen
operation's name), ``args`` holding the values of :mod:`.values`.
"""

from __future__ import annotations

import torch
from torch import nn

from ...errors import UnsupportedLayerError
from ...stax import INPUT
from ..combinators import Add
from ..indexing import Index, Reduce
from ..positions import AddPositions
from ..trace.independence import correlated
from .translator import _where
from .values import Const, Param, Proj, Rows, Seq, dims

ALIASES = {"contiguous", "clone", "alias", "detach", "dropout", "lift_fresh_copy", "detach_",
           "_to_copy", "to"}
_VIEWS = {"view", "reshape", "_unsafe_view", "flatten", "unflatten", "expand"}
_ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "silu": nn.SiLU,
                "elu": nn.ELU, "softplus": nn.Softplus, "mish": nn.Mish}


def _linear(walk, node, args, kwargs):
    x, weight, bias = (args[1], args[2], args[0]) if node.target.__name__.startswith("addmm") \
        else (args[0], args[1], args[2] if len(args) > 2 else kwargs.get("bias"))
    if not (isinstance(weight, Param) and isinstance(x, Seq)):
        raise UnsupportedLayerError(f"{_where(node)}: a product of tensors computed by the model "
                                    f"has no kernel rule here.")
    addmm = node.target.__name__.startswith("addmm")
    return Proj(x.index, weight, bias, addmm, 0, (weight.tensor.shape[1] if addmm else
                                                   weight.tensor.shape[0]), node)


def _alias(walk, node, args, kwargs):
    if isinstance(args[0], Seq):
        if node.target.__name__.startswith("dropout") and len(args) > 2 and args[2]:
            raise UnsupportedLayerError(f"{_where(node)} drops units in training mode; call "
                                        f"model.eval().")
        return args[0]
    if isinstance(args[0], (Rows, Param)) and node.target.__name__.startswith("to"):
        return args[0]  # to the dtype and device it has
    raise UnsupportedLayerError(f"{_where(node)}: {node.target} of a parameter has no kernel rule.")


def _view(walk, node, args, kwargs):
    before, after = dims(node.args[0]), dims(node)
    if isinstance(args[0], Seq) and before and after and before[-1] == after[-1] and (
            len(before) > 1 and len(after) > 1):
        return args[0]  # (N, T, d) <-> (N * T, d): the same tokens
    raise UnsupportedLayerError(f"{_where(node)}: a reshape from {before} to {after}; only "
                                f"those keeping the features (the last axis) have a rule here.")


def _embedding(walk, node, args, kwargs):
    weight, ids = args[0], args[1]
    name, module = walk.owner(weight)
    if isinstance(ids, Seq) and ids.index == INPUT and isinstance(module, nn.Embedding):
        return walk.add(name, module, (INPUT,), node)
    if isinstance(ids, Const):
        return Rows(weight, torch.as_tensor(ids.value))
    raise UnsupportedLayerError(f"{_where(node)}: an embedding of computed ids has no rule.")


def _add(walk, node, args, kwargs):
    a, b = args[:2]
    if isinstance(a, (Rows, Param)):
        a, b = b, a
    if isinstance(a, Seq) and isinstance(b, Seq) and kwargs.get("alpha", 1) == 1:
        inputs = (a.index, b.index)
        return walk.add("", Add(correlated(walk.nodes, inputs)), inputs, node)
    if isinstance(a, Seq) and isinstance(b, (Rows, Param)):
        return _positions(walk, node, a, b)
    raise UnsupportedLayerError(f"{_where(node)}: a sum of a sequence with "
                                f"{type(b).__name__.lower()} values has no kernel rule here.")


def _positions(walk, node, x: Seq, b) -> Seq:
    """``x + P[ids]`` for ids ``arange(T)`` (any batch of them), or ``x + P``."""
    param = b.param if isinstance(b, Rows) else b
    name, module = walk.owner(param)
    attr = param.name.rpartition(".")[2]
    t = dims(node)[-2]
    if isinstance(b, Rows):
        rows = b.ids.reshape(-1, b.ids.shape[-1])
        if not (rows == torch.arange(t)).all():
            raise UnsupportedLayerError(
                f"{_where(node)} adds the rows {b.ids.flatten()[:8].tolist()}... of "
                f"'{param.name}' to the tokens; only positions 0, 1, ..., T-1 have a rule here.")
    init_std = 1.0 if isinstance(module, nn.Embedding) else None
    return walk.add(name, AddPositions(attr, param.tensor, prefix=True, init_std=init_std),
                    (x.index,), node)


def _layer_norm(walk, node, args, kwargs):
    weight = args[2] if len(args) > 2 else kwargs.get("weight")
    if not isinstance(weight, Param):
        return walk.add("", nn.LayerNorm(args[1], args[4] if len(args) > 4 else 1e-5,
                                         elementwise_affine=False), (args[0].index,), node)
    name, module = walk.owner(weight)
    return walk.add(name, module, (args[0].index,), node)


def _activation(walk, node, args, kwargs):
    name = node.target.overloadpacket.__name__.rstrip("_")
    if name == "gelu":
        module = nn.GELU(kwargs.get("approximate", args[1] if len(args) > 1 else "none"))
    else:
        module = _ACTIVATIONS[name]()
    return walk.add("", module, (args[0].index,), node)


def _select(walk, node, args, kwargs):
    x, dim, i = args[:3]
    if not isinstance(x, Seq) or dim != 1:
        raise UnsupportedLayerError(f"{_where(node)}: only a token of sequences, x[:, i], is "
                                    f"selected here.")
    return walk.add("", Index((slice(None), i)), (x.index,), node)


def _slice(walk, node, args, kwargs):
    if dims(node) == dims(node.args[0]):
        return args[0]
    raise UnsupportedLayerError(f"{_where(node)}: slicing a sequence has no kernel rule here.")


def _mean(walk, node, args, kwargs):
    dim = tuple(args[1]) if isinstance(args[1], (list, tuple)) else (args[1],)
    keep = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    return walk.add("", Reduce(dim, keep), (args[0].index,), node)


HANDLERS = {"linear": _linear, "addmm": _linear, "embedding": _embedding, "add": _add,
            "layer_norm": _layer_norm, "gelu": _activation, "select": _select, "slice": _slice,
            "mean": _mean, **{n: _alias for n in ALIASES}, **{n: _view for n in _VIEWS},
            **{n: _activation for n in _ACTIVATIONS}}
