"""Choosing and compiling a strategy: ``empirical_ntk_fn``, and ``auto``'s cost model (XLA's cost
analysis of each candidate's lowered program, a roofline per platform)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Hashable

import jax

from .. import programs
from ..devices import platform_of
from ..errors import InputError
from ..options import IMPLEMENTATIONS, STRATEGIES
from .axes import Axes
from .jacobian import jacobian_strategy
from .ntvp import ntvp_strategy
from .structured import structured_plan, structured_strategy

_NTVP_CHUNK_BYTES = 2 ** 28  # memory for the VJPs (parameter-sized vectors) held at once
# Roofline of the time estimate of "auto": (flops per second, bytes per second), per platform.
_ROOFLINE = {"cpu": (1e11, 2e10), "gpu": (3e13, 3e12), "tpu": (1e14, 1e12)}
_STRATEGY_FNS = {"jacobian": jacobian_strategy, "ntvp": ntvp_strategy,
                 "structured": structured_strategy}


@dataclasses.dataclass(frozen=True)
class StrategyInfo:
    """The strategy that computed a kernel, and why.

    Attributes:
      implementation: ``"jacobian"``, ``"ntvp"`` or ``"structured"``; ``"torch.func"`` for a
        first call that ``"auto"`` ran torch-side (:mod:`.payback`).
      costs: per candidate, XLA's cost analysis of its lowered program: ``flops``,
        ``bytes_accessed`` and ``estimated_s`` (the roofline ``max(flops / F, bytes / B)`` of the
        platform); where ``"auto"`` weighed the compile, ``"torch.func"`` and ``"compile"`` with
        their ``estimated_s``.
      reason: why this one, in words.
      path: how the model's function was obtained: ``"layers"`` (the layer registry,
        ``ntbridge.convert``) or ``"torch.export"`` (the translated graph of a model without a
        converter), ``"apply_fn"`` (a bare JAX function given to ``empirical_ntk_fn``), or
        ``"torch"`` (the torch model itself, ``torch.func``).

    Example:
        >>> k, info = ntbridge.empirical_ntk(model, x1, x2, return_info=True)  # the README's
        >>> info
        StrategyInfo(implementation='structured', path='layers', reason="lowest estimated time on cpu from XLA's cost analysis (structured 1.13 ms, ntvp 6.05 ms, jacobian 11.8 ms)")
    """

    implementation: str
    costs: dict[str, dict[str, float]]
    reason: str
    path: str = "layers"

    def __repr__(self) -> str:
        """The choice, the path and the reason; the candidates' costs are ``info.costs``."""
        return (f"StrategyInfo(implementation={self.implementation!r}, path={self.path!r}, "
                f"reason={self.reason!r})")


def _analysis(stage: jax.stages.Lowered | jax.stages.Compiled) -> dict:
    analysis = stage.cost_analysis()
    return (analysis[0] if isinstance(analysis, (list, tuple)) else analysis) or {}


def _cost(program: Callable, args: tuple, platform: str) -> dict[str, float]:
    """XLA's cost analysis of ``program`` lowered (not compiled) for ``args``, and its roofline
    time on ``platform``.

    PJRT plug-ins (e.g. CUDA's) analyse compiled programs only: there the program is lowered for
    abstract copies of ``args`` on the CPU, whose client analyses the same operations (nothing
    runs); without a CPU backend, the candidate is compiled.
    """
    lowered = program.lower(*args)
    analysis = _analysis(lowered)
    if "flops" not in analysis:
        try:
            cpu = jax.sharding.SingleDeviceSharding(jax.local_devices(backend="cpu")[0])
            on_cpu = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=cpu),
                                  args)
            analysis = _analysis(program.lower(*on_cpu))
        except RuntimeError:  # no CPU backend (JAX_PLATFORMS excludes it)
            analysis = _analysis(lowered.compile())
    flops = float(analysis.get("flops", math.nan))
    nbytes = float(analysis.get("bytes accessed", math.nan))
    peak_flops, bandwidth = _ROOFLINE.get(platform, _ROOFLINE["gpu"])
    return {"flops": flops, "bytes_accessed": nbytes,
            "estimated_s": max(flops / peak_flops, nbytes / bandwidth)}


class _Model:
    """A bare ``apply_fn`` seen as a model without layers."""

    def __init__(self, apply_fn):
        self.apply_fn = apply_fn


class WithState:
    """A model whose ``apply_fn`` takes the differentiated params only, the fixed ``state`` (e.g.
    buffers, a dict) merged in; ``lookup`` holds both, for the layers' own functions."""

    def __init__(self, model, state):
        self.layers = getattr(model, "layers", None)
        self.state = state or {}
        self.apply_fn = (model.apply_fn if not state else
                         lambda p, x: model.apply_fn({**p, **self.state}, x))


def as_model(model):
    if hasattr(model, "apply_fn"):
        return model
    if callable(model):
        return _Model(model)
    raise InputError(f"expected an apply_fn(params, x) or an ntbridge.Graph, got {model!r}.")


def _identity(model) -> Any:
    """What fixes a model's function, for cache keys: a Graph's signature, else its apply_fn."""
    return getattr(model, "signature", None) or model.apply_fn


class Dispatch:
    """``fn(params, x1, x2=None, *, trace_axes, diagonal_axes, by_layer, return_info)``: compiles
    the requested strategy (or auto's choice) once per shape signature."""

    def __init__(self, model, implementation: str, interact: bool):
        if implementation not in IMPLEMENTATIONS:
            raise InputError(f"implementation must be one of {IMPLEMENTATIONS}, "
                             f"got {implementation!r}.")
        self.model, self.implementation, self.interact = model, implementation, interact

    def candidates(self) -> tuple[list[str], str]:
        """The strategies that apply to this model, and why the others do not."""
        if self.interact:
            return ["jacobian"], "the examples interact (e.g. BatchNorm using batch statistics), " \
                                 "so only the whole-batch Jacobian applies"
        if getattr(self.model, "layers", None) is None:
            return ["jacobian", "ntvp"], "a bare apply_fn has no layer structure"
        if not structured_plan(self.model)[1]:
            return ["jacobian", "ntvp"], "no layer declares a derivative structure"
        return list(STRATEGIES), ""

    def program(self, strategy: str, axes: Axes, by_layer: bool, chunk=None) -> Callable:
        """``run((params, state), x1, x2)``: the strategy as a traceable function."""
        def run(args, x1, x2):
            params, state = args
            kw = {"chunk": chunk} if strategy == "ntvp" else {}
            kw = {"interact": True} if self.interact else kw
            return _STRATEGY_FNS[strategy](WithState(self.model, state), params, x1, x2, axes,
                                           by_layer, **kw)
        return run

    def choose(self, params, state, x1, x2, axes: Axes, by_layer: bool, platform: str):
        valid, why_not = self.candidates()
        wanted = valid if self.implementation == "auto" else [self.implementation]
        if wanted[0] not in valid:
            raise InputError(f"implementation={self.implementation!r} does not apply here: "
                             f"{why_not}; use one of {valid} or 'auto'.")
        if self.implementation != "auto":  # nothing to compare
            best, costs, reason = self.implementation, {}, "requested"
        else:
            costs = {s: _cost(jax.jit(self.program(s, axes, by_layer)), ((params, state), x1, x2),
                              platform) for s in wanted}
            ranked = sorted(wanted, key=lambda s: (math.isnan(costs[s]["estimated_s"]),
                                                   costs[s]["estimated_s"]))
            best = ranked[0]
            estimates = ", ".join(f"{s} {costs[s]['estimated_s'] * 1e3:.3g} ms" for s in ranked)
            reason = (f"lowest estimated time on {platform} from XLA's cost analysis "
                      f"({estimates})" + (f"; {why_not}" if why_not else ""))
        chunk = None
        if best == "ntvp":  # bound the memory of the VJPs held at once (same flops, same kernel)
            leaf_bytes = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(params))
            chunk = max(1, _NTVP_CHUNK_BYTES // max(leaf_bytes, 1))
            units = math.prod(jax.eval_shape(WithState(self.model, state).apply_fn, params,
                                             x1).shape[1:])
            chunk = chunk if chunk < (x1 if x2 is None else x2).shape[0] * units else None
        info = StrategyInfo(best, costs, reason, getattr(self.model, "path", "apply_fn"))
        return self.program(best, axes, by_layer, chunk), info, chunk

    def plan(self, params, x1, x2=None, *, trace_axes=(-1,), diagonal_axes=(),
             by_layer: bool = False, state=None, out_ndim: int | None = None,
             platform: str | None = None) -> tuple[Callable, StrategyInfo, Axes, Hashable]:
        """``(run, info, axes, computation)`` for these shapes: ``run((params, state), x1, x2)``
        is the chosen strategy as a traceable function, and ``computation`` what fixes it (for
        program keys); ``x1`` and ``x2`` may be arrays or ``jax.ShapeDtypeStruct``s. The choice is
        made once per shape signature (:mod:`ntbridge.programs`)."""
        if out_ndim is None:
            out_ndim = len(jax.eval_shape(WithState(self.model, state).apply_fn, params, x1).shape)
        axes = Axes.of(out_ndim, trace_axes, diagonal_axes)
        platform = platform or platform_of(x1)
        computation = (_identity(self.model), self.implementation, self.interact, axes,
                       bool(by_layer), platform)
        key = programs.ProgramKey.of("strategy", computation, ((params, state), x1, x2))
        run, info, chunk = programs.cached(key, lambda: self.choose(
            params, state, x1, x2, axes, bool(by_layer), platform))
        return run, info, axes, (*computation, info.implementation, chunk)

    def __call__(self, params, x1, x2=None, *, trace_axes=(-1,), diagonal_axes=(),
                 by_layer: bool = False, return_info: bool = False, state=None):
        run, info, axes, computation = self.plan(params, x1, x2, trace_axes=trace_axes,
                                                 diagonal_axes=diagonal_axes, by_layer=by_layer,
                                                 state=state)
        key = programs.ProgramKey.of("empirical_ntk_fn", computation, ((params, state), x1, x2))
        k = programs.cached(key, lambda: jax.jit(run))((params, state), x1, x2)
        k = axes.symmetrized(k, x2)
        return (k, info) if return_info else k


def empirical_ntk_fn(model: Callable[[Any, jax.Array], jax.Array] | Any,
                     implementation: str = "jacobian", *,
                     examples_interact: bool = False) -> Callable:
    """``fn(params, x1, x2=None, *, trace_axes=(-1,), diagonal_axes=(), by_layer=False,
    return_info=False)`` -> the empirical NTK ``sum_p df(x1)/dp df(x2)/dp``.

    Args:
      model: ``apply_fn(params, x)``, or an ``ntbridge.Graph`` (needed by ``"structured"``).
      implementation: one of :data:`IMPLEMENTATIONS` (see the module doc).
      examples_interact: the outputs of an example depend on the others in the batch (see the
        module doc for the kernel's meaning then).

    The kernel has the shape given by the axes rules of the module doc; ``by_layer=True`` gives a
    dict from group name (a Graph's module names; the top-level keys of a params pytree) to its
    contribution, summing to the kernel; ``return_info=True`` gives ``(kernel, StrategyInfo)``.
    Compiled once per shape signature; with ``x2=None`` the result is exactly symmetric.

    Example:
        >>> fn = empirical_ntk_fn(graph, "auto")
        >>> k, info = fn(graph.params, x1, x2, trace_axes=(), return_info=True)  # (N1, N2, O, O)
        >>> info.implementation, info.reason
    """
    return Dispatch(as_model(model), implementation, examples_interact)
