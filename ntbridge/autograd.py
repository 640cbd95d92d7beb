"""Kernels that torch autograd differentiates.

When grad mode is on and ``x1``, ``x2`` or a model parameter the kernel depends on requires grad,
the pipeline's kernel is computed as one :class:`~ntbridge.dlpack.Differentiable` node: the
forward is :func:`ntbridge.tiling.compute` as without gradients (the result is handed over without
a copy), and the backward is the sum of the tiles' JAX VJPs (:mod:`ntbridge.tiling.backward`),
compiled on first use and cached like every program. Otherwise nothing changes: no history, no VJP
program.

Which leaves of ``task.args`` count: the very JAX arrays the converter made from torch parameters
requiring grad (``graph.params``: the empirical kernels' parameters), and the analytic kernels'
hyper-parameters (``args["hyper"]``, :meth:`~ntbridge.Graph.hyper_args`) given as torch tensors
requiring grad (``W_std=``, ``b_std=``).

Example:
    >>> x = torch.randn(8, 3, requires_grad=True)
    >>> ntbridge.ntk(model, x).sum().backward()
    >>> x.grad.shape
    torch.Size([8, 3])
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import torch

from .converters.graph import Graph
from .dlpack import Differentiable, precision
from .errors import InputError
from .tiling import Batching, Task, TilingInfo
from .tiling import compute as compute_tiles
from .tiling.backward import vjp


def tracked_parameters(task: Task, graph: Graph) -> list[tuple[int, torch.Tensor]]:
    """``(leaf index in task.args, torch tensor)`` for each leaf of ``task.args`` converted from
    a torch tensor that requires grad (see the module doc)."""
    tensors = graph.tensors
    hyper = graph.hyper_tensors() if isinstance(task.args, dict) and "hyper" in task.args else {}
    found = []
    for n, (path, leaf) in enumerate(jax.tree_util.tree_flatten_with_path(task.args)[0]):
        keys = tuple(getattr(p, "key", getattr(p, "idx", None)) for p in path)
        if keys[:1] == ("hyper",):
            tensor = hyper.get(keys[1:])
        else:
            key = keys[-1] if keys else None
            tensor = tensors.get(key) if leaf is graph.params.get(key, ()) else None
        if tensor is not None and tensor.requires_grad:
            found.append((n, tensor))
    return found


@dataclasses.dataclass
class _Kernel:
    """A task's kernel and its VJP (the :class:`~ntbridge.dlpack.Computation` of a request)."""

    task: Task
    x1: torch.Tensor
    x2: torch.Tensor | None
    opts: Batching
    tracked: tuple[tuple[int, torch.Tensor], ...]  # (leaf index in task.args, its torch tensor)
    treedef: Any = None
    tiling: TilingInfo | None = None

    def forward(self) -> list[torch.Tensor]:
        result, self.tiling = compute_tiles(self.task, self.x1, self.x2, self.opts)
        leaves, self.treedef = jax.tree.flatten(result)
        return leaves

    def backward(self, grads: Sequence[torch.Tensor],
                 needed: Sequence[bool]) -> list[torch.Tensor | None]:
        """Gradients for ``(x1, x2, *tracked tensors)``, those ``needed``, each shaped, typed and
        placed like its tensor."""
        tracked = tuple(i for (i, _), want in zip(self.tracked, needed[2:]) if want)
        with precision(self.x1.dtype):
            d_args, d_x1, d_x2 = vjp(self.task, self.x1, self.x2, self.opts, grads, tracked,
                                     (needed[0], needed[1] and self.x2 is not None),
                                     None if self.tiling is None else self.tiling.tile)
        by_leaf = dict(zip(tracked, d_args))
        like = lambda d, t: None if d is None else d.reshape(t.shape).to(t.device, t.dtype)
        return [d_x1, d_x2, *[like(by_leaf.get(i), t) for i, t in self.tracked]]


def compute(task: Task, inputs: tuple[torch.Tensor, torch.Tensor | None], x1: torch.Tensor,
            x2: torch.Tensor | None, opts: Batching, graph: Graph) -> tuple[Any, TilingInfo]:
    """:func:`ntbridge.tiling.compute` of ``task`` on the validated ``x1``, ``x2``, with autograd
    history when grad mode is on and the user's ``inputs`` (x1, x2 as given) or the tracked model
    parameters require grad (with ``out=``, inputs that require grad are refused and parameters
    are not tracked).

    Returns the task's pytree of ``(N1, N2, ...)`` torch tensors, and how it was tiled.

    Example:
        >>> k, tiling = compute(task, (request.x1, request.x2), x1, x2, batching, graph)
    """
    wanted = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in inputs)
    if wanted and opts.out is not None:
        raise InputError("out= writes the kernel to a file, which carries no autograd history, but "
                         "x1 or x2 requires grad; drop out= to differentiate the kernel, or detach "
                         "the inputs (x.detach(), or torch.no_grad()).")
    params = tracked_parameters(task, graph) if torch.is_grad_enabled() and opts.out is None else []
    if not (wanted or params):
        return compute_tiles(task, x1, x2, opts)
    kernel = _Kernel(task, x1, x2, opts, tuple(params))
    leaves = Differentiable.apply(kernel, *inputs, *[t for _, t in params])
    return jax.tree.unflatten(kernel.treedef, leaves), kernel.tiling


@dataclasses.dataclass
class _Deferred:
    """A kernel computed outside the pipeline (torch-side), whose VJP is that of the pipeline's
    task for the same request, built on the first backward (:func:`deferred`)."""

    compute: Callable[[], list[torch.Tensor]]
    build: Callable[[], tuple[Task, Graph, torch.Tensor, torch.Tensor | None, Batching]]
    params: tuple[torch.Tensor, ...]

    def forward(self) -> list[torch.Tensor]:
        return self.compute()

    def backward(self, grads: Sequence[torch.Tensor],
                 needed: Sequence[bool]) -> list[torch.Tensor | None]:
        task, graph, x1, x2, opts = self.build()
        tracked = tracked_parameters(task, graph)
        wanted = {id(p) for p, want in zip(self.params, needed[2:]) if want}
        kernel = _Kernel(task, x1, x2, opts, tuple(tracked))
        d = kernel.backward(grads, [*needed[:2], *[id(t) in wanted for _, t in tracked]])
        by_tensor = {id(t): g for (_, t), g in zip(tracked, d[2:])}
        return [d[0], d[1], *[by_tensor.get(id(p)) for p in self.params]]


def deferred(compute: Callable[[], list[torch.Tensor]],
             build: Callable[[], tuple[Task, Graph, torch.Tensor, torch.Tensor | None, Batching]],
             inputs: tuple[torch.Tensor, torch.Tensor | None],
             params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``compute()``'s tensors (a kernel's leaves, computed without history) as one node of torch's
    autograd graph over ``inputs`` (x1, x2 as the user gave them) and the model's ``params``,
    when grad mode is on and one of them requires grad; its backward is the VJP of the task that
    ``build()`` returns, ``(task, graph, x1, x2, batching)``, as :func:`compute` differentiates it.

    Example:
        >>> (k,) = deferred(lambda: [torch_ntk(...)], build, (x1, None), list(model.parameters()))
    """
    params = tuple(p for p in params if p.requires_grad)
    wanted = any(t is not None and t.requires_grad for t in (*inputs, *params))
    if not (torch.is_grad_enabled() and wanted):
        return compute()
    return list(Differentiable.apply(_Deferred(compute, build, params), *inputs, *params))
