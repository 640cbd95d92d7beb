"""Normalization layers: LayerNorm, RMSNorm and BatchNorm (a kernel rule in eval mode; in training mode,
the exact forward only)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ShapeError, UnsupportedLayerError
from .channel_blocks import weighted_sum
from .kernel import Kernel, _diagonal_variances, variances
from .layers import Layer, channels_first
from .sources import SAMPLING, ChannelMap, Sources, pointwise, rule_of


def LayerNorm(normalized_shape: tuple[int, ...], eps: float, weight: float | None = None,
              bias: float | None = None) -> Layer:
    """torch's ``nn.LayerNorm(normalized_shape, eps)`` over every non-batch axis, ``(N, C, *S)``,
    or over each position's features of sequences ``(N, T, d)`` or channels-last images ``(N, *S,
    d)`` (``normalized_shape = (d,)``: the same rule per position, with its own variance ``v_s``).

    ``weight``/``bias`` are the affine parameters' values, each constant over its entries (None:
    no such parameter). Forward: ``(x - mean) / sqrt(var + eps) * weight + bias`` per example.
    Kernel (Neural Tangents' LayerNorm, with torch's eps): in the infinite-width limit each
    example's mean over its entries is 0 and its variance is ``v`` = the mean over positions of its
    covariance diagonal, so ``K -> K / sqrt((v1 + eps)(v2 + eps))``, the NTK likewise (the
    projection off the example's own direction is one direction out of infinitely many). The
    trained affine parameters add ``weight**2`` to the carried NTK's factor, their own
    ``K_normalized + 1`` (weight, bias) to the NTK and ``bias**2`` to the NNGP.

    Example:
        >>> layer = LayerNorm((64,), 1e-5, weight=1.0, bias=0.0)
    """
    return _normalization("LayerNorm", tuple(normalized_shape), eps, weight, bias, centred=True)


def RMSNorm(normalized_shape: tuple[int, ...], eps: float, weight: float | None = None) -> Layer:
    """torch's ``nn.RMSNorm(normalized_shape, eps)`` (and Llama's): ``x / sqrt(mean(x**2) + eps)
    * weight``, over the same axes as :func:`LayerNorm`'s (per token for ``(N, T, d)``).

    ``weight``: the scale's value, constant over its entries (None: no scale); a size -1 in
    ``normalized_shape`` takes the input's, whatever it is (a hand-written norm of the last axis).
    Kernel: in the
    infinite-width limit the mean square over the normalized entries is the mean of the covariance
    diagonal ``v`` (a law of large numbers over i.i.d. units, for any input distribution, so no
    centring is needed), hence ``K -> K / sqrt((v1 + eps)(v2 + eps))``, the NTK likewise; a trained
    ``weight`` multiplies both by ``weight**2`` and adds the normalized NNGP to the NTK (its
    gradient is the normalized input).

    Example:
        >>> layer = RMSNorm((64,), 1e-6, weight=1.0)
    """
    return _normalization("RMSNorm", tuple(normalized_shape), eps, weight, None, centred=False)


def _normalization(name: str, shape: tuple[int, ...], eps: float, weight: float | None,
                   bias: float | None, centred: bool) -> Layer:
    """LayerNorm (``centred``: the mean subtracted) or RMSNorm over the last ``len(shape)`` axes."""
    n_axes = len(shape)

    def init_fn(key, input_shape):
        normalized = tuple(input_shape[-n_axes:])
        if (len(input_shape) - n_axes < 1
                or any(s not in (-1, n) for s, n in zip(shape, normalized))):
            raise ShapeError(f"normalizes over {shape}, which must be the whole per-example shape "
                             f"or each position's features (N, T, d) or (N, *S, d), got inputs "
                             f"{tuple(input_shape)}")
        fresh = {"weight": (weight, jnp.ones), "bias": (bias, jnp.zeros)}  # torch's own init
        return tuple(input_shape), {key: init(shape) for key, (value, init) in fresh.items()
                                    if value is not None}

    def apply_fn(params, x):
        axes = tuple(range(x.ndim - n_axes, x.ndim))
        x = x - x.mean(axes, keepdims=True) if centred else x
        y = x * jax.lax.rsqrt(jnp.square(x).mean(axes, keepdims=True) + eps)
        if "weight" in params:
            y = y * params["weight"]
        return y + params["bias"] if "bias" in params else y

    def kernel_fn(k: Kernel) -> Kernel:
        _check_input(name, shape, k, centred)
        return _normalized(k, n_axes, eps, weight, bias)

    return Layer(init_fn, apply_fn, kernel_fn)


def _check_input(name: str, shape: tuple[int, ...], k: Kernel, centred: bool) -> None:
    """ShapeError for a per-token norm of channels-first inputs; UnsupportedLayerError for a
    LayerNorm (``centred``) of an input that is not a zero-mean Gaussian."""
    if len(k.shape1) - len(shape) >= 2 and not k.tokens:
        raise ShapeError(
            f"{name}{shape} of inputs {k.shape1} normalizes the last axis: a kernel rule for "
            f"sequences (N, T, d), features last, but its input here is channels first, its last "
            f"axis positions. Normalize the whole per-example shape, or use "
            f"ntbridge.empirical_ntk.")
    if centred and not k.is_gaussian:
        raise UnsupportedLayerError(
            "LayerNorm's kernel rule needs a zero-mean Gaussian input (the output of a "
            "Linear/Conv layer or of another LayerNorm); its input here has a nonzero mean per "
            "example. Put an affine layer before it, or use ntbridge.empirical_ntk.")


def _normalized(k: Kernel, n_axes: int, eps: float, weight: float | None,
                bias: float | None) -> Kernel:
    """``k`` divided by ``sqrt((v1 + eps)(v2 + eps))`` (``v``: the mean of each example's
    covariance diagonal, or each position's variance where each position's features are
    normalized on their own), then the affine parameters' terms (see LayerNorm)."""
    if len(k.shape1) - n_axes == 1:  # the whole per-example shape: one variance per example
        v1, v2 = (_diagonal_variances(c, k.diagonal_spatial) for c in (k.cov1, k.cov2))
        r1, r2 = (jax.lax.rsqrt(v.reshape(v.shape[0], -1).mean(1) + eps) for v in (v1, v2))
        pad = (1,) * (k.nngp.ndim - 2)
        factors = {"nngp": (r1.reshape(-1, 1, *pad), r2.reshape(1, -1, *pad)),
                   "cov1": (r1.reshape(-1, *pad),) * 2, "cov2": (r2.reshape(-1, *pad),) * 2}
    else:  # each position of (N, T, d) or (N, *S, d): its own variance, broadcast to each entry
        factors = {name: tuple(jax.lax.rsqrt(v + eps) for v in pair)
                   for name, pair in variances(k).items()}
    scaled = lambda a, name: a * factors[name][0] * factors[name][1]
    nngp = scaled(k.nngp, "nngp")
    w2 = 1.0 if weight is None else weight ** 2
    b2 = 0.0 if bias is None else bias ** 2
    own = (0.0 if weight is None else nngp) + (0.0 if bias is None else 1.0)
    ntk = None if k.ntk is None else w2 * scaled(k.ntk, "nngp") + own
    return k.replace(nngp=w2 * nngp + b2, ntk=ntk, cov1=w2 * scaled(k.cov1, "cov1") + b2,
                     cov2=w2 * scaled(k.cov2, "cov2") + b2,
                     is_gaussian=k.is_gaussian and b2 == 0)  # else not centred


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


def _eval_rule(moments: ChannelMoments, cmap: ChannelMap | None):
    """Eval-mode BatchNorm's kernel rule (see :func:`BatchNorm`)."""

    def kernel_fn(k: Kernel) -> Kernel:
        if k.blocks is not None and cmap is not None:
            return _per_block(k, cmap)
        if not k.is_gaussian:
            if k.sources is not None and cmap is not None:
                return pointwise(k, cmap, "BatchNorm")
            raise UnsupportedLayerError(
                "eval-mode BatchNorm's kernel rule needs a zero-mean Gaussian input with i.i.d. "
                "channels (the output of a Linear/Conv layer) or one made of Gaussian sources by "
                "layers with rules for them (nonlinearities, residual sums, MaxPool); its input "
                "here is neither: put it right after a Linear/Conv layer, or use "
                "ntbridge.empirical_ntk / ntbridge.monte_carlo.")
        affine = lambda c: moments.scale2 * c + moments.shift2
        own = (0.0 if moments.weight is None else moments.weight[0] * k.nngp + moments.weight[1])
        ntk = None if k.ntk is None else moments.scale2 * k.ntk + own + float(moments.bias)
        # a trained gamma's gradient is the channel's own input, which a nonlinearity's derivative
        # correlates with: a nonlinearity after it needs the channels' map (stax.sources)
        gaussian = moments.uniform and moments.weight is None
        sources = (None if gaussian or cmap is None
                   else Sources(base=k, ops=(cmap,), rule=rule_of(k)))
        return k.replace(nngp=affine(k.nngp), ntk=ntk, cov1=affine(k.cov1), cov2=affine(k.cov2),
                         is_gaussian=gaussian, sources=sources)

    return kernel_fn


def _per_block(k: Kernel, cmap: ChannelMap) -> Kernel:
    """BatchNorm of a concatenation along channels (DenseNet's ``norm(cat(features))``): each
    block mapped by its own channels' constants, the blocks kept for a nonlinearity after it
    (:mod:`.channel_blocks`)."""
    blocks, start = [], 0
    for block in k.blocks:
        stop = start + block.shape1[block.channel_axis]
        part = cmap.channels(start, stop)
        blocks.append(_eval_rule(ChannelMoments.of(part), part)(block))
        start = stop
    shares = [b.shape1[k.channel_axis] / k.shape1[k.channel_axis] for b in blocks]
    out = weighted_sum(blocks, shares, False)
    return out.replace(shape1=k.shape1, shape2=k.shape2, blocks=tuple(blocks))


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
    samples = channel_map is not None and not (moments.uniform and moments.weight is None)

    def init_fn(key, input_shape):
        return tuple(input_shape), {name: _fresh(name, input_shape[1]) for name in tensors}

    return channels_first(Layer(init_fn, apply_fn, kernel_fn,
                                replicates=SAMPLING.replicates if samples else 0))
