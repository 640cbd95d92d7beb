"""Finite-width kernels of a network's current parameters (JAX level).

``f = apply_fn(params, x)`` maps ``(N, *input)`` to ``(N, *out)``. Axis semantics follow Neural
Tangents: ``trace_axes`` (output axes, counted on ``f``'s shape, so ``-1`` is the last) are
averaged over, ``diagonal_axes`` keep only their diagonal, and every other output axis appears
once for x1 and once for x2. The result has shape ``(N1, N2, *kept1, *kept2)`` where ``kept1`` are
the non-traced axes of ``f(x1)`` (diagonal axes included, once) and ``kept2`` the non-traced,
non-diagonal axes of ``f(x2)``:

* ``trace_axes=(-1,)`` (default), ``f`` of shape ``(N, O)``: ``(N1, N2)``, comparable to the
  analytic per-unit kernel.
* ``trace_axes=()``: ``(N1, N2, O, O)``; ``diagonal_axes=(-1,)``: ``(N1, N2, O)``.

Strategies of the empirical NTK (all give the same kernel):

* ``"jacobian"`` (:mod:`.jacobian`): per-example Jacobians, contracted one parameter array at a
  time.
* ``"ntvp"`` (:mod:`.ntvp`): NTK-vector products, the JVP over x1 of each VJP of one x2 output
  unit; Jacobians are never formed whole (the VJPs are taken in chunks of bounded memory).
* ``"structured"`` (:mod:`.structured`): for a layer whose output is an outer product in a parameter (a
  :class:`~ntbridge.stax.Outer` declared by ``Layer.structure``: Linear, Conv), the contribution
  ``sum_{p,q} (g1[p] . g2[q]) (patch1[p] . patch2[q])`` is formed from the cotangents ``g`` at the
  layer's output (one backward pass per output unit, through zero "taps" added to each layer's
  output) and the layer's input patches, without the parameter Jacobian. The backward pass
  through the network's affine last layers (``Layer.affine``: e.g. a last Conv, Flatten, Linear)
  is the same for every example and is taken once; with x2 = None, one side's cotangents and
  per-example factors serve both. Other parameters fall back to Jacobians.
  Needs the network's layers (a ``Graph``), not a bare ``apply_fn``.
* ``"auto"`` (:mod:`.choose`): lowers each candidate (traced, not compiled), estimates its time from XLA's cost
  analysis of that program (a roofline of flops and bytes accessed, for the inputs' platform; on
  GPUs the CPU client analyses the same program), compiles and runs the cheapest only, and
  caches the choice per shape signature; :class:`StrategyInfo` says what was chosen and why.
  Memory is left to the batching planner, which sizes the chosen program's tiles to fit.

Examples are assumed independent (``f(x)[n]`` depends on ``x[n]`` only) unless
``examples_interact=True`` (e.g. BatchNorm using batch statistics): the kernel is then that of the
batch ``X = concat(x1, x2)`` (``X = x1`` when x2 is None), ``J(X)[x1 rows] J(X)[x2 rows]^T``,
computed with the whole-batch Jacobian (the ``"jacobian"`` strategy only), and the empirical NNGP
is ``f(X)[x1 rows] f(X)[x2 rows]``.

Example:
    >>> k = empirical_ntk_fn(graph.apply_fn)(graph.params, x1, x2)   # (N1, N2)
    >>> k, info = empirical_ntk_fn(graph, "auto")(graph.params, x1, x2, return_info=True)
"""


from ..options import IMPLEMENTATIONS, STRATEGIES
from ..specs import int_tuple
from .axes import Axes, contract, normalize_axes
from .choose import StrategyInfo, empirical_ntk_fn
from .model import Initialisable, ModelGraph
from .monte_carlo import Moments, running, sample_counts, sample_task
from .nngp import empirical_nngp_fn
from .tasks import nngp_task, ntk_task

__all__ = ["IMPLEMENTATIONS", "STRATEGIES", "Axes", "Initialisable", "ModelGraph", "Moments",
           "StrategyInfo", "contract", "empirical_nngp_fn", "empirical_ntk_fn", "int_tuple",
           "normalize_axes", "nngp_task", "ntk_task", "running", "sample_counts", "sample_task"]
