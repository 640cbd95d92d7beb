"""torch.nn.Module -> stax ``Graph``: a registry of converters keyed by module type.

One file per family (``linear``, ``activations``, ``structure``); supporting a new module type is
one small function decorated with :func:`register` (public as ``ntbridge.register_converter``).
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch import nn

from ..dlpack import precision, to_jax
from ..errors import InputError, InputTypeError, UnsupportedLayerError
from . import activations, linear, normalization, structure  # noqa: F401  (they register their converters)
from .graph import Graph, Kernels, Node
from .registry import Context, Options, StdOption, find_converter, register, supported_types

__all__ = ["Graph", "Kernels", "Node", "convert", "register"]


def _leaves(module: nn.Module, prefix: str = "") -> Iterator[tuple[str, nn.Module]]:
    """The leaf modules of nested ``nn.Sequential`` containers, with their qualified names."""
    if isinstance(module, nn.Sequential):
        for name, child in module.named_children():
            yield from _leaves(child, f"{prefix}.{name}" if prefix else name)
    else:
        yield prefix, module


def _tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(module.named_parameters(recurse=False)),
            **dict(module.named_buffers(recurse=False))}


def _check_uniform(model: nn.Module) -> None:
    tensors = list(model.parameters()) + list(model.buffers())
    kinds = {(t.dtype, t.device) for t in tensors if t.is_floating_point()}
    if len(kinds) > 1:
        raise InputError(f"the model's parameters have several dtypes/devices {sorted(map(str, kinds))}; "
                         f"move them to one, e.g. model.to(torch.float32).")


def _signature_part(module: nn.Module):
    """A faithful hashable description of a module's architecture and mode."""
    if type(module).__module__.startswith("torch.nn"):
        return type(module).__name__, repr(module), module.training
    return module  # a user's module: its repr may omit what matters, so key by identity


def convert(model: nn.Module, *, parameterization: str = "standard", init: str = "torch",
            W_std: StdOption = None, b_std: StdOption = None) -> Graph:
    """Translate ``model`` into a :class:`Graph` (``init_fn``, ``apply_fn``, ``kernel_fn``, ``params``).

    Args:
      model: an ``nn.Sequential`` (nested to any depth) of supported modules, or one such module.
      parameterization: ``"standard"`` (torch's; the NTK uses the model's actual widths) or
        ``"ntk"`` (the width-independent NTK limit).
      init: ``"torch"`` (the variance of torch's default init of each module) or ``"infer"`` (read
        from the current weights).
      W_std, b_std: explicit standard deviations, a float for every layer or a mapping from
        qualified module names (as in ``model.named_modules()``) to floats.

    Example:
        >>> g = ntbridge.convert(nn.Sequential(nn.Linear(3, 64), nn.ReLU(), nn.Linear(64, 1)))
        >>> [n.name for n in g.layers]
        ['0', '1', '2']
    """
    if not isinstance(model, nn.Module):
        raise InputTypeError(f"model must be a torch.nn.Module, got {type(model).__name__}.")
    _check_uniform(model)
    options = Options(parameterization, init, W_std, b_std)
    nodes = []
    for index, (name, module) in enumerate(_leaves(model)):
        converter = find_converter(module)
        where = f"module {index} '{name}' ({type(module).__name__})"
        if converter is None:
            raise UnsupportedLayerError(
                f"{where} has no converter. Supported module types: {', '.join(supported_types())}. "
                f"Register one with @ntbridge.register_converter({type(module).__name__}), or build "
                f"the model from supported modules in an nn.Sequential.")
        ctx = Context(name, index, options)
        layer = converter(module, ctx)
        nodes.append(Node(index, name, module, layer, tuple(_tensors(module)), ctx.hyper,
                          inputs=(index - 1,)))
    options.check_names([n.name for n in nodes if n.hyper])
    floats = [t for t in model.parameters()] or [torch.empty(0)]
    with precision(floats[0].dtype):
        params = {n.key(p): to_jax(t, n.key(p)) for n in nodes for p, t in _tensors(n.module).items()}
    signature = (parameterization, tuple(
        (n.name, _signature_part(n.module), tuple(sorted(n.hyper.items())), n.inputs) for n in nodes))
    return Graph(nodes, params, signature)
