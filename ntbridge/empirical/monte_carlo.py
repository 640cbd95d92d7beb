"""Kernels estimated by averaging empirical kernels over random initialisations.

Sample ``s`` draws parameters with ``graph.init_fn(fold_in(key(seed), s), ...)`` (the init in use:
torch's for ``init="torch"``) and evaluates the empirical NTK or NNGP; the running mean and sum of
squared deviations are accumulated with Welford's update inside one program (:func:`sample_task`),
so any layer with an exact forward works, closed form or not (MaxPool, BatchNorm in eval mode...).
The NTK differentiates the drawn parameters, not the buffers (BatchNorm's running statistics, as
a fresh module holds them).
:func:`running` merges the moments of successive ranges of samples into the estimates a user asks
for, whichever way each range was drawn.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..errors import InputError, InputTypeError
from ..results import Estimate
from ..specs import MonteCarlo
from ..tiling import Task
from .axes import Axes
from .choose import empirical_ntk_fn
from .model import Initialisable
from .nngp import empirical_nngp_fn
from .tasks import trainable


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


def sample_counts(n_samples: int | Sequence[int]) -> list[int]:
    """``n_samples`` (an int, or an increasing sequence of ints) as the list of counts at which
    estimates are reported."""
    counts = [n_samples] if isinstance(n_samples, int) and not isinstance(n_samples, bool) else n_samples
    try:
        counts = [int(c) for c in counts]
    except (TypeError, ValueError):
        raise InputTypeError(f"n_samples must be an int or a list of ints, got {n_samples!r}.") from None
    if not counts or counts[0] < 1 or any(b <= a for a, b in zip(counts, counts[1:])):
        raise InputError(f"n_samples must be >= 1 (a list: increasing), got {n_samples!r}.")
    return counts


def running(counts: list[int],
            draw: Callable[[int, int], Iterable[Moments]]) -> Iterator[Estimate]:
    """The :class:`~ntbridge.results.Estimate` at each of ``counts``, ``draw(start, stop)`` giving
    the moments of the samples ``start <= s < stop`` in parts (merged in order).

    Example:
        >>> draw = lambda a, b: [Moments(b - a, torch.full((2, 2), 1.), torch.zeros(2, 2))]
        >>> [e.n_samples for e in running([1, 4], draw)]
        [1, 4]
    """
    moments, done = None, 0
    for count in counts:
        for part in draw(done, count):
            moments = part if moments is None else moments.merge(part)
        done = count
        # the running mean feeds the next merge: a yielded estimate is the caller's own copy
        yield Estimate(moments.mean.clone(), moments.standard_error, count)


def sample_task(spec: MonteCarlo, graph: Initialisable, x1: jax.ShapeDtypeStruct,
                x2: jax.ShapeDtypeStruct | None, platform: str) -> tuple[Task, None]:
    """The moments ``(mean, m2)`` of the samples ``spec.start <= s < spec.start + spec.count``, as
    a task for :func:`ntbridge.tiling.compute` (the first sample is its argument: other ranges of
    the same length reuse the program)."""
    axes = Axes.of(len(graph.output_shape(x1.shape)), spec.trace_axes, spec.diagonal_axes)
    ntk, nngp = empirical_ntk_fn(graph.apply_fn), empirical_nngp_fn(graph.apply_fn)

    def kernel(drawn, x1, x2):  # the NTK differentiates the parameters only, not the buffers
        if spec.get == "nngp":
            return nngp(drawn, x1, x2, trace_axes=axes.trace, diagonal_axes=axes.diagonal)
        params, state = trainable(graph, drawn)
        return ntk(params, x1, x2, trace_axes=axes.trace, diagonal_axes=axes.diagonal, state=state)

    def fn(first, x1, x2):
        def step(carry, s):
            n, mean, m2 = carry
            _, params = graph.init_fn(jax.random.fold_in(jax.random.key(spec.seed), s), x1.shape)
            k = kernel(params, x1, x2)
            delta = k - mean
            mean = mean + delta / (n + 1)
            return (n + 1, mean, m2 + delta * (k - mean)), None

        shape = jax.eval_shape(lambda: kernel(graph.init_fn(jax.random.key(0), x1.shape)[1], x1, x2))
        zeros = jnp.zeros(shape.shape, shape.dtype)
        (_, mean, m2), _ = jax.lax.scan(step, (0, zeros, zeros), first + jnp.arange(spec.count))
        return mean, m2

    return Task(("monte_carlo", graph.signature, spec.get, spec.seed, spec.count, axes), fn,
                axes.swap_perm, np.int32(spec.start), kernels=2), None
