"""Indexing and reductions of a layer's outputs ``(N, C, *S)``: torch's ``x[key]`` (``narrow``,
``select``), ``x.sum(dim)`` / ``x.mean(dim)``, ``x.unsqueeze(dim)`` and ``torch.stack``.

Along a spatial axis (``d >= 2``) each is a fixed linear map of the positions, the same for every
channel and example, and its kernel rule is exact for any input: a selection (slices and integers
pick one position per output: it runs on the diagonal layout too) or a sum (mean) over the axis
(which needs the full spatial covariance).

Along the channel axis the kernel is a channel average, which determines a selection or a
reduction only when the channels are independent and identically distributed: the outputs of a
Linear/Conv layer (``is_gaussian``). Then a selection keeps the kernel, and the mean (sum) of
``C`` channels divides (multiplies) it by ``C``, NNGP and NTK alike (exact in the limit of the
widths before that layer, ``C`` its actual channel count). The model's input channels (the kernel
only keeps their average), channels after a concatenation, a nonlinearity or a normalization are
refused; slice the input before the model, or the pre-activations (elementwise functions commute
with a selection).

Removing an axis (an integer index, ``keepdim=False``) drops a spatial axis of size 1 (the
kernel's axes reshaped); a removed channel axis gives its place to the first spatial axis, whose
positions become the channels: the kernel is their mean, as after ``Flatten``.
"""

from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
import numpy as np

from ..errors import ShapeError, UnsupportedLayerError
from .combinators import concat_kernels, same_shapes
from .features import Channels, Sampler, linear_features
from .kernel import Kernel, map_arrays
from .layers import Layer, channels_first
from .pooling import separable_linear
from .reshape import Flatten, axis_of, reshaped
from .sequence import TokenMean, TokenSelect

Key = tuple  # of ints, slices and at most one Ellipsis, as in x[key]


def _positions(k: Kernel, axis: int, matrix: np.ndarray, name: str) -> Kernel:
    """``k`` with ``matrix (out, in)`` applied along spatial ``axis`` (a selection when each row
    has one 1)."""
    ms = [matrix if d == axis else None for d in range(2, len(k.shape1))]
    selection = bool((matrix.sum(1) == 1).all() and ((matrix == 0) | (matrix == 1)).all())
    return separable_linear(None, lambda spatial: ms, name, one_per_row=selection).kernel_fn(k)


def _channels(k: Kernel, count: int, scale: float, name: str) -> Kernel:
    """``k`` for ``count`` channels taken (``scale=1``), averaged or summed from i.i.d. ones."""
    if not k.is_gaussian:
        raise UnsupportedLayerError(
            f"{name} of channels needs independent, identically distributed channels (a Linear "
            f"or Conv layer's outputs): the kernel only keeps their average. Select or reduce "
            f"the input before the model, or the pre-activations (before the nonlinearity), or "
            f"use ntbridge.empirical_ntk / ntbridge.monte_carlo.")
    shape = lambda s: (s[0], count, *s[2:])
    return map_arrays(k, lambda a, n: scale * a).replace(shape1=shape(k.shape1),
                                                          shape2=shape(k.shape2))


def _squeeze(k: Kernel, axis: int, name: str) -> Kernel:
    """``k`` with axis ``axis`` (of size 1) removed (see module doc)."""
    drop = lambda s: (*s[:axis], *s[axis + 1:])
    if axis >= 2:
        return reshaped(k, drop(k.shape1), drop(k.shape2))
    if len(k.shape1) == 2:
        raise UnsupportedLayerError(
            f"{name} leaves one number per example, which has no kernel layout here: keep the "
            f"axis (h[:, 0:1], keepdim=True).")
    return Flatten(1, 2).kernel_fn(k)


def _of_tokens(k: Kernel, kept: dict[int, list[int]], removed: list[int], name: str) -> Kernel:
    """``x[:, i]`` of sequences ``(N, T, d)`` (:mod:`.sequence`): one token's entry of the kernel.
    Other selections of sequences have no rule here."""
    if removed == [1] and list(kept) == [1]:
        return TokenSelect(kept[1][0]).kernel_fn(k)
    raise UnsupportedLayerError(
        f"{name} of sequences (N, T, d) has a kernel rule for one token, x[:, i], only; select "
        f"tokens or features of the input before the model, or use ntbridge.empirical_ntk / "
        f"ntbridge.monte_carlo.")


def _selections(key: Key, shape: tuple[int, ...]) -> tuple[dict[int, list[int]], list[int]]:
    """``x[key]`` for ``x`` of ``shape`` as ``({axis: kept indices}, [removed axes])``."""
    key = key if isinstance(key, tuple) else (key,)
    if key.count(Ellipsis) > 1 or len(key) - key.count(Ellipsis) > len(shape):
        raise ShapeError(f"index {key} is too long for inputs of shape {shape}")
    if Ellipsis in key:
        i = key.index(Ellipsis)
        key = (*key[:i], *[slice(None)] * (len(shape) - len(key) + 1), *key[i + 1:])
    key = (*key, *[slice(None)] * (len(shape) - len(key)))
    kept, removed = {}, []
    for axis, (entry, size) in enumerate(zip(key, shape)):
        if isinstance(entry, slice):
            if entry.step is not None and entry.step <= 0:
                raise ShapeError(f"slice step {entry.step}: torch takes positive steps only")
            indices = list(range(*entry.indices(size)))
        else:
            if not -size <= entry < size:
                raise ShapeError(f"index {entry} is out of range for axis {axis} of size {size}")
            indices, removed = [entry % size], removed + [axis]
        if indices != list(range(size)):
            kept[axis] = indices
    if 0 in kept or 0 in removed:
        raise UnsupportedLayerError("indexing the batch axis 0 selects examples; the kernel is per "
                                    "example: index the inputs instead.")
    return kept, removed


def Index(key: Key, name: str = "indexing") -> Layer:
    """torch's ``x[key]`` for ``key`` a tuple of ints, positive-step slices and at most one
    Ellipsis (``x[:, 0]``, ``x[..., 2:5]``, ``x.narrow(d, s, n)`` is ``[..., s:s + n]`` on ``d``).

    Example:
        >>> Index((slice(None), slice(None), slice(1, 3))).init_fn(None, (5, 8, 4))[0]
        (5, 8, 2)
    """

    def out_shape(shape):
        kept, removed = _selections(key, tuple(shape))
        return tuple(len(kept.get(a, range(n))) for a, n in enumerate(shape) if a not in removed)

    def kernel_fn(k: Kernel) -> Kernel:
        kept, removed = _selections(key, k.shape1)
        if k.tokens:
            return _of_tokens(k, kept, removed, name)
        for axis, indices in kept.items():
            if axis == 1:
                k = _channels(k, len(indices), 1.0, name)
            else:
                k = _positions(k, axis, np.eye(k.shape1[axis])[indices], name)
        for axis in reversed(removed):
            k = _squeeze(k, axis, name)
        return k

    return Layer(lambda _, shape: (out_shape(shape), {}), lambda params, x: x[key], kernel_fn,
                 full_spatial=False, affine=True)


def Chunk(index: int, chunks: int, dim: int) -> Layer:
    """torch's ``x.chunk(chunks, dim)[index]`` along the feature axis (the last axis of vectors
    and of sequences ``(N, T, d)``, axis 1 of channels-first inputs): a subset of i.i.d. units,
    whose kernel per unit is the input's; the other axes are refused (index them instead).

    Example:
        >>> Chunk(1, 2, -1).init_fn(None, (5, 8))[0]
        (5, 4)
    """

    def index_layer(shape: tuple[int, ...]) -> Layer:
        axis = axis_of(dim, len(shape), "dim")
        size = -(-shape[axis] // chunks)  # torch's: the last chunk may be smaller
        entry = slice(index * size, min((index + 1) * size, shape[axis]))
        return Index((slice(None),) * axis + (entry,), name=f"chunk {index} of {chunks}")

    def kernel_fn(k: Kernel) -> Kernel:
        axis = axis_of(dim, len(k.shape1), "dim")
        if axis != (len(k.shape1) - 1 if k.tokens else 1):
            raise UnsupportedLayerError(
                f"chunk({chunks}, dim={dim}) of inputs {k.shape1} splits an axis of positions; "
                f"only the features (channels) are chunked here: index positions with x[..., a:b].")
        return index_layer(k.shape1).kernel_fn(k)

    return Layer(lambda key, shape: index_layer(tuple(shape)).init_fn(key, shape),
                 lambda params, x: index_layer(x.shape).apply_fn(params, x), kernel_fn,
                 full_spatial=False, affine=True)


def Reduce(dims: Sequence[int], keepdim: bool = False, mean: bool = True,
           name: str = "mean") -> Layer:
    """torch's ``x.mean(dims, keepdim)`` (``mean=False``: ``x.sum``) over non-batch ``dims``.

    Example:
        >>> Reduce((-1,)).init_fn(None, (5, 8, 4))[0]
        (5, 8)
    """

    def axes(shape):
        found = sorted({axis_of(d, len(shape), "dim") for d in dims})
        if 0 in found:
            raise UnsupportedLayerError(f"{name} over the batch axis 0 mixes examples; the kernel "
                                        f"is per example: reduce the non-batch axes only.")
        return found

    def out_shape(shape):
        found = axes(shape)
        return tuple(1 if a in found else n for a, n in enumerate(shape)
                     if keepdim or a not in found)

    def kernel_fn(k: Kernel) -> Kernel:
        found = axes(k.shape1)
        if k.tokens:  # sequences (N, T, d): the mean over tokens, x.mean(1), has a rule
            if found != [1] or keepdim:
                raise UnsupportedLayerError(
                    f"{name} over dims {tuple(dims)} of sequences (N, T, d): only the mean or "
                    f"sum over the tokens, x.mean(1), has a kernel rule here.")
            tokens, k = k.shape1[1], TokenMean().kernel_fn(k)
            return k if mean else map_arrays(k, lambda a, n: tokens ** 2 * a)
        for axis in found:
            size = k.shape1[axis]
            if axis == 1:  # the mean of C i.i.d. channels has 1/C their kernel, their sum C
                k = _channels(k, 1, 1 / size if mean else float(size), name)
            else:
                k = _positions(k, axis, np.full((1, size), 1 / size if mean else 1.0), name)
        for axis in [] if keepdim else reversed(found):
            k = _squeeze(k, axis, name)
        return k

    # positions are mixed by a reduction over a spatial axis, and over the tokens of sequences,
    # x.mean(1) (without keepdim: the one form with a rule there); the layers before then keep
    # every pair of positions. keepdim=True over dim 1 alone is a channel mean (N, 1, *S), which
    # mixes no positions.
    reduce = jnp.mean if mean else jnp.sum
    apply_fn = lambda params, x: reduce(x, axis=tuple(axes(x.shape)), keepdims=keepdim)
    linear = linear_features(apply_fn)

    def features(c: Channels, sampler: Sampler) -> Channels:
        if any(d % c.z.ndim in (0, 1) for d in dims):
            raise UnsupportedLayerError("a mean or sum over channels has no random-features "
                                        "rule; use ntbridge.kernel.")
        return linear(c, sampler)

    return Layer(lambda _, shape: (out_shape(shape), {}), apply_fn, kernel_fn,
                 full_spatial=not keepdim or any(d != 1 for d in dims), affine=True,
                 features=features)


def _inserted(shape: tuple[int, ...], dim: int) -> tuple[int, ...]:
    axis = axis_of(dim, len(shape) + 1, "dim")
    if axis < 2:
        raise UnsupportedLayerError(
            f"a new axis at dim={dim} goes before the channels; the kernel has a rule for new "
            f"spatial axes (dim >= 2) only.")
    return (*shape[:axis], 1, *shape[axis:])


def Unsqueeze(dim: int) -> Layer:
    """torch's ``x.unsqueeze(dim)`` for a new spatial axis (``dim >= 2``): the kernel reshaped.

    Example:
        >>> Unsqueeze(-1).init_fn(None, (5, 8))[0]
        (5, 8, 1)
    """

    def apply_fn(params, x):
        return x.reshape(_inserted(x.shape, dim))

    kernel_fn = lambda k: reshaped(k, _inserted(k.shape1, dim), _inserted(k.shape2, dim))
    return channels_first(Layer(lambda _, shape: (_inserted(tuple(shape), dim), {}), apply_fn,
                                kernel_fn, affine=True))


def FanInStack(dim: int) -> Layer:
    """torch's ``torch.stack(xs, dim)`` along a new spatial axis (``dim >= 2``): each branch
    unsqueezed, then concatenated (see :func:`~.combinators.FanInConcat`: exact when the branches
    are uncorrelated, which ``ntbridge.convert`` checks).

    Example:
        >>> FanInStack(2).init_fn(None, ((5, 8), (5, 8), (5, 8)))[0]
        (5, 8, 3)
    """

    def init_fn(key, shapes):
        same_shapes(shapes)
        new = _inserted(tuple(shapes[0]), dim)
        axis = axis_of(dim, len(new), "dim")
        return (*new[:axis], len(shapes), *new[axis + 1:]), {}

    def kernel_fn(ks):
        same_shapes([k.shape1 for k in ks])
        ks = [Unsqueeze(dim).kernel_fn(k) for k in ks]
        return concat_kernels(ks, axis_of(dim, len(ks[0].shape1), "dim"))

    return channels_first(Layer(init_fn, lambda params, xs: jnp.stack(xs, dim), kernel_fn,
                                affine=True))
