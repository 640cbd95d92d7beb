"""Each example's covariances with itself, computed once and reused by every kernel it is part of.

A network's kernel of ``b1 x b2`` examples also computes, at every layer, each example's covariance
with itself (a :class:`Kernel`'s ``cov1`` and ``cov2``): ``b1 + b2`` of them next to ``b1 b2``
pairs. A kernel computed in many blocks of examples recomputes them in each block. Instead,
:func:`own_covariances` gives every layer's covariance of one example (once per example), and
:func:`with_covariances` is a ``dag`` hook that puts them in place of those the layers compute,
which are then unused and compiled away.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np

from .combinators import After
from .kernel import Kernel, input_kernel
from .layers import Layer

Covariances = dict[int, Any]  # node index (INPUT: the inputs) -> its outputs' covariances


def _is_kernel(value: Any) -> bool:
    return isinstance(value, Kernel)


def inputs_kernel(network: Layer, x1: jax.Array, x2: jax.Array | None, compute_ntk: bool,
                  diagonal_spatial: bool) -> Kernel:
    """The kernel of the raw inputs in the layout ``network`` reads them (see ``Layer``)."""
    make = network.input_kernel or input_kernel
    k = make(x1, x2, compute_ntk=compute_ntk, diagonal_spatial=diagonal_spatial)
    return k if network.sampling is None else k.replace(sampling=network.sampling)


def own_covariances(network: Layer, x: jax.Array, diagonal_spatial: bool,
                    hyper: tuple | None = None) -> Covariances:
    """The covariance of one example ``x`` ``(C, *S)`` (or ``(features,)``) with itself at the
    inputs and after every layer of the ``dag`` ``network`` (its layers' hyper-parameters
    ``hyper``, None for their own): ``{i: cov}``, ``cov`` shaped like a Kernel's ``cov1`` without
    its batch axis (a tuple of them for a layer with several outputs). No NTK is computed: no
    covariance depends on it.

    Example:
        >>> net = serial(Dense(3, 4, W_std=1., b_std=0.), Relu())
        >>> {i: c.shape for i, c in own_covariances(net, jnp.ones(3), True).items()}
        {-1: (), 0: (), 1: ()}
    """
    covs = {}

    def record(i, out):
        covs[i] = jax.tree.map(lambda k: k.cov1[0], out, is_leaf=_is_kernel)
        return out

    k = inputs_kernel(network, x[None], None, False, diagonal_spatial)
    network.kernel_fn(k, hyper, after=record)
    return covs


def with_covariances(covs1: Covariances, covs2: Covariances) -> After:
    """A hook ``after`` for a ``dag``'s ``kernel_fn`` that sets the ``cov1`` and ``cov2`` of node
    ``i``'s kernels to ``covs1[i]`` and ``covs2[i]``: :func:`own_covariances` of the x1 and of the
    x2 examples, stacked ``(N1, ...)`` and ``(N2, ...)``.

    Example:
        >>> covs = jax.vmap(lambda x: own_covariances(net, x, True))(x1)
        >>> k = net.kernel_fn(input_kernel(x1, x1, compute_ntk=True, diagonal_spatial=True),
        ...                   after=with_covariances(covs, covs))
    """

    def after(i, out):
        return jax.tree.map(lambda k, c1, c2: k.replace(cov1=c1, cov2=c2, sources=k.sources),
                            out, covs1[i],
                            covs2[i], is_leaf=_is_kernel)

    return after


def evaluate(network: Layer, x1: jax.Array, x2: jax.Array | None, names: tuple[str, ...],
             covs: tuple[Covariances, Covariances] | None = None,
             hyper: tuple | None = None, replicate: jax.Array | None = None) -> dict[str, jax.Array]:
    """The kernels ``names`` (``"nngp"``, ``"ntk"``) of the ``dag`` network's outputs for inputs
    x1 ``(N1, ...)`` and x2 ``(N2, ...)`` (None: x1 with itself); ``covs``: the examples' own
    covariances at every layer (:func:`own_covariances` of the x1 and of the x2 examples, stacked),
    used instead of computing them; ``hyper``: the layers' hyper-parameters (None: their own);
    ``replicate``: the one replicate of numerical rules to use (``Kernel.replicate``; None: all).

    Example:
        >>> evaluate(serial(Dense(3, 4, W_std=1., b_std=0.), Relu()), jnp.ones((5, 3)), None,
        ...          ("nngp",))["nngp"].shape
        (5, 5)
    """
    k = inputs_kernel(network, x1, x2, "ntk" in names, not network.full_spatial)
    k = network.kernel_fn(k.replace(replicate=replicate), hyper,
                          after=None if covs is None else with_covariances(*covs))
    return {name: getattr(k, name) for name in names}


def evaluate_error(network: Layer, x1: jax.Array, x2: jax.Array | None,
                   names: tuple[str, ...], compiled: Callable | None = None) -> float:
    """The relative error of the kernels ``names`` where the network's rules are numerical
    expectations with independent replicates (``Layer.replicates``, e.g. attention's): the kernels
    computed once per replicate alone, their largest standard error over the largest entry of
    their mean (an error bar of the kernel computed with all replicates, to first order in the
    rules' errors); 0 where every rule is exact. One program, called once per replicate (the
    memory of one kernel computation): ``compiled()``, which gives the compiled
    :func:`replicate_fn` and is called only where a rule has replicates (None: compile it here).

    Example:
        >>> evaluate_error(serial(Dense(3, 4, W_std=1., b_std=0.)), jnp.ones((2, 3)), None,
        ...                ("nngp",))
        0.0
    """
    r = network.replicates
    if r < 2:
        return 0.0
    alone = compiled() if compiled else jax.jit(replicate_fn(network, names))
    runs = [alone(x1, x2, i) for i in range(r)]
    errors = []
    for name in names:
        # in float64: float32's rounding of the mean of equal replicates is a spread of its own
        v = np.stack([np.asarray(run[name], np.float64) for run in runs])
        scale = max(np.abs(v.mean(0)).max(), np.finfo(v.dtype).tiny)
        errors.append(v.std(0, ddof=1).max() / r ** 0.5 / scale)
    return float(max(errors))


def replicate_fn(network: Layer, names: tuple[str, ...]) -> Callable:
    """``fn(x1, x2, i)``: the kernels ``names`` of the network with replicate ``i`` of its numerical
    rules alone (what :func:`evaluate_error` calls once per replicate)."""
    return lambda a1, a2, i: evaluate(network, a1, a2, names, replicate=i)
