"""The torch-facing entry points: torch model and tensors in, torch tensors out.

Each builds a :class:`~ntbridge.pipeline.Request` and runs it through :mod:`ntbridge.pipeline`.

Conventions (see each function):

* Results are on the device of ``x1`` and in its dtype: float64 inputs give float64 kernels
  (computed with JAX's x64 mode on for the call only); float16/bfloat16 inputs are computed and
  returned in float32. ``x2`` is converted to the dtype of ``x1``.
* ``x2=None`` means ``x2 = x1`` and the result is exactly symmetric.
* Kernels are differentiable by torch autograd when x1, x2 (or, for the empirical kernels, a model
  parameter) require grad and grad mode is on; otherwise they carry no history and cost no VJP
  work (see :mod:`ntbridge.autograd`).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch
from torch import nn

from . import first_calls, pipeline
from .converters import batch_statistics
from .converters.registry import ATTENTION_POINTS, EXPECTATION_POINTS, StdOption
from .dlpack import check_module
from .empirical import sample_counts
from .empirical.reinit import sample_seed  # noqa: F401  (public: the seeding of samples)
from .errors import BatchStatisticsWarning, InputError, warn
from .pipeline import Request, run
from .results import Kernels
from .specs import Analytic, EmpiricalNNGP, EmpiricalNTK, MonteCarlo
from .tiling import Batching


def kernel(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor | None = None,
           get: str | Sequence[str] = ("nngp", "ntk"), *, parameterization: str = "standard",
           init: str = "torch", W_std: StdOption = None, b_std: StdOption = None,
           attention: str = "softmax", attention_points: int = ATTENTION_POINTS,
           shared_weights: str = "auto", expectation_points: int = EXPECTATION_POINTS,
           batch_size: int | None = None, device_count: int = -1,
           store_on_device: bool = True, progress: bool | None = None, out: str | None = None,
           by_layer: bool = False, return_info: bool = False):
    """Infinite-width NNGP and/or NTK of ``model``'s architecture, in closed form.

    Args:
      model: an ``nn.Sequential`` of supported modules (see ``ntbridge.convert``).
      x1: ``(N1, *input_shape)`` floating tensor; for a graph model of ``forward(x, adjacency)``,
        a pair ``(x (N1, C, V), adjacency (N1, V, V))``.
      x2: ``(N2, *input_shape)`` (a pair likewise), or None for x2 = x1 (the result is then
        exactly symmetric).
      get: ``"nngp"``, ``"ntk"`` (returns a tensor) or a sequence of them (returns a named tuple
        ``Kernels(nngp, ntk)``, entries not asked for being None).
      parameterization, init, W_std, b_std, attention, attention_points, shared_weights,
        expectation_points: see ``ntbridge.convert`` (attention: torch's softmax attention, whose
        expectation is numerical with ``attention_points`` points per replicate, or the
        ``"linear"`` variant; expectation_points: those of the numerical rules of non-Gaussian
        inputs, BatchNorm with shifts before a nonlinearity, residual sums, MaxPool).
      batch_size, device_count, store_on_device, progress, out: tiling over (N1, N2), devices,
        where the result is kept, a progress bar, and a ``.npy`` file to write it to (resumable);
        see ``ntbridge.tiling.Batching``.
      return_info: also return a :class:`~ntbridge.tiling.TilingInfo` (tiles, those computed by
        this call, tile size and memory).

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
    outcome = run(Request(model, x1, x2, Analytic(get, by_layer=by_layer),
                          Batching(batch_size, device_count, store_on_device, progress, out),
                          dict(parameterization=parameterization, init=init, W_std=W_std,
                               b_std=b_std, attention=attention,
                               attention_points=attention_points,
                               shared_weights=shared_weights,
                               expectation_points=expectation_points)))
    result = outcome.result if isinstance(get, str) else Kernels(*outcome.result)
    if outcome.info is not None:  # by_layer on a chain: the NNGP and each module's contribution
        nngp, parts = outcome.result
        result = Kernels(nngp, dict(zip(outcome.info, parts)))
    return (result, outcome.tiling) if return_info else result


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


def expectation_error(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor | None = None,
                      get: str | Sequence[str] = ("nngp", "ntk"), **conversion) -> float:
    """The estimated relative error of the analytic kernels ``get`` of ``model`` where their rules
    are numerical expectations (torch's softmax attention): the kernels computed once per
    replicate of the randomised quasi-Monte-Carlo rule, their largest standard error over the
    largest kernel entry; 0.0 where every rule is exact. It costs about one more kernel
    computation, in one piece (no tiling).

    Example:
        >>> ntbridge.expectation_error(encoder, x)       # a float, e.g. 2e-4
    """
    return pipeline.expectation_error(Request(model, x1, x2, Analytic(get), conversion=conversion))


def _empirical_batching(model: nn.Module, options: dict) -> tuple[Batching, bool]:
    """The batching of an empirical kernel, and whether the model's examples interact (then in
    one tile, with a :class:`~ntbridge.errors.BatchStatisticsWarning` naming the modules)."""
    check_module(model)
    batching, modules = Batching(**options), batch_statistics(model)
    interact = bool(modules)
    if interact:
        if batching.batch_size or batching.device_count not in (-1, 1):
            raise InputError("the model's examples interact (BatchNorm using batch statistics), "
                             "so its kernel cannot be tiled; drop batch_size and device_count, "
                             "or put the model in eval mode (model.eval()).")
        warn(BatchStatisticsWarning(
            f"{', '.join(modules)} normalises with the batch's own statistics, so this empirical "
            f"kernel is that of the joint batch cat(x1, x2): an entry depends on which other "
            f"examples are in the call, not on its pair alone. Call model.eval() for the kernel "
            f"of each pair (running statistics), or, if the joint batch is what you want, "
            f"silence this warning: warnings.simplefilter('ignore', "
            f"ntbridge.errors.BatchStatisticsWarning)."))
        batching = Batching(0, 1, batching.store_on_device, batching.progress, batching.out)
    return batching, interact


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
    is None), as ``torch.func.jacrev`` of ``model(X)`` gives it: ``J(X)[:N1] J(X)[N1:]^T``; an
    entry then changes with the other examples in the call, so it warns
    (:class:`~ntbridge.errors.BatchStatisticsWarning`, naming the modules): call ``model.eval()``
    for the kernel of each pair of examples.

    Any model whose forward takes one tensor and returns one works: models the layer registry does
    not cover (attention, recurrent layers, embeddings, custom forwards) are exported with
    ``torch.export`` and translated to JAX (in eval mode: call ``model.eval()`` first if it has
    dropout or BatchNorm); ``info.path`` says which (``"layers"`` or ``"torch.export"``).

    Args:
      model: a torch model; its dtype must match x1's.
      x1, x2: as in :func:`kernel`, or integer token ids when the model takes them (the kernel is
        still w.r.t. the parameters; it is in the model's dtype).
      implementation: ``"auto"`` (chooses by XLA's cost estimate, once per shape signature),
        ``"jacobian"``, ``"ntvp"`` (NTK-vector products) or ``"structured"`` (layer derivative
        structure); see ``ntbridge.empirical``.
      trace_axes, diagonal_axes: output axes to average over / to keep the diagonal of.
      by_layer: return a dict from each module's qualified name (modules with parameters) to its
        contribution; the contributions sum to the kernel.
      return_info: also return a ``StrategyInfo`` (chosen strategy, candidates' costs, reason,
        path).
      batching_options: ``batch_size``, ``device_count``, ``store_on_device``, ``progress``,
        ``out``, as in :func:`kernel`.

    Example:
        >>> ntbridge.empirical_ntk(model, x1, x2).shape
        torch.Size([20, 5])
        >>> k, info = ntbridge.empirical_ntk(model, x1, return_info=True)
        >>> info.implementation
        'structured'
    """
    spec = EmpiricalNTK(implementation, trace_axes, diagonal_axes, by_layer)
    batching, interact = _empirical_batching(model, batching_options)
    outcome = first_calls.run(Request(model, x1, x2, dataclasses.replace(spec, interact=interact),
                                      batching))
    return (outcome.result, outcome.info) if return_info else outcome.result


def empirical_nngp(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor | None = None, *,
                   trace_axes: Sequence[int] = (-1,), diagonal_axes: Sequence[int] = (),
                   **batching_options) -> torch.Tensor:
    """The outputs' products ``f(x1) f(x2)`` of ``model`` at its current weights, axes as
    :func:`empirical_ntk` (with ``trace_axes=(-1,)``, the mean over output units; BatchNorm using
    batch statistics: the outputs of the joint batch). Any model, and token ids, as
    :func:`empirical_ntk`.

    Example:
        >>> ntbridge.empirical_nngp(model, x1).shape
        torch.Size([20, 20])
    """
    spec = EmpiricalNNGP(trace_axes, diagonal_axes)
    batching, interact = _empirical_batching(model, batching_options)
    return run(Request(model, x1, x2, dataclasses.replace(spec, interact=interact), batching)).result


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
    BatchNorm in eval mode is, in every sample, a fresh module: weight 1, bias 0, running mean 0
    and variance 1 (as ``reset_parameters()`` leaves it), not the model's trained statistics; the
    NTK counts its weight and bias, not its buffers. BatchNorm using batch statistics (training
    mode, or ``track_running_stats=False``) is refused (UnsupportedLayerError): a sample's kernel
    would depend on which other examples are in the call; call ``model.eval()``.
    A model without a converter (see :func:`empirical_ntk`) is re-initialised torch-side by its
    modules' own ``reset_parameters()``, sample ``s`` under a seed derived from ``(seed, s)`` (see
    ``ntbridge.empirical.reinit``; ``init``/``W_std``/``b_std`` do not apply), one kernel per sample;
    a module with parameters but no ``reset_parameters`` is refused (UnsupportedLayerError).

    Args:
      n_samples: an int, or an increasing list of ints: then a generator yields the running
        :class:`Estimate` at each of those counts (the samples are shared, not redrawn).
      get: ``"ntk"`` or ``"nngp"`` (the outputs' products ``f(x1) f(x2)``).
      seed: the samples are ``fold_in(key(seed), s)`` for ``s = 0, 1, ...`` (translated models:
        ``torch.manual_seed(ntbridge.sample_seed(seed, s))``).
      trace_axes, diagonal_axes: as :func:`empirical_ntk`.
      Other options: as :func:`kernel`.

    Example:
        >>> est = ntbridge.monte_carlo(model, x, n_samples=100)
        >>> est.mean.shape, est.standard_error.shape
        (torch.Size([8, 8]), torch.Size([8, 8]))
    """
    spec = MonteCarlo(get, seed, 0, sample_counts(n_samples)[0], trace_axes, diagonal_axes)
    estimates = pipeline.sample(Request(model, x1, x2, spec, Batching(
        batch_size, device_count, store_on_device, progress), dict(init=init, W_std=W_std,
                                                                    b_std=b_std)), n_samples)
    return next(estimates) if isinstance(n_samples, int) else estimates
