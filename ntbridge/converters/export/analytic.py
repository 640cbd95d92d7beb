"""The analytic route over a ``torch.export`` graph: models torch.fx cannot trace (Hugging Face's,
nanoGPT's) converted into the same stax rules as the fx route's.

The model is exported for its example input (a dynamic batch axis, the sequence length fixed;
once per model and example shape, kept in :mod:`ntbridge.programs`), without decomposition, so that its ATen graph keeps ``linear``, ``layer_norm``, ``embedding``,
``gelu``, ``softmax`` and ``scaled_dot_product_attention`` whole. :func:`export_nodes` walks it
once, keeping for every graph value what it is (:mod:`.values`): a converted tensor, a constant of
the buffers and sizes (computed here: causal masks sliced to the length, position ids), a
parameter, a projection not yet converted; attentions are recognised by :mod:`.heads`. Each
operation on converted tensors becomes the node of the module computing it: the model's own
``nn.Linear``, ``nn.Embedding``, ``nn.LayerNorm`` (found from their parameters), an activation's
module, a residual sum, positions added (:class:`~..positions.AddPositions`), a token selected or
the tokens' mean, or :mod:`.standins`' (``addmm`` of a weight stored ``(in, out)``, attention).

A model returning a Hugging Face ``ModelOutput`` gives the kernel of its first field
(``last_hidden_state``); wrap it in a module to choose another (``model(ids).pooler_output``).
"""

from __future__ import annotations

import inspect

import torch
from torch import fx, nn
from torch.export.graph_signature import InputKind

from ... import programs
from ...errors import ConversionError, UnsupportedLayerError
from ...stax import INPUT
from ..graph import Node, make_node
from ..normalization import rms_norm_of
from ..registry import Options
from .heads import HEAD_VALUES, Mixed, attention, head_op
from .norms import Normed, norm_op
from .operations import HANDLERS
from .padding import padding_op
from .pointwise import Pointwise, module_of, pointwise
from .standins import ExportedAffine
from .translator import _where, cache_key, export
from .values import Const, Param, Proj, Rows, Seq, dims


class _Walk:
    """The state of :func:`export_nodes`' walk."""

    def __init__(self, model: nn.Module, options: Options, program, example: torch.Tensor):
        self.model, self.options, self.example = model, options, example
        self.nodes: list[Node] = []
        self.values: dict[fx.Node, object] = {}
        self.made: dict = {}  # the node of each projection or elementwise function read
        signature = program.graph_signature
        params = dict(model.named_parameters(remove_duplicate=False))
        state = {**dict(model.named_buffers(remove_duplicate=False)), **program.constants}
        self.inputs = {}
        for spec in signature.input_specs:
            if spec.kind == InputKind.PARAMETER:
                self.inputs[spec.arg.name] = Param(spec.target, params[spec.target])
            elif spec.kind == InputKind.USER_INPUT:
                self.inputs[spec.arg.name] = Seq(INPUT)
            else:
                self.inputs[spec.arg.name] = Const(state[spec.target])

    def add(self, name: str, module: nn.Module, inputs: tuple[int, ...], node: fx.Node) -> Seq:
        """Append the node of ``module`` fed by ``inputs`` (``name``: its owner's qualified name,
        or "" for a function: named by ``node``); its value."""
        self.nodes.append(make_node(len(self.nodes), name or node.name, module, inputs,
                                    self.options, "" if name else _where(node)))
        return Seq(len(self.nodes) - 1)

    def owner(self, param: Param) -> tuple[str, nn.Module]:
        name = param.name.rpartition(".")[0]
        return name, self.model.get_submodule(name)

    def seq(self, value, node: fx.Node) -> int:
        """The converted node of ``value``, converting a projection that no attention took."""
        if isinstance(value, Proj):
            if (value.lo, value.hi) != (0, value.out_features):
                raise UnsupportedLayerError(f"{_where(node)}: a share of a projection's output "
                                            f"is used outside attention; no kernel rule.")
            if value not in self.made:
                self.made[value] = self.affine(value).index
            return self.made[value]
        if isinstance(value, (Pointwise, Normed)):  # an RMSNorm that no weight multiplied
            if value not in self.made:
                module = module_of(value) if isinstance(value, Pointwise) else rms_norm_of(
                    None, value.eps)
                self.made[value] = self.add("", module, (value.source,), value.node).index
            return self.made[value]
        if not isinstance(value, Seq):
            raise UnsupportedLayerError(f"{_where(node)} computes {node.target} of "
                                        f"{type(value).__name__.lower()} values, which has no "
                                        f"kernel rule here.")
        return value.index

    def affine(self, p: Proj) -> Seq:
        name, module = self.owner(p.weight)
        if p.transposed or not isinstance(module, nn.Linear):
            module = ExportedAffine(name, p.weight.tensor, p.bias and p.bias.tensor)
        return self.add(name, module, (p.source,), p.node)


def export_nodes(model: nn.Module, example: torch.Tensor, options: Options) -> list[Node]:
    """The converted nodes of ``model``'s exported graph for inputs like ``example``, in
    execution order (module doc).

    Example:
        >>> [n.name for n in export_nodes(gpt2, ids, Options())][:3]
        ['wte', 'wpe', 'h.0.ln_1']

    Raises:
      UnsupportedLayerError: an operation without a rule; its ``attention`` attribute says
        whether the walk had met an attention's heads (its spelling is then what is refused).
    """
    kwargs = {"use_cache": False} if "use_cache" in inspect.signature(model.forward).parameters \
        else {}
    key = programs.ProgramKey.of("exported graph", cache_key(model, example), ())
    program = programs.cached(key, lambda: export(model, example, decompose=False, kwargs=kwargs))
    walk = _Walk(model, options, program, example)
    try:
        for node in program.graph.nodes:
            if node.op == "placeholder":
                walk.values[node] = walk.inputs[node.name]
            elif node.op == "call_function":
                walk.values[node] = _call(walk, node)
            elif node.op == "output":
                _output(walk, node)
    except UnsupportedLayerError as e:
        e.attention = any(isinstance(v, HEAD_VALUES[1:]) for v in walk.values.values())
        raise
    return walk.nodes


def _output(walk: _Walk, node: fx.Node) -> None:
    results = [walk.values[a] for a in node.args[0] if isinstance(a, fx.Node)]
    many = type(walk.model).__module__.startswith("transformers.")
    if not results or (len(results) > 1 and not many):
        raise ConversionError(f"{type(walk.model).__name__}.forward returns {len(results)} "
                              f"tensors; ntbridge models return one tensor.")
    index = walk.seq(results[0], node)
    if many:  # the other fields (a pooled output) are computed after, from it
        del walk.nodes[index + 1:]
    if index == INPUT or index != len(walk.nodes) - 1:
        raise ConversionError(f"{type(walk.model).__name__}.forward returns a tensor computed "
                              f"before its last operation; return the last one.")


def _call(walk: _Walk, node: fx.Node):
    """The value of one ``call_function`` node."""
    args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda a: walk.values[a])
    target = node.target
    name = getattr(getattr(target, "overloadpacket", None), "__name__", getattr(target, "__name__",
                                                                                str(target)))
    if name == "sym_size":
        return Const(walk.example.shape[0] if args[1] == 0 else dims(node.args[0])[args[1]])
    if name.startswith("_assert") or name.startswith("sym_constrain"):
        return Const(None)  # checks of dtypes and sizes: nothing computed
    if (found := padding_op(name, node, args)) is not None:
        return found
    if name == "getitem":
        return args[0][args[1]]
    flat = [a for a in _flat((args, kwargs))]
    if any(isinstance(a, HEAD_VALUES) for a in flat):
        if isinstance(args[0], (Mixed,)) or (name in ("linear", "addmm") and any(
                isinstance(a, Mixed) for a in flat)):
            if name in ("linear", "addmm"):
                return _attention(walk, node, name, args)
        if (found := head_op(name, node, args, kwargs)) is not None:
            return found
        args = tuple(Seq(walk.seq(a, node)) if isinstance(a, Proj) else a for a in args)
    if (found := norm_op(walk, name, node, args)) is not None:
        return found
    if (found := pointwise(name, node, args, kwargs)) is not None:
        return found
    args = tuple(Seq(walk.seq(a, node)) if isinstance(a, (Pointwise, Normed)) else a
                 for a in args)
    flat = [a for a in _flat((args, kwargs))]
    if not any(isinstance(a, (Seq, Param, Rows)) for a in flat):
        return _constant(target, args, kwargs)
    handler = HANDLERS.get(name)
    if handler is None:
        raise UnsupportedLayerError(
            f"{_where(node)} computes aten.{name}, which has no kernel rule on the analytic route "
            f"over exported graphs. Its empirical kernels work: ntbridge.empirical_ntk(model, x).")
    return handler(walk, node, args, kwargs)


def _flat(tree):
    if isinstance(tree, (list, tuple)):
        for a in tree:
            yield from _flat(a)
    elif isinstance(tree, dict):
        for a in tree.values():
            yield from _flat(a)
    else:
        yield tree


def _constant(target, args, kwargs) -> Const:
    unwrap = lambda a: a.value if isinstance(a, Const) else a
    args, kwargs = fx.node.map_aggregate((args, kwargs), unwrap)
    with torch.no_grad():
        return Const(target(*args, **kwargs))


def _attention(walk: _Walk, node: fx.Node, name: str, args) -> Seq:
    mixed, weight, bias = (args[1], args[2], args[0]) if name == "addmm" else (
        args[0], args[1], args[2] if len(args) > 2 else None)
    out = Proj(-1, weight, bias, name == "addmm", 0, 0, node)
    out = Proj(-1, weight, bias, name == "addmm", 0, out.out_features, node)

    module, prefix, source = attention(mixed, out)
    ids = () if module.padding is None else (INPUT,)
    return walk.add(prefix, module, (source, *ids), node)
