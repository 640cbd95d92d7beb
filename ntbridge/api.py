"""The torch-facing entry points: torch model and tensors in, torch tensors out.

Conventions (see each function):

* Results are on the device of ``x1`` and in its dtype: float64 inputs give float64 kernels
  (computed with JAX's x64 mode on for the call only); float16/bfloat16 inputs are computed and
  returned in float32. ``x2`` is converted to the dtype of ``x1``.
* ``x2=None`` means ``x2 = x1`` and the result is exactly symmetric.
* Kernels are returned without autograd history (inputs that require grad are detached).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple, Sequence

import jax
import numpy as np
import torch
from torch import nn

from . import batching
from .converters import Graph, Kernels, convert
from .converters.graph import compiled
from .converters.registry import StdOption
from .dlpack import describe, kernel_dtype, precision, to_jax, to_torch
from .empirical import (IMPLEMENTATIONS, Axes, empirical_nngp_fn, empirical_ntk_fn, int_tuple,
                        normalize_axes, swap_x1_x2)
from .errors import InputError, InputTypeError, ShapeError
# imported before ntbridge/__init__ binds the name ``monte_carlo`` to the function below
from .monte_carlo import Moments, sample_range_fn
from .stax.kernel import swap


def _torch_result(a) -> torch.Tensor:
    """A result handed to torch without a copy: JAX arrays by DLPack, host arrays and memory maps
    by ``torch.from_numpy``."""
    return torch.from_numpy(a) if isinstance(a, np.ndarray) else to_torch(a)


def _check_inputs(x1: torch.Tensor, x2: torch.Tensor | None) -> tuple[torch.dtype, torch.Tensor | None]:
    """Validate x1 and x2; return the kernel dtype and x2 in that dtype."""
    dtype = kernel_dtype(x1, "x1")
    for name, x in (("x1", x1), ("x2", x2)):
        if x is None:
            continue
        kernel_dtype(x, name)
        if x.ndim < 2:
            raise ShapeError(f"{name} has shape {tuple(x.shape)}; inputs are batched, (N, ...): "
                             f"for a single example pass {name}[None].")
        if x.shape[0] == 0:
            raise InputError(f"{name} is an empty batch (shape {tuple(x.shape)}); pass at least one "
                             f"example.")
        if x.numel() == 0:
            raise ShapeError(f"{name} has zero-size examples (shape {tuple(x.shape)}); every "
                             f"example needs at least one entry.")
    if x2 is not None:
        if x2.shape[1:] != x1.shape[1:]:
            raise ShapeError(f"x1 and x2 must have the same shape per example, got x1 "
                             f"{tuple(x1.shape)} and x2 {tuple(x2.shape)}.")
        if x2.device != x1.device:
            raise InputError(f"x1 is on {x1.device} and x2 on {x2.device}; move them to one device.")
        x2 = x2.to(dtype) if x2.dtype != x1.dtype else x2
    return dtype, x2


def _inputs(graph: Graph, x1: torch.Tensor, x2: torch.Tensor | None):
    """x1, x2 as JAX arrays, after checking they fit the model."""
    arrays = []
    for name, x in (("x1", x1), ("x2", x2)):
        if x is None:
            arrays.append(None)
            continue
        a = to_jax(x, name)
        if not bool(jax.numpy.isfinite(a).all()):
            raise InputError(f"{name} contains NaN or Inf; kernels of non-finite inputs are "
                             f"undefined. Clean the data first (e.g. torch.nan_to_num, or drop those "
                             f"examples).")
        try:
            graph.output_shape(a.shape)
        except ShapeError as e:
            raise ShapeError(f"{name} of shape {tuple(x.shape)} does not fit the model: {e}") from None
        arrays.append(a)
    return arrays


def kernel(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor | None = None,
           get: str | Sequence[str] = ("nngp", "ntk"), *, parameterization: str = "standard",
           init: str = "torch", W_std: StdOption = None, b_std: StdOption = None,
           batch_size: int | None = None, device_count: int = -1, store_on_device: bool = True,
           progress: bool | None = None, out: str | None = None):
    """Infinite-width NNGP and/or NTK of ``model``'s architecture, in closed form.

    Args:
      model: an ``nn.Sequential`` of supported modules (see ``ntbridge.convert``).
      x1: ``(N1, *input_shape)`` floating tensor.
      x2: ``(N2, *input_shape)``, or None for x2 = x1 (the result is then exactly symmetric).
      get: ``"nngp"``, ``"ntk"`` (returns a tensor) or a sequence of them (returns a named tuple
        ``Kernels(nngp, ntk)``, entries not asked for being None).
      parameterization, init, W_std, b_std: see ``ntbridge.convert``.
      batch_size, device_count, store_on_device, progress, out: tiling over (N1, N2), devices,
        where the result is kept, a progress bar, and a ``.npy`` file to write it to (resumable);
        see ``ntbridge.batching.Batching``.

    Returns:
      ``(N1, N2)`` kernels per output unit (the full kernel is ``K ⊗ I``), on x1's device (on the
      host with ``store_on_device=False``; with ``out``, a tensor over a copy-on-write memory map
      of the file: writing to it leaves the file as computed).

    Example:
        >>> model = nn.Sequential(nn.Linear(3, 512), nn.ReLU(), nn.Linear(512, 1))
        >>> k = ntbridge.kernel(model, torch.randn(5, 3))
        >>> k.ntk.shape, k.nngp.shape
        (torch.Size([5, 5]), torch.Size([5, 5]))
    """
    names = (get,) if isinstance(get, str) else tuple(get)
    if not names or any(n not in ("nngp", "ntk") for n in names):
        raise InputError(f"get must be 'nngp', 'ntk' or a sequence of them, got {get!r}.")
    dtype, x2 = _check_inputs(x1, x2)
    options = batching.Batching(batch_size, device_count, store_on_device, progress, out)
    get = get if isinstance(get, str) else names
    with precision(dtype):
        graph = convert(model, parameterization=parameterization, init=init, W_std=W_std,
                        b_std=b_std)
        a1, a2 = _inputs(graph, x1, x2)
        graph.check_init()
        fn = compiled(("analytic", graph.signature, get), lambda: functools.partial(
            lambda kernel_fn, args, t1, t2: kernel_fn(t1, t2, get=get), graph._compiled_kernel))
        diagonal = not graph.network.full_spatial
        result = batching.compute(fn, a1, a2, options, swap=lambda a: swap(a, diagonal),
                                  describe=("analytic", get, repr(graph.signature)))
    if isinstance(get, str):
        return _torch_result(result)
    return Kernels(*(None if v is None else _torch_result(v) for v in result))


def ntk(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor | None = None, **opts) -> torch.Tensor:
    """Infinite-width NTK ``(N1, N2)`` of ``model``'s architecture; options as :func:`kernel`.

    Example:
        >>> ntbridge.ntk(nn.Sequential(nn.Linear(3, 64), nn.ReLU(), nn.Linear(64, 1)), x)
    """
    return kernel(model, x1, x2, "ntk", **opts)


def nngp(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor | None = None, **opts) -> torch.Tensor:
    """Infinite-width NNGP ``(N1, N2)`` of ``model``'s architecture; options as :func:`kernel`.

    Example:
        >>> ntbridge.nngp(nn.Sequential(nn.Linear(3, 64), nn.ReLU(), nn.Linear(64, 1)), x)
    """
    return kernel(model, x1, x2, "nngp", **opts)


def _batch_statistics(graph: Graph) -> list[str]:
    """The modules whose output for one example depends on the others in the batch."""
    return [n.where for n in graph.layers
            if isinstance(n.module, nn.modules.batchnorm._BatchNorm)
            and (n.module.training or n.module.running_mean is None)]


def _empirical(which: str, model: nn.Module, x1, x2, trace_axes, diagonal_axes,
               implementation: str = "auto", by_layer: bool = False, return_info: bool = False,
               **batching_options):
    if implementation not in IMPLEMENTATIONS:
        raise InputError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}.")
    dtype, x2 = _check_inputs(x1, x2)
    options = batching.Batching(**batching_options)
    with precision(dtype):
        graph = convert(model)
        trainable = {n.key(p) for n in graph.layers for p, _ in n.module.named_parameters(recurse=False)}
        params = {k: v for k, v in graph.params.items() if k in trainable}
        state = {k: v for k, v in graph.params.items() if k not in trainable}
        if which == "ntk" and not params:
            raise InputError("the model has no parameters, so its empirical NTK is undefined; "
                             "use ntbridge.empirical_nngp, or the analytic ntbridge.ntk.")
        model_dtype = {p.dtype for p in params.values()}
        if model_dtype and model_dtype != {jax.numpy.dtype(str(dtype).removeprefix("torch."))}:
            raise InputTypeError(f"the model's parameters are {model_dtype.pop()} but x1 is "
                                 f"{x1.dtype}; convert one to the other, e.g. model.to({x1.dtype}).")
        a1, a2 = _inputs(graph, x1, x2)
        interact = bool(_batch_statistics(graph))
        if interact:
            if options.batch_size or options.device_count not in (-1, 1):
                raise InputError("the model's examples interact (BatchNorm using batch statistics), "
                                 "so its kernel cannot be tiled; drop batch_size and device_count, "
                                 "or put the model in eval mode (model.eval()).")
            options = dataclasses.replace(options, batch_size=0, device_count=1)
        axes_options = dict(trace_axes=int_tuple(trace_axes, "trace_axes"),
                            diagonal_axes=int_tuple(diagonal_axes, "diagonal_axes"))
        if which == "ntk":
            dispatch = compiled(("empirical_ntk", implementation, interact, graph.signature),
                                lambda: empirical_ntk_fn(graph, implementation,
                                                         examples_interact=interact))
            run, info, axes = dispatch.plan(params, a1, a2, by_layer=by_layer, state=state,
                                            **axes_options)
            args = (params, state)
        else:
            nngp_fn = compiled(("empirical_nngp", interact, graph.signature),
                               lambda: empirical_nngp_fn(graph.apply_fn, examples_interact=interact))
            run = compiled(("empirical_nngp_run", interact, graph.signature, *axes_options.values()),
                           lambda: lambda args, t1, t2: nngp_fn(args, t1, t2, **axes_options))
            out_ndim = len(graph.output_shape(a1.shape))
            info, axes = None, Axes(out_ndim, *normalize_axes(*axes_options.values(), out_ndim))
            args = graph.params
        k = batching.compute(run, a1, a2, options, args=args, swap=lambda v: swap_x1_x2(v, axes),
                             describe=(which, implementation, by_layer, axes, repr(graph.signature),
                                       *jax.tree.leaves(args)))
    k = {name: _torch_result(v) for name, v in k.items()} if by_layer else _torch_result(k)
    return (k, info) if return_info else k


def empirical_ntk(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor | None = None, *,
                  implementation: str = "auto", trace_axes: Sequence[int] = (-1,),
                  diagonal_axes: Sequence[int] = (), by_layer: bool = False,
                  return_info: bool = False, **batching_options):
    """The finite-width NTK of ``model`` at its current weights (w.r.t. all its parameters).

    Equals what ``torch.func`` computes on the same model (jacobian contraction). Axes follow
    Neural Tangents (see ``ntbridge.empirical``): the default ``trace_axes=(-1,)`` averages over the
    output units, giving ``(N1, N2)`` comparable to :func:`ntk`; ``trace_axes=()`` gives
    ``(N1, N2, O, O)``; ``diagonal_axes=(-1,)`` (with ``trace_axes=()``) ``(N1, N2, O)``.

    Models with BatchNorm using batch statistics (train mode): an example's output depends on the
    whole batch, so the kernel is that of the joint batch ``X = cat(x1, x2)`` (``x1`` alone when x2
    is None), as ``torch.func.jacrev`` of ``model(X)`` gives it: ``J(X)[:N1] J(X)[N1:]^T``.

    Args:
      model: a supported model; its dtype must match x1's.
      x1, x2: as in :func:`kernel`.
      implementation: ``"auto"`` (chooses by XLA's cost estimate, once per shape signature),
        ``"jacobian"``, ``"ntvp"`` (NTK-vector products) or ``"structured"`` (layer derivative
        structure); see ``ntbridge.empirical``.
      trace_axes, diagonal_axes: output axes to average over / to keep the diagonal of.
      by_layer: return a dict from each module's qualified name (modules with parameters) to its
        contribution; the contributions sum to the kernel.
      return_info: also return a ``StrategyInfo`` (chosen strategy, candidates' costs, reason).
      batching_options: ``batch_size``, ``device_count``, ``store_on_device``, ``progress``,
        ``out``, as in :func:`kernel`.

    Example:
        >>> ntbridge.empirical_ntk(model, x1, x2).shape
        torch.Size([20, 5])
        >>> k, info = ntbridge.empirical_ntk(model, x1, return_info=True)
        >>> info.implementation
        'structured'
    """
    return _empirical("ntk", model, x1, x2, trace_axes, diagonal_axes, implementation, by_layer,
                      return_info, **batching_options)


def empirical_nngp(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor | None = None, *,
                   trace_axes: Sequence[int] = (-1,), diagonal_axes: Sequence[int] = (),
                   **batching_options) -> torch.Tensor:
    """The outputs' products ``f(x1) f(x2)`` of ``model`` at its current weights, axes as
    :func:`empirical_ntk` (with ``trace_axes=(-1,)``, the mean over output units; BatchNorm using
    batch statistics: the outputs of the joint batch).

    Example:
        >>> ntbridge.empirical_nngp(model, x1).shape
        torch.Size([20, 20])
    """
    return _empirical("nngp", model, x1, x2, trace_axes, diagonal_axes, **batching_options)


class Estimate(NamedTuple):
    """A Monte-Carlo kernel estimate: the mean over ``n_samples`` initialisations and its
    standard error (same shape), as torch tensors.

    Example:
        >>> ntbridge.monte_carlo(model, torch.randn(8, 16), n_samples=100)  # the README's model
        Estimate(mean=(8, 8) float32 cpu, n_samples=100, mean standard error 0.269)
    """

    mean: torch.Tensor
    standard_error: torch.Tensor
    n_samples: int

    def __repr__(self) -> str:
        return (f"Estimate(mean={describe(self.mean)}, n_samples={self.n_samples}, "
                f"mean standard error {self.standard_error.mean().item():.3g})")


def _sample_counts(n_samples) -> list[int]:
    counts = [n_samples] if isinstance(n_samples, int) and not isinstance(n_samples, bool) else n_samples
    try:
        counts = [int(c) for c in counts]
    except (TypeError, ValueError):
        raise InputTypeError(f"n_samples must be an int or a list of ints, got {n_samples!r}.") from None
    if not counts or counts[0] < 1 or any(b <= a for a, b in zip(counts, counts[1:])):
        raise InputError(f"n_samples must be >= 1 (a list: increasing), got {n_samples!r}.")
    return counts


def monte_carlo(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor | None = None, *,
                n_samples: int | Sequence[int], get: str = "ntk", seed: int = 0,
                trace_axes: Sequence[int] = (-1,), diagonal_axes: Sequence[int] = (),
                init: str = "torch", W_std: StdOption = None, b_std: StdOption = None,
                batch_size: int | None = None, device_count: int = -1,
                store_on_device: bool = True, progress: bool | None = None):
    """The empirical NTK or NNGP averaged over ``n_samples`` fresh initialisations of ``model``'s
    architecture, with its standard error.

    Parameters are drawn by the converter's ``init_fn`` from the init in use (``init="torch"``:
    torch's default uniform init; explicit ``W_std``/``b_std``: Gaussian), so the model's own
    weights do not matter. Works for layers without a closed form (MaxPool, BatchNorm, ...).

    Args:
      n_samples: an int, or an increasing list of ints: then a generator yields the running
        :class:`Estimate` at each of those counts (the samples are shared, not redrawn).
      get: ``"ntk"`` or ``"nngp"`` (the outputs' products ``f(x1) f(x2)``).
      seed: the samples are ``fold_in(key(seed), s)`` for ``s = 0, 1, ...``.
      trace_axes, diagonal_axes: as :func:`empirical_ntk`.
      Other options: as :func:`kernel`.

    Example:
        >>> est = ntbridge.monte_carlo(model, x, n_samples=100)
        >>> est.mean.shape, est.standard_error.shape
        (torch.Size([8, 8]), torch.Size([8, 8]))
    """
    if get not in ("ntk", "nngp"):
        raise InputError(f"get must be 'ntk' or 'nngp', got {get!r}.")
    counts = _sample_counts(n_samples)
    dtype, x2 = _check_inputs(x1, x2)
    options = batching.Batching(batch_size, device_count, store_on_device, progress)
    axes = (int_tuple(trace_axes, "trace_axes"), int_tuple(diagonal_axes, "diagonal_axes"))

    def running():
        moments, done = None, 0
        for count in counts:
            with precision(dtype):
                graph = convert(model, init=init, W_std=W_std, b_std=b_std)
                a1, a2 = _inputs(graph, x1, x2)
                out_ndim = len(graph.output_shape(a1.shape))
                fixed = Axes(out_ndim, *normalize_axes(*axes, out_ndim))
                fn = compiled(("monte_carlo", graph.signature, get, seed, done, count, fixed),
                              lambda: sample_range_fn(graph, get, seed, done, count,
                                                      fixed.trace, fixed.diagonal))
                mean, m2 = batching.compute(fn, a1, a2, options,
                                            swap=lambda k: swap_x1_x2(k, fixed))
                part = Moments(count - done, jax.numpy.asarray(mean), jax.numpy.asarray(m2))
                moments = part if moments is None else moments.merge(part)
                # fresh buffers a user may write to: the running mean feeds the next merge, and
                # numpy views of JAX arrays are read-only
                hand = lambda a: (to_torch(a.copy()) if store_on_device
                                  else torch.from_numpy(np.array(a)))
                estimate = Estimate(hand(moments.mean), hand(moments.standard_error), count)
            done = count
            yield estimate

    if isinstance(n_samples, int):
        return next(running())
    return running()
