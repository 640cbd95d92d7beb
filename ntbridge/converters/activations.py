"""Converters of elementwise activations (closed-form kernels where they exist, quadrature
otherwise) and of Softmax/LogSoftmax (exact forward, no kernel rule).

Each JAX twin below is exactly the function the torch module computes, with its parameters.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from torch import nn

from .. import stax
from ..stax.piecewise import Piece, Pieces
from ..stax.quadrature import Corrected
from ..errors import UnsupportedLayerError
from .registry import Context, register


@register(nn.ReLU)
def _relu(module: nn.ReLU, ctx: Context) -> stax.Layer:
    return stax.Relu()


@register(nn.LeakyReLU)
def _leaky_relu(module: nn.LeakyReLU, ctx: Context) -> stax.Layer:
    return stax.LeakyRelu(module.negative_slope)


@register(nn.RReLU)
def _rrelu(module: nn.RReLU, ctx: Context) -> stax.Layer:
    if module.training:
        raise UnsupportedLayerError(
            "RReLU in training mode draws a random slope per entry and call; call model.eval() "
            "(it is then LeakyReLU with slope (lower + upper) / 2).")
    return stax.LeakyRelu((module.lower + module.upper) / 2)


@register(nn.GELU)
def _gelu(module: nn.GELU, ctx: Context) -> stax.Layer:
    return stax.Gelu(module.approximate)


def _softplus(x, beta: float = 1.0, threshold: float = 20.0):
    """torch's softplus: ``log(1 + exp(beta x)) / beta``, and ``x`` itself where ``beta x > threshold``."""
    bx = beta * x
    smooth = (jnp.maximum(bx, 0.0) + jnp.log1p(jnp.exp(-jnp.abs(bx)))) / beta   # half logaddexp's cost
    return jnp.where(bx > threshold, x, smooth)


def _elu(x, alpha: float):
    return jnp.where(x > 0, x, alpha * jnp.expm1(jnp.minimum(x, 0.0)))


def _celu(x, alpha: float):
    return jnp.where(x > 0, x, alpha * jnp.expm1(jnp.minimum(x, 0.0) / alpha))


def _softshrink(x, lambd: float):
    return jnp.where(x > lambd, x - lambd, jnp.where(x < -lambd, x + lambd, 0.0))


def _hardshrink(x, lambd: float):
    return jnp.where(jnp.abs(x) > lambd, x, 0.0)


def _relu6(x):
    return jnp.clip(x, 0.0, 6.0)


def _threshold(x, threshold: float, value: float):
    return jnp.where(x > threshold, x, value)


def _softplus_twin(beta: float, threshold: float) -> Twin:
    """torch's Softplus returns ``x`` itself above ``threshold / beta``: a jump of
    ``log1p(exp(-threshold)) / beta`` in the function and of ``sigmoid(-threshold)`` in its slope,
    both below ``exp(-threshold)`` relative to the function's scale (``log 2 / beta``, ``1 / 2``).
    Below 1e-8 (threshold > 18.4, as torch's default 20: 2e-9) the jump is below the kernels'
    accuracy and the function counts as smooth; otherwise it is the smooth softplus plus a
    correction above the threshold (``Corrected``)."""
    fn = lambda x: _softplus(x, beta, threshold)
    if math.exp(-threshold) < 1e-8:
        return Twin(fn)
    smooth = lambda x: _softplus(x, beta, math.inf)
    return Twin(fn, corrected=Corrected(smooth, lambda x: -smooth(-x), threshold / beta))  # x - smooth(x)


_X = Piece((0.0, 1.0))
_SELU_ALPHA, _SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946  # jax.nn.selu's


def _exponential_below_zero(scale: float, alpha: float, rate: float) -> Pieces:
    """``scale * x`` above 0, ``scale * alpha * (exp(rate x) - 1)`` below: ELU, CELU, SELU."""
    return Pieces((0.0,), (Piece((-scale * alpha,), scale * alpha, rate), Piece((0.0, scale))))


class Twin(NamedTuple):
    """A torch activation's exact elementwise function in JAX (``fn``) and what its kernel rule
    needs: its ``pieces`` (closed-form inner expectation, ``stax.piecewise``), or its smooth part
    and a correction above a threshold (``corrected``, ``stax.quadrature``), or else its ``kinks``
    (kink-aware quadrature; none: the smooth rule), see ``stax.Numerical``."""
    fn: Callable[[jax.Array], jax.Array]
    kinks: tuple[float, ...] = ()
    pieces: Pieces | None = None
    corrected: Corrected | None = None


# torch module type -> (module -> its Twin)
TWINS = {
    nn.Tanh: lambda m: Twin(jnp.tanh),
    nn.Sigmoid: lambda m: Twin(jax.nn.sigmoid),
    nn.SiLU: lambda m: Twin(jax.nn.silu),
    nn.ELU: lambda m: Twin(partial(_elu, alpha=m.alpha), pieces=_exponential_below_zero(1.0, m.alpha, 1.0)),
    nn.CELU: lambda m: Twin(partial(_celu, alpha=m.alpha),
                            pieces=_exponential_below_zero(1.0, m.alpha, 1 / m.alpha)),
    nn.SELU: lambda m: Twin(jax.nn.selu, pieces=_exponential_below_zero(_SELU_SCALE, _SELU_ALPHA, 1.0)),
    nn.Softplus: lambda m: _softplus_twin(m.beta, m.threshold),
    nn.Mish: lambda m: Twin(lambda x: x * jnp.tanh(_softplus(x))),  # torch's threshold 20: smooth (see _softplus_twin)
    nn.Hardtanh: lambda m: Twin(partial(jnp.clip, min=m.min_val, max=m.max_val), pieces=Pieces(
        (m.min_val, m.max_val), (Piece((m.min_val,)), _X, Piece((m.max_val,))))),
    nn.Hardswish: lambda m: Twin(lambda x: x * _relu6(x + 3.0) / 6.0, pieces=Pieces(
        (-3.0, 3.0), (Piece(), Piece((0.0, 0.5, 1 / 6)), _X))),
    nn.Hardsigmoid: lambda m: Twin(lambda x: _relu6(x + 3.0) / 6.0, pieces=Pieces(
        (-3.0, 3.0), (Piece(), Piece((0.5, 1 / 6)), Piece((1.0,))))),
    nn.LogSigmoid: lambda m: Twin(jax.nn.log_sigmoid),
    nn.Softsign: lambda m: Twin(lambda x: x / (1.0 + jnp.abs(x)), (0.0,)),
    nn.Tanhshrink: lambda m: Twin(lambda x: x - jnp.tanh(x)),
    nn.Softshrink: lambda m: Twin(partial(_softshrink, lambd=m.lambd),
                                  pieces=Pieces((-m.lambd, m.lambd), (Piece((m.lambd, 1.0)), Piece(),
                                                                      Piece((-m.lambd, 1.0))))),
    nn.Hardshrink: lambda m: Twin(partial(_hardshrink, lambd=m.lambd),
                                  pieces=Pieces((-m.lambd, m.lambd), (_X, Piece(), _X))),
    nn.Threshold: lambda m: Twin(partial(_threshold, threshold=m.threshold, value=m.value),
                                 pieces=Pieces((m.threshold,), (Piece((m.value,)), _X))),
}


def twin(module: nn.Module) -> Twin:
    """The :class:`Twin` of a module of a type in ``TWINS`` (or a subclass: ReLU6 is a Hardtanh)."""
    return next(TWINS[cls] for cls in type(module).__mro__ if cls in TWINS)(module)


def _numerical(module: nn.Module, ctx: Context) -> stax.Layer:
    fn, kinks, pieces, corrected = twin(module)
    return stax.Numerical(fn, type(module).__name__, kinks, pieces, corrected)


for _type in TWINS:
    register(_type)(_numerical)


def _refused(name: str):
    def kernel_fn(k):
        raise UnsupportedLayerError(
            f"{name} mixes the output units of each example, which has no infinite-width kernel "
            f"rule here; use ntbridge.empirical_ntk or ntbridge.monte_carlo for this model.")
    return kernel_fn


def _explicit_dim(module: nn.Module) -> None:
    if module.dim is None:
        raise UnsupportedLayerError(f"{type(module).__name__}(dim=None) picks its axis from the "
                                    f"input's rank (deprecated in torch); pass dim=-1 explicitly.")


@register(nn.Softmax)
def _softmax(module: nn.Softmax, ctx: Context) -> stax.Layer:
    _explicit_dim(module)
    dim = module.dim  # the value, not the module: the layer's description holds it
    return stax.Layer(lambda key, shape: (tuple(shape), {}),
                      lambda params, x: jax.nn.softmax(x, axis=dim), _refused("Softmax"))


@register(nn.LogSoftmax)
def _log_softmax(module: nn.LogSoftmax, ctx: Context) -> stax.Layer:
    _explicit_dim(module)
    dim = module.dim
    return stax.Layer(lambda key, shape: (tuple(shape), {}),
                      lambda params, x: jax.nn.log_softmax(x, axis=dim), _refused("LogSoftmax"))
