"""Layers that start from one set of weights: ``nn.TransformerEncoder``'s and
``nn.TransformerDecoder``'s layers, which torch deep-copies from one layer, so that at
initialisation they hold equal weights (distinct parameters, which training then moves apart).

Why the kernel differs from that of independent layers: a weight matrix ``W`` used at depths
``i`` and ``j`` makes pre-activations ``W h_i`` and ``W h_j`` that are jointly Gaussian in the
infinite-width limit, with the cross-covariance ``W_std**2 <h_i, h_j'> / n`` of the inputs it sees
there (as in weight-tied recurrent networks; no ``W^T`` is used in the forward pass, so nothing
else correlates). A residual stream adds the branches' outputs, so its covariance across depths
carries these correlations: with independent layers they are zero, with copies they are not
(a 2-layer encoder's NNGP differs by 13-30%).

The rule. The residual stream is at every depth a linear combination of Gaussian *sources*: the
stack's input, and each branch's output at each depth (``W_o A v`` of attention, ``W_2 f(W_1
h)`` of the feed-forward part), with coefficients per example and token (a post-norm LayerNorm
divides by each token's standard deviation, deterministic in the limit). Sources of different
weights are uncorrelated; one branch's outputs at depths ``i`` and ``j`` have the covariance its
own kernel rule gives for the pair of inputs ``(stream_i, stream_j)``: a layer's rule for a batch
of examples is that of weights shared across the batch, so applied to the pair (an example at
depth ``i`` against one at depth ``j``) it gives the copies' cross-covariance.

The NTK is the covariance of the tangents ``df = J dtheta``, which combine over the sources in
the same way. The copies are distinct parameters, so ``dtheta`` is drawn independently per copy:
across depths only the tangents carried in through the shared forward weights correlate, and the
copies' own part (what each rule adds at zero incoming NTK; the rules are affine in it) is left
out. A LayerNorm's scale moves its tangent by a vanishing amount; its weight and bias add a
tangent of their own, per copy.

A decoder's cross-attention is a branch too: its memory, the same at every depth, is read by
the copies' shared key and value weights, so its rule on a pair of depths takes the memory's
kernel on both sides (and an example's memory with itself for that example's own covariance).

So the rule keeps, for every pair of sources of one branch, their NNGP and NTK between x1 and x2
and each example's own covariance across depths, and the streams as coefficients over the
sources. Cost: about ``depth`` times the branches' rules of independent layers.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp

from ..errors import UnsupportedLayerError
from .kernel import Kernel, spatial_diagonal
from .layers import Layer

# A branch's kernel rule: (pair kernel, the stack's other input's kernel or None, the body's
# hyper) -> Kernel. The other input is the same at every depth: the token ids of an encoder's
# key padding mask, or a decoder's memory.
BranchRule = Callable[[Kernel, Kernel | None, tuple], Kernel]


class Branch(NamedTuple):
    """A residual step ``h = h + branch(h)``; ``rule`` is the branch's kernel rule, which must end
    in an affine layer of the branch's own weights (attention's ``out_proj``, a Linear)."""

    rule: BranchRule


class Norm(NamedTuple):
    """A post-norm step ``h = LayerNorm(h)`` over each token's features: ``eps`` and the affine
    parameters' values (None: no such parameter)."""

    eps: float
    weight: float | None
    bias: float | None


Step = Branch | Norm
Source = tuple  # ("input",) or (step index, depth): one Gaussian source of the residual stream


class _Form(NamedTuple):
    """A stream as a linear combination of sources: coefficients ``(N1, T)`` and ``(N2, T)``."""

    coefficients: dict  # Source -> (c1, c2)


class _Store:
    """The sources' covariances: between x1 and x2 (``cross``: NNGP and NTK ``(N1, N2, T, T)``,
    the NNGP None for a source that is a tangent only) and each example's own across depths
    (``own[side]``: NNGP ``(N, T, T)``), for pairs of sources of one family (step)."""

    def __init__(self, k: Kernel):
        start = ("input",)
        self.cross = {(start, start): (k.nngp, k.ntk)}
        self.own = ({(start, start): k.cov1}, {(start, start): k.cov2})

    def cross_cov(self, a: _Form, b: _Form, field: int):
        total = 0.0
        for (sa, (ca, _)) in a.coefficients.items():
            for (sb, (_, cb)) in b.coefficients.items():
                entry = self.cross.get((sa, sb))
                if entry is not None and entry[field] is not None:
                    total = total + ca[:, None, :, None] * cb[None, :, None, :] * entry[field]
        return total

    def own_cov(self, a: _Form, b: _Form, side: int):
        total = 0.0
        for (sa, ca) in a.coefficients.items():
            for (sb, cb) in b.coefficients.items():
                entry = self.own[side].get((sa, sb))
                if entry is not None:
                    total = total + ca[side][:, :, None] * cb[side][:, None, :] * entry
        return total


def _swap(a):
    """Exchange x1 and x2 in ``(N1, N2, T, T')`` (None stays None)."""
    return None if a is None else jnp.transpose(a, (1, 0, 3, 2))


def _pair(k: Kernel, store: _Store, a: _Form, b: _Form, symmetric: bool) -> Kernel:
    """The kernel of stream ``a`` on x1 against stream ``b`` on x2."""
    ntk = None if k.ntk is None else store.cross_cov(a, b, 1)
    return k.replace(nngp=store.cross_cov(a, b, 0), ntk=ntk, cov1=store.own_cov(a, a, 0),
                     cov2=store.own_cov(b, b, 1), x1_is_x2=symmetric)


def _alone(k: Kernel, side: int, c, ca, cb) -> Kernel:
    """``k`` of one example (of x1 or x2: ``side``) paired with itself: covariances ``c`` between
    the two members of the pair and ``ca``, ``cb`` of each, without NTK."""
    shape = (1, *(k.shape1, k.shape2)[side][1:])
    return k.replace(nngp=c[None, None], ntk=None, cov1=ca[None], cov2=cb[None], shape1=shape,
                     shape2=shape, x1_is_x2=False, ids1=None, ids2=None)


def _own_pairs(rule, k: Kernel, other: Kernel | None, store: _Store, a: _Form, b: _Form,
               side: int, hyper):
    """Each example's covariance of the branch's outputs at the depths of ``a`` and ``b``
    ``(N, T, T)``: the branch's rule on the pair (example at one depth, itself at the other),
    with the stack's other input of that example (its token ids, or its memory)."""
    cross = store.own_cov(a, b, side)
    va, vb = store.own_cov(a, a, side), store.own_cov(b, b, side)
    if other is None:
        per_example, of = (), None
    elif other.ids1 is not None:
        per_example = ((other.ids1, other.ids2)[side],)
        of = lambda i: other.replace(ids1=i[None], ids2=i[None])
    else:  # the memory, the same at both depths: its own covariance on both sides
        per_example = ((other.cov1, other.cov2)[side],)
        of = lambda c: _alone(other, side, c, c, c)

    def one(c, ca, cb, *e):  # e: the example's entry of the other input, if any
        return rule(_alone(k, side, c, ca, cb), of(*e) if e else None, hyper).nngp[0, 0]

    return jax.vmap(one)(cross, va, vb, *per_example)


def _across(rule: BranchRule, k: Kernel, other, store: _Store, a: _Form, b: _Form, hyper):
    """The NNGP and NTK of a branch's outputs at two depths: stream ``a`` on x1, ``b`` on x2. The
    copies' parameters are distinct, so their own part of the NTK (the rule's at zero incoming
    NTKs) is left out: the rules are affine in the incoming NTKs (the stream's, and a decoder's
    memory's, whose parameters every depth shares), whose linear part is the rule's derivative
    along them (one pass, the NNGP's expectations shared)."""
    pair = _pair(k, store, a, b, False)
    if pair.ntk is None:
        return rule(pair, other, hyper).nngp, None
    tangents = (pair.ntk, None if other is None else other.ntk)

    def kernels(ntks):
        given = None if other is None else other.replace(ntk=ntks[1])
        out = rule(pair.replace(ntk=ntks[0]), given, hyper)
        return out.nngp, out.ntk

    zeros = jax.tree.map(jnp.zeros_like, tangents)
    (nngp, _), (_, ntk) = jax.jvp(kernels, (zeros,), (tangents,))
    return nngp, ntk


def _branch(step: int, depth: int, rule: BranchRule, k, other, store: _Store, inputs: list,
            hyper) -> None:
    """Add the sources ``(step, depth)`` of a branch whose inputs at each depth are ``inputs``."""
    new, here = (step, depth), inputs[depth]
    out = rule(_pair(k, store, here, here, k.x1_is_x2), other, hyper)
    store.cross[new, new] = (out.nngp, out.ntk)
    store.own[0][new, new], store.own[1][new, new] = out.cov1, out.cov2
    for i in range(depth):
        old, there = (step, i), inputs[i]
        store.cross[new, old] = _across(rule, k, other, store, here, there, hyper)
        store.cross[old, new] = (tuple(map(_swap, store.cross[new, old])) if k.x1_is_x2 else
                                 _across(rule, k, other, store, there, here, hyper))
        for side in (0,) if k.x1_is_x2 else (0, 1):  # x2 = x1: one side is the other
            own = _own_pairs(rule, k, other, store, here, there, side, hyper)
            store.own[side][new, old] = own
            store.own[side][old, new] = jnp.swapaxes(own, -1, -2)
        if k.x1_is_x2:
            store.own[1][new, old], store.own[1][old, new] = (store.own[0][new, old],
                                                              store.own[0][old, new])


def _plus(form: _Form, source: Source, k: Kernel) -> _Form:
    ones = (jnp.ones(k.shape1[:2], k.nngp.dtype), jnp.ones(k.shape2[:2], k.nngp.dtype))
    return _Form({**form.coefficients, source: ones})


def _normalized(form: _Form, store: _Store, norm: Norm) -> tuple[_Form, _Form]:
    """The stream over each token's standard deviation, and times the LayerNorm's weight."""
    var = [spatial_diagonal(store.own_cov(form, form, side), 1, False) + norm.eps
           for side in (0, 1)]
    scale = lambda c, w: (c[0] * w * jax.lax.rsqrt(var[0]), c[1] * w * jax.lax.rsqrt(var[1]))
    weight = 1.0 if norm.weight is None else norm.weight
    unit = _Form({s: scale(c, 1.0) for s, c in form.coefficients.items()})
    return unit, _Form({s: scale(c, weight) for s, c in form.coefficients.items()})


def _tangents(step: int, depth: int, norm: Norm, store: _Store, unit: _Form) -> None:
    """The tangent of a LayerNorm's trained weight and bias at ``depth``, ``dw * unit + db``: a
    source without NNGP, uncorrelated with the other copies' (distinct parameters)."""
    own = 0.0 if norm.weight is None else store.cross_cov(unit, unit, 0)
    store.cross[(step, depth), (step, depth)] = (None, own + (0.0 if norm.bias is None else 1.0))


def tied_stack_rule(steps: Sequence[Step], depth: int):
    """The kernel rule of ``depth`` applications of a residual block of ``steps`` sharing its
    weights (module doc); ``kernel_fn((k, other) or k, body_hyper)``, ``other`` the kernel of the
    stack's other input (token ids, or a decoder's memory)."""

    def kernel_fn(k, hyper) -> Kernel:
        k, other = k if isinstance(k, tuple) else (k, None)
        if not k.tokens or k.diagonal_spatial:
            raise UnsupportedLayerError("layers sharing weights need sequences (N, T, d) and the "
                                        "covariance of every pair of tokens.")
        store = _Store(k)
        form = _Form({("input",): (jnp.ones(k.shape1[:2], k.nngp.dtype),
                                   jnp.ones(k.shape2[:2], k.nngp.dtype))})
        seen = [[] for _ in steps]  # each branch's input at each depth
        for d in range(depth):
            for s, step in enumerate(steps):
                if isinstance(step, Branch):
                    seen[s].append(form)
                    _branch(s, d, step.rule, k, other, store, seen[s], hyper)
                    form = _plus(form, (s, d), k)
                    continue
                if not k.is_gaussian:
                    raise UnsupportedLayerError(
                        "a LayerNorm after the sum of the stack's input and a branch needs a "
                        "zero-mean Gaussian input to the stack (the output of a Linear, an "
                        "embedding, a LayerNorm); put an affine layer before it.")
                if step.bias not in (None, 0.0):
                    raise UnsupportedLayerError(
                        f"a LayerNorm with bias {step.bias} between layers that share weights: "
                        f"the rule needs its outputs centred (bias 0, torch's init).")
                unit, form = _normalized(form, store, step)
                if k.ntk is not None and (step.weight is not None or step.bias is not None):
                    _tangents(s, d, step, store, unit)
                    form = _plus(form, (s, d), k)
        out = _pair(k, store, form, form, k.x1_is_x2)
        return out if k.ntk is not None else out.replace(ntk=None)

    return kernel_fn


def tied(network: Layer, steps: Sequence[Step], depth: int,
         finish: Callable[[Kernel, tuple], Kernel]) -> Layer:
    """``network``, ``depth`` copies of a residual block of ``steps`` and what follows them (a
    final norm: ``finish(k, hyper)``), with the kernel rule of copies sharing one set of weights
    (module doc); its forward pass and parameters are ``network``'s.

    Example:
        >>> stack = tied(network, [Branch(attention), Norm(1e-5, 1.0, 0.0)], 2, lambda k, h: k)
    """
    rule = tied_stack_rule(steps, depth)

    def kernel_fn(k, hyper=None):
        hyper = network.hyper if hyper is None else hyper
        return finish(rule(k, hyper), hyper)

    return network._replace(kernel_fn=kernel_fn)
