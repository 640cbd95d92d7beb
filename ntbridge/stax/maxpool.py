"""The kernel of max pooling (torch's ``nn.MaxPool{n}d``, ``nn.AdaptiveMaxPool{n}d``), a numerical
expectation (:mod:`.sources`).

Its input must be Gaussian or an elementwise map of a Gaussian output ``h`` (``conv -> ReLU``,
``conv -> BatchNorm -> ReLU``): then an output entry ``(a, b)`` is a function of ``h`` at the ``W``
positions of ``a``'s window and the ``W`` of ``b``'s, jointly Gaussian with the ``2W x 2W``
covariance that ``h``'s kernel holds (every pair of positions: the full spatial layout). The
rule draws them (scrambled Sobol points, factor of that covariance per entry), applies the
elementwise maps and takes each window's maximum (padding never wins, as torch pads with
``-inf``). The NTK goes through the argmax: a sample's tangent is that of the winning positions,
``D(a*) D(b*) Theta(a*, b*)`` (the maps' derivative factors at the winners, ``h``'s NTK between
them, and BatchNorm's own terms), as autodiff of the maximum sees it.

Cost: ``2W`` normals and a ``2W x 2W`` factorization per entry and sample set, ``S * 2W`` values
per entry (``W``: the window's size).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import UnsupportedLayerError
from .kernel import Kernel, spatial_diagonal
from .softmax_moments import psd_factor
from .sources import (Samples, Sources, apply_op, channels_of, normals, rule_of,
                      sampled_kernel)

Windows = Callable[[tuple[int, ...]], list[tuple[np.ndarray, np.ndarray]]]


def pool_windows(length: int, count: int, size: int, stride: int, pad: int,
                 dilation: int) -> tuple[np.ndarray, np.ndarray]:
    """``(index, valid)``, each ``(count, size)``: the input position of offset ``j`` of output
    ``o``'s window, ``o * stride + j * dilation - pad`` (clipped), and whether it is inside."""
    index = np.arange(count)[:, None] * stride + np.arange(size)[None] * dilation - pad
    valid = (index >= 0) & (index < length)
    return np.clip(index, 0, length - 1), valid


def adaptive_pool_windows(bounds: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """``(index, valid)`` of adaptive windows ``[lo, hi)``, padded to the largest."""
    size = max(hi - lo for lo, hi in bounds)
    offsets = np.arange(size)[None]
    lo, hi = (np.array(b)[:, None] for b in zip(*bounds))
    return np.minimum(lo + offsets, hi - 1), offsets < hi - lo


def _gather(a: jax.Array, n_batch: int, index: list[np.ndarray]) -> jax.Array:
    """A kernel array ``(batch, S1, S1', S2, S2', ...)`` at every pair of window positions:
    ``(batch, O1, O1', O2, O2', ..., W, W')`` (``W``: the offsets of all dims, row-major)."""
    ndim = len(index)
    for d in reversed(range(ndim)):
        count, size = index[d].shape
        for axis in (n_batch + 2 * d + 1, n_batch + 2 * d):
            a = jnp.take(a, jnp.asarray(index[d].reshape(-1)), axis=axis)
            a = a.reshape(*a.shape[:axis], count, size, *a.shape[axis + 1:])
    outs = [n_batch + 4 * d + s for d in range(ndim) for s in (0, 2)]
    offsets = [[n_batch + 4 * d + s for d in range(ndim)] for s in (1, 3)]
    a = jnp.transpose(a, [*range(n_batch), *outs, *offsets[0], *offsets[1]])
    w = int(np.prod([i.shape[1] for i in index]))
    return a.reshape(*a.shape[:n_batch + 2 * ndim], w, w)


def _own(a: jax.Array, n_batch: int) -> jax.Array:
    """Same-output entries ``(batch, O1, O2, ..., W, W')`` of a gathered array."""
    a = jnp.moveaxis(a, (-2, -1), (0, 1))
    return jnp.moveaxis(spatial_diagonal(a, n_batch + 2, False), (0, 1), (-2, -1))


def _side(a: jax.Array, n_batch: int, batch_axis: int | None, side: int,
          trailing: int = 2) -> jax.Array:
    """Same-output blocks ``(N, O1, ..., *trailing axes)`` shaped to broadcast against the entries
    of a pair layout: ``batch_axis`` 0 or 1 of ``(N1, N2, ...)`` (None: one batch axis), ``side``
    0 for the first of each output pair, 1 for the second."""
    ndim = a.ndim - n_batch - trailing
    shape = list(a.shape[:n_batch])
    if batch_axis is not None:
        shape = [shape[0], 1] if batch_axis == 0 else [1, shape[0]]
    for size in a.shape[n_batch:n_batch + ndim]:
        shape += [size, 1] if side == 0 else [1, size]
    return a.reshape(*shape, *a.shape[a.ndim - trailing:])


def _joint(first: jax.Array, cross: jax.Array, second: jax.Array) -> jax.Array:
    """The ``(..., 2W, 2W)`` covariance of both windows from its blocks (broadcasting)."""
    shape = jnp.broadcast_shapes(first.shape, cross.shape, second.shape)
    first, cross, second = (jnp.broadcast_to(b, shape) for b in (first, cross, second))
    top = jnp.concatenate([first, cross], -1)
    return jnp.concatenate([top, jnp.concatenate([jnp.swapaxes(cross, -1, -2), second], -1)], -2)


def _replay(ops, u, v, t, index):
    """The maps ``ops`` on samples ``u``, ``v`` with their tangent ``t`` (None: not carried)."""
    for op in ops:
        u, v, t = apply_op(op, u, v, t, index)
    return u, v, t


def _window_max(joint, ntk, valid, ops, z, index, chunk: int = 64):
    """The samples ``(u, v, t)`` ``(S, ...)`` of both windows' maxima for covariances ``joint``
    ``(..., 2W, 2W)``, the NTK between the windows ``ntk`` (``(..., W, W)``, or None), whether
    each position is inside ``valid`` (two arrays broadcasting to ``(..., W)``), the elementwise
    ``ops`` before the maximum, normals ``z`` ``(S, 2W)`` and each sample's channel ``index``;
    ``chunk`` samples at a time (the window values of all entries: ``chunk * 2W`` per entry)."""
    w = joint.shape[-1] // 2
    floor = 1e-8 if joint.dtype == jnp.float64 else 1e-4  # windows repeat positions
    factor = psd_factor(joint, floor)
    pick = lambda a, i: jnp.take_along_axis(a, i, -1)[..., 0]

    def some(args):
        zc, ic = args
        h = jnp.einsum("...ij,sj->s...i", factor, zc, precision=jax.lax.Precision.HIGHEST)
        hu, hv = h[..., :w], h[..., w:]
        fu, fv, _ = _replay(ops, hu, hv, None, ic)
        best = [jnp.argmax(jnp.where(ok, f, -jnp.inf), -1)[..., None]
                for ok, f in zip(valid, (fu, fv))]
        t = None
        if ntk is not None:
            rows = jnp.take_along_axis(jnp.broadcast_to(ntk, h.shape[:-1] + (w, w)),
                                       best[0][..., None], -2)[..., 0, :]
            t = pick(rows, best[1])
        return _replay(ops, pick(hu, best[0]), pick(hv, best[1]), t, ic)

    chunk = min(chunk, z.shape[0])
    out = jax.lax.map(some, (z.reshape(-1, chunk, z.shape[1]), index.reshape(-1, chunk)))
    return jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:]), out)


def _entries(k: Kernel, base: Kernel, index: list[np.ndarray], masks: np.ndarray, z, ops, chan):
    """The samples of every entry of the output kernel (:class:`Samples`)."""
    own1 = _own(_gather(base.cov1, 1, index), 1)
    own2 = own1 if k.x1_is_x2 else _own(_gather(base.cov2, 1, index), 1)
    ntk = None if base.ntk is None else _gather(base.ntk, 2, index)
    sides = lambda batch: [_side(jnp.asarray(masks)[None], 1, batch, s, 1) for s in (0, 1)]
    u, v, t = _window_max(_joint(_side(own1, 1, 0, 0), _gather(base.nngp, 2, index),
                                 _side(own2, 1, 1, 1)), ntk, sides(0), ops, z, chan)
    cov = lambda c, own: _window_max(_joint(_side(own, 1, None, 0), _gather(c, 1, index),
                                            _side(own, 1, None, 1)), None, sides(None), ops, z,
                                     chan)[:2]
    u1, v1 = cov(base.cov1, own1)
    u2, v2 = (u1, v1) if k.x1_is_x2 else cov(base.cov2, own2)
    return Samples(u, v, t, u1, v1, u2, v2)


def max_rule(windows: Windows, name: str) -> Callable[[Kernel], Kernel]:
    """The kernel rule of a max pooling whose windows along each spatial dim of inputs of
    spatial shape ``S`` are ``windows(S)`` (a list of ``(index, valid)``, :func:`pool_windows`)."""

    def kernel_fn(k: Kernel) -> Kernel:
        if k.is_gaussian:
            base, ops = k, ()
        elif k.sources is not None and k.sources.samples is None:
            base, ops = k.sources.base, k.sources.ops
        else:
            raise UnsupportedLayerError(
                f"{name}'s kernel rule needs a Gaussian input or an elementwise map of one "
                f"(conv -> ReLU, conv -> BatchNorm -> ReLU), whose values in a window are jointly "
                f"Gaussian before the map; its input here is the raw data, or comes after a "
                f"residual sum, another MaxPool or a layer mixing positions after a nonlinearity. "
                f"Use ntbridge.monte_carlo, or average pooling.")
        if k.diagonal_spatial:
            raise UnsupportedLayerError(f"{name} compares positions: its kernel rule needs the "
                                        f"full spatial covariance (diagonal_spatial=False)")
        wins = windows(k.spatial_shape)
        index = [i for i, _ in wins]
        masks = np.ones(())
        for _, valid in wins:
            masks = np.multiply.outer(masks, valid)  # (O1, J1, O2, J2, ...)
        ndim = len(wins)
        masks = masks.transpose([2 * d for d in range(ndim)] + [2 * d + 1 for d in range(ndim)])
        masks = masks.reshape(*masks.shape[:ndim], -1)
        out = tuple(i.shape[0] for i in index)
        rule = rule_of(k)
        z = normals(k, rule, 2 * masks.shape[-1], 0)
        chan, _ = channels_of(k, rule)
        samples = _entries(k, base, index, masks, z, ops, chan)
        shaped = k.replace(shape1=(*k.shape1[:2], *out), shape2=(*k.shape2[:2], *out))
        return sampled_kernel(shaped, Sources(samples=samples, count=z.shape[1], rule=rule),
                              samples)

    return kernel_fn
