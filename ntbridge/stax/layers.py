"""The ``Layer`` record and the affine layers (Linear).

A layer is a tiny stax triple plus what it requires of its input kernel:

* ``init_fn(key, input_shape) -> (output_shape, params)``: samples parameters (torch layout);
  raises :class:`~ntbridge.errors.ShapeError` when the input shape does not fit.
* ``apply_fn(params, x) -> y``: the forward pass, exactly the torch module's.
* ``kernel_fn(k: Kernel) -> Kernel``: how the infinite-width NNGP and NTK transform.
* ``full_spatial``: whether ``kernel_fn`` needs the covariance of every pair of positions.
* ``structure``: optional, ``structure(params, x) -> {param_name: Outer}`` for the parameters the
  layer's output is linear in through an outer product (see :class:`Outer`); the empirical NTK's
  ``"structured"`` strategy uses it, and falls back to Jacobians for parameters it does not list.
* ``affine``: the output is an affine function of the input (Linear, Conv, reshapes, average
  pooling), so the layer's VJP is the same at every input; the ``"structured"`` strategy takes the
  VJP of a network's affine last layers once for all examples.
* ``pairwise``: the kernel of each pair of examples depends on that pair alone, not on whether x2
  is x1 (all but training-mode Dropout), so a kernel of x1 with itself can be computed in tiles
  and blocks of examples.
* ``hyper``: the layer's hyper-parameters, the numbers its ``kernel_fn`` reads that a user may
  want to differentiate or fit (the affine layers' ``W_std`` and ``b_std``): a dict from name to
  float, the values the layer was built with (combinators: a tuple, one entry per layer).
* ``input_kernel``: for a layer reading inputs that are not channels-first features (sequences
  ``(N, T, d)``, token ids), ``input_kernel(x1, x2, compute_ntk=, diagonal_spatial=) -> Kernel``
  of the raw inputs in the layout it expects (Linear: features last); a network takes that of a
  layer reading its input, else of any ``full_spatial`` layer (attention needs sequences), else
  the channels-first :func:`~ntbridge.stax.kernel.input_kernel`. A layer whose rule reads the
  channels-first layout is wrapped in :func:`channels_first`, which refuses sequences.
* ``replicates``: for a rule that is a numerical expectation, its number of independent
  replicates (``Kernel.replicate`` picks one); 0 for exact rules (a network: its layers' largest).
* ``sampling``: a network's rule (a :class:`~ntbridge.stax.softmax_moments.Rule`) for the
  numerical expectations of non-Gaussian inputs (:mod:`ntbridge.stax.sources`), carried by its
  input kernel (``Kernel.sampling``; None: the default rule).
* ``features``: optional, ``features(channels, sampler) -> Channels``, the layer's random-feature
  map (:mod:`ntbridge.stax.features`): F random channels of its output ``(N, F, *positions)``
  from those of its input (a :class:`~ntbridge.stax.features.Channels`, or a tuple of them for
  several inputs, as ``kernel_fn`` takes kernels), whose Gram matrices average to what
  ``kernel_fn`` gives; ``sampler`` draws the layer's standard normal weights. Written beside the
  kernel rule, with the values the layer was built with; ``ntbridge.features`` walks a network's
  layers through it, and refuses a layer without one::

      def features(ch, sampler):       # Scale(c): each channel times c, the NTK's too
          return Channels(c * ch.z, None if ch.t is None else c * ch.t, ch.gaussian)
      return Layer(init_fn, apply_fn, kernel_fn, features=features)

  The maps of most layers are built from three: ``affine_features`` (Dense, Conv: the layer's
  projection of its input), ``elementwise_features`` (activations) and ``linear_features``
  (maps acting on each channel alike: pooling, Flatten, sums, Scale).

How a layer declares hyper-parameters: it lists them with their values in ``hyper`` and takes
them as the second argument of its ``kernel_fn``, defaulting to those values::

    hyper = {"W_std": W_std}
    def kernel_fn(k, hyper=hyper):
        return k.replace(nngp=hyper["W_std"] ** 2 * k.nngp, ...)
    return Layer(init_fn, apply_fn, kernel_fn, hyper=hyper)

The analytic programs pass them in as arguments (JAX scalars, perhaps traced: use them in
arithmetic only, never in Python control flow or shapes), so one compiled program serves every
value and the kernels are differentiable in them. A layer without hyper-parameters leaves
``hyper`` empty and keeps ``kernel_fn(k)``; combinators call a layer through :func:`with_hyper`.
``init_fn`` samples with the built-in values.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import math

import jax
import jax.numpy as jnp

from ..errors import ShapeError, UnsupportedLayerError
from .features import Channels, Features, Sampler, affine_features, linear_features, refused
from .kernel import Kernel, features_last_kernel, input_kernel

Shape = tuple[int, ...]
PARAMETERIZATIONS = ("standard", "ntk")


class Outer(NamedTuple):
    """How a layer's output ``y`` depends on one parameter ``w``: a sum of outer products.

    For a cotangent ``g`` of ``y`` (shape ``(N, *y)``), the gradient of ``<g, y>`` w.r.t. ``w`` is,
    up to a fixed reshape/permutation of ``w``, ``sum_p outer(rows(g)[n, p], patches[n, p])``:
    ``rows(g)`` is ``(N, P, C)`` and ``patches`` ``(N, P, K)`` over ``P`` positions (positions
    first, channels last, as XLA lays out convolutions' outputs). ``patches=None`` stands for
    all-ones (``K = 1``: a bias). Linear: ``P`` = the leading axes, ``patches`` the inputs. Conv:
    ``P`` = output positions, ``patches`` the input patches ``(N, P, prod(kernel) * C_in)``,
    ``rows(g)`` the cotangent.
    """

    patches: jax.Array | None
    rows: Callable[[jax.Array], jax.Array]


class Layer(NamedTuple):
    """One layer (or a whole network) as ``(init_fn, apply_fn, kernel_fn)`` and its requirements."""

    init_fn: Callable[[jax.Array, Shape], tuple[Shape, Any]]
    apply_fn: Callable[[Any, jax.Array], jax.Array]
    kernel_fn: Callable[[Kernel], Kernel]
    full_spatial: bool = False
    structure: Callable[[Any, jax.Array], dict[str, Outer]] | None = None
    affine: bool = False
    pairwise: bool = True
    hyper: Any = {}
    input_kernel: Callable[..., Kernel] | None = None
    replicates: int = 0
    features: Features | None = None
    sampling: Any = None


def with_hyper(layer: Layer, hyper: Any = None) -> Callable[[Kernel], Kernel]:
    """``layer.kernel_fn`` with its hyper-parameters set to ``hyper`` (a pytree like
    ``layer.hyper``, leaves floats or JAX scalars; None: the layer's own values).

    Example:
        >>> dense = Dense(3, 8, W_std=1.0, b_std=0.1)
        >>> k = with_hyper(dense, {"W_std": jnp.float32(2.0), "b_std": 0.0})(k_in)
    """
    if hyper is None or not layer.hyper:
        return layer.kernel_fn
    return lambda k: layer.kernel_fn(k, hyper)


def channels_first(layer: Layer) -> Layer:
    """``layer``, whose rule reads kernels of channels-first inputs ``(N, C, *S)`` (convolutions,
    pooling, BatchNorm, resizing), refusing kernels of sequences ``(N, T, d)``, features last,
    which torch would read with the tokens as channels. Reading a network's input, it reads it
    channels first (not as the sequences of attention later on, after a ViT's patch embedding).

    Example:
        >>> k = sequence_kernel(jnp.ones((2, 5, 3)), None, compute_ntk=False,
        ...                     diagonal_spatial=False)
        >>> channels_first(Identity()).kernel_fn(k)
        Traceback (most recent call last):
        UnsupportedLayerError: its input here is a sequence (N, T, d), features last ...
    """

    def kernel_fn(k: Kernel | tuple[Kernel, ...], *hyper):
        if (k[0] if isinstance(k, tuple) else k).tokens:
            raise UnsupportedLayerError(
                "its input here is a sequence (N, T, d), features last (the output of attention, "
                "an embedding or a per-token layer), which torch reads channels first, the tokens "
                "as channels: that has no kernel rule here. Put the layer before the sequence "
                "part of the model, or use ntbridge.empirical_ntk.")
        return layer.kernel_fn(k, *hyper)

    return layer._replace(kernel_fn=kernel_fn, input_kernel=layer.input_kernel or input_kernel)


def affine_hyper(W_std: float, b_std: float | None) -> dict[str, float]:
    """The hyper-parameters of an affine layer: ``W_std``, and ``b_std`` when it has a bias."""
    return {"W_std": W_std} if b_std is None else {"W_std": W_std, "b_std": b_std}


def without_kernel(layer: Layer, message: str) -> Layer:
    """``layer`` with the same forward pass, whose ``kernel_fn`` (and feature map, where it has
    one) raises :class:`~ntbridge.errors.UnsupportedLayerError` with ``message``."""

    def kernel_fn(k):
        raise UnsupportedLayerError(message)

    return layer._replace(kernel_fn=kernel_fn,
                          features=None if layer.features is None else refused(message))


def _sample(key: jax.Array, shape: Shape, std: float, distribution: str) -> jax.Array:
    """Zero-mean samples of standard deviation ``std``: torch's uniform init or a Gaussian."""
    if distribution == "uniform":
        bound = std * 3 ** 0.5
        return jax.random.uniform(key, shape, minval=-bound, maxval=bound)
    return std * jax.random.normal(key, shape)


def affine_ntk(k: Kernel, nngp_out: jax.Array, fan_in: int, W_std: float, has_bias: bool,
               parameterization: str) -> jax.Array | None:
    """NTK after an affine layer whose input kernel is ``k`` and output NNGP is ``nngp_out``.

    ``"ntk"``: the layer's own parameters contribute its output NNGP. ``"standard"``: weights of
    variance ``W_std**2 / fan_in`` contribute ``fan_in * nngp_in`` and a bias ``1``. Either way the
    earlier layers' NTK is carried through with factor ``W_std**2``.
    """
    if k.ntk is None:
        return None
    if parameterization == "ntk":
        own = nngp_out
    else:
        own = fan_in * k.nngp + (1.0 if has_bias else 0.0)
    return own + W_std ** 2 * k.ntk


def dense_rule(k: Kernel, in_features: int, out_features: int, W_std: float,
               b_std: float | None, parameterization: str) -> Kernel:
    """The kernel after ``y = W x + b`` on the last axis (features of vectors, or of each token):
    ``K -> W_std**2 K + b_std**2`` entry by entry, the NTK by :func:`affine_ntk`."""
    has_bias = b_std is not None
    b_var = b_std ** 2 if has_bias else 0.0
    affine = lambda c: W_std ** 2 * c + b_var
    nngp = affine(k.nngp)
    return k.replace(
        nngp=nngp, cov1=affine(k.cov1), cov2=affine(k.cov2),
        ntk=affine_ntk(k, nngp, in_features, W_std, has_bias, parameterization),
        shape1=(*k.shape1[:-1], out_features), shape2=(*k.shape2[:-1], out_features),
        is_gaussian=True)


def Dense(in_features: int, out_features: int, *, W_std: float, b_std: float | None,
          parameterization: str = "standard", distribution: str = "uniform") -> Layer:
    """torch's ``nn.Linear(in_features, out_features, bias=b_std is not None)``.

    Shapes: ``x (N, in_features) -> (N, out_features)``. Params ``{"weight": (out, in),
    "bias": (out,)}`` with weight variance ``W_std**2 / in_features`` and bias variance
    ``b_std**2``, drawn from ``distribution`` (``"uniform"`` as torch, or ``"normal"``).

    Example:
        >>> layer = Dense(3, 8, W_std=3 ** -0.5, b_std=1 / 3)
        >>> out_shape, params = layer.init_fn(jax.random.key(0), (5, 3))
        >>> layer.apply_fn(params, jnp.ones((5, 3))).shape
        (5, 8)
    """
    has_bias, hyper = b_std is not None, affine_hyper(W_std, b_std)

    def init_fn(key, input_shape):
        if len(input_shape) < 2 or input_shape[-1] != in_features:
            raise ShapeError(f"expects inputs of shape (N, ..., {in_features}), "
                             f"got {tuple(input_shape)}")
        kw, kb = jax.random.split(key)
        params = {"weight": _sample(kw, (out_features, in_features),
                                    W_std / in_features ** 0.5, distribution)}
        if has_bias:
            params["bias"] = _sample(kb, (out_features,), b_std, distribution)
        return (*input_shape[:-1], out_features), params

    def apply_fn(params, x):
        y = jnp.matmul(x, params["weight"].T, precision=jax.lax.Precision.HIGHEST)
        return y + params["bias"] if has_bias else y

    def kernel_fn(k, hyper=hyper):
        if len(k.shape1) != 2 and not k.tokens:
            raise UnsupportedLayerError(
                f"Linear on inputs of shape {k.shape1}, read channels first, has no kernel rule "
                f"here: it needs (N, features) inputs or sequences (N, T, features), which a "
                f"Linear reads features last when it takes the model's input itself or follows "
                f"attention or an nn.Embedding (put an input Dropout after it); for channels-"
                f"first inputs, add nn.Flatten() before it.")
        return dense_rule(k, in_features, out_features, hyper["W_std"], hyper.get("b_std"),
                          parameterization)

    def project(h, g):  # (N, C) through g (F, C), unit variance per input
        return jnp.matmul(h, g.T, precision=jax.lax.Precision.HIGHEST) / math.sqrt(h.shape[1])

    affine = affine_features(project, (), in_features, hyper, parameterization)

    def features(c: Channels, sampler: Sampler) -> Channels:  # (N, in) -> (N, F)
        if c.z.ndim != 2:
            raise UnsupportedLayerError("features need Linear on (N, features) inputs; add "
                                        "nn.Flatten() before it.")
        return affine(c, sampler)

    def structure(params, x):
        rows = lambda g: g.reshape(g.shape[0], -1, g.shape[-1])
        outer = {"weight": Outer(rows(x), rows)}
        return {**outer, "bias": Outer(None, rows)} if has_bias else outer

    return Layer(init_fn, apply_fn, kernel_fn, structure=structure, affine=True, hyper=hyper,
                 input_kernel=features_last_kernel, features=features)


def Identity() -> Layer:
    """torch's ``nn.Identity`` (and Dropout in eval mode): nothing changes."""
    apply_fn = lambda params, x: x
    return Layer(lambda key, shape: (tuple(shape), {}), apply_fn, lambda k: k, affine=True,
                 features=linear_features(apply_fn))
