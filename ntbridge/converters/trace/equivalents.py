"""Functional calls in a traced ``forward`` as the module instances computing them
(:func:`equivalent`): ``F.gelu(x, approximate=a)`` -> ``nn.GELU(a)`` as every activation's
functional and method forms (:mod:`..functional`), ``x.view(x.size(0), -1)`` -> ``nn.Flatten()``,
``F.interpolate`` -> ``nn.Upsample``, ``x.transpose(1, 2)`` -> :class:`~..structure.SwapLast`,
``+`` -> :class:`~..combinators.Add`, ``torch.cat`` -> :class:`~..combinators.Concat`, products and
quotients by constants -> :class:`~..combinators.Scale`, the product of two tensors ->
:class:`~..products.Multiply`, indexing, reductions and stacks -> :mod:`..indexing`'s, ``h @ M`` ->
:mod:`.adjacency`'s."""

from __future__ import annotations

import operator
from typing import Callable

import torch
import torch.nn.functional as F
from torch import fx, nn

from ...errors import UnsupportedLayerError
from .. import indexing
from ..combinators import Add, Concat, Scale
from ..functional import FUNCTIONS, METHOD_FORMS, module_of
from ..products import Multiply
from ..structure import SwapLast
from . import adjacency


def _flatten(x, start_dim=0, end_dim=-1) -> nn.Module:
    if start_dim == 0:
        raise UnsupportedLayerError("flattening from axis 0 mixes the examples of the batch; "
                                    "flatten from axis 1: torch.flatten(x, 1).")
    return nn.Flatten(start_dim, end_dim)


def as_sizes(args: tuple) -> tuple:
    """Sizes or dims given as torch takes them, ``x.view(a, b)`` or ``x.view((a, b))``: a tuple.

    Example:
        >>> as_sizes((2, 3)), as_sizes(([2, 3],))
        ((2, 3), (2, 3))
    """
    return tuple(args[0]) if len(args) == 1 and isinstance(args[0], (tuple, list)) else tuple(args)


def _transpose(x, dim0, dim1) -> nn.Module:
    if {dim0, dim1} not in ({1, 2}, {-1, -2}):
        raise UnsupportedLayerError(
            f"transpose({dim0}, {dim1}): only transpose(1, 2) of (N, C, L) <-> (N, L, C) "
            f"(positions <-> tokens) and transpose(0, 1) of sequences (time-major) are supported.")
    return SwapLast()


def _permute(x, *dims) -> nn.Module:
    dims = as_sizes(dims)
    n = len(dims)
    dims = tuple(d % n for d in dims)
    to_last, back = (0, *range(2, n), 1), (0, n - 1, *range(1, n - 1))
    if n < 3 or dims not in (to_last, back):
        raise UnsupportedLayerError(f"permute{dims}: only permute(0, 2, 1) of (N, C, L) <-> "
                                    f"(N, L, C), the channels of (N, C, *S) moved last "
                                    f"(permute(0, 2, 3, 1)) or back (permute(0, 3, 1, 2)), and "
                                    f"permute(1, 0, 2) of sequences are supported.")
    return SwapLast(None if n == 3 else dims == to_last)


def _attribute(x, name) -> nn.Module:
    """``x.mT`` of ``(N, C, L)``: ``x.transpose(1, 2)``."""
    if name in ("x", "edge_index", "edge_weight", "batch"):
        raise UnsupportedLayerError(f"x.{name}: a PyTorch Geometric model's forward takes the "
                                    f"Data's tensors, forward(x, edge_index, ...), not the Data.")
    if name != "mT":
        raise UnsupportedLayerError(f"x.{name}: of a tensor's attributes only x.mT (x.transpose(1, "
                                    f"2) of (N, C, L) <-> (N, L, C)) is supported.")
    return SwapLast()


def is_shape(a) -> bool:
    """Whether fx node ``a`` computes a shape or size (an int), or reads a tensor's device or
    dtype (``torch.arange(T, device=ids.device)``): no tensor."""
    if not isinstance(a, fx.Node):
        return False
    return ((a.op == "call_method" and a.target == "size")
            or (a.op == "call_function" and a.target is getattr
                and a.args[1] in ("shape", "device", "dtype"))
            or (a.op == "call_function" and a.target is operator.getitem and is_shape(a.args[0])))


def is_batch_size(a) -> bool:
    """Whether fx node ``a`` is ``t.size(0)``, ``t.shape[0]`` or ``t.size()[0]``."""
    if not isinstance(a, fx.Node):
        return False
    if a.op == "call_method" and a.target == "size":
        return (a.args[1:] or (a.kwargs.get("dim"),)) == (0,)
    return a.target is operator.getitem and is_shape(a.args[0]) and a.args[1] == 0


def _view(x, *shape) -> nn.Module:
    shape = as_sizes(shape)
    if len(shape) == 2 and is_batch_size(shape[0]) and shape[1] == -1:
        return nn.Flatten()
    raise UnsupportedLayerError(
        "only reshapes that flatten each example are supported: x.view(x.size(0), -1), "
        "x.reshape(x.shape[0], -1), x.flatten(1) or torch.flatten(x, 1).")


def _avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None) -> nn.Module:
    return nn.AvgPool2d(kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override)


def _interpolate(x, size=None, scale_factor=None, mode="nearest", align_corners=None,
                 recompute_scale_factor=None, antialias=False) -> nn.Module:
    """``F.interpolate`` as the ``nn.Upsample`` it equals (the deprecated ``F.upsample``,
    ``F.upsample_nearest`` and ``F.upsample_bilinear`` call it: fx records it)."""
    if antialias:
        raise UnsupportedLayerError(
            f"antialias=True (mode={mode!r}) has no kernel rule in ntbridge, nor a translation "
            f"for its empirical kernels; with antialias=False every mode's kernel is exact.")
    return nn.Upsample(size, scale_factor, mode, align_corners, recompute_scale_factor)


def _scale(x, c, divide: bool = False) -> nn.Module:
    if isinstance(x, fx.Node) and isinstance(c, fx.Node):
        if divide:
            raise UnsupportedLayerError("the quotient of two tensors has no kernel rule; only "
                                        "division by a constant number is supported.")
        return Multiply()
    c = c if isinstance(x, fx.Node) else x
    if not isinstance(c, (int, float)) or isinstance(c, bool):
        what = f"a constant tensor of shape {tuple(c.shape)}" if isinstance(c, torch.Tensor) else repr(c)
        raise UnsupportedLayerError(f"multiplication by {what}: only constant numbers (or another "
                                    f"tensor computed by the model) are supported.")
    return Scale(1 / c if divide else float(c))


def _add(x, y, *, alpha=1) -> nn.Module:
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        raise UnsupportedLayerError(
            "adds a fixed tensor of the model (a buffer, e.g. a sinusoidal positional encoding) to "
            "features: the kernel rules take features of mean zero, which such a sum is not. Use a "
            "learned positional embedding (an nn.Parameter, or an nn.Embedding of "
            "torch.arange(T)), or ntbridge.empirical_ntk for this model.")
    if not (isinstance(x, fx.Node) and isinstance(y, fx.Node)) or alpha != 1:
        raise UnsupportedLayerError("only sums of two tensors (x + y, torch.add(x, y)) are "
                                    "supported, not the addition of constants or alpha != 1.")
    return Add()


UNARY: dict = {
    F.avg_pool2d: _avg_pool2d,
    F.adaptive_avg_pool2d: lambda x, output_size: nn.AdaptiveAvgPool2d(output_size),
    torch.flatten: _flatten,
    F.interpolate: _interpolate,  # F.upsample* trace to it
    F.pixel_shuffle: lambda x, upscale_factor: nn.PixelShuffle(upscale_factor),
    F.pixel_unshuffle: lambda x, downscale_factor: nn.PixelUnshuffle(downscale_factor),
    operator.mul: _scale, torch.mul: _scale,
    operator.truediv: lambda x, c: _scale(x, c, divide=True),
    torch.transpose: _transpose, torch.swapaxes: _transpose, torch.swapdims: _transpose,
    torch.permute: _permute, getattr: _attribute,
}
BINARY: dict = {operator.add: _add, torch.add: _add}
METHODS: dict = {
    "transpose": _transpose, "swapaxes": _transpose, "swapdims": _transpose, "permute": _permute,
    "flatten": _flatten, "view": _view, "reshape": _view,
    "div": lambda x, c: _scale(x, c, divide=True),
}
BINARY_METHODS: dict = {"add": _add, "mul": _scale}
OTHER_FUNCTIONS = {**indexing.FUNCTIONS, **adjacency.FUNCTIONS}  # -> (module, input nodes)
OTHER_METHODS = {**indexing.METHODS, **adjacency.METHODS}

CONCATS = (torch.cat, torch.concat, torch.concatenate)


def _concat(tensors, dim=0, *, axis=None) -> nn.Module:
    """``torch.cat``; of one tensor (a DenseNet layer's first input list), that tensor."""
    return Concat(dim if axis is None else axis) if len(tensors) > 1 else nn.Identity()


def equivalent(node: fx.Node, constants: dict | None = None) -> tuple[nn.Module, list]:
    """The module instance computing fx node ``node``, and the fx nodes it takes as inputs;
    ``constants``: the values of the nodes computed from the model's buffers alone."""
    constants = constants or {}
    args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda a: constants.get(a, a))
    other = (OTHER_FUNCTIONS if node.op == "call_function" else OTHER_METHODS).get(node.target)
    if other is not None:
        return other(*args, **kwargs)
    if ((node.op == "call_function" and node.target in FUNCTIONS)
            or (node.op == "call_method" and node.target in METHOD_FORMS)):
        module, x = module_of(node.target, args, kwargs)
        return module, [x]
    if node.op == "call_method" and node.target in BINARY_METHODS:
        module = BINARY_METHODS[node.target](*args, **kwargs)
        return module, [a for a in args if isinstance(a, fx.Node)]
    if node.op == "call_method" and node.target in METHODS:
        return METHODS[node.target](*args, **kwargs), [args[0]]
    if node.op == "call_function" and node.target in BINARY:
        return BINARY[node.target](*args, **kwargs), list(args)
    if node.op == "call_function" and node.target in CONCATS:
        return _concat(*args, **kwargs), list(args[0])
    if node.op == "call_function" and node.target in UNARY:
        module = UNARY[node.target](*args, **kwargs)
        return module, [a for a in args if isinstance(a, fx.Node)]
    what = getattr(node.target, "__name__", node.target)
    functions = (*UNARY, *BINARY, *CONCATS, *FUNCTIONS, *OTHER_FUNCTIONS)
    raise UnsupportedLayerError(
        f"{node.op} '{what}' has no equivalent module here. Supported: the registered modules, "
        f"{sorted({getattr(f, '__name__', f) for f in functions})} and the tensor methods "
        f"{sorted({*METHODS, *METHOD_FORMS, *BINARY_METHODS, *OTHER_METHODS})}. Use a module, "
        f"or register a converter for "
        f"a module wrapping this computation (ntbridge.register_converter).")


def located(fn: Callable, where: str) -> Callable:
    """``fn`` whose errors (unsupported arguments) name the call ``where``."""
    def located(*args):
        try:
            return fn(*args)
        except UnsupportedLayerError as e:
            raise UnsupportedLayerError(f"{where}: {e}") from None
        except TypeError as e:  # arguments the equivalent module does not take
            raise UnsupportedLayerError(f"{where}: unsupported arguments ({e}).") from None
    return located
