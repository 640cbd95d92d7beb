"""Combinators that build networks from layers, in the style of ``jax.example_libraries.stax``."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from ..errors import ShapeError, UnsupportedLayerError
from .channel_blocks import weighted_sum
from .features import linear_features
from .kernel import Kernel, spatial_axes
from .layers import Layer, with_hyper
from .sources import SAMPLING, channel_map, sum_sources

INPUT = -1  # in ``dag``, the index that stands for the network's input

After = Callable[[int, Any], Any]  # (node index, its output) -> the output the graph goes on with


def _run(fns: Sequence[Callable], inputs: Sequence[tuple[int, ...]], x,
         after: After | None = None):
    """Evaluate ``fns[i]`` on the values of ``inputs[i]`` (one value, or a tuple if several);
    ``after(i, value)``, when given, replaces each value as it is made (``i = INPUT`` for ``x``)."""
    after = after or (lambda i, value: value)
    values = {INPUT: after(INPUT, x)}
    for i, (fn, sources) in enumerate(zip(fns, inputs)):
        args = tuple(values[j] for j in sources)
        values[i] = after(i, fn(args[0] if len(args) == 1 else args))
    return values[len(fns) - 1]


def _computed_once(out):
    """A layer's output kernel(s) with each example's covariances (``cov1``, ``cov2``) divided by a
    1 XLA cannot fold away (``x == x``; a NaN stays NaN): exact, and computed once. XLA repeats
    cheap elementwise steps (``W**2 q + b**2``) inside each consumer but not a division, so without
    it a depth-L network's program holds these chains L times over (compiles grow as L**2)."""
    if not isinstance(out, Kernel):
        return tuple(map(_computed_once, out))
    once = lambda c: c / jnp.where(c == c, 1, 2).astype(c.dtype)
    cov1 = once(out.cov1)
    return out.replace(cov1=cov1, cov2=cov1 if out.x1_is_x2 else once(out.cov2),
                       sources=out.sources, blocks=out.blocks)


def dag(layers: Sequence[Layer], inputs: Sequence[tuple[int, ...]]) -> Layer:
    """A directed acyclic graph of layers; params are a tuple, one entry per layer.

    ``inputs[i]`` lists the layers whose outputs feed layer ``i`` (``INPUT`` for the network's
    input), all earlier than ``i``; a layer with several inputs (e.g. a residual sum) receives a
    tuple. The last layer's output is the network's output.

    Its ``kernel_fn(k, hyper=None, after=None)`` takes the layers' hyper-parameters (a tuple like
    its ``hyper``, one entry per layer; None: the layers' own values, see
    :func:`~ntbridge.stax.layers.with_hyper`) and an optional ``after(i, kernels)``, called with
    the input kernel ``k`` (``i = INPUT``) and with each layer's output (a :class:`Kernel`, or a
    tuple of them): what it returns replaces them, e.g. to record or substitute intermediate
    kernels.

    Example:
        >>> residual = dag([Dense(8, 8, W_std=1., b_std=0.), Relu(), FanInSum()], [(INPUT,), (0,), (1, INPUT)])
        >>> seen = []
        >>> k = residual.kernel_fn(input_kernel(jnp.ones((2, 8)), None, compute_ntk=False,
        ...                                     diagonal_spatial=True),
        ...                        after=lambda i, out: seen.append(i) or out)
        >>> seen
        [-1, 0, 1, 2]
    """
    layers, inputs = tuple(layers), tuple(tuple(i) for i in inputs)

    def init_fn(key, input_shape):
        keys = iter(jax.random.split(key, max(len(layers), 1)))
        params = []

        def init(layer):
            def fn(shape):
                shape, p = layer.init_fn(next(keys), shape)
                params.append(p)
                return shape
            return fn

        return _run([init(layer) for layer in layers], inputs, input_shape), tuple(params)

    def apply_fn(params, x):
        return _run([lambda v, l=layer, p=p: l.apply_fn(p, v) for layer, p in zip(layers, params)],
                    inputs, x)

    def kernel_fn(k: Kernel, hyper: tuple | None = None, after: After | None = None) -> Kernel:
        hyper = (None,) * len(layers) if hyper is None else hyper
        then = after or (lambda i, out: out)
        return _run([with_hyper(layer, h) for layer, h in zip(layers, hyper)], inputs, k,
                    lambda i, out: then(i, _computed_once(out)))

    # the layers reading the input say how, else any layer mixing positions that needs sequences
    # (attention; not a Linear head after a convolution)
    readers = [layer.input_kernel for layer, i in zip(layers, inputs) if INPUT in i]
    readers += [layer.input_kernel for layer in layers if layer.full_spatial]
    return Layer(init_fn, apply_fn, kernel_fn, any(layer.full_spatial for layer in layers),
                 pairwise=all(layer.pairwise for layer in layers),
                 hyper=tuple(layer.hyper for layer in layers),
                 input_kernel=next((r for r in readers if r is not None), None),
                 replicates=max((layer.replicates for layer in layers), default=0))


def serial(*layers: Layer) -> Layer:
    """The layers applied one after the other; params are a tuple, one entry per layer.

    Example:
        >>> net = serial(Dense(3, 16, W_std=1.0, b_std=0.1), Relu(), Dense(16, 1, W_std=1.0, b_std=0.1))
    """
    return dag(layers, [(i - 1,) for i in range(len(layers))])


def FanOut(n: int) -> Layer:
    """``n`` copies of the input, as a tuple (to feed :func:`parallel`).

    Example:
        >>> net = serial(FanOut(2), parallel(Identity(), Dense(4, 4, W_std=1., b_std=0.)), FanInSum())
    """
    copies = lambda v: (v,) * n
    return Layer(lambda key, shape: (copies(tuple(shape)), {}), lambda params, x: copies(x), copies)


def Pick(i: int) -> Layer:
    """Entry ``i`` of a tuple input (in a :func:`dag` whose input is several tensors).

    Example:
        >>> Pick(1).apply_fn({}, ("x", "ids"))
        'ids'
    """
    return Layer(lambda key, shapes: (tuple(shapes[i]), {}), lambda params, xs: xs[i],
                 lambda ks: ks[i], affine=True)


def parallel(*layers: Layer) -> Layer:
    """Layer ``i`` applied to the ``i``-th entry of a tuple input; params are a tuple.

    Example:
        >>> branches = parallel(Identity(), Relu())   # (x, y) -> (x, relu(y))
    """

    def init_fn(key, input_shapes):
        keys = jax.random.split(key, max(len(layers), 1))
        out = [layer.init_fn(k, s) for layer, k, s in zip(layers, keys, input_shapes)]
        return tuple(s for s, _ in out), tuple(p for _, p in out)

    def apply_fn(params, xs):
        return tuple(layer.apply_fn(p, x) for layer, p, x in zip(layers, params, xs))

    def kernel_fn(ks, hyper: tuple | None = None):
        hyper = (None,) * len(layers) if hyper is None else hyper
        return tuple(with_hyper(layer, h)(k) for layer, h, k in zip(layers, hyper, ks))

    return Layer(init_fn, apply_fn, kernel_fn, any(layer.full_spatial for layer in layers),
                 pairwise=all(layer.pairwise for layer in layers),
                 hyper=tuple(layer.hyper for layer in layers),
                 replicates=max((layer.replicates for layer in layers), default=0))


def same_shapes(shapes, skip_axis: int | None = None) -> None:
    """Raise ShapeError unless the branches' shapes agree (except on ``skip_axis``)."""
    strip = lambda s: tuple(d for i, d in enumerate(s) if i != skip_axis)
    if len({len(s) for s in shapes}) > 1 or len({strip(s) for s in shapes}) > 1:
        where = "" if skip_axis is None else f" except on axis {skip_axis}"
        raise ShapeError(f"the branches' shapes {[tuple(s) for s in shapes]} must agree{where}.")


def FanInSum() -> Layer:
    """The sum of a tuple of same-shape inputs (a residual connection ``h + f(h)``).

    Kernel rule: the sum of the branches' NNGPs and NTKs, exact when the branches' outputs are
    uncorrelated in the infinite-width limit, e.g. when one branch ends in an affine layer with
    zero-mean weights that the other does not depend on (``h + Linear(relu(h))``). Where the
    branches are made of Gaussian sources (:mod:`.sources`), the sum records their samples for the
    rules after it (a nonlinearity after ``identity + branch``), and where several are not
    centred (``relu(h) + BatchNorm(conv(relu(h)))``) its kernel is their samples' moments. It is *not*
    exact when both are deterministic functions of one value (``h + relu(h)``, ``h + h``): the
    cross-covariance is missing. ``ntbridge.convert`` detects that case and refuses it.

    Example:
        >>> residual = dag([Dense(8, 8, W_std=1., b_std=0.), FanInSum()], [(INPUT,), (INPUT, 0)])
    """

    def init_fn(key, shapes):
        same_shapes(shapes)
        return tuple(shapes[0]), {}

    def kernel_fn(ks):
        same_shapes([k.shape1 for k in ks])
        out = weighted_sum(ks, [1.0] * len(ks), all(k.is_gaussian for k in ks))
        others = [k for k in ks if not k.is_gaussian]
        if others and all(k.sources is not None for k in others):
            if len(others) == 1:  # the others are centred: the sum of kernels is exact
                return out.replace(sources=sum_sources(ks).sources)
            return sum_sources(ks)
        centred = lambda k: (cmap := channel_map(k)) is not None and cmap.centred
        if any(k.sources is not None and not centred(k) for k in others):
            raise UnsupportedLayerError(
                "a sum of a branch with a nonzero mean (a nonlinearity's output, or BatchNorm's "
                "with shifts) and a non-Gaussian branch made of no Gaussian sources (the raw "
                "data, or a layer mixing positions after a nonlinearity): their kernels' sum "
                "misses the product of their means, and the sampled rule has no samples of the "
                "second. Use ntbridge.monte_carlo.")
        return out

    apply_fn = lambda params, xs: sum(xs[1:], xs[0])
    return Layer(init_fn, apply_fn, kernel_fn, affine=True, features=linear_features(apply_fn),
                 replicates=SAMPLING.replicates)


def _join_positions(arrays: Sequence[jax.Array], n_batch: int, d: int, sizes: Sequence[int],
                    diagonal_spatial: bool) -> jax.Array:
    """Kernel arrays of branches concatenated along spatial dim ``d``: the diagonal layout puts
    them side by side; the full one block-diagonally (positions of different branches:
    uncorrelated)."""
    ndim = (arrays[0].ndim - n_batch) // (1 if diagonal_spatial else 2)
    axes = spatial_axes(n_batch, ndim, diagonal_spatial)[d]
    if diagonal_spatial:
        return jnp.concatenate(arrays, axes[0])
    out, start = 0, 0
    for a, size in zip(arrays, sizes):
        pad = [(start, sum(sizes) - start - size) if i in axes else (0, 0) for i in range(a.ndim)]
        out, start = out + jnp.pad(a, pad), start + size
    return out


def concat_kernels(ks: Sequence[Kernel], axis: int) -> Kernel:
    """The kernel of the branches' outputs concatenated along ``axis`` (>= 1; see
    :func:`FanInConcat`)."""
    same_shapes([k.shape1 for k in ks], skip_axis=axis)
    sizes = [k.shape1[axis] for k in ks]
    grow = lambda s: (*s[:axis], sum(sizes), *s[axis + 1:])
    blocks = None
    if axis == ks[0].channel_axis:  # each block kept for an elementwise function after it
        blocks = sum((k.blocks or (k,) for k in ks), ())
        out = weighted_sum(ks, [c / sum(sizes) for c in sizes], False)
    else:
        join = lambda field, n_batch: _join_positions([getattr(k, field) for k in ks], n_batch,
                                                      ks[0].position(axis), sizes,
                                                      ks[0].diagonal_spatial)
        ntk = None if any(k.ntk is None for k in ks) else join("ntk", 2)
        out = ks[0].replace(nngp=join("nngp", 2), ntk=ntk, cov1=join("cov1", 1),
                            cov2=join("cov2", 1), is_gaussian=all(k.is_gaussian for k in ks))
    return out.replace(shape1=grow(out.shape1), shape2=grow(out.shape2), blocks=blocks)


def FanInConcat(axis: int = 1) -> Layer:
    """Concatenation of a tuple of inputs along ``axis`` (torch's ``torch.cat(xs, dim=axis)``).

    Kernel rule along the channel axis (1, or the last of sequences ``(N, T, d)``): the
    channel-weighted average of the branches' kernels
    ``sum_i C_i K_i / sum_i C_i``, exact for any correlation between the branches; its channels are
    no longer identically distributed (is_gaussian False): the result feeds affine layers, and
    elementwise functions by their rule on each branch (:mod:`.channel_blocks`).
    Along a spatial axis: each branch's kernel on its own positions, and zero between positions of
    different branches, exact when the branches are uncorrelated (``ntbridge.convert`` refuses
    the others); the diagonal layout, which keeps same-position covariances only, is exact for
    any branches.

    Example:
        >>> dense_block = dag([Dense(4, 8, W_std=1., b_std=0.), FanInConcat()], [(INPUT,), (INPUT, 0)])
    """

    def init_fn(key, shapes):
        ax = axis % len(shapes[0])
        same_shapes(shapes, skip_axis=ax)
        out = list(shapes[0])
        out[ax] = sum(s[ax] for s in shapes)
        return tuple(out), {}

    def kernel_fn(ks):
        ndim = len(ks[0].shape1)
        if axis % ndim == 0:
            raise UnsupportedLayerError("concatenation along axis 0 joins batches of examples; "
                                        "the kernel is per example: concatenate the inputs.")
        return concat_kernels(ks, axis % ndim)

    return Layer(init_fn, lambda params, xs: jnp.concatenate(xs, axis=axis), kernel_fn,
                 full_spatial=False, affine=True)


def Scale(c: float) -> Layer:
    """Multiplication by a constant ``c``: kernels scale by ``c**2``.

    Example:
        >>> half = Scale(0.5)
    """

    def kernel_fn(k):
        s = lambda v: None if v is None else c * c * v
        return k.replace(nngp=s(k.nngp), ntk=s(k.ntk), cov1=s(k.cov1), cov2=s(k.cov2))

    apply_fn = lambda params, x: c * x
    return Layer(lambda key, shape: (tuple(shape), {}), apply_fn, kernel_fn, affine=True,
                 features=linear_features(apply_fn))
