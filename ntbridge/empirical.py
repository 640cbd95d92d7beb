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

* ``"jacobian"``: per-example Jacobians, contracted one parameter array at a time.
* ``"ntvp"``: NTK-vector products, the JVP over x1 of each VJP of one x2 output unit; Jacobians
  are never formed whole (the VJPs are taken in chunks of bounded memory).
* ``"structured"``: for a layer whose output is an outer product in a parameter (a
  :class:`~ntbridge.stax.Outer` declared by ``Layer.structure``: Linear, Conv), the contribution
  ``sum_{p,q} (g1[p] . g2[q]) (patch1[p] . patch2[q])`` is formed from the cotangents ``g`` at the
  layer's output (one backward pass per output unit, through zero "taps" added to each layer's
  output) and the layer's input patches, without the parameter Jacobian. The backward pass
  through the network's affine last layers (``Layer.affine``: e.g. a last Conv, Flatten, Linear)
  is the same for every example and is taken once. Other parameters fall back to Jacobians.
  Needs the network's layers (a ``Graph``), not a bare ``apply_fn``.
* ``"auto"``: lowers each candidate (traced, not compiled), estimates its time from XLA's cost
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

from __future__ import annotations

import dataclasses
import functools
import math
import string
from typing import Any, Callable, Hashable, Iterator, Sequence

import jax
import jax.numpy as jnp

from . import programs
from .devices import platform_of
from .errors import InputError, InputTypeError
from .stax.kernel import symmetrize
from .tiling import Task

IMPLEMENTATIONS = ("auto", "jacobian", "ntvp", "structured")
STRATEGIES = IMPLEMENTATIONS[1:]
_HIGHEST = jax.lax.Precision.HIGHEST
_NTVP_CHUNK_BYTES = 2 ** 28  # memory for the VJPs (parameter-sized vectors) held at once
# Roofline of the time estimate of "auto": (flops per second, bytes per second), per platform.
_ROOFLINE = {"cpu": (1e11, 2e10), "gpu": (3e13, 3e12), "tpu": (1e14, 1e12)}


# ---------------------------------------------------------------------------------------------
# Axes


def int_tuple(axes: Sequence[int], arg: str) -> tuple[int, ...]:
    """``axes`` as a tuple of ints; InputError naming ``arg`` if it is not a sequence of ints."""
    try:
        return tuple(int(a) for a in axes)
    except (TypeError, ValueError):
        raise InputError(f"{arg} must be a tuple of ints, got {axes!r}.") from None


def normalize_axes(trace_axes: Sequence[int], diagonal_axes: Sequence[int],
                   ndim: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Output axes as non-negative indices into ``f``'s shape of rank ``ndim``, checked."""
    result = []
    for arg, axes in (("trace_axes", trace_axes), ("diagonal_axes", diagonal_axes)):
        axes = int_tuple(axes, arg)
        fixed = tuple(a % ndim if -ndim <= a < ndim else None for a in axes)
        if None in fixed or 0 in fixed:
            raise InputError(f"{arg}={axes} names an axis the output (rank {ndim}, axis 0 being "
                             f"the batch) does not have; use output axes 1..{ndim - 1} or negative "
                             f"indices.")
        if len(set(fixed)) != len(fixed):
            raise InputError(f"{arg}={axes} names an axis twice.")
        result.append(fixed)
    if set(result[0]) & set(result[1]):
        raise InputError(f"trace_axes={tuple(trace_axes)} and diagonal_axes="
                         f"{tuple(diagonal_axes)} overlap; an axis is traced or diagonal, not both.")
    return result[0], result[1]


@dataclasses.dataclass(frozen=True)
class Axes:
    """The rank of ``f`` (batch included) and its normalized trace and diagonal axes."""

    out_ndim: int
    trace: tuple[int, ...]
    diagonal: tuple[int, ...]

    def subscripts(self, letters: Iterator[str]) -> tuple[str, str, str]:
        """Einsum subscripts of ``f(x1)``'s axes, ``f(x2)``'s axes and of the kernel."""
        sa, sb, kept1, kept2 = [next(letters)], [next(letters)], "", ""
        for axis in range(1, self.out_ndim):
            la = next(letters)
            lb = la if axis in self.trace or axis in self.diagonal else next(letters)
            sa.append(la)
            sb.append(lb)
            if axis not in self.trace:
                kept1 += la
                kept2 += "" if axis in self.diagonal else lb
        return "".join(sa), "".join(sb), sa[0] + sb[0] + kept1 + kept2

    def scale(self, out_shape: Sequence[int]) -> int:
        """The number of entries the traced axes average over."""
        return math.prod(out_shape[axis] for axis in self.trace)

    def swap_perm(self, ndim: int) -> tuple[int, ...]:
        """The axes permutation exchanging x1 and x2 in a kernel array of rank ``ndim``."""
        kept = [a for a in range(1, self.out_ndim) if a not in self.trace]
        paired = [i for i, a in enumerate(kept) if a not in self.diagonal]
        perm = [1, 0] + list(range(2, 2 + len(kept))) + list(range(2 + len(kept), ndim))
        for j, i in enumerate(paired):
            perm[2 + i], perm[2 + len(kept) + j] = perm[2 + len(kept) + j], perm[2 + i]
        return tuple(perm)


def contract(a: jax.Array, b: jax.Array, axes: Axes) -> jax.Array:
    """Contract ``a (N1, *out, *rest)`` with ``b (N2, *out, *rest)`` over ``rest`` and the axes rules.

    ``rest`` (e.g. a parameter's shape) is summed over; traced output axes are averaged.
    """
    letters = iter(string.ascii_letters)
    sa, sb, out = axes.subscripts(letters)
    rest = "".join(next(letters) for _ in range(a.ndim - axes.out_ndim))
    return jnp.einsum(f"{sa}{rest},{sb}{rest}->{out}", a, b,
                      precision=_HIGHEST) / axes.scale(a.shape[:axes.out_ndim])


# ---------------------------------------------------------------------------------------------
# Parameters and their groups (the by-layer split)


def _group_of(model) -> Callable[[tuple], str]:
    """Names the group (layer) of a parameter leaf from its pytree path.

    A ``Graph``: the qualified name of the module owning the parameter. A bare ``apply_fn``: the
    top-level key (or index) of the params pytree.
    """
    owners = {n.key(p): n.name for n in getattr(model, "layers", None) or () for p in n.param_names}

    def group(path):
        top = path[0]
        name = str(getattr(top, "key", getattr(top, "idx", getattr(top, "name", top))))
        return owners.get(name, name)

    return group


def _leaf_paths(params) -> list[tuple]:
    """The pytree path of each leaf of ``params``, in ``jax.tree.leaves`` order."""
    return [path for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]


def _restrict(apply_fn, params, keep: Sequence[int]):
    """``(fn(sub, x), sub)``: ``apply_fn`` as a function of the leaves ``keep`` only."""
    leaves, treedef = jax.tree.flatten(params)

    def fn(sub, x):
        full = list(leaves)
        for i, v in zip(keep, sub):
            full[i] = v
        return apply_fn(jax.tree.unflatten(treedef, full), x)

    return fn, [leaves[i] for i in keep]


def _sum_groups(parts: dict[str, list[jax.Array]], by_layer: bool):
    groups = {name: functools.reduce(jnp.add, values) for name, values in parts.items()}
    return groups if by_layer else functools.reduce(jnp.add, groups.values())


# ---------------------------------------------------------------------------------------------
# Strategies: fn(model, params, x1, x2, axes, by_layer) -> kernel or {group: kernel}


def _jacobian(apply_fn, params, x, interact: bool):
    """Jacobian of each example's output w.r.t. params: leaves ``(N, *out, *param_shape)``.

    With interacting examples, that of the whole batch's output (same layout).
    """
    if interact:
        return jax.jacrev(apply_fn)(params, x)
    single = lambda p, xi: apply_fn(p, xi[None])[0]
    return jax.vmap(jax.jacrev(single), in_axes=(None, 0))(params, x)


def _jacobian_parts(apply_fn, params, x1, x2, axes, keep, group, interact=False):
    """Jacobian contraction of the leaves ``keep``, as ``{group: [contributions]}``."""
    fn, sub = _restrict(apply_fn, params, keep)
    if interact:
        n1 = x1.shape[0]
        j = _jacobian(fn, sub, x1 if x2 is None else jnp.concatenate([x1, x2]), True)
        j1, j2 = [a[:n1] for a in j], (j if x2 is None else [a[n1:] for a in j])
    else:
        j1 = _jacobian(fn, sub, x1, False)
        j2 = j1 if x2 is None else _jacobian(fn, sub, x2, False)
    parts: dict[str, list] = {}
    paths = _leaf_paths(params)
    for i, a, b in zip(keep, j1, j2):
        parts.setdefault(group(paths[i]), []).append(contract(a, b, axes))
    return parts


def jacobian_strategy(model, params, x1, x2, axes, by_layer, interact=False):
    keep = range(len(jax.tree.leaves(params)))
    parts = _jacobian_parts(model.apply_fn, params, x1, x2, axes, keep, _group_of(model), interact)
    return _sum_groups(parts, by_layer)


def _ntvp_columns(apply_fn, params, x1, x2, chunk):
    """``Theta[n2, o2, n1, *o1]``: the JVP over x1 of the VJP of each x2 output unit."""
    out = jax.eval_shape(apply_fn, params, x2[:1]).shape[1:]
    units = math.prod(out)
    xs = jnp.repeat(x2, units, axis=0)[:, None]
    cts = jnp.tile(jnp.eye(units, dtype=x2.dtype), (x2.shape[0], 1)).reshape(-1, 1, *out)

    def column(args):
        x, ct = args
        _, vjp = jax.vjp(lambda p: apply_fn(p, x), params)
        return jax.jvp(lambda p: apply_fn(p, x1), (params,), vjp(ct))[1]

    cols = jax.lax.map(column, (xs, cts), batch_size=chunk or xs.shape[0])
    return cols.reshape(x2.shape[0], *out, *cols.shape[1:])


def ntvp_strategy(model, params, x1, x2, axes, by_layer, chunk=None):
    """``chunk``: VJPs taken at once (None: all; the kernel is the same, memory is not)."""
    group = _group_of(model)
    groups: dict[str, list[int]] = {}
    for i, path in enumerate(_leaf_paths(params)):
        groups.setdefault(group(path), []).append(i)
    letters = iter(string.ascii_letters)
    sa, sb, out = axes.subscripts(letters)
    parts = {}
    for name, keep in groups.items():
        fn, sub = _restrict(model.apply_fn, params, keep)
        full = _ntvp_columns(fn, sub, x1, x1 if x2 is None else x2, chunk)
        parts[name] = [jnp.einsum(f"{sb}{sa}->{out}", full) / axes.scale(full.shape[:axes.out_ndim])]
    return _sum_groups(parts, by_layer)


def _forward(nodes, structured, params, values, lo, hi, taps=None):
    """Runs ``nodes[lo:hi]`` on ``values`` (node index -> output; -1 is the input), adding
    ``taps[j]`` to the output of the j-th of those nodes listed in ``structured``.

    Returns all values and the inputs of the ``structured`` nodes run.
    """
    values, ins = dict(values), []
    for i in range(lo, hi):
        node = nodes[i]
        args = tuple(values[j] for j in node.inputs)
        arg = args[0] if len(args) == 1 else args
        y = node.layer.apply_fn({p: params[node.key(p)] for p in node.param_names}, arg)
        if i in structured:
            y = y if taps is None else y + taps[len(ins)]
            ins.append(arg)
        values[i] = y
    return values, ins


def _affine_tail(nodes) -> int:
    """The first index of the longest run of affine layers that ends the network."""
    start = len(nodes)
    while start > 0 and nodes[start - 1].layer.affine:
        start -= 1
    return start


def _cotangents(nodes, structured, params, x):
    """The inputs of the ``structured`` nodes and the cotangents of each output unit w.r.t. each
    one's output, ``(N, *out, *y)``, from one backward pass per output unit through zero taps.

    The network's affine last layers have the same VJP at every example: theirs is taken once,
    at example 0, and their cotangents come back as ``(1, *out, *y)``, the same for all examples.
    """
    n, end, start = x.shape[0], len(nodes), _affine_tail(nodes)
    head, tail = [i for i in structured if i < start], [i for i in structured if i >= start]
    # the values the tail reads from the head (the network's output itself when the tail is empty)
    frontier = sorted({j for node in nodes[start:] for j in node.inputs if j < start}
                      | ({end - 1} if start == end else set()))
    shapes = jax.eval_shape(lambda: _forward(nodes, (), params, {-1: x}, 0, end)[0])
    zeros = lambda nodes, batch: [jnp.zeros((batch, *shapes[i].shape[1:]), shapes[i].dtype)
                                  for i in nodes]

    def head_fn(taps):
        values, ins = _forward(nodes, head, params, {-1: x}, 0, start, taps)
        return [values[j] for j in frontier], ins

    def tail_fn(taps, front):
        return _forward(nodes, tail, params, dict(zip(frontier, front)), start, end, taps)[0][end - 1]

    front, head_vjp, head_ins = jax.vjp(head_fn, zeros(head, n), has_aux=True)
    tail_ins = _forward(nodes, tail, params, dict(zip(frontier, front)), start, end)[1]
    out, tail_vjp = jax.vjp(tail_fn, zeros(tail, 1), [v[:1] for v in front])
    units = math.prod(out.shape[1:])
    g_tail, g_front = jax.vmap(tail_vjp)(jnp.eye(units, dtype=out.dtype).reshape(units, *out.shape))
    g_head = jax.vmap(head_vjp)([jnp.broadcast_to(g, (units, n, *g.shape[2:])) for g in g_front]
                                )[0] if head else []
    per_example = lambda g: jnp.moveaxis(g, 0, 1).reshape(g.shape[1], *out.shape[1:], *g.shape[2:])
    return head_ins + tail_ins, [per_example(g) for g in [*g_head, *g_tail]]


def _outer_contribution(o1: Any, o2: Any, axes: Axes) -> jax.Array:
    """``sum_{p,q} (g1[:, p] . g2[:, q]) (patch1[:, p] . patch2[:, q])`` per the axes rules.

    ``o = (g, patches, n)``: ``g`` is ``(N, P, *out, C)``, or ``(1, P, *out, C)`` when the same
    for all ``n`` examples; ``patches`` is ``(N, P, K)`` or None (all ones). Positions lead and
    channels trail (``*out`` between them), so each example's ``g`` is a ``(P, out x C)`` matrix as
    it stands.
    """
    letters = iter(string.ascii_letters)
    sa, sb, out = axes.subscripts(letters)
    p, q, c, k = (next(letters) for _ in range(4))
    (g1, x1, n1), (g2, x2, n2) = o1, o2
    scale = axes.scale((n1, *g1.shape[2:axes.out_ndim + 1]))
    x1, x2 = (jnp.ones((n, g.shape[1], 1), g.dtype) if x is None else x
              for x, g, n in ((x1, g1, n1), (x2, g2, n2)))
    s1, s2 = (s[0] + pos + s[1:] if g.shape[0] == n else pos + s[1:]
              for s, pos, g, n in ((sa, p, g1, n1), (sb, q, g2, n2)))
    g1, g2 = (g if g.shape[0] == n else g[0] for g, n in ((g1, n1), (g2, n2)))
    return jnp.einsum(f"{s1}{c},{s2}{c},{sa[0]}{p}{k},{sb[0]}{q}{k}->{out}",
                      g1, g2, x1, x2, precision=_HIGHEST, optimize="optimal") / scale


def _structured_plan(model):
    """The nodes with a structure rule whose parameters are theirs alone (not shared)."""
    nodes = model.layers
    if nodes is None:
        raise InputError("implementation='structured' needs the network's layers (an "
                         "ntbridge.Graph), not a bare apply_fn; use 'jacobian' or 'ntvp'.")
    uses: dict[str, int] = {}
    for n in nodes:
        for p in n.param_names:
            uses[n.key(p)] = uses.get(n.key(p), 0) + 1
    return nodes, tuple(i for i, n in enumerate(nodes) if n.layer.structure is not None
                        and n.param_names and all(uses[n.key(p)] == 1 for p in n.param_names))


def structured_strategy(model, params, x1, x2, axes, by_layer):
    nodes, structured = _structured_plan(model)
    parts: dict[str, list] = {}
    done = set()
    if structured:
        lookup = {**params, **model.state}
        sides = [_cotangents(nodes, structured, lookup, x) for x in ((x1,) if x2 is None else (x1, x2))]
        (ins1, gs1), (ins2, gs2) = sides[0], sides[-1]
        n1, n2 = x1.shape[0], (x1 if x2 is None else x2).shape[0]
        for j, i in enumerate(structured):
            node = nodes[i]
            local = {p: lookup[node.key(p)] for p in node.param_names}
            rule1, rule2 = node.layer.structure(local, ins1[j]), node.layer.structure(local, ins2[j])
            for p, r1 in rule1.items():
                if node.key(p) not in params:
                    continue
                r2 = rule2[p]
                g1, g2 = _rows(r1, gs1[j], axes), _rows(r2, gs2[j], axes)
                parts.setdefault(node.name, []).append(_outer_contribution(
                    (g1, r1.patches, n1), (g2, r2.patches, n2), axes))
                done.add(node.key(p))
    rest = [i for i, path in enumerate(_leaf_paths(params)) if str(path[0].key) not in done]
    if rest:
        for name, values in _jacobian_parts(model.apply_fn, params, x1, x2, axes, rest,
                                            _group_of(model)).items():
            parts.setdefault(name, []).extend(values)
    return _sum_groups(parts, by_layer)


def _rows(rule, g: jax.Array, axes: Axes) -> jax.Array:
    """``rule.rows`` of cotangents ``g (N, *out, *y)``, as ``(N, P, *out, C)``."""
    rows = rule.rows(g.reshape(-1, *g.shape[axes.out_ndim:]))  # (N * prod(out), P, C)
    return jnp.moveaxis(rows.reshape(*g.shape[:axes.out_ndim], *rows.shape[1:]), -2, 1)


_STRATEGY_FNS = {"jacobian": jacobian_strategy, "ntvp": ntvp_strategy,
                 "structured": structured_strategy}


# ---------------------------------------------------------------------------------------------
# Choosing and compiling a strategy


@dataclasses.dataclass(frozen=True)
class StrategyInfo:
    """The strategy that computed a kernel, and why.

    Attributes:
      implementation: ``"jacobian"``, ``"ntvp"`` or ``"structured"``.
      costs: per candidate, XLA's cost analysis of its lowered program: ``flops``,
        ``bytes_accessed`` and ``estimated_s`` (the roofline ``max(flops / F, bytes / B)`` of the
        platform).
      reason: why this one, in words.

    Example:
        >>> k, info = ntbridge.empirical_ntk(model, x1, x2, return_info=True)  # the README's
        >>> info
        StrategyInfo(implementation='structured', reason="lowest estimated time on cpu from XLA's cost analysis (structured 1.13 ms, ntvp 6.05 ms, jacobian 11.8 ms)")
    """

    implementation: str
    costs: dict[str, dict[str, float]]
    reason: str

    def __repr__(self) -> str:
        """The choice and its reason; the candidates' costs are ``info.costs``."""
        return f"StrategyInfo(implementation={self.implementation!r}, reason={self.reason!r})"


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


class _WithState:
    """A model whose ``apply_fn`` takes the differentiated params only, the fixed ``state`` (e.g.
    buffers, a dict) merged in; ``lookup`` holds both, for the layers' own functions."""

    def __init__(self, model, state):
        self.layers = getattr(model, "layers", None)
        self.state = state or {}
        self.apply_fn = (model.apply_fn if not state else
                         lambda p, x: model.apply_fn({**p, **self.state}, x))


def _as_model(model):
    if hasattr(model, "apply_fn"):
        return model
    if callable(model):
        return _Model(model)
    raise InputError(f"expected an apply_fn(params, x) or an ntbridge.Graph, got {model!r}.")


def _identity(model) -> Any:
    """What fixes a model's function, for cache keys: a Graph's signature, else its apply_fn."""
    return getattr(model, "signature", None) or model.apply_fn


def _symmetric(k: Any, x2, axes: Axes) -> Any:
    """The kernel(s) ``k``, symmetrized op by op (so exactly) when ``x2`` is None."""
    return jax.tree.map(lambda a: a if x2 is not None else symmetrize(a, axes.swap_perm(a.ndim)), k)


class _Dispatch:
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
        if not _structured_plan(self.model)[1]:
            return ["jacobian", "ntvp"], "no layer declares a derivative structure"
        return list(STRATEGIES), ""

    def program(self, strategy: str, axes: Axes, by_layer: bool, chunk=None) -> Callable:
        """``run((params, state), x1, x2)``: the strategy as a traceable function."""
        def run(args, x1, x2):
            params, state = args
            kw = {"chunk": chunk} if strategy == "ntvp" else {}
            kw = {"interact": True} if self.interact else kw
            return _STRATEGY_FNS[strategy](_WithState(self.model, state), params, x1, x2, axes,
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
            units = math.prod(jax.eval_shape(_WithState(self.model, state).apply_fn, params,
                                             x1).shape[1:])
            chunk = chunk if chunk < (x1 if x2 is None else x2).shape[0] * units else None
        return self.program(best, axes, by_layer, chunk), StrategyInfo(best, costs, reason), chunk

    def plan(self, params, x1, x2=None, *, trace_axes=(-1,), diagonal_axes=(),
             by_layer: bool = False, state=None, out_ndim: int | None = None,
             platform: str | None = None) -> tuple[Callable, StrategyInfo, Axes, Hashable]:
        """``(run, info, axes, computation)`` for these shapes: ``run((params, state), x1, x2)``
        is the chosen strategy as a traceable function, and ``computation`` what fixes it (for
        program keys); ``x1`` and ``x2`` may be arrays or ``jax.ShapeDtypeStruct``s. The choice is
        made once per shape signature (:mod:`ntbridge.programs`)."""
        if out_ndim is None:
            out_ndim = len(jax.eval_shape(_WithState(self.model, state).apply_fn, params, x1).shape)
        axes = Axes(out_ndim, *normalize_axes(trace_axes, diagonal_axes, out_ndim))
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
        k = _symmetric(k, x2, axes)
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
    return _Dispatch(_as_model(model), implementation, examples_interact)


def _nngp(apply_fn: Callable, interact: bool) -> Callable:
    """``nngp(params, x1, x2, axes)``: the outputs' products, traceable."""
    def nngp(params, x1, x2, axes):
        if interact and x2 is not None:
            f = apply_fn(params, jnp.concatenate([x1, x2]))
            f1, f2 = f[:x1.shape[0]], f[x1.shape[0]:]
        else:
            f1 = apply_fn(params, x1)
            f2 = f1 if x2 is None else apply_fn(params, x2)
        return contract(f1, f2, axes)
    return nngp


def empirical_nngp_fn(apply_fn: Callable[[Any, jax.Array], jax.Array], *,
                      examples_interact: bool = False) -> Callable:
    """``fn(params, x1, x2=None, *, trace_axes=(-1,), diagonal_axes=())`` -> ``f(x1) f(x2)``.

    The outputs' products contracted per the axes rules (the finite-width NNGP of one network);
    with ``examples_interact``, the outputs of the joint batch (see the module doc). With
    ``x2=None`` the result is exactly symmetric.
    """
    nngp = _nngp(apply_fn, examples_interact)

    def fn(params, x1, x2=None, *, trace_axes=(-1,), diagonal_axes=()):
        out_ndim = len(jax.eval_shape(apply_fn, params, x1[:1]).shape)
        axes = Axes(out_ndim, *normalize_axes(trace_axes, diagonal_axes, out_ndim))
        key = programs.ProgramKey.of("empirical_nngp_fn", (apply_fn, examples_interact, axes),
                                     (params, x1, x2))
        run = programs.cached(key, lambda: jax.jit(nngp, static_argnums=3))
        return _symmetric(run(params, x1, x2, axes), x2, axes)

    return fn


# ---------------------------------------------------------------------------------------------
# Tasks of the request pipeline


def _trainable(graph) -> tuple[dict, dict]:
    """``(params, state)``: the graph's arrays that are torch parameters, and the others (buffers)."""
    names = {n.key(p) for n in graph.layers for p, _ in n.module.named_parameters(recurse=False)}
    return ({k: v for k, v in graph.params.items() if k in names},
            {k: v for k, v in graph.params.items() if k not in names})


def ntk_task(graph, x1: jax.ShapeDtypeStruct, x2: jax.ShapeDtypeStruct | None, *,
             implementation: str, trace_axes, diagonal_axes, by_layer: bool, interact: bool,
             platform: str) -> tuple[Task, StrategyInfo]:
    """The empirical NTK of ``graph`` at its parameters, as a task for :func:`ntbridge.tiling.compute`."""
    params, state = _trainable(graph)
    if not params:
        raise InputError("the model has no parameters, so its empirical NTK is undefined; "
                         "use ntbridge.empirical_nngp, or the analytic ntbridge.ntk.")
    model_dtype = {p.dtype for p in params.values()}
    if model_dtype != {x1.dtype}:
        raise InputTypeError(f"the model's parameters are {model_dtype.pop()} but x1 is "
                             f"torch.{x1.dtype}; convert one to the other, e.g. model.to(torch.{x1.dtype}).")
    run, info, axes, computation = _Dispatch(graph, implementation, interact).plan(
        params, x1, x2, trace_axes=trace_axes, diagonal_axes=diagonal_axes, by_layer=by_layer,
        state=state, out_ndim=len(graph.output_shape(x1.shape)), platform=platform)
    return Task(("empirical_ntk", *computation), run, axes.swap_perm, (params, state)), info


def nngp_task(graph, x1: jax.ShapeDtypeStruct, x2: jax.ShapeDtypeStruct | None, *, trace_axes,
              diagonal_axes, interact: bool) -> tuple[Task, None]:
    """The outputs' products of ``graph`` at its parameters, as a task."""
    out_ndim = len(graph.output_shape(x1.shape))
    axes = Axes(out_ndim, *normalize_axes(trace_axes, diagonal_axes, out_ndim))
    nngp = _nngp(graph.apply_fn, interact)
    return Task(("empirical_nngp", graph.signature, axes, interact),
                lambda params, a1, a2: nngp(params, a1, a2, axes), axes.swap_perm,
                graph.params), None
