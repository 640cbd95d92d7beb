"""Converters of elementwise activations (closed-form kernels where they exist, quadrature
otherwise) and of Softmax/LogSoftmax (exact forward, no kernel rule).

Each JAX twin below is exactly the function the torch module computes, with its parameters.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from torch import nn

from .. import stax
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
    return jnp.where(bx > threshold, x, jnp.logaddexp(bx, 0.0) / beta)


def _elu(x, alpha: float):
    return jnp.where(x > 0, x, alpha * jnp.expm1(jnp.minimum(x, 0.0)))


def _relu6(x):
    return jnp.clip(x, 0.0, 6.0)


_SCALE = (-2.0, -1.0, 1.0, 2.0)  # where the sigmoid family changes fastest: quadrature breaks


def _threshold(x, threshold: float, value: float):
    return jnp.where(x > threshold, x, value)


# torch module type -> (module -> (its exact elementwise function in JAX, its kinks, more breaks)):
# the kinks are the inputs where the function or its derivative is not smooth (or jumps), the breaks
# where it changes fastest (see stax.quadrature).
TWINS = {
    nn.Tanh: lambda m: (jnp.tanh, (), _SCALE),
    nn.Sigmoid: lambda m: (jax.nn.sigmoid, (), _SCALE),
    nn.SiLU: lambda m: (jax.nn.silu, (), _SCALE),
    nn.ELU: lambda m: (lambda x: _elu(x, m.alpha), (0.0,), _SCALE),
    nn.CELU: lambda m: (lambda x: jnp.where(x > 0, x, m.alpha * jnp.expm1(jnp.minimum(x, 0.0) / m.alpha)),
                        (0.0,), _SCALE),
    nn.SELU: lambda m: (jax.nn.selu, (0.0,), _SCALE),
    # torch returns x itself above threshold / beta: a jump of log1p(exp(-threshold)) / beta
    nn.Softplus: lambda m: (lambda x: _softplus(x, m.beta, m.threshold), (m.threshold / m.beta,),
                            tuple(b / m.beta for b in _SCALE)),
    nn.Mish: lambda m: (lambda x: x * jnp.tanh(_softplus(x)), (20.0,), _SCALE),
    nn.Hardtanh: lambda m: (lambda x: jnp.clip(x, m.min_val, m.max_val), (m.min_val, m.max_val), ()),
    nn.Hardswish: lambda m: (lambda x: x * _relu6(x + 3.0) / 6.0, (-3.0, 3.0), ()),
    nn.Hardsigmoid: lambda m: (lambda x: _relu6(x + 3.0) / 6.0, (-3.0, 3.0), ()),
    nn.LogSigmoid: lambda m: (jax.nn.log_sigmoid, (), _SCALE),
    nn.Softsign: lambda m: (lambda x: x / (1.0 + jnp.abs(x)), (0.0,), _SCALE),
    nn.Tanhshrink: lambda m: (lambda x: x - jnp.tanh(x), (), _SCALE),
    nn.Softshrink: lambda m: (lambda x: jnp.where(x > m.lambd, x - m.lambd,
                                                  jnp.where(x < -m.lambd, x + m.lambd, 0.0)),
                              (-m.lambd, m.lambd), ()),
    nn.Hardshrink: lambda m: (lambda x: jnp.where(jnp.abs(x) > m.lambd, x, 0.0), (-m.lambd, m.lambd), ()),
    nn.Threshold: lambda m: (lambda x: _threshold(x, m.threshold, m.value), (m.threshold,), ()),
}


def _numerical(module: nn.Module, ctx: Context) -> stax.Layer:
    twin = next(TWINS[cls] for cls in type(module).__mro__ if cls in TWINS)  # ReLU6 is a Hardtanh
    fn, kinks, breaks = twin(module)
    return stax.Numerical(fn, type(module).__name__, kinks, breaks)


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
    return stax.Layer(lambda key, shape: (tuple(shape), {}),
                      lambda params, x: jax.nn.softmax(x, axis=module.dim), _refused("Softmax"))


@register(nn.LogSoftmax)
def _log_softmax(module: nn.LogSoftmax, ctx: Context) -> stax.Layer:
    _explicit_dim(module)
    return stax.Layer(lambda key, shape: (tuple(shape), {}),
                      lambda params, x: jax.nn.log_softmax(x, axis=module.dim), _refused("LogSoftmax"))
