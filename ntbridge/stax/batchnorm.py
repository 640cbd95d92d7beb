"""Eval-mode BatchNorm and other fixed per-channel maps ``y_c = a_c x_c + d_c`` (ConvNeXt's layer
scale): their kernel rule from the channels' constants, per block of a concatenation along
channels; BatchNorm in training mode has the exact forward only."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ShapeError, UnsupportedLayerError
from .channel_blocks import weighted_sum
from .kernel import Kernel
from .layers import Layer, channels_first
from .sources import SAMPLING, ChannelMap, Sources, pointwise, rule_of


class ChannelMoments(NamedTuple):
    """Channel means of the constants of eval-mode BatchNorm's map ``y_c = a_c x_c + d_c``, with
    ``s_c = sqrt(running_var_c + eps)``, ``a_c = gamma_c / s_c``, ``d_c = beta_c - a_c mu_c``
    (``gamma = 1``, ``beta = 0`` without the affine parameters).

    Attributes:
      scale2: ``mean_c a_c**2``; shift2: ``mean_c d_c**2``.
      weight: ``(mean_c 1 / s_c**2, mean_c mu_c**2 / s_c**2)`` for a trained ``gamma`` (None: none).
      bias: whether ``beta`` is trained.
      uniform: every ``a_c`` equal and every ``d_c`` zero (fresh buffers: ``a_c**2 = 1 / (1 +
        eps)``): the outputs stay i.i.d. centred Gaussians.
    """

    scale2: float
    shift2: float
    weight: tuple[float, float] | None
    bias: bool
    uniform: bool

    @classmethod
    def of(cls, cmap: ChannelMap) -> "ChannelMoments":
        """The moments of the channels of ``cmap``."""
        a, d, mu, s = (np.asarray(v) for v in (cmap.a, cmap.d, cmap.mu, cmap.s))
        mean = lambda t: float(np.mean(t))
        weight = (mean(1 / s ** 2), mean(mu ** 2 / s ** 2)) if cmap.gamma else None
        return cls(mean(a ** 2), mean(d ** 2), weight, cmap.beta,
                   bool((a == a[0]).all() and (d == 0).all()))

    @property
    def gaussian(self) -> bool:
        """Whether the map keeps a centred Gaussian input so: uniform constants and no trained
        gamma (whose gradient, the channel's own input, a nonlinearity's derivative would
        correlate with)."""
        return self.uniform and self.weight is None


def _eval_rule(moments: ChannelMoments, cmap: ChannelMap | None,
               name: str = "eval-mode BatchNorm"):
    """Eval-mode BatchNorm's kernel rule (see :func:`BatchNorm`), of a map that ``name`` names in
    messages."""

    def kernel_fn(k: Kernel) -> Kernel:
        if k.blocks is not None and cmap is not None:
            return _per_block(k, cmap, name)
        if not k.is_gaussian:
            if k.sources is not None and cmap is not None:
                return pointwise(k, cmap, name)
            raise UnsupportedLayerError(
                f"{name}'s kernel rule needs a zero-mean Gaussian input with i.i.d. channels (the "
                f"output of a Linear/Conv layer) or one made of Gaussian sources by layers with "
                f"rules for them (nonlinearities, residual sums, MaxPool); its input here is "
                f"neither: put it right after a Linear/Conv layer, or use "
                f"ntbridge.empirical_ntk / ntbridge.monte_carlo.")
        affine = lambda c: moments.scale2 * c + moments.shift2
        own = (0.0 if moments.weight is None else moments.weight[0] * k.nngp + moments.weight[1])
        ntk = None if k.ntk is None else moments.scale2 * k.ntk + own + float(moments.bias)
        # otherwise a nonlinearity after it needs the channels' map (stax.sources)
        sources = (None if moments.gaussian or cmap is None
                   else Sources(base=k, ops=(cmap,), rule=rule_of(k)))
        return k.replace(nngp=affine(k.nngp), ntk=ntk, cov1=affine(k.cov1), cov2=affine(k.cov2),
                         is_gaussian=moments.gaussian, sources=sources)

    return kernel_fn


def _per_block(k: Kernel, cmap: ChannelMap, name: str) -> Kernel:
    """BatchNorm of a concatenation along channels (DenseNet's ``norm(cat(features))``): each
    block mapped by its own channels' constants, the blocks kept for a nonlinearity after it
    (:mod:`.channel_blocks`)."""
    blocks, start = [], 0
    for block in k.blocks:
        stop = start + block.shape1[block.channel_axis]
        part = dataclasses.replace(cmap, **{field: getattr(cmap, field)[start:stop]
                                            for field in ("a", "d", "mu", "s")})
        blocks.append(_eval_rule(ChannelMoments.of(part), part, name)(block))
        start = stop
    shares = [b.shape1[k.channel_axis] / k.shape1[k.channel_axis] for b in blocks]
    out = weighted_sum(blocks, shares, False)
    return out.replace(shape1=k.shape1, shape2=k.shape2, blocks=tuple(blocks))


def ChannelScale(name: str, shape: tuple[int, ...], cmap: ChannelMap) -> Layer:
    """``x * gamma`` for a learned scale per channel ``gamma`` of ``shape`` ``(C, 1, ..., 1)``
    (channels first) or ``(C,)`` (channels last): ConvNeXt's layer scale. Its map is eval-mode
    BatchNorm's with ``a = gamma``, ``d = 0`` (``cmap``), and so is its kernel rule (a trained
    gamma's NTK term: the input's kernel). Param: ``name``, ``gamma`` itself (its values, which
    ``init_fn`` keeps: the model sets them).

    Example:
        >>> layer = ChannelScale("layer_scale", (4, 1, 1), ChannelMap((0.5,) * 4, (0.0,) * 4,
        ...                      (0.0,) * 4, (1.0,) * 4, True, False))
    """
    moments = ChannelMoments.of(cmap)
    rule = _eval_rule(moments, cmap, "a scale per channel")

    def init_fn(key, input_shape):
        if jnp.broadcast_shapes(tuple(input_shape), shape) != tuple(input_shape):
            raise ShapeError(f"a scale of shape {shape} broadcast against inputs "
                             f"{tuple(input_shape)} changes their shape.")
        return tuple(input_shape), {name: jnp.asarray(cmap.a).reshape(shape)}

    def kernel_fn(k: Kernel) -> Kernel:
        if len(k.shape1) - len(shape) != k.channel_axis:
            raise UnsupportedLayerError(
                f"a scale of shape {shape} multiplies axis {len(k.shape1) - len(shape)} of "
                f"outputs {k.shape1}, not their channels (axis {k.channel_axis}): only one scale "
                f"per channel has a kernel rule.")
        return rule(k)

    return Layer(init_fn, lambda params, x: x * params[name], kernel_fn,
                 replicates=0 if moments.gaussian else SAMPLING.replicates)


def _batch_statistics_refused(k: Kernel) -> Kernel:
    raise UnsupportedLayerError(
        "BatchNorm in training mode (or without running statistics) normalises with the batch's "
        "own mean and variance, which couple the examples: one pair's kernel depends on the whole "
        "batch, and there is no per-pair infinite-width kernel. Call model.eval() (running "
        "statistics: an exact rule), or use ntbridge.empirical_ntk / ntbridge.monte_carlo.")


def _fresh(name: str, channels: int) -> jax.Array:
    """torch's value of BatchNorm's tensor ``name`` in a fresh module (``reset_parameters``):
    ``weight`` and ``running_var`` ones, ``bias`` and ``running_mean`` zeros, no batch tracked."""
    if name == "num_batches_tracked":
        return jnp.zeros((), int)
    return (jnp.ones if name in ("weight", "running_var") else jnp.zeros)((channels,))


def BatchNorm(eps: float, moments: ChannelMoments | None, tensors: tuple[str, ...] = (),
              channel_map: ChannelMap | None = None) -> Layer:
    """torch's ``nn.BatchNormNd`` on ``(N, C, *S)``, normalising each channel.

    ``moments=None``: normalise with the batch's own mean and (biased) variance, as torch does in
    training mode or without running stats (examples then interact: no kernel rule). Otherwise
    eval mode, with the ``running_mean``/``running_var`` params and the channel means of the
    resulting constants (:class:`ChannelMoments`). Params: those two (when used) and the optional
    affine ``weight``/``bias``, each ``(C,)``. ``tensors``: the module's parameters and buffers by
    name, which ``init_fn`` draws as a fresh torch module holds them (:func:`_fresh`; Monte-Carlo
    samples of a fresh model).

    Kernel in eval mode: each channel is the fixed affine map ``y_c = a_c x_c + d_c`` of a
    zero-mean Gaussian input channel ``x_c`` independent of the constants, and a kernel is the
    channel mean of second moments, so the cross term ``a_c d_c (E x_c + E x'_c)`` vanishes:
    ``K' = mean(a**2) K + mean(d**2)`` (the same for ``cov1``/``cov2``). NTK: the carried NTK
    scales by ``mean(a**2)``; a trained ``gamma`` adds the second moment of ``dy/dgamma = (x -
    mu) / s``, ``mean(1/s**2) K + mean(mu**2 / s**2)``, a trained ``beta`` adds 1 (the affine
    parameters count as LayerNorm's do: the same in both parameterizations). Exact for any
    buffers when affine layers follow. Before a nonlinearity, uniform buffers without a trained
    gamma keep the output Gaussian; otherwise channels differ in scale and mean, or gamma's
    gradient, the channel's own input, correlates with the nonlinearity's derivative, and the
    output records ``channel_map`` for the nonlinearity's rule (:mod:`.sources`; in closed form
    for ReLU, LeakyReLU and Abs, :mod:`.orthant`).

    Example:
        >>> bn = BatchNorm(1e-5, ChannelMoments(1 / (1 + 1e-5), 0.0, (1 / (1 + 1e-5), 0.0), True,
        ...                                     True))
    """

    def apply_fn(params, x):
        shape = (1, -1) + (1,) * (x.ndim - 2)
        if moments is None:
            axes = (0,) + tuple(range(2, x.ndim))
            mean = x.mean(axes, keepdims=True)
            var = jnp.square(x - mean).mean(axes, keepdims=True)
        else:
            mean, var = params["running_mean"].reshape(shape), params["running_var"].reshape(shape)
        y = (x - mean) * jax.lax.rsqrt(var + eps)
        if "weight" in params:
            y = y * params["weight"].reshape(shape)
        return y + params["bias"].reshape(shape) if "bias" in params else y

    kernel_fn = _batch_statistics_refused if moments is None else _eval_rule(moments, channel_map)
    samples = channel_map is not None and not moments.gaussian

    def init_fn(key, input_shape):
        return tuple(input_shape), {name: _fresh(name, input_shape[1]) for name in tensors}

    return channels_first(Layer(init_fn, apply_fn, kernel_fn,
                                replicates=SAMPLING.replicates if samples else 0))
