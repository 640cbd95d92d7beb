"""What the empirical kernels need of a model's graph, as protocols: met by a converted
:class:`ntbridge.Graph` (the layer registry) and by a
:class:`~ntbridge.converters.Translation` (``torch.export``) alike.

Example:
    >>> isinstance(ntbridge.convert(model), Initialisable)
    True
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, Protocol, runtime_checkable

import jax
import torch


@runtime_checkable
class ModelGraph(Protocol):
    """A model's forward pass and parameters, as the empirical kernels read them.

    Attributes:
      path: how the graph was obtained, ``"layers"`` or ``"torch.export"`` (for ``StrategyInfo``).
      params: JAX arrays of the parameters and buffers, by qualified name.
      parameter_names: the names in ``params`` that are torch parameters (what kernels
        differentiate); the others are buffers.
      tensors: the torch parameters and buffers ``params`` were read from, by name.
      signature: a hashable description of what fixes ``apply_fn`` (for program keys).
      layers: the steps declaring derivative structure (for the ``"structured"`` strategy).
      apply_fn: ``apply_fn(params, x) -> f(x)``, ``(N, *input) -> (N, *output)``.
    """

    path: str
    params: dict[str, jax.Array]
    parameter_names: frozenset[str]
    tensors: dict[str, torch.Tensor]
    signature: Hashable
    layers: tuple
    apply_fn: Callable[[Any, jax.Array], jax.Array]

    def output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The output shape for inputs of ``input_shape``."""


@runtime_checkable
class Initialisable(ModelGraph, Protocol):
    """A model graph that draws fresh parameters (Monte-Carlo estimates need it)."""

    def init_fn(self, key: jax.Array, input_shape: tuple[int, ...]) -> tuple[tuple, dict]:
        """``(output_shape, params)`` from the init distribution in use."""
