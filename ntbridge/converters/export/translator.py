"""Any torch model's forward as a pure JAX function: its ``torch.export`` program, translated.

The empirical kernels need nothing but the forward pass, which JAX differentiates. Models that no
converter covers (attention, recurrent layers, embeddings of token ids, custom forwards with
products, ``torch.where``, cumulative sums, indexing...) are exported by ``torch.export`` with a
dynamic batch axis, decomposed to the core ATen operator set, and each node is evaluated with the
JAX function of :data:`.aten.OPS`. Shapes computed from the batch size (``x.view(x.shape[0], -1)``)
are computed again from the array ``apply_fn`` receives, so the function serves any batch size,
including the single examples of ``vmap(jacrev(...))``. ``torch.cond`` becomes ``lax.cond``.

The translation is that of the model in eval mode (dropout off, BatchNorm with its running
statistics); the model's own modes are restored afterwards.

Example:
    >>> t = translate(nn.TransformerEncoder(layer, 2), torch.randn(4, 10, 16))
    >>> t(jnp.ones((3, 10, 16))).shape                          # apply_fn({**params, **state}, x)
    (3, 10, 16)
    >>> k = empirical_ntk_fn(t.apply_fn)(t.params, x1, x2, state=t.state)
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import warnings
import weakref
from typing import Callable, Iterator, Sequence

import jax
import torch
from jax import lax
from torch import fx, nn
from torch.export import Dim, ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from ...compat import is_op_overload
from ...dlpack import check_module, model_dtype, precision, to_jax
from ...errors import ConversionError, InputError, UnsupportedLayerError
from ..huggingface import export_settings, is_pretrained
from .aten import OPS, jax_dtype

Variables = dict[str, jax.Array]
# attention is translated as one operator (:mod:`.aten_layers`): its decomposition is not always
# exportable (a view of its transposed output fails for GPT-2)
_DECOMPOSITIONS = {op: fn for op, fn in torch.export.default_decompositions().items()
                   if op.overloadpacket is not torch.ops.aten.scaled_dot_product_attention}
_STATE = (InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
_SYMBOLIC = {torch.sym_max, torch.sym_min, torch.sym_float, torch.sym_int, torch.sym_not,
             torch.sym_sum, torch.sym_ite, torch.sym_sqrt}  # integer arithmetic on sizes


@dataclasses.dataclass(frozen=True)
class Translated:
    """A torch model's forward in JAX.

    Attributes:
      apply_fn: ``apply_fn(variables, x) -> y``, pure and jittable: ``variables`` maps the names of
        ``params`` and ``state`` to arrays (``{**params, **state}``); ``x`` is ``(N, *example
        shape[1:])`` for any ``N`` and the example's dtype (integers for token ids); ``y`` is
        ``model(x)`` in eval mode.
      params: the model's parameters, keyed as in ``model.named_parameters()`` (zero-copy views).
      state: the buffers (e.g. BatchNorm's running statistics, keyed as in
        ``model.named_buffers()``) and tensor constants of ``forward`` that the program reads; what
        the kernels do not differentiate.
      program: the exported, decomposed program the function was translated from.
    """

    apply_fn: Callable[[Variables, jax.Array], jax.Array]
    params: Variables
    state: Variables
    program: ExportedProgram

    def __call__(self, x: jax.Array) -> jax.Array:
        """``model(x)`` at the translated weights."""
        return self.apply_fn({**self.params, **self.state}, x)

    def with_weights(self, model: nn.Module) -> Translated:
        """The same translation at ``model``'s current weights (a model of the same architecture,
        e.g. the translated one after training steps); no export."""
        return dataclasses.replace(self, **_arrays(self.program, model))


def cache_key(model: nn.Module, example: torch.Tensor) -> tuple:
    """What a translation depends on besides the weights' values, as a hashable key.

    The model itself (by identity, weakly referenced: a user's forward may read any attribute),
    the names, shapes and dtypes of its parameters and buffers, and the example's shape without
    the batch axis and dtype. A translation cached under this key serves other batch sizes and,
    through :meth:`Translated.with_weights`, other weights.
    """
    tensors = tuple((name, tuple(t.shape), str(t.dtype)) for name, t in
                    (*model.named_parameters(), *model.named_buffers()))
    return weakref.ref(model), tuple(example.shape[1:]), str(example.dtype), tensors


def translate(model: nn.Module, example: torch.Tensor) -> Translated:
    """Export ``model`` (eval mode, dynamic batch axis) and translate its program into JAX.

    Args:
      model: any ``nn.Module`` whose ``forward(x)`` returns one tensor and that ``torch.export``
        can export (no Python branching on tensor values; ``torch.cond`` is fine).
      example: an input batch ``(N, ...)``; only its shape without the batch axis and its dtype
        matter (floating, or integer token ids).

    Returns:
      A :class:`Translated` (``apply_fn``, ``params``, ``state``).

    Raises:
      ConversionError: torch.export cannot export the model (quoting torch's reason).
      UnsupportedLayerError: the program has an operator without a JAX translation (naming it and
        the module it comes from).

    Example:
        >>> t = translate(model, torch.randint(0, 100, (8, 12)))       # an nn.Embedding model
        >>> jnp.allclose(t(to_jax(ids)), to_jax(model(ids).detach()))
    """
    program = export(model, example)
    translated = Translated(_apply_fn(program, is_pretrained(model)), program=program,
                            **_arrays(program, model))
    with precision(model_dtype(model)):  # trace once: an untranslated operator fails here, not later
        jax.eval_shape(translated, jax.ShapeDtypeStruct(example.shape, jax_dtype(example.dtype)))
    return translated


def export(model: nn.Module, example: torch.Tensor, decompose: bool = True,
           kwargs: dict | None = None) -> ExportedProgram:
    """``model``'s forward exported with a dynamic batch axis and (``decompose``) decomposed to
    core ATen; ``kwargs``: keyword arguments of the call (e.g. ``use_cache=False``)."""
    check_module(model)
    if not isinstance(example, torch.Tensor) or example.ndim == 0 or example.shape[0] == 0:
        raise InputError("the example must be a torch.Tensor of shape (N, ...) with N >= 1.")
    if example.shape[0] == 1:  # torch.export fixes axes of size 1: show it two examples
        example = example.expand(2, *example.shape[1:])
    with _eval_mode(model), warnings.catch_warnings():
        # torch.export's own notices about how it traced (e.g. an RNN's cached flat weights), not
        # about anything the user did: never shown to the user
        warnings.filterwarnings("ignore", message=".*assigned during export", category=UserWarning)
        warnings.filterwarnings("ignore", message=".*LeafSpec.*deprecated", category=FutureWarning)
        try:
            kwargs = kwargs or {}
            with export_settings(model):
                program = torch.export.export(model, (example,), kwargs=kwargs, dynamic_shapes=(
                    {0: Dim("batch")}, *[None] * len(kwargs)))
            return program.run_decompositions(_DECOMPOSITIONS) if decompose else program
        except Exception as e:  # torch.export raises many types, each about the model's forward
            raise ConversionError(
                f"torch.export could not export {type(model).__name__}.forward for inputs of "
                f"shape (N, {', '.join(map(str, example.shape[1:]))}): {_reason(e)}. Branches on "
                f"tensor values (if x.sum() > 0: ...) cannot be exported: write them with "
                f"torch.where, or as torch.cond(pred, true_fn, false_fn, (x,)), or remove them; "
                f"sizes must follow the input (x.view(x.shape[0], -1), not a fixed batch size)."
            ) from e


# ------------------------------------------------------------ weights

def _arrays(program: ExportedProgram, model: nn.Module) -> dict[str, Variables]:
    """``{"params": ..., "state": ...}``: the tensors the program reads, as JAX arrays (zero-copy views
    where the layout allows; int64 constants become int32 unless x64 is on)."""
    tensors = {**dict(model.named_parameters(remove_duplicate=False)),
               **dict(model.named_buffers(remove_duplicate=False)), **program.constants}
    read = {n.name for n in program.graph.nodes if n.op == "placeholder" and n.users}
    specs = program.graph_signature.input_specs
    with precision(model_dtype(model)):
        return {"params": {s.target: to_jax(tensors[s.target], s.target)
                           for s in specs if s.kind == InputKind.PARAMETER},
                "state": {s.target: to_jax(tensors[s.target], s.target)
                          for s in specs if s.kind in _STATE and s.arg.name in read}}


@contextlib.contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


def _reason(e: Exception) -> str:
    """torch's reason, in one line: its first line and the user's line that raised it."""
    text = str(e).strip()
    reason = f"{type(e).__name__}: {text.splitlines()[0] if text else ''}".rstrip()
    call = re.search(r"The following call raised this error:\n(.*\n.*)", text)
    return reason + (f" (at {' '.join(call.group(1).split())})" if call else "")


# ------------------------------------------------------------ the program

def _apply_fn(program: ExportedProgram, first_output: bool
              ) -> Callable[[Variables, jax.Array], jax.Array]:
    """The program as ``apply_fn``; ``first_output``: the first of several outputs is the model's
    (a Hugging Face ``ModelOutput``'s first field)."""
    signature = program.graph_signature
    specs = signature.input_specs
    outputs = [i for i, s in enumerate(signature.output_specs) if s.kind == OutputKind.USER_OUTPUT]
    outputs = outputs[:1] if first_output else outputs
    if len(outputs) != 1 or sum(s.kind == InputKind.USER_INPUT for s in specs) != 1:
        raise ConversionError(f"the model's forward takes {len(signature.user_inputs)} inputs and "
                              f"returns {len(outputs)} outputs; ntbridge models take one tensor "
                              f"and return one tensor (wrap the model to select them).")
    graph_module = program.graph_module

    def apply_fn(variables: Variables, x: jax.Array) -> jax.Array:
        inputs = [x if s.kind == InputKind.USER_INPUT else variables.get(s.target) for s in specs]
        return _interpret(graph_module, inputs)[outputs[0]]

    return apply_fn


def _interpret(module: fx.GraphModule, inputs: Sequence) -> tuple:
    """The outputs of ``module``'s ATen graph evaluated in JAX on ``inputs`` (its placeholders')."""
    env: dict[fx.Node, object] = {}
    remaining = iter(inputs)
    for node in module.graph.nodes:
        if node.op == "placeholder":
            env[node] = next(remaining)
        elif node.op == "get_attr":  # a branch of torch.cond
            env[node] = getattr(module, node.target)
        elif node.op == "call_function":
            args, kwargs = fx.node.map_arg((node.args, node.kwargs), env.__getitem__)
            env[node] = call_node(node, args, kwargs)
        elif node.op == "output":
            return tuple(fx.node.map_arg(node.args[0], env.__getitem__))
    raise ConversionError("the exported graph has no output node.")


def _cond(pred, on_true: fx.GraphModule, on_false: fx.GraphModule, operands) -> tuple:
    branch = lambda graph: lambda ops: _interpret(graph, ops)
    return lax.cond(pred, branch(on_true), branch(on_false), tuple(operands))


def call_node(node: fx.Node, args, kwargs):
    """The value of the ATen ``node`` applied to ``args`` and ``kwargs`` (JAX arrays for tensors)."""
    target = node.target
    if is_op_overload(target) and target.overloadpacket in OPS:
        fn = OPS[target.overloadpacket]
    elif target is torch.ops.higher_order.cond:
        fn = _cond
    elif getattr(target, "__module__", None) in ("_operator", "math") or target in _SYMBOLIC:
        fn = target
    else:
        raise UnsupportedLayerError(
            f"the operator {target} of {_where(node)} has no JAX translation. Compute it with "
            f"supported operators, or add one: "
            f"ntbridge.converters.export.aten.OPS[torch.ops.aten.<name>] = a JAX function of the "
            f"operator's arguments.")
    try:
        return fn(*args, **kwargs)
    except UnsupportedLayerError as e:
        raise UnsupportedLayerError(f"the operator {target} of {_where(node)}: {e}") from None


def _where(node: fx.Node) -> str:
    """The user's module that produced ``node``: its qualified name and type."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "the model's forward"
    name, kind = list(stack.values())[-1]
    kind = getattr(kind, "__name__", str(kind).rsplit(".", 1)[-1])
    return f"module '{name}' ({kind})" if name else f"the forward of the model ({kind})"
