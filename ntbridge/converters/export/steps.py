"""A translated ATen program as a list of steps, the layer list the ``"structured"`` strategy runs.

Every node of the exported program that depends on the model's input becomes a :class:`Step` (the
nodes that depend on weights alone, e.g. ``permute(weight, [1, 0])``, are recomputed inside the
steps that read them, so a step's parameters are the model's own). Steps follow the protocol of a
converted layer node (``inputs``, ``param_names``, ``key``, ``owner``, ``layer.apply_fn``,
``layer.structure``, ``layer.affine``): a matrix product with a weight (``mm``/``addmm`` of a
parameter's transpose, ``nn.Linear`` after decomposition) or a convolution of a parameter whose
input and output lead with the batch axis declares the outer-product structure of ``nn.Linear`` and
``nn.Conv`` (:class:`~ntbridge.stax.Outer`). A weight used by several steps (a recurrent cell's, at
every time step) is shared: the structured strategy leaves it to Jacobians.

Example:
    >>> steps = program_steps(translate(model, x).program)
    >>> [s.name for s in steps if s.layer.structure]     # the modules whose weights are structured
    ['head']
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import torch
from torch import fx
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from ... import stax
from ...stax import Outer
from .translator import call_node

aten = torch.ops.aten


class StepLayer(NamedTuple):
    """What the structured strategy reads of a step: its function and structure (see the module
    doc); translated steps are never treated as affine."""

    apply_fn: Callable[[dict, Any], Any]
    structure: Callable[[dict, jax.Array], dict[str, Outer]] | None = None
    affine: bool = False


@dataclasses.dataclass(frozen=True)
class Step:
    """One input-dependent node of the exported program.

    Attributes:
      index: position in the list; ``inputs`` index the steps feeding it (-1: the model's input).
      name: the qualified name of the module that produced it ("" for the model's own forward).
      layer: its function ``layer.apply_fn({param: array}, arg)`` (``arg``: the single input, or a
        tuple of them) and optional structure.
      param_names: the parameters, buffers and constants it reads, by their names in the model.
    """

    index: int
    name: str
    layer: StepLayer
    param_names: tuple[str, ...]
    inputs: tuple[int, ...]

    def key(self, param: str) -> str:
        """A step's parameter names are the model's own."""
        return param

    def owner(self, param: str) -> str:
        """The qualified name of the module owning ``param`` (for ``by_layer``)."""
        return param.rpartition(".")[0]


def program_steps(program: ExportedProgram) -> tuple[Step, ...]:
    """The steps computing ``program``'s user output, in order, the output's step last."""
    graph_module = program.graph_module
    nodes = list(graph_module.graph.nodes)
    names = {s.arg.name: s.target for s in program.graph_signature.input_specs
             if s.kind != InputKind.USER_INPUT}
    user = next(s.arg.name for s in program.graph_signature.input_specs
                if s.kind == InputKind.USER_INPUT)
    output = _user_output(program)
    dependent = _descendants(nodes, user) & _ancestors(output)
    index = {n: i for i, n in enumerate(n for n in nodes if n in dependent)}
    index[next(n for n in nodes if n.name == user)] = -1
    batch = _batch_symbol(nodes, user)
    return tuple(_step(n, index, names, graph_module, batch) for n in index if index[n] >= 0)


def _user_output(program: ExportedProgram) -> fx.Node:
    outputs = next(n for n in program.graph.nodes if n.op == "output").args[0]
    kinds = [s.kind.name for s in program.graph_signature.output_specs]
    return outputs[kinds.index("USER_OUTPUT")]


def _descendants(nodes: list[fx.Node], user: str) -> set[fx.Node]:
    found = {n for n in nodes if n.name == user}
    for n in nodes:
        if any(a in found for a in n.all_input_nodes):
            found.add(n)
    return found - {n for n in nodes if n.name == user}


def _ancestors(node: fx.Node) -> set[fx.Node]:
    found, todo = set(), [node]
    while todo:
        n = todo.pop()
        if n not in found:
            found.add(n)
            todo.extend(n.all_input_nodes)
    return found


def _batch_symbol(nodes: list[fx.Node], user: str):
    return next(n for n in nodes if n.name == user).meta["val"].shape[0]


def _step(node: fx.Node, index: dict, names: dict[str, str], graph_module: fx.GraphModule,
          batch) -> Step:
    inputs = tuple(dict.fromkeys(a for a in node.all_input_nodes if a in index))
    folded = _folded_placeholders(node, index)

    def apply_fn(local: dict, arg):
        env = dict(zip(inputs, (arg,) if len(inputs) == 1 else arg))

        def value(n: fx.Node):
            if n not in env:
                if n.op == "placeholder":
                    env[n] = local[names[n.name]]
                elif n.op == "get_attr":
                    env[n] = getattr(graph_module, n.target)
                else:
                    args, kwargs = fx.node.map_arg((n.args, n.kwargs), value)
                    env[n] = call_node(n, args, kwargs)
            return env[n]

        args, kwargs = fx.node.map_arg((node.args, node.kwargs), value)
        return call_node(node, args, kwargs)

    structure = _structure(node, names, batch)
    return Step(index[node], _module_name(node), StepLayer(apply_fn, structure),
                tuple(names[p.name] for p in folded), tuple(index[a] for a in inputs))


def _folded_placeholders(node: fx.Node, index: dict) -> list[fx.Node]:
    """The weight placeholders read by ``node`` through nodes that do not depend on the input."""
    found, todo = [], [a for a in node.all_input_nodes if a not in index]
    while todo:
        n = todo.pop(0)
        if n.op == "placeholder" and n not in found:
            found.append(n)
        todo.extend(a for a in n.all_input_nodes if a not in index)
    return found


def _module_name(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    return list(stack.values())[-1][0] if stack else ""


# ------------------------------------------------------------ structure of linear steps

def _weight(node: Any, names: dict[str, str]) -> str | None:
    """The parameter name of ``weight`` when ``node`` is ``permute(weight, [1, 0])``."""
    if (isinstance(node, fx.Node) and node.target == aten.permute.default
            and list(node.args[1]) == [1, 0] and node.args[0].op == "placeholder"):
        return names.get(node.args[0].name)
    return None


def _placeholder(node: Any, names: dict[str, str]) -> str | None:
    return names.get(node.name) if isinstance(node, fx.Node) and node.op == "placeholder" else None


def _per_example(node: fx.Node, batch) -> bool:
    """Whether ``node``'s value leads with the batch axis (not, e.g., batch x positions)."""
    value = node.meta.get("val") if isinstance(node, fx.Node) else None
    return isinstance(value, torch.Tensor) and value.ndim > 0 and str(value.shape[0]) == str(batch)


def _structure(node: fx.Node, names: dict[str, str], batch) -> Callable | None:
    """The outer-product structure of a linear step, or None (see the module doc)."""
    if node.target == aten.mm.default:
        x, w = node.args
        bias, beta, alpha = None, 1, 1
    elif node.target == aten.addmm.default:
        (bias, x, w), beta, alpha = node.args, node.kwargs.get("beta", 1), node.kwargs.get("alpha", 1)
        bias = _placeholder(bias, names)
        if bias is None or beta != 1:
            return None
    elif node.target == aten.convolution.default:
        return _conv_structure(node, names, batch)
    else:
        return None
    weight = _weight(w, names)
    if weight is None or alpha != 1 or not (_per_example(node, batch) and _per_example(x, batch)):
        return None
    rows = lambda g: g.reshape(g.shape[0], -1, g.shape[-1])
    return lambda params, x: {weight: Outer(rows(x), rows),
                              **({bias: Outer(None, rows)} if bias else {})}


def _conv_structure(node: fx.Node, names: dict[str, str], batch) -> Callable | None:
    x, w, b, stride, padding, dilation, transposed, _, groups = node.args
    weight, bias = _placeholder(w, names), _placeholder(b, names)
    if weight is None or transposed or (b is not None and bias is None) or not (
            _per_example(node, batch) and _per_example(x, batch)):
        return None
    out_channels, in_per_group, *kernel = w.meta["val"].shape
    conv = stax.Conv(in_per_group * groups, out_channels, tuple(kernel), stride=tuple(stride),
                     padding=tuple(padding), dilation=tuple(dilation), groups=groups, W_std=1.0,
                     b_std=None if b is None else 1.0)

    def structure(params, x):
        local = {"weight": params[weight], **({"bias": params[bias]} if bias else {})}
        return {{"weight": weight, "bias": bias}[p]: o for p, o in conv.structure(local, x).items()}

    return structure
