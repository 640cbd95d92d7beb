"""torch.fx tracing of a model's ``forward``, remembering which of the user's modules wrote each
node, so that errors name it (``torch.cumsum in module '1.1' (MyModule)``), not the traced node;
and the values of the nodes computed from the model's buffers alone (:func:`constant`)."""

from __future__ import annotations

import operator
from typing import Callable

import torch
from torch import fx, nn

from ...errors import ConversionError
from ..registry import find_converter, overrides_forward
from ..geometric import pool_functions

_SCOPE = "ntbridge_scope"  # node.meta key: (qualified name, type name) of the enclosing module


class _Tracer(fx.Tracer):
    """Keeps registered module types (and torch's own modules) whole, as ``call_module`` nodes,
    and records in each node's meta the module whose ``forward`` created it (``_SCOPE``)."""

    def __init__(self, model: nn.Module):
        super().__init__(autowrap_functions=pool_functions())
        self.scopes = [("", type(model).__name__)]

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        """Modules with a converter, unless their class overrides its ``forward`` (traced
        through, as the user's own modules), and torch's own."""
        if find_converter(m) is not None:
            return not overrides_forward(m)
        return super().is_leaf_module(m, qualname)

    def call_module(self, m: nn.Module, forward: Callable, args: tuple, kwargs: dict):
        self.scopes.append((self.path_of_module(m), type(m).__name__))
        try:
            return super().call_module(m, forward, args, kwargs)
        finally:
            self.scopes.pop()

    def create_node(self, *args, **kwargs) -> fx.Node:
        node = super().create_node(*args, **kwargs)
        node.meta[_SCOPE] = self.scopes[-1]
        return node


def describe(node: fx.Node) -> str:
    """How error messages name a functional call: the operation and the user's module around it,
    e.g. ``torch.cumsum in module '1.1' (MyModule)``."""
    if node.op == "call_method":
        operation = f"Tensor.{node.target}"
    else:
        module = getattr(node.target, "__module__", None) or "builtins"
        operation = f"{module.lstrip('_')}.{getattr(node.target, '__name__', node.target)}"
    path, kind = node.meta[_SCOPE]
    return f"{operation} in module '{path}' ({kind})" if path else f"{operation} in {kind}.forward"


def trace(model: nn.Module) -> fx.Graph:
    """The graph of ``model.forward``, leaf modules kept whole, each node's enclosing module in its
    meta (see :func:`describe`).

    Example:
        >>> [n.op for n in trace(nn.Sequential(nn.Linear(3, 4))).nodes]
        ['placeholder', 'call_module', 'output']
    """
    try:
        graph = _Tracer(model).trace(model)
    except Exception as e:  # fx raises many types; none of them is the user's fault but the model's
        raise ConversionError(f"torch.fx could not trace {type(model).__name__}.forward "
                              f"({type(e).__name__}: {e}). {_why_untraceable(e)}") from e
    graph.owning_module = model  # whose modules say whether calling them is pure
    graph.eliminate_dead_code()
    return graph


def _why_untraceable(e: Exception) -> str:
    """What to do about torch.fx's error ``e``."""
    if isinstance(e, TypeError) and "slice indices must be integers" in str(e):
        return ("A buffer sliced by a size of the input (a positional encoding's self.pe[:x.size(1)]) "
                "cannot be traced: torch.fx hands buffers over as values, not as traced tensors. A "
                "fixed encoding added to the features has no kernel rule anyway (the rules take "
                "zero-mean features): use learned positions, x + self.pos(torch.arange(T)) with an "
                "nn.Embedding, or an nn.Parameter (T, d); or ntbridge.empirical_ntk.")
    return ("Data-dependent control flow (if/for/while on tensor values) cannot be traced. Rewrite "
            "the model as an nn.Sequential of supported modules, or register a converter for the "
            "module that cannot be traced (ntbridge.register_converter) so that it is kept whole.")


def constant(model: nn.Module, node: fx.Node, constants: dict):
    """The value of ``node`` if it is a buffer (or tensor attribute) of ``model``, or computed
    from such alone (``self.adjacency.T``); None otherwise. Parameters are not constants."""
    if node.op == "get_attr":
        value = operator.attrgetter(node.target)(model)
        return None if isinstance(value, nn.Parameter) else value
    if node.op not in ("call_function", "call_method") or not node.all_input_nodes or any(
            a not in constants for a in node.all_input_nodes):
        return None
    args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda a: constants[a])
    with torch.no_grad():
        if node.op == "call_method":
            return getattr(args[0], node.target)(*args[1:], **kwargs)
        return node.target(*args, **kwargs)
