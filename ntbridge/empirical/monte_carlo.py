"""Kernels estimated by averaging empirical kernels over random initialisations.

Sample ``s`` draws parameters with ``graph.init_fn(fold_in(key(seed), s), ...)`` (the init in use:
torch's for ``init="torch"``) and evaluates the empirical NTK or NNGP; the running mean and sum of
squared deviations are accumulated with Welford's update, so any layer with an exact forward works,
closed form or not (MaxPool, BatchNorm in eval mode, ...).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..converters.graph import Graph
from ..tiling import Task
from .axes import Axes
from .choose import empirical_ntk_fn
from .nngp import empirical_nngp_fn


class Moments(NamedTuple):
    """Running moments of ``count`` samples: their mean and sum of squared deviations (tensors)."""

    count: int
    mean: torch.Tensor
    m2: torch.Tensor

    def merge(self, other: "Moments") -> "Moments":
        """The moments of both sample sets together (Chan et al.'s parallel update)."""
        n = self.count + other.count
        delta = other.mean - self.mean
        return Moments(n, self.mean + delta * (other.count / n),
                       self.m2 + other.m2 + delta ** 2 * (self.count * other.count / n))

    @property
    def standard_error(self) -> torch.Tensor:
        """Standard error of the mean, ``sqrt(m2 / (count - 1) / count)`` (0 for one sample)."""
        if self.count < 2:
            return torch.zeros_like(self.mean)
        return torch.sqrt(self.m2 / ((self.count - 1) * self.count))


def sample_task(graph: Graph, x1: jax.ShapeDtypeStruct, get: str, seed: int, start: int,
                count: int, trace_axes: tuple, diagonal_axes: tuple) -> tuple[Task, None]:
    """The moments ``(mean, m2)`` of the samples ``start <= s < start + count``, as a task for
    :func:`ntbridge.tiling.compute` (the first sample is its argument: other ranges of the same length
    reuse the program)."""
    axes = Axes.of(len(graph.output_shape(x1.shape)), trace_axes, diagonal_axes)
    empirical = (empirical_ntk_fn if get == "ntk" else empirical_nngp_fn)(graph.apply_fn)
    kernel = lambda params, x1, x2: empirical(params, x1, x2, trace_axes=axes.trace,
                                              diagonal_axes=axes.diagonal)

    def fn(first, x1, x2):
        def step(carry, s):
            n, mean, m2 = carry
            _, params = graph.init_fn(jax.random.fold_in(jax.random.key(seed), s), x1.shape)
            k = kernel(params, x1, x2)
            delta = k - mean
            mean = mean + delta / (n + 1)
            return (n + 1, mean, m2 + delta * (k - mean)), None

        shape = jax.eval_shape(lambda: kernel(graph.init_fn(jax.random.key(0), x1.shape)[1], x1, x2))
        zeros = jnp.zeros(shape.shape, shape.dtype)
        (_, mean, m2), _ = jax.lax.scan(step, (0, zeros, zeros), first + jnp.arange(count))
        return mean, m2

    return Task(("monte_carlo", graph.signature, get, seed, count, axes), fn, axes.swap_perm,
                np.int32(start)), None
