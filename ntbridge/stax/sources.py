"""Non-Gaussian layer outputs as functions of independent Gaussian sources, and their kernels as a
deterministic numerical expectation.

In the infinite-width limit every channel of a layer's output is a function of independent
Gaussian sources, one per fresh weight matrix (a Linear/Conv layer's output, whose covariance over
every pair of points the ordinary rules give). Where a rule has no closed form for such an output
(a nonlinearity other than ReLU, LeakyReLU and Abs after eval-mode BatchNorm with shifts, after a
residual sum whose identity is not Gaussian, MaxPool), the kernel records how the output is made
(:class:`Sources`, ``Kernel.sources``) and computes its second moments numerically:

* for each kernel entry (a point ``a`` of an x1 example and ``b`` of an x2 example, or two points
  of one example for ``cov1``/``cov2``), ``points`` fixed, scrambled Sobol draws of each source at
  ``a`` and ``b`` jointly (the 2 x 2 covariance of that entry), in ``replicates`` independent
  scramblings (``Kernel.replicate`` picks one: the error estimate of
  ``covariances.evaluate_error``, as attention's rule);
* pushed through the elementwise maps (eval-mode BatchNorm's ``a_c x + d_c``, each sample
  belonging to one channel ``c``, nonlinearities) and sums with new independent sources;
* the NNGP is the samples' mean of ``y(a) y(b)``, the NTK that of the per-sample tangent
  ``T = sum_k D_k(a) D_k(b) Theta_k(a, b)`` over the sources ``k`` (``D_k``: the derivative of the
  output by source ``k``; cross terms of independent sources vanish in the limit), plus the terms
  of BatchNorm's trained ``gamma`` (``D(a) D(b) (h_a - mu)(h_b - mu) / s**2``) and ``beta``.

Memory: ``points * replicates`` samples of every entry of the kernel (tile the examples).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import UnsupportedLayerError
from .kernel import Kernel, safe_sqrt, variances
from .quadrature import correlation
from .softmax_moments import Rule

SAMPLING = Rule(points=256, replicates=8, seed=0, chunk=0)  # 2048 samples of every entry


@dataclasses.dataclass(frozen=True)
class ChannelMap:
    """Eval-mode BatchNorm's map of channel ``c``, ``y = a_c x + d_c`` (``a = gamma / s``,
    ``d = beta - a mu``, ``s = sqrt(running_var + eps)``), per channel, and whether ``gamma``
    and ``beta`` are trained (their NTK terms). Tuples of floats: a static part of a program."""

    a: tuple[float, ...]
    d: tuple[float, ...]
    mu: tuple[float, ...]
    s: tuple[float, ...]
    gamma: bool
    beta: bool

    @property
    def centred(self) -> bool:
        """No shift on any channel and, with a trained ``gamma``, no running mean."""
        return not any(self.d) and not (self.gamma and any(self.mu))


@dataclasses.dataclass(frozen=True)
class Samples:
    """Samples ``(S, *entry shape)`` of an output at both points of every entry: ``u``, ``v`` and
    the tangent ``t`` (None without the NTK) for ``nngp``; ``u1, v1`` for ``cov1``, ``u2, v2``
    for ``cov2``."""

    u: jax.Array
    v: jax.Array
    t: jax.Array | None
    u1: jax.Array
    v1: jax.Array
    u2: jax.Array
    v2: jax.Array


@dataclasses.dataclass(frozen=True)
class Sources:
    """How a non-Gaussian output is made: ``ops`` (elementwise maps, :class:`ChannelMap` or a
    function) applied to the Gaussian ``base``; or, where it is no such thing (after a residual
    sum, MaxPool), its ``samples``, drawn from ``count`` dimensions of the rule's points."""

    base: Kernel | None = None
    samples: Samples | None = None
    ops: tuple[Any, ...] = ()
    count: int = 2
    rule: Rule = SAMPLING


for _cls, _meta in ((Samples, []), (Sources, ["ops", "count", "rule"])):
    _fields = [f.name for f in dataclasses.fields(_cls)]
    jax.tree_util.register_dataclass(_cls, data_fields=[f for f in _fields if f not in _meta],
                                     meta_fields=_meta)


DIMENSIONS = 256  # the dimensions of one Sobol point set, shared by the sources of an entry


@functools.lru_cache(maxsize=16)
def _points(rule: Rule, block: int) -> np.ndarray:
    """``(replicates, points, DIMENSIONS)`` standard normals: scrambled Sobol points (seeded by
    the rule, the block of dimensions and the replicate), through the normal quantile."""
    from scipy.special import ndtri  # optional at import time: only numerical rules need it
    from scipy.stats import qmc

    out = []
    for r in range(rule.replicates):
        seed = np.random.default_rng([rule.seed, block, r])
        u = qmc.Sobol(DIMENSIONS, scramble=True, seed=seed).random(rule.points)
        out.append(ndtri(np.clip(u, 1e-12, 1 - 1e-12)))
    return np.stack(out)


def normals(k: Kernel, rule: Rule, dims: int, offset: int) -> jax.Array:
    """``(S, dims)`` standard normals for sources drawn at dimensions ``offset, ...`` of the
    rule's points (every replicate's, or ``k.replicate``'s): the sources of an entry share one
    Sobol point set (joint low discrepancy), up to :data:`DIMENSIONS`; beyond, independently
    scrambled sets; a window wider than one set, Gaussian samples."""
    block, start = divmod(offset, DIMENSIONS)
    if start + dims > DIMENSIONS:
        block, start = block + 1, 0
    if dims > DIMENSIONS:  # a large window: Gaussian samples (Monte-Carlo's order)
        rng = np.random.default_rng([rule.seed, offset, dims])
        z = rng.standard_normal((rule.replicates, rule.points, dims))
    else:
        z = _points(rule, block)[..., start:start + dims]
    return _replicate(k, jnp.asarray(z, k.nngp.dtype))


def _replicate(k: Kernel, a: jax.Array) -> jax.Array:
    """``a`` ``(replicates, points, ...)``: every replicate's entries in one axis, or those of
    ``k.replicate`` (a traced index: selected by a one-hot product, exact, not by a gather)."""
    if k.replicate is None:
        return a.reshape(-1, *a.shape[2:])
    pick = jnp.arange(a.shape[0]) == k.replicate
    return jnp.sum(jnp.where(pick.reshape(-1, *[1] * (a.ndim - 1)), a, 0), 0)


@functools.lru_cache(maxsize=64)
def _channel_table(rule: Rule, channels: int) -> tuple[np.ndarray, np.ndarray]:
    """``(replicates, points)`` channel of each sample and its weight (1 / the channel's count:
    every channel weighs the same). Each replicate gives its points to ``min(channels, points)``
    channels of a fixed permutation, in runs of consecutive points (runs of a Sobol sequence are
    spread evenly; every ``k``-th point is not); with more channels than points, the replicates
    take turns."""
    per = min(channels, rule.points)
    perm = np.random.default_rng([rule.seed, channels]).permutation(channels)
    block = np.arange(rule.points) * per // rule.points
    index = perm[(np.arange(rule.replicates)[:, None] * per + block[None]) % channels]
    weight = 1.0 / np.bincount(index.reshape(-1), minlength=channels)[index]
    return index, weight


def channels_of(k: Kernel, rule: Rule) -> tuple[jax.Array, jax.Array]:
    """Each sample's channel ``(S,)`` (ints) and weight ``(S,)``, as :func:`normals` orders them."""
    index, weight = _channel_table(rule, k.shape1[k.channel_axis])
    return (_replicate(k, jnp.asarray(index, jnp.int32)),
            _replicate(k, jnp.asarray(weight, k.nngp.dtype)))


def _pairs(c, q1, q2, z):
    """Samples ``(u, v)`` ``(S, *shape)`` of centred Gaussians of variances ``q1``, ``q2`` and
    covariance ``c`` (broadcasting), from normals ``z`` ``(S, 2)``. Through the correlation
    (clipped to [-1, 1]): ``q2 - c**2 / q1`` cancels for correlated points, and in float32 its
    rounding, grown through residual blocks, put a ResNet-34's NNGP 28% off."""
    shape = (z.shape[0], *jnp.broadcast_shapes(c.shape, q1.shape, q2.shape))
    e = lambda j: z[:, j].reshape(-1, *[1] * (len(shape) - 1))
    r1, r2, rho = correlation(c, q1, q2)
    u, v = r1 * e(0), r2 * (rho * e(0) + safe_sqrt((1 - rho) * (1 + rho)) * e(1))
    return jnp.broadcast_to(u, shape), jnp.broadcast_to(v, shape)


def gaussian_samples(k: Kernel, z: jax.Array) -> Samples:
    """Samples of the Gaussian outputs of kernel ``k`` at every entry, from normals ``z``."""
    q = variances(k)
    u, v = _pairs(k.nngp, *q["nngp"], z)
    u1, v1 = _pairs(k.cov1, *q["cov1"], z)
    u2, v2 = (u1, v1) if k.x1_is_x2 else _pairs(k.cov2, *q["cov2"], z)
    return Samples(u, v, None if k.ntk is None else jnp.broadcast_to(k.ntk, u.shape), u1, v1,
                   u2, v2)


def _per_sample(values: tuple[float, ...], index: jax.Array, ndim: int, dtype) -> jax.Array:
    return jnp.take(jnp.asarray(values, dtype), index).reshape(-1, *[1] * (ndim - 1))


def apply_op(op: Any, u: jax.Array, v: jax.Array, t: jax.Array | None, index: jax.Array):
    """One elementwise map ``op`` on samples ``u``, ``v`` of both points and their tangent ``t``
    (None: not carried); ``index``: each sample's channel."""
    if isinstance(op, ChannelMap):
        a, d, mu, s = (_per_sample(vals, index, u.ndim, u.dtype)
                       for vals in (op.a, op.d, op.mu, op.s))
        if t is not None:
            own = (u - mu) * (v - mu) / (s * s) if op.gamma else 0.0
            t = a * a * t + own + float(op.beta)
        return a * u + d, a * v + d, t
    if t is None:
        return op(u), op(v), None
    (fu, du), (fv, dv) = (jax.jvp(op, (x,), (jnp.ones_like(x),)) for x in (u, v))
    return fu, fv, du * dv * t


def apply_ops(ops: tuple[Any, ...], s: Samples, index: jax.Array) -> Samples:
    """The maps ``ops``, in order, on every entry's samples."""
    u, v, t, u1, v1, u2, v2 = (s.u, s.v, s.t, s.u1, s.v1, s.u2, s.v2)
    same = u2 is u1
    for op in ops:
        u, v, t = apply_op(op, u, v, t, index)
        u1, v1, _ = apply_op(op, u1, v1, None, index)
        u2, v2, _ = (u1, v1, None) if same else apply_op(op, u2, v2, None, index)
    return Samples(u, v, t, u1, v1, u2, v2)


def _mean(x: jax.Array, weight: jax.Array) -> jax.Array:
    """The weighted mean over the samples (axis 0), as a product with the weights."""
    return jnp.tensordot(weight / jnp.sum(weight), x, (0, 0), precision=jax.lax.Precision.HIGHEST)


def sampled_kernel(k: Kernel, sources: Sources, samples: Samples) -> Kernel:
    """``k`` with the second moments of ``samples`` and with ``sources`` (not Gaussian)."""
    _, weight = channels_of(k, sources.rule)
    cov1 = _mean(samples.u1 * samples.v1, weight)
    return k.replace(nngp=_mean(samples.u * samples.v, weight),
                     ntk=None if samples.t is None or k.ntk is None else _mean(samples.t, weight),
                     cov1=cov1,
                     cov2=cov1 if k.x1_is_x2 else _mean(samples.u2 * samples.v2, weight),
                     is_gaussian=False, sources=sources)


def rule_of(k: Kernel) -> Rule:
    """The rule of ``k``'s numerical expectations: its network's (``Kernel.sampling``), or the
    default."""
    return k.sampling or SAMPLING


def materialize(k: Kernel, offset: int) -> tuple[Samples, int] | None:
    """The samples of ``k``'s outputs, a Gaussian one drawn at dimensions ``offset, offset + 1``
    of the rule's points, and how many dimensions they take (:func:`normals`; samples recorded
    already start at 0); None where ``k`` records no sources."""
    if k.sources is not None and k.sources.samples is not None:
        return k.sources.samples, k.sources.count
    if k.sources is not None:
        base, ops, rule = k.sources.base, k.sources.ops, k.sources.rule
    elif k.is_gaussian:
        base, ops, rule = k, (), rule_of(k)
    else:
        return None
    index, _ = channels_of(k, rule)
    return apply_ops(ops, gaussian_samples(base, normals(k, rule, 2, offset)), index), 2


def pointwise(k: Kernel, op: Any, name: str) -> Kernel:
    """The kernel after the elementwise map ``op`` of outputs recorded by ``k.sources``."""
    src = k.sources
    if src is None:
        raise UnsupportedLayerError(
            f"{name}'s kernel rule needs a Gaussian input or one made of Gaussian sources by "
            f"layers with a rule for them, but its input is the raw data or the output of a layer "
            f"that mixes positions or examples after a nonlinearity; put an affine layer before "
            f"it, or use ntbridge.empirical_ntk / ntbridge.monte_carlo.")
    index, _ = channels_of(k, src.rule)
    if src.samples is None:
        new = dataclasses.replace(src, ops=src.ops + (op,))
        return sampled_kernel(k, new, materialize(k.replace(sources=new), 0)[0])
    samples = apply_ops((op,), src.samples, index)
    return sampled_kernel(k, dataclasses.replace(src, samples=samples), samples)


def sum_sources(ks: tuple[Kernel, ...]) -> Kernel:
    """The kernel of a sum of independent outputs, at least one of them recorded by sources: at
    most one of them sampled already (a residual block's identity), the others Gaussian or
    elementwise maps of one, each drawn as new sources."""
    stored = [k for k in ks if k.sources is not None and k.sources.samples is not None]
    made, rule = [materialize(k, 0) for k in stored], rule_of(ks[0])
    count = sum(n for _, n in made)
    for k in ks:
        if k.sources is None or k.sources.samples is None:
            made.append(materialize(k, count))
            count += 2
    if len(stored) > 1 or any(m is None for m in made):
        raise UnsupportedLayerError(
            "a sum of branches whose rule needs samples: each branch must be Gaussian (ending in "
            "a Linear/Conv layer, perhaps with an eval-mode BatchNorm) or an elementwise map of "
            "one, except one (the identity of a residual block); this sum has a branch of another "
            "kind or two non-Gaussian identities. Use ntbridge.monte_carlo.")
    total = functools.reduce(lambda a, b: jax.tree.map(jnp.add, a, b), [s for s, _ in made])
    return sampled_kernel(ks[0], Sources(samples=total, count=count, rule=rule), total)


def channel_map(k: Kernel) -> ChannelMap | None:
    """The BatchNorm map of ``k``'s outputs where they are that map of a Gaussian; else None."""
    src = k.sources
    one = src is not None and src.samples is None and len(src.ops) == 1 and src.ops[0]
    return one if isinstance(one, ChannelMap) else None
