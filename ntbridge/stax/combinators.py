"""Combinators that build networks from layers, in the style of ``jax.example_libraries.stax``."""

from __future__ import annotations

import jax

from .layers import Layer


def serial(*layers: Layer) -> Layer:
    """The layers applied one after the other; params are a tuple, one entry per layer.

    Example:
        >>> net = serial(Dense(3, 16, W_std=1.0, b_std=0.1), Relu(), Dense(16, 1, W_std=1.0, b_std=0.1))
    """

    def init_fn(key, input_shape):
        params = []
        for layer, k in zip(layers, jax.random.split(key, max(len(layers), 1))):
            input_shape, p = layer.init_fn(k, input_shape)
            params.append(p)
        return input_shape, tuple(params)

    def apply_fn(params, x):
        for layer, p in zip(layers, params):
            x = layer.apply_fn(p, x)
        return x

    def kernel_fn(k):
        for layer in layers:
            k = layer.kernel_fn(k)
        return k

    return Layer(init_fn, apply_fn, kernel_fn, any(layer.full_spatial for layer in layers))
