"""Empirical kernels as tasks of the request pipeline (:func:`ntbridge.tiling.compute`).

Each builder takes its spec (:mod:`ntbridge.specs`), the model's graph (:mod:`.model`), the
inputs' shapes and dtypes and their platform, and returns ``(Task, info)``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..errors import InputError, InputTypeError
from ..specs import EmpiricalNNGP, EmpiricalNTK
from ..tiling import Task
from .axes import Axes
from .choose import Dispatch, StrategyInfo
from .model import ModelGraph
from .nngp import outputs_product


def trainable(graph: ModelGraph, arrays: dict | None = None) -> tuple[dict, dict]:
    """``(params, state)``: the arrays (default: the graph's own ``params``; e.g. a fresh draw of
    them) that are torch parameters, and the others (buffers)."""
    names, arrays = graph.parameter_names, graph.params if arrays is None else arrays
    return ({k: v for k, v in arrays.items() if k in names},
            {k: v for k, v in arrays.items() if k not in names})


def ntk_task(spec: EmpiricalNTK, graph: ModelGraph, x1: jax.ShapeDtypeStruct,
             x2: jax.ShapeDtypeStruct | None, platform: str) -> tuple[Task, StrategyInfo]:
    """The empirical NTK of ``graph`` at its parameters, for inputs like x1 and x2."""
    params, state = trainable(graph)
    if not params:
        raise InputError("the model has no parameters, so its empirical NTK is undefined; "
                         "use ntbridge.empirical_nngp, or the analytic ntbridge.ntk.")
    model_dtype = {p.dtype for p in params.values()}
    if jnp.issubdtype(x1.dtype, jnp.floating) and model_dtype != {x1.dtype}:  # else token ids
        raise InputTypeError(f"the model's parameters are {model_dtype.pop()} but x1 is "
                             f"torch.{x1.dtype}; convert one to the other, e.g. model.to(torch.{x1.dtype}).")
    run, info, axes, computation = Dispatch(graph, spec.implementation, spec.interact).plan(
        params, x1, x2, trace_axes=spec.trace_axes, diagonal_axes=spec.diagonal_axes,
        by_layer=spec.by_layer, state=state, out_ndim=len(graph.output_shape(x1.shape)),
        platform=platform)
    return Task(("empirical_ntk", *computation), run, axes.swap_perm, (params, state)), info


def nngp_task(spec: EmpiricalNNGP, graph: ModelGraph, x1: jax.ShapeDtypeStruct,
              x2: jax.ShapeDtypeStruct | None, platform: str) -> tuple[Task, None]:
    """The outputs' products of ``graph`` at its parameters, for inputs like x1 and x2."""
    axes = Axes.of(len(graph.output_shape(x1.shape)), spec.trace_axes, spec.diagonal_axes)
    nngp = outputs_product(graph.apply_fn, spec.interact)
    return Task(("empirical_nngp", graph.signature, axes, spec.interact),
                lambda params, a1, a2: nngp(params, a1, a2, axes), axes.swap_perm,
                graph.params), None
