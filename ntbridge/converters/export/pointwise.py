"""Elementwise functions of one tensor written out of ATen arithmetic in an exported graph
(Hugging Face's ``NewGELUActivation``: ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 *
x ** 3)))``), for the analytic walk (:mod:`.analytic`).

The operations on one converted tensor (and numbers) compose into a :class:`Pointwise` value, in
torch and in JAX (:data:`.aten.OPS`). Where another operation reads it, it becomes one node
(:func:`module_of`): the activation module it equals on a grid of points (its closed-form or
exact rule), else an :class:`~..elementwise.Elementwise` function by the smooth numerical rule.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
from torch import fx, nn

from ..elementwise import Elementwise, Step
from .aten import OPS
from .values import Seq

# smooth functions only: the numerical rule finds no kinks (abs, sign, roots are refused)
POINTWISE = {"mul", "add", "sub", "rsub", "div", "pow", "tanh", "exp", "erf", "neg", "sin",
             "cos", "sigmoid", "square"}
# modules a written-out function may equal (checked on a grid, float64): their own rules serve
_KNOWN = (lambda: nn.GELU("tanh"), lambda: nn.GELU(), nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Mish)


@dataclasses.dataclass(frozen=True)
class Pointwise:
    """``fn(x)`` of the converted tensor ``source``, elementwise; ``torch_fn``/``jax_fn``: the
    function in each library; ``name``: the ATen operations it composes; ``node``: the last."""

    source: int
    torch_fn: Callable
    jax_fn: Callable
    name: str
    node: fx.Node


def _lifted(value, source: int):
    """``value`` as ``(torch_fn, jax_fn)`` of the source (a number: a constant function)."""
    if isinstance(value, Pointwise):
        return value.torch_fn, value.jax_fn
    if isinstance(value, Seq):
        return (lambda x: x), (lambda x: x)
    return (lambda x: value), (lambda x: value)


def pointwise(name: str, node: fx.Node, args: tuple, kwargs: dict) -> Pointwise | None:
    """The value of elementwise operation ``name`` on tensors of one source and numbers; None if
    it is not one (two sources: a residual sum, a product of branches)."""
    if name not in POINTWISE or kwargs.get("alpha", 1) != 1:
        return None
    if name == "pow" and not (isinstance(args[1], (int, float)) and float(args[1]).is_integer()
                              and args[1] >= 1):
        return None  # positive integer powers only
    tensors = [a for a in args if isinstance(a, (Seq, Pointwise))]
    numbers = all(isinstance(a, (Seq, Pointwise, int, float)) and not isinstance(a, bool)
                  for a in args)
    sources = {a.index if isinstance(a, Seq) else a.source for a in tensors}
    if len(sources) != 1 or not numbers:
        return None
    (source,) = sources
    if all(isinstance(a, Seq) for a in tensors) and len(tensors) > 1:
        return None  # x + x: a sum of one tensor, converted as such
    lifted, target = [_lifted(a, source) for a in args], node.target
    jax_op = OPS[target.overloadpacket]
    names = "(" + ", ".join(a.name if isinstance(a, Pointwise) else "x" if isinstance(a, Seq)
                            else repr(a) for a in args) + ")"
    return Pointwise(source, lambda x: target(*[t(x) for t, _ in lifted]),
                     lambda x: jax_op(*[j(x) for _, j in lifted]), f"{name}{names}", node)


def module_of(value: Pointwise) -> nn.Module:
    """The module computing ``value``'s function (module doc)."""
    grid = torch.linspace(-6, 6, 1201, dtype=torch.float64)
    with torch.no_grad():
        y = value.torch_fn(grid)
        for make in _KNOWN:
            module = make()
            if torch.allclose(module(grid), y, rtol=1e-9, atol=1e-9):
                return module
    return Elementwise((Step(value.name, value.torch_fn, value.jax_fn),))
