"""Random-feature maps of the layers: F random channels whose Gram matrices average to the kernel.

Each channel of an infinite-width network's layer is an independent sample of one Gaussian
process, so F samples of it, scaled by ``1/sqrt(F)``, are features of its kernel. A layer's
feature map (``Layer.features``, written beside its ``kernel_fn``) maps F random channels of its
input to F random channels of its output, as its kernel rule maps kernels (kernels as the mean
over channels of ``z_j(x) z_j(y)``, as :func:`~ntbridge.stax.kernel.input_kernel` does):

* an affine layer (Dense, Conv) draws ``z_j = W_std * g_j . h / sqrt(fan_in) + b_std * c_j``
  (``g``, ``c`` standard normal, ``h`` its input's channels): given ``h``, a Gaussian whose
  covariance is the layer's NNGP rule applied to ``h``'s kernel; F of them are a random layer of
  width F (:func:`affine_features`);
* an elementwise activation acts on each channel (:func:`elementwise_features`);
* linear maps of positions (pooling, flattening, means, sums of branches) act on each channel
  (:func:`linear_features`).

The NTK has its own channels ``t``, Gaussian with the NTK as covariance and independent of ``z``
channel by channel (the recursion of Zandieh et al. 2021, "Scaling neural tangent kernels via
sketching and random features", with Gaussian projections as the sketches): an affine layer adds
a fresh sample of its own contribution (its NNGP in the NTK parameterization, ``sqrt(fan_in) g . h
/ sqrt(fan_in) + c`` in the standard one) to ``W_std`` times a fresh projection of ``t``; an
activation multiplies ``t`` by ``f'(z)`` entrywise, so that ``E[t t' f'(z) f'(z')] = NTK *
E[f'(z) f'(z')]``, the analytic rule.

A feature map is ``features(channels, sampler) -> Channels``: ``channels`` a :class:`Channels`,
or a tuple of them for a layer of several inputs (as ``kernel_fn`` takes kernels); ``sampler``
draws the layer's standard normal weights (:class:`Sampler`). It reads the hyper-parameters the
layer was built with, and raises :class:`~ntbridge.errors.UnsupportedLayerError` for inputs it
has no map for.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from ..errors import UnsupportedLayerError

Shape = tuple[int, ...]


class Channels(NamedTuple):
    """The random channels of one layer's output, channels first: ``z`` for the NNGP, ``t`` for
    the NTK (None before the first layer with parameters, or when the NTK is not asked for), both
    ``(N, F, *positions)`` (the network's input: ``(N, C, *positions)``); ``gaussian``: the
    channels are Gaussian (an activation needs it)."""

    z: jax.Array
    t: jax.Array | None
    gaussian: bool


class Sampler(NamedTuple):
    """What a layer's feature map draws from: ``draw(role, shape)``, standard normal weights of
    ``shape``, the same for every call with the same ``role`` (e.g. ``"nngp"``, ``"nngp bias"``)
    and independent across roles and layers; ``width``: F, the channels an affine layer makes;
    ``ntk``: whether the NTK's channels ``t`` are wanted."""

    draw: Callable[[str, Shape], jax.Array]
    width: int
    ntk: bool


Features = Callable[..., Channels]  # (Channels or a tuple of them, Sampler) -> Channels
Project = Callable[[jax.Array, jax.Array], jax.Array]


def affine_features(project: Project, window: Shape, fan_in: int, hyper: dict[str, float],
                    parameterization: str) -> Features:
    """The feature map of an affine layer (module doc). ``project(h, g)`` maps channels ``h``
    ``(N, C, *positions)`` through weights ``g`` ``(F, C, *window)`` (standard normal) scaled to
    unit variance per input, as the layer maps its input; ``fan_in`` is the layer's own (the NTK
    of the standard parameterization weighs its weights' contribution by it); ``hyper``: the
    layer's ``W_std`` and ``b_std`` (read from the layer's own dict, so that a network's
    description without hyper-parameter values, which keys its analytic programs, holds none)."""

    def features(c: Channels, sampler: Sampler) -> Channels:
        W_std, b_std = hyper["W_std"], hyper.get("b_std")
        shape = (c.z.shape[1], *window)
        spatial = (1,) * (c.z.ndim - 2)

        def sample(h, role, scale, shift):
            y = scale * project(h, sampler.draw(role, (sampler.width, *shape)))
            if shift is None:
                return y
            return y + shift * sampler.draw(role + " bias", (sampler.width,)).reshape(-1, *spatial)

        z = sample(c.z, "nngp", W_std, b_std)
        t = None
        if sampler.ntk:
            own = (sample(c.z, "ntk own", W_std, b_std)
                   if parameterization == "ntk" else
                   sample(c.z, "ntk own", math.sqrt(fan_in), None if b_std is None else 1.0))
            t = own if c.t is None else own + sample(c.t, "ntk carried", W_std, None)
        return Channels(z, t, True)

    return features


def elementwise_features(fn: Callable[[jax.Array], jax.Array]) -> Features:
    """The feature map of an activation ``fn`` applied to each entry: ``z -> fn(z)`` and ``t ->
    t * fn'(z)`` (autodiff's derivative, as the kernel rule's); it needs Gaussian channels."""

    def features(c: Channels, sampler: Sampler) -> Channels:
        if not c.gaussian:
            raise UnsupportedLayerError(
                "an activation needs Gaussian inputs (the output of a Linear/Conv layer, possibly "
                "pooled), as its analytic kernel does; put an affine layer before it.")
        if c.t is None:
            return Channels(fn(c.z), None, False)
        z, t = jax.jvp(fn, (c.z,), (c.t,))
        return Channels(z, t, False)

    return features


def linear_features(apply_fn: Callable) -> Features:
    """The feature map of a parameter-free map acting on each channel alike (pooling, flattening,
    means and sums over positions, sums of branches): ``apply_fn({}, x)`` (``x`` one input, or a
    tuple for several) applied to ``z`` and to ``t``; Gaussian channels stay Gaussian."""

    def features(channels: Channels | tuple[Channels, ...], sampler: Sampler) -> Channels:
        several = not isinstance(channels, Channels)
        cs = channels if several else (channels,)
        apply = lambda xs: apply_fn({}, tuple(xs) if several else xs[0])
        z = apply([c.z for c in cs])
        t = None if all(c.t is None for c in cs) else apply(
            [jnp.zeros_like(c.z) if c.t is None else c.t for c in cs])
        return Channels(z, t, all(c.gaussian for c in cs))

    return features


def refused(message: str) -> Features:
    """A feature map that raises :class:`~ntbridge.errors.UnsupportedLayerError` with
    ``message``, for a layer whose inputs or options have none."""

    def features(channels, sampler: Sampler) -> Channels:
        raise UnsupportedLayerError(message)

    return features
