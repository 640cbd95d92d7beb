"""Torch models expanded in their parameters: the linearized network and higher Taylor expansions.

``taylor_expand(model, degree)`` returns an ``nn.Module`` whose forward is

    f(x; p0) + D f(x; p0)[p - p0] + ... + D^k f(x; p0)[p - p0, ..., p - p0] / k!

with ``p0`` the model's parameters when it was called and ``p`` the new module's own parameters
(initialised at ``p0``, so the expansion equals the model until it is trained). The directional
derivatives are forward-mode products (``torch.func.jvp``, nested ``k`` times): no Jacobian is
formed, and a degree-1 forward costs about one extra forward pass of the model. ``linearize(model)``
is degree 1, the network whose gradient-descent training the empirical NTK describes exactly.

Example:
    >>> model = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 1))
    >>> lin = ntbridge.linearize(model)                 # lin(x) == model(x) for now
    >>> opt = torch.optim.SGD(lin.parameters(), lr=0.1)  # trains lin's parameters only
"""

from __future__ import annotations

import copy
import math
from typing import Callable

import torch
from torch import nn
from torch.func import functional_call, jvp
from torch.nn.attention import SDPBackend, sdpa_kernel
from .compat import tree_leaves, tree_map
from .dlpack import check_module
from .errors import InputError, InputTypeError, UnsupportedLayerError

__all__ = ["TaylorExpansion", "linearize", "taylor_expand"]


def _tree(named: dict[str, torch.Tensor], parameters: bool) -> nn.Module:
    """Empty modules nested as the dotted names say, holding ``named`` as parameters (trainable
    copies) or buffers, so that ``tree.get_parameter("0.weight")`` works as on the model."""
    root = nn.Module()
    for name, tensor in named.items():
        *path, leaf = name.split(".")
        module = root
        for part in path:
            if not hasattr(module, part):
                module.add_module(part, nn.Module())
            module = getattr(module, part)
        if parameters:
            module.register_parameter(leaf, nn.Parameter(tensor.clone()))
        else:
            module.register_buffer(leaf, tensor.clone())
    return root


def _directional_derivatives(fn: Callable[[dict], torch.Tensor], tangent: dict,
                             order: int) -> Callable[[dict], tuple[torch.Tensor, ...]]:
    """``p -> (fn(p), D fn(p)[t], ..., D^order fn(p)[t, ..., t])`` for the tangent ``t``: the
    derivative along ``t`` of the tuple one order lower, by one more forward-mode product."""
    if order == 0:
        return lambda p: (fn(p),)
    lower = _directional_derivatives(fn, tangent, order - 1)

    def derivatives(p: dict) -> tuple[torch.Tensor, ...]:
        values, tangents = jvp(lower, (p,), (tangent,))
        return (*values, tangents[-1])

    return derivatives


class TaylorExpansion(nn.Module):
    """The degree-``degree`` Taylor expansion of a model in its parameters (see the module doc).

    Attributes:
      degree: the expansion's order (1: the linearized model).
      params: the trainable parameters, named as the model's (``params.get_parameter("0.weight")``).
      reference: the expansion point ``p0`` and the model's buffers, as buffers (not trained).

    ``train()``/``eval()`` set the mode of the expanded model (dropout, batch statistics). The
    output is the model's: a tensor, or tuples, lists and dicts of tensors, each expanded.
    """

    def __init__(self, model: nn.Module, degree: int):
        super().__init__()
        named = dict(model.named_parameters())
        # the structure only: every tensor is substituted at each call, so the copy shares the
        # model's storage instead of duplicating it, and later changes to the model do not leak in
        memo = {id(t): t for t in [*named.values(), *model.buffers()]}
        object.__setattr__(self, "_function", copy.deepcopy(model, memo))
        self.degree = degree
        self.params = _tree({n: p.detach() for n, p in named.items()}, parameters=True)
        self.reference = _tree({**{n: p.detach() for n, p in named.items()},
                                **{n: b.detach() for n, b in model.named_buffers()}},
                               parameters=False)
        self._names = tuple(named)
        self._buffer_names = tuple(n for n, _ in model.named_buffers())

    def train(self, mode: bool = True) -> TaylorExpansion:
        self._function.train(mode)
        return super().train(mode)

    def forward(self, *args, **kwargs):
        """The expansion at ``args`` (the model's own arguments), differentiable in ``params``."""
        point = {n: self.reference.get_buffer(n) for n in self._names}
        buffers = {n: self.reference.get_buffer(n) for n in self._buffer_names}
        step = {n: self.params.get_parameter(n) - point[n] for n in self._names}

        def fn(p: dict):
            out = functional_call(self._function, {**p, **buffers}, args, kwargs)
            others = [type(o).__name__ for o in tree_leaves(out)
                      if not isinstance(o, torch.Tensor)]
            if others:
                raise InputTypeError(f"taylor_expand needs a model returning tensors (or tuples, "
                                     f"lists and dicts of them); {type(self._function).__name__} "
                                     f"returned {', '.join(others)} too: return those from "
                                     f"another function.")
            return out

        try:  # torch's math attention has forward-mode derivatives, its fused kernels do not
            with sdpa_kernel(SDPBackend.MATH):
                terms = _directional_derivatives(fn, step, self.degree)(point)
        except NotImplementedError as e:
            if "forward AD" not in str(e):
                raise
            raise UnsupportedLayerError(
                f"the expansion needs forward-mode derivatives, and torch has none for an "
                f"operation of {type(self._function).__name__} ({e}). A module's fused inference "
                f"path may be the cause (nn.MultiheadAttention and nn.TransformerEncoderLayer in "
                f"eval mode): expand the model in train mode with dropout 0 "
                f"(expansion.train()).") from None
        return tree_map(
            lambda *term: sum(t / math.factorial(j) for j, t in enumerate(term)), *terms)

    def extra_repr(self) -> str:
        return f"degree={self.degree}, model={type(self._function).__name__}"


def taylor_expand(model: nn.Module, degree: int) -> TaylorExpansion:
    """The expansion of ``model`` to order ``degree`` in its parameters, around their current
    values, as a trainable module (``model`` is left untouched).

    Args:
      model: any torch model whose forward returns tensors (one, or tuples, lists and dicts of
        them) and whose operations have forward-mode derivatives, as ``torch.func.jvp`` needs.
      degree: the order, >= 1 (the cost grows about as ``2**degree`` forward passes).

    Returns:
      A :class:`TaylorExpansion`; its output has the model's structure and shapes, e.g. ``(N, O)``
      for inputs ``(N, *input)``. It is ``torch.compile``-able (``fullgraph=True`` included).

    Example:
        >>> quad = ntbridge.taylor_expand(model, 2)
        >>> torch.allclose(quad(x), model(x))   # at the expansion point
        True
    """
    check_module(model)
    if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
        raise InputError(f"degree must be an int >= 1, got {degree!r}; degree=1 is linearize.")
    if not any(True for _ in model.parameters()):
        raise InputError(f"model ({type(model).__name__}) has no parameters to expand in.")
    return TaylorExpansion(model, degree)


def linearize(model: nn.Module) -> TaylorExpansion:
    """``f(x; p0) + J(x; p0) (p - p0)``: the first-order expansion of ``model`` in its parameters
    (see :func:`taylor_expand`). Trained by gradient descent on the MSE, its outputs follow the
    closed form of ``ntbridge.predict.gradient_descent_mse`` on the model's empirical NTK.

    Example:
        >>> lin = ntbridge.linearize(model)
        >>> lin(x).shape == model(x).shape
        True
    """
    return taylor_expand(model, 1)
