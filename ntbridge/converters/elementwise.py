"""Elementwise functions that have no module (``torch.exp``, ``torch.sin``, ``x ** 2``...), traced
by fx, and chains of them, converted as one nonlinearity of the tensor the chain starts from.

A kernel rule needs a Gaussian input, and in ``torch.exp(-h ** 2)`` only the first function gets
one: ``exp`` is applied to ``-h ** 2``. So :mod:`.trace` folds a chain of elementwise calls from one
tensor into one :class:`Elementwise` module (here ``f(x) = exp(-x^2)`` applied to the Gaussian
``h``). A chain starts with a function of :data:`FUNCTIONS` or a positive integer power, and goes
on through those and arithmetic with constant numbers (``-x``, ``2 * x``, ``x + 1``, ``x / 3``).
Its kernel is in closed form for one function that has one (exp, sin, cos, erf, abs, sign), and
computed numerically otherwise (the smooth rule, with nodes reaching as far as growing functions
need; abs and sign, allowed first in a chain, by the polar rule of a kink at 0).

Example:
    >>> class Rbf(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.fc = nn.Linear(8, 512)
    ...     def forward(self, x):
    ...         return torch.exp(-self.fc(x) ** 2)   # one module: Elementwise(pow 2, neg, exp)
    >>> k = ntbridge.nngp(Rbf(), torch.randn(4, 8))
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import torch
from torch import fx, nn

from .. import stax
from ..errors import UnsupportedLayerError
from ..stax.quadrature import SMOOTH, smooth_rule
from .registry import Context, register


@dataclass(frozen=True)
class Step:
    """One elementwise function, in torch and in JAX; ``closed`` builds its stax layer where its
    rule is in closed form; ``kink``: not smooth at 0; ``starts``: may start a chain (a product
    with a constant outside a chain stays a linear ``Scale``)."""

    name: str
    torch_fn: Callable[[torch.Tensor], torch.Tensor]
    jax_fn: Callable[[jax.Array], jax.Array]
    closed: Callable[[], stax.Layer] | None = None
    kink: bool = False
    starts: bool = True


STEPS = {
    "exp": Step("exp", torch.exp, jnp.exp, stax.Exp),
    "sin": Step("sin", torch.sin, jnp.sin, stax.Sin),
    "cos": Step("cos", torch.cos, jnp.cos, stax.Cos),
    "erf": Step("erf", torch.erf, jax.scipy.special.erf, stax.Erf),
    "abs": Step("abs", torch.abs, jnp.abs, stax.Abs, kink=True),
    "sign": Step("sign", torch.sign, jnp.sign, stax.Sign, kink=True),
    "square": Step("square", torch.square, jnp.square),
    "neg": Step("neg", torch.neg, jnp.negative, starts=False),
}
# torch functions and Tensor method names of each step
FUNCTIONS = {torch.exp: "exp", torch.sin: "sin", torch.cos: "cos", torch.erf: "erf",
             torch.special.erf: "erf", torch.abs: "abs", torch.sign: "sign",
             torch.square: "square", operator.neg: "neg", torch.neg: "neg"}
METHODS = {name: name for name in STEPS}
# Nodes of the smooth rule (per dtype: count, half-width in standard deviations): powers and
# exponentials grow, so their integrands reach further out than bounded activations' do.
GROWING = {**SMOOTH, jnp.dtype(jnp.float32): SMOOTH[jnp.dtype(jnp.float64)]}
POWERS = (operator.pow, torch.pow, "pow")
PRODUCTS, QUOTIENTS = (operator.mul, torch.mul, "mul"), (operator.truediv, torch.div, "div")
SUMS, DIFFERENCES = (operator.add, torch.add, "add"), (operator.sub, torch.sub, "sub")


def _power(k) -> Step:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise UnsupportedLayerError(f"x ** {k!r}: only positive integer powers have a kernel rule "
                                    f"here; use ntbridge.empirical_ntk or ntbridge.monte_carlo.")
    return Step(f"pow {k}", lambda x: x ** k, lambda x: x ** k)


def _with_constant(target, c, first: bool) -> Step | None:
    """``x op c`` (``first``: x is the first argument) or ``c op x`` for a number ``c``."""
    if not isinstance(c, (int, float)) or isinstance(c, bool):
        return None
    if target in PRODUCTS or (first and target in QUOTIENTS):
        c = c if target in PRODUCTS else 1 / c
        return Step(f"* {c!r}", lambda t: t * c, lambda t: t * c, starts=False)
    if target in SUMS or (first and target in DIFFERENCES):
        c = c if target in SUMS else -c
        return Step(f"+ {c!r}", lambda t: t + c, lambda t: t + c)
    if target in DIFFERENCES:
        return Step(f"{c!r} -", lambda t: c - t, lambda t: c - t)
    return None


def step_of(node: fx.Node, chains: dict) -> tuple[fx.Node, Step] | None:
    """``(tensor, step)`` where fx node ``node`` applies an elementwise ``step`` to one tensor
    and either starts a chain or extends one (its tensor is in ``chains``); None otherwise."""
    if node.op not in ("call_function", "call_method") or node.kwargs:
        return None
    target, args = node.target, node.args
    tensors = [a for a in args if isinstance(a, fx.Node)]
    if len(tensors) != 1 or len(args) > 2:
        return None
    x = tensors[0]
    if len(args) == 1:
        name = FUNCTIONS.get(target) if node.op == "call_function" else METHODS.get(target)
        step = STEPS[name] if name else None
    elif args[0] is x and target in POWERS:
        step = _power(args[1])
    else:
        step = _with_constant(target, args[1] if args[0] is x else args[0], args[0] is x)
    return (x, step) if step is not None and (step.starts or x in chains) else None


class Elementwise(nn.Module):
    """The chain of elementwise ``steps``, applied in order (e.g. ``pow 2``, ``neg``, ``exp``)."""

    def __init__(self, steps: tuple[Step, ...]):
        super().__init__()
        self.steps = steps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for step in self.steps:
            x = step.torch_fn(x)
        return x

    def extra_repr(self) -> str:
        return ", ".join(step.name for step in self.steps)


@register(Elementwise)
def _elementwise(module: Elementwise, ctx: Context) -> stax.Layer:
    steps = module.steps
    if len(steps) == 1 and steps[0].closed is not None:
        return steps[0].closed()
    if any(step.kink for step in steps[1:]):
        raise UnsupportedLayerError(
            f"the chain {module.extra_repr()} applies abs or sign after another function, which "
            f"puts kinks where the kernel rule cannot find them; apply abs or sign first, or use "
            f"ntbridge.empirical_ntk or ntbridge.monte_carlo.")

    def fn(x):
        for step in steps:
            x = step.jax_fn(x)
        return x

    name = module.extra_repr()
    if steps[0].kink:
        return stax.Numerical(fn, name, kinks=(0.0,))
    return stax.elementwise(fn, smooth_rule(fn, GROWING), name)
