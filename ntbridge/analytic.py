"""Infinite-width kernels as tasks of the request pipeline (the twin of ``empirical/tasks.py``).

:func:`task` turns a converted model's closed-form kernels into a :class:`~ntbridge.tiling.Task`
for :func:`ntbridge.tiling.compute`:

* on CPUs each tile is computed in blocks of examples that stay in cache
  (:func:`ntbridge.tiling.blocks.in_blocks`), the blocks sharing each example's own covariances
  (:func:`ntbridge.stax.covariances.own_covariances`, once per tile);
* programs without full-spatial layers take the XLA options of kernels of vectors or of
  same-position covariances (:data:`ntbridge.devices.PROGRAM_OPTIONS`);
* with ``by_layer``, a chain of modules gives the NNGP and each module's contribution to the NTK:
  the NTK of the network with the NTK zeroed just before module ``j``, minus the same from ``j``'s
  successor on, is ``j``'s contribution;
* the layers' hyper-parameters (``W_std``, ``b_std``: :mod:`ntbridge.stax.layers`) are the task's
  arguments, ``{"hyper": graph.hyper_args(dtype)}``, not constants of its program: one program
  serves every value, and :mod:`ntbridge.autograd` differentiates those given as torch tensors.

Example:
    >>> t, names = task(Analytic("ntk"), ntbridge.convert(model), a1, None, "cpu")
    >>> t.computation[0]
    'analytic'
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from . import programs
from .results import Kernels
from .specs import Analytic
from .stax import Layer, with_hyper
from .stax.covariances import Covariances, evaluate, inputs_kernel, own_covariances
from .stax.kernel import jax_kernel_dtype, swap_perm
from .tiling import Task
from .tiling.blocks import in_blocks, splits


def perm_of(network: Layer):
    """``perm(ndim)``: the axes exchanging x1 and x2 in an analytic kernel array of rank ``ndim``."""
    return functools.partial(swap_perm, diagonal_spatial=not network.full_spatial)


def kernels(network: Layer, x1, x2, get, covs: tuple[Covariances, Covariances] | None = None,
            hyper: tuple | None = None):
    """The kernels ``get`` (a name: an array; a tuple: a :class:`~ntbridge.results.Kernels`) with
    the layers' hyper-parameters ``hyper`` (None: their own)."""
    names = (get,) if isinstance(get, str) else tuple(get)
    return Kernels.pick(evaluate(network, x1, x2, names, covs, hyper), get)


def _own_covariances(network: Layer, args, x: jax.Array) -> Covariances:
    """Each example's covariance with itself at every layer, ``(N, ...)`` leaves, for the examples
    x ``(N, ...)``, with the hyper-parameters of the task's arguments ``args``."""
    return jax.vmap(lambda example: own_covariances(network, example, not network.full_spatial,
                                                    args["hyper"]))(x)


def program_kind(network: Layer, a1: jax.ShapeDtypeStruct) -> str:
    """The kind of XLA options (:data:`ntbridge.devices.PROGRAM_OPTIONS`) for inputs like a1."""
    if network.full_spatial:
        return "default"
    return "vector" if len(a1.shape) == 2 else "diagonal"


def _pair_bytes(network: Layer, a1: jax.ShapeDtypeStruct) -> int:
    """The bytes of one example pair in the kernel of inputs like ``a1`` ``(N, ...)``, in the
    layout ``network`` reads them: positions (or pairs of positions, ``full_spatial``) of images,
    tokens of sequences and of token ids, in the kernels' dtype."""
    one = jax.ShapeDtypeStruct((1, *a1.shape[1:]), a1.dtype)
    k = jax.eval_shape(lambda a: inputs_kernel(network, a, None, False, not network.full_spatial),
                       one)
    return k.nngp.dtype.itemsize * math.prod(k.nngp.shape[2:])


def _pair_bytes_of(graph, a1: jax.ShapeDtypeStruct) -> int:
    """:func:`_pair_bytes` of ``graph.network``, traced once per architecture, example shape and
    dtype, and x64 mode (a trace costs milliseconds, more than a small kernel's call): an entry of
    :mod:`ntbridge.programs`' cache."""
    example = jax.ShapeDtypeStruct((1, *a1.shape[1:]), a1.dtype)
    key = programs.ProgramKey.of("pair bytes", graph.architecture, example)
    return programs.cached(key, lambda: _pair_bytes(graph.network, a1))


def task(spec: Analytic, graph, x1: jax.ShapeDtypeStruct, x2: jax.ShapeDtypeStruct | None,
         platform: str) -> tuple[Task, tuple[str, ...] | None]:
    """The kernels of ``spec`` on ``graph`` (a :class:`~ntbridge.Graph`) as a task for inputs like
    x1 on ``platform``; its info is the names of the modules whose NTK contributions it returns
    (``spec.by_layer`` on a chain of modules), else None."""
    graph.check_init()
    network, perm = graph.network, perm_of(graph.network)
    args = {"hyper": graph.hyper_args(jax_kernel_dtype(x1.dtype))}
    if spec.by_layer and all(n.inputs == (n.index - 1,) for n in graph.layers):
        owners = tuple(n.index for n in graph.layers if n.param_names)
        return (Task(("analytic_by_layer", graph.architecture, owners),
                     _by_layer_fn(graph, owners), perm, args, pairwise=network.pairwise,
                     kernels=1 + len(owners)),
                tuple(graph.layers[j].name for j in owners))
    get = spec.get
    fn = lambda args, a1, a2, covs=None: kernels(network, a1, a2, get, covs, args["hyper"])
    blocks = platform == "cpu" and network.pairwise
    pair_bytes = functools.partial(_pair_bytes_of, graph)
    own = functools.partial(_own_covariances, network)
    return Task(("analytic", graph.architecture, get, blocks),
                in_blocks(fn, pair_bytes, perm, own) if blocks else fn, perm, args,
                pairwise=network.pairwise,
                exactly_symmetric=lambda a1: blocks and splits(a1, None, pair_bytes),
                program_kind=functools.partial(program_kind, network),
                compute_bound=network.replicates > 0,
                kernels=1 if isinstance(get, str) else len(get)), None


def _by_layer_fn(graph, owners: tuple[int, ...]):
    """``fn(args, x1, x2) -> (nngp, [contribution of layer j for j in owners])`` (module doc)."""
    layers = tuple(n.layer for n in graph.layers)

    def suffix(k, start, hyper):
        for i, (layer, h) in enumerate(zip(layers, hyper)):
            if i == start:
                k = k.replace(ntk=jnp.zeros_like(k.ntk))
            k = with_hyper(layer, h)(k)
        return k

    def fn(args, x1, x2):
        k0 = inputs_kernel(graph.network, x1, x2, True, not graph.network.full_spatial)
        parts = [suffix(k0, j, args["hyper"]) for j in owners]
        sums = [k.ntk for k in parts] + [jnp.zeros_like(parts[0].ntk)]
        return parts[0].nngp, [a - b for a, b in zip(sums, sums[1:])]

    return fn
