"""The ``"structured"`` strategy: layer derivative structure instead of parameter Jacobians.

A layer declares it (``ntbridge.stax.Layer``'s protocol): ``structure(params, x) -> {param: Outer}``
when its output is an outer product in a parameter (Linear, Conv), and ``affine`` when its VJP is
the same at every input. The contribution of such a parameter is
``sum_{p,q} (g1[p] . g2[q]) (patch1[p] . patch2[q])``, from the cotangents ``g`` at the layer's output
(one backward pass per output unit, through zero "taps" added to each layer's output) and the
layer's input patches. The backward pass through the network's affine last layers is the same for
every example and is taken once. Each contribution is contracted in the cheaper of two orders (per
example parameter gradients, or Gram products of cotangents and of patches: see
``_outer_contribution``), traced output axes inside the product; with x2 = None the cotangents,
patches and per-example gradients are formed once. Other parameters fall back to Jacobians."""

from __future__ import annotations

import math
import string

import jax
import jax.numpy as jnp

from ..errors import InputError
from .axes import HIGHEST, Axes, contract, contract_subscripts
from .groups import leaf_paths, sum_groups, group_of
from .jacobian import jacobian_parts


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


def affine_tail(nodes) -> int:
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
    n, end, start = x.shape[0], len(nodes), affine_tail(nodes)
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


def _outer_contribution(outers: list, axes: Axes) -> jax.Array:
    """``sum_{p,q} (g1[:, p] . g2[:, q]) (patch1[:, p] . patch2[:, q])`` per the axes rules, from
    the outers ``[o1, o2]`` of x1 and x2, or ``[o1]`` when x2 is x1.

    ``o = (g, patches, n)``: ``g`` is ``(N, P, *out, C)``, or ``(1, P, *out, C)`` when the same
    for all ``n`` examples; ``patches`` is ``(N, P, K)`` or None (all ones). Positions lead and
    channels trail (``*out`` between them), so each example's ``g`` is a ``(P, out x C)`` matrix as
    it stands.

    Of two contraction orders, the one with fewer operations (opt_einsum's count) is taken:
    * factors: each example's parameter gradient ``F = sum_p g[:, p] (x) patches[:, p]``, ``(N,
      *out, C, K)``, then ``F1 . F2`` over ``(C, K)`` with the traced output axes summed in the
      same product (no output-output block is formed). When x2 is x1, ``F`` is formed once.
    * Gram: the products of cotangents ``g1 . g2`` and of patches ``patch1 . patch2``, never
      forming ``C x K`` (the cheaper one for few positions and a large ``C K``: a last Linear,
      whose ``g`` is the identity).
    """
    letters = iter(string.ascii_letters)
    sa, sb, out = axes.subscripts(letters)
    p, q, c, k = (next(letters) for _ in range(4))
    (g1, x1, n1), (g2, x2, n2) = outers[0], outers[-1]
    scale = axes.scale((n1, *g1.shape[2:axes.out_ndim + 1]))
    x1, x2 = (jnp.ones((n, g.shape[1], 1), g.dtype) if x is None else x
              for x, g, n in ((x1, g1, n1), (x2, g2, n2)))
    s1, s2 = (s[0] + pos + s[1:] if g.shape[0] == n else pos + s[1:]
              for s, pos, g, n in ((sa, p, g1, n1), (sb, q, g2, n2)))
    g1, g2 = (g if g.shape[0] == n else g[0] for g, n in ((g1, n1), (g2, n2)))
    gram = (f"{s1}{c},{s2}{c},{sa[0]}{p}{k},{sb[0]}{q}{k}->{out}", g1, g2, x1, x2)
    factors = [(f"{s1}{c},{sa[0]}{p}{k}->{sa}{c}{k}", g1, x1)]
    factors += [(f"{s2}{c},{sb[0]}{q}{k}->{sb}{c}{k}", g2, x2)][:len(outers) - 1]
    if _gram_is_cheaper(gram, factors, axes):
        return jnp.einsum(*gram, precision=HIGHEST, optimize="optimal") / scale
    formed = [jnp.einsum(*f, precision=HIGHEST) for f in factors]
    return contract(formed[0], formed[-1], axes)


def _gram_is_cheaper(gram: tuple, factors: list[tuple], axes: Axes) -> bool:
    """Whether the Gram order of :func:`_outer_contribution` takes no more operations
    (opt_einsum's count) than forming the ``factors`` (``(spec, g, patches)``, one or two) and
    contracting them."""
    count = lambda spec, *ops: jnp.einsum_path(spec, *ops, optimize="optimal")[1].opt_cost
    shapes = [jax.eval_shape(lambda *a, spec=spec: jnp.einsum(spec, *a), *ops)
              for spec, *ops in (factors[0], factors[-1])]
    product = count(contract_subscripts(shapes[0].ndim - axes.out_ndim, axes), *shapes)
    return count(*gram) <= sum(count(*f) for f in factors) + product


def structured_plan(model):
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
    nodes, structured = structured_plan(model)
    parts: dict[str, list] = {}
    done = set()
    if structured:
        lookup = {**params, **model.state}
        sides = [_cotangents(nodes, structured, lookup, x) for x in ((x1,) if x2 is None else (x1, x2))]
        n1, n2 = x1.shape[0], (x1 if x2 is None else x2).shape[0]
        for j, i in enumerate(structured):
            node = nodes[i]
            local = {p: lookup[node.key(p)] for p in node.param_names}
            rules = [node.layer.structure(local, ins[j]) for ins, _ in sides]
            for p in rules[0]:
                if node.key(p) not in params:
                    continue
                outers = [(_rows(r[p], gs[j], axes), r[p].patches, n)
                          for r, (_, gs), n in zip(rules, sides, (n1, n2))]
                parts.setdefault(node.name, []).append(_outer_contribution(outers, axes))
                done.add(node.key(p))
    rest = [i for i, path in enumerate(leaf_paths(params)) if str(path[0].key) not in done]
    if rest:
        for name, values in jacobian_parts(model.apply_fn, params, x1, x2, axes, rest,
                                            group_of(model)).items():
            parts.setdefault(name, []).extend(values)
    return sum_groups(parts, by_layer)


def _rows(rule, g: jax.Array, axes: Axes) -> jax.Array:
    """``rule.rows`` of cotangents ``g (N, *out, *y)``, as ``(N, P, *out, C)``."""
    rows = rule.rows(g.reshape(-1, *g.shape[axes.out_ndim:]))  # (N * prod(out), P, C)
    return jnp.moveaxis(rows.reshape(*g.shape[:axes.out_ndim], *rows.shape[1:]), -2, 1)
