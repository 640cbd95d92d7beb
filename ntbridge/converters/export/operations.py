"""The operations on converted tensors of the analytic walk over an exported graph
(:mod:`.analytic`): each becomes the node of the module computing it (the model's own
``nn.Linear``, ``nn.Embedding`` or ``nn.LayerNorm``, found from their parameters; an activation's
module; a residual sum; a product of branches; positions added; a token selected or the tokens'
mean), or a value the next operations read (a projection not yet converted, the rows of a parameter, an alias).

Each handler is ``fn(walk, node, args, kwargs) -> value`` (:data:`HANDLERS`, by the ATen
operation's name), ``args`` holding the values of :mod:`.values`.
"""

from __future__ import annotations

import torch
from torch import nn

from ...errors import UnsupportedLayerError
from ...stax import INPUT
from ..combinators import Add, Concat
from ..indexing import Index, Reduce
from ..positions import AddPositions, AddRow, LearnedToken
from ..structure import SwapLast
from ..products import Multiply
from ..reuse import TIED_EMBEDDINGS
from ..trace.independence import correlated, dependent
from .translator import _where
from .values import Const, Param, Proj, Rows, Seq, dims

ALIASES = {"contiguous", "clone", "alias", "detach", "dropout", "lift_fresh_copy", "detach_",
           "_to_copy", "to"}
_VIEWS = {"view", "reshape", "_unsafe_view", "unflatten"}
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
    if isinstance(ids, Seq) and ids.index == INPUT:  # the weight is another module's too
        embedding = next(((n, m) for n, m in walk.model.named_modules(remove_duplicate=False)
                          if isinstance(m, nn.Embedding) and m.weight is weight.tensor), None)
        if embedding is not None and walk.options.shared_weights == "independent":
            return walk.add(*embedding, (INPUT,), node)
        untie = ("pass shared_weights='independent' or untie them (Hugging Face: "
                 "tie_word_embeddings=False)" if embedding else "give the ids an nn.Embedding")
        raise UnsupportedLayerError(
            f"{_where(node)} embeds the ids with the weight of {name!r} "
            f"({type(module).__name__}): one parameter at two places. {TIED_EMBEDDINGS} For the "
            f"kernel of independent input and output embeddings {untie}; or use "
            f"ntbridge.empirical_ntk, whose kernel is the model's own.")
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
    init_std = 1.0 if isinstance(module, nn.Embedding) else None
    if isinstance(b, Rows):
        rows = b.ids.reshape(-1, b.ids.shape[-1])
        if (rows == rows.flatten()[0]).all():
            row = AddRow(attr, param.tensor, int(rows.flatten()[0]), init_std=init_std)
            return walk.add(name, row, (x.index,), node)
        if not (rows == torch.arange(t)).all():
            raise UnsupportedLayerError(
                f"{_where(node)} adds the rows {b.ids.flatten()[:8].tolist()}... of "
                f"'{param.name}' to the tokens; only positions 0, 1, ..., T-1 and one row for "
                f"every token have a rule here.")
    return walk.add(name, AddPositions(attr, param.tensor, prefix=True, init_std=init_std),
                    (x.index,), node)


def _layer_norm(walk, node, args, kwargs):
    weight = args[2] if len(args) > 2 else kwargs.get("weight")
    if not isinstance(weight, Param):
        norm = nn.LayerNorm(args[1], args[4] if len(args) > 4 else 1e-5, elementwise_affine=False)
        return walk.add("", norm, (walk.seq(args[0], node),), node)
    name, module = walk.owner(weight)
    return walk.add(name, module, (walk.seq(args[0], node),), node)


def _activation(walk, node, args, kwargs):
    name = node.target.overloadpacket.__name__.rstrip("_")
    if name == "gelu":
        module = nn.GELU(kwargs.get("approximate", args[1] if len(args) > 1 else "none"))
    else:
        module = _ACTIVATIONS[name]()
    return walk.add("", module, (walk.seq(args[0], node),), node)


def _mul(walk, node, args, kwargs):
    a, b = args[:2]
    if isinstance(a, Seq) and isinstance(b, Seq):
        inputs = (a.index, b.index)
        return walk.add("", Multiply(dependent(walk.nodes, inputs)), inputs, node)
    raise UnsupportedLayerError(f"{_where(node)}: a product of a sequence with "
                                f"{type(b if isinstance(a, Seq) else a).__name__.lower()} values "
                                f"has no kernel rule here (products of branches, such as "
                                f"F.silu(gate(x)) * up(x), and of numbers have).")


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
    return walk.add("", Reduce(dim, keep), (walk.seq(args[0], node),), node)


def _conv(walk, node, args, kwargs):
    name, module = walk.owner(args[1])
    if not isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        raise UnsupportedLayerError(f"{_where(node)}: a convolution by a parameter of "
                                    f"{type(module).__name__}, not of a ConvNd module.")
    return walk.add(name, module, (walk.seq(args[0], node),), node)


def _flatten(walk, node, args, kwargs):
    before, after = dims(node.args[0]), dims(node)
    if before[-1] == after[-1]:
        return _view(walk, node, args, kwargs)
    start = args[1] if len(args) > 1 else 0
    end = args[2] if len(args) > 2 else -1
    return walk.add("", nn.Flatten(start, end), (walk.seq(args[0], node),), node)


def _transpose(walk, node, args, kwargs):
    if {a % len(dims(node)) for a in args[1:3]} != {1, 2} or len(dims(node)) != 3:
        raise UnsupportedLayerError(f"{_where(node)}: transpose{tuple(args[1:3])}; only (N, C, L) "
                                    f"<-> (N, L, C), transpose(1, 2), has a rule here.")
    return walk.add("", SwapLast(), (walk.seq(args[0], node),), node)


def _expand(walk, node, args, kwargs):
    if isinstance(args[0], Param) and args[0].tensor.shape[:2] == (1, 1):
        name, _ = walk.owner(args[0])
        attr = args[0].name.rpartition(".")[2]
        return walk.add(name, LearnedToken(attr, args[0].tensor), (INPUT,), node)
    return _view(walk, node, args, kwargs)


def _cat(walk, node, args, kwargs):
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    inputs = tuple(walk.seq(a, node) for a in args[0])
    if len(inputs) == 1:  # torch.cat of one tensor: that tensor
        return Seq(inputs[0])
    return walk.add("", Concat(dim, correlated(walk.nodes, inputs)), inputs, node)


HANDLERS = {"linear": _linear, "addmm": _linear, "embedding": _embedding, "add": _add,
            "layer_norm": _layer_norm, "gelu": _activation, "mul": _mul, "select": _select,
            "slice": _slice, "mean": _mean, **{n: _alias for n in ALIASES},
            **{n: _view for n in _VIEWS},
            "conv1d": _conv, "conv2d": _conv, "conv3d": _conv, "flatten": _flatten,
            "transpose": _transpose, "expand": _expand, "cat": _cat,
            **{n: _activation for n in _ACTIVATIONS}}
