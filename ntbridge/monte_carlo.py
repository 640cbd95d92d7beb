"""Kernels estimated by averaging empirical kernels over random initialisations (JAX level).

Sample ``s`` draws parameters with ``graph.init_fn(fold_in(key(seed), s), ...)`` (the init in use:
torch's for ``init="torch"``) and evaluates the empirical NTK or NNGP; the running mean and sum of
squared deviations are accumulated with Welford's update, so any layer with an exact forward works,
closed form or not (MaxPool, BatchNorm in eval mode, ...).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from .converters import Graph
from .empirical import empirical_nngp_fn, empirical_ntk_fn


class Moments(NamedTuple):
    """Running moments of ``count`` samples: their mean and sum of squared deviations."""

    count: int
    mean: jax.Array
    m2: jax.Array

    def merge(self, other: "Moments") -> "Moments":
        """The moments of both sample sets together (Chan et al.'s parallel update)."""
        n = self.count + other.count
        delta = other.mean - self.mean
        return Moments(n, self.mean + delta * (other.count / n),
                       self.m2 + other.m2 + delta ** 2 * (self.count * other.count / n))

    @property
    def standard_error(self) -> jax.Array:
        """Standard error of the mean, ``sqrt(m2 / (count - 1) / count)`` (0 for one sample)."""
        if self.count < 2:
            return jnp.zeros_like(self.mean)
        return jnp.sqrt(self.m2 / ((self.count - 1) * self.count))


def sample_range_fn(graph: Graph, get: str, seed: int, start: int, stop: int, trace_axes: tuple,
                    diagonal_axes: tuple) -> Callable:
    """``fn(None, x1, x2_or_None) -> (mean, m2)`` over the samples ``start <= s < stop``.

    A batch-independent kernel function, so it can be tiled like any other.
    """
    empirical = (empirical_ntk_fn if get == "ntk" else empirical_nngp_fn)(graph.apply_fn)

    def fn(args, x1, x2):
        def step(carry, s):
            count, mean, m2 = carry
            _, params = graph.init_fn(jax.random.fold_in(jax.random.key(seed), s), x1.shape)
            k = empirical(params, x1, x2, trace_axes=trace_axes, diagonal_axes=diagonal_axes)
            delta = k - mean
            mean = mean + delta / (count + 1)
            return (count + 1, mean, m2 + delta * (k - mean)), None

        shape = jax.eval_shape(lambda: empirical(
            graph.init_fn(jax.random.key(0), x1.shape)[1], x1, x2, trace_axes=trace_axes,
            diagonal_axes=diagonal_axes))
        zeros = jnp.zeros(shape.shape, shape.dtype)
        (_, mean, m2), _ = jax.lax.scan(step, (0, zeros, zeros), jnp.arange(start, stop))
        return mean, m2

    return jax.jit(fn)
