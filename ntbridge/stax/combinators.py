"""Combinators that build networks from layers, in the style of ``jax.example_libraries.stax``."""

from __future__ import annotations

from typing import Callable, Sequence

import jax

from .layers import Layer

INPUT = -1  # in ``dag``, the index that stands for the network's input


def _run(fns: Sequence[Callable], inputs: Sequence[tuple[int, ...]], x):
    """Evaluate ``fns[i]`` on the values of ``inputs[i]`` (one value, or a tuple if several)."""
    values = {INPUT: x}
    for i, (fn, sources) in enumerate(zip(fns, inputs)):
        args = tuple(values[j] for j in sources)
        values[i] = fn(args[0] if len(args) == 1 else args)
    return values[len(fns) - 1]


def dag(layers: Sequence[Layer], inputs: Sequence[tuple[int, ...]]) -> Layer:
    """A directed acyclic graph of layers; params are a tuple, one entry per layer.

    ``inputs[i]`` lists the layers whose outputs feed layer ``i`` (``INPUT`` for the network's
    input), all earlier than ``i``; a layer with several inputs (e.g. a residual sum) receives a
    tuple. The last layer's output is the network's output.

    Example:
        >>> residual = dag([Dense(8, 8, W_std=1., b_std=0.), Relu(), FanInSum()], [(INPUT,), (0,), (1, INPUT)])
    """
    layers, inputs = tuple(layers), tuple(tuple(i) for i in inputs)

    def init_fn(key, input_shape):
        keys = iter(jax.random.split(key, max(len(layers), 1)))
        params = []

        def init(layer):
            def fn(shape):
                shape, p = layer.init_fn(next(keys), shape)
                params.append(p)
                return shape
            return fn

        return _run([init(layer) for layer in layers], inputs, input_shape), tuple(params)

    def apply_fn(params, x):
        return _run([lambda v, l=layer, p=p: l.apply_fn(p, v) for layer, p in zip(layers, params)],
                    inputs, x)

    def kernel_fn(k):
        return _run([layer.kernel_fn for layer in layers], inputs, k)

    return Layer(init_fn, apply_fn, kernel_fn, any(layer.full_spatial for layer in layers))


def serial(*layers: Layer) -> Layer:
    """The layers applied one after the other; params are a tuple, one entry per layer.

    Example:
        >>> net = serial(Dense(3, 16, W_std=1.0, b_std=0.1), Relu(), Dense(16, 1, W_std=1.0, b_std=0.1))
    """
    return dag(layers, [(i - 1,) for i in range(len(layers))])
