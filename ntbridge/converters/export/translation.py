"""The model of an empirical kernel: the layer registry's :class:`~..graph.Graph` where it converts
the model, else its ``torch.export`` translation (:mod:`.translator`) as a :class:`Translation`.

The empirical kernels need a forward pass only, so a model that no converter covers (attention,
recurrent layers, embeddings of token ids, custom forwards) or that torch.fx cannot trace is
translated instead; integer inputs (token ids) always take the translation. The analytic kernels
never do: they need each layer's infinite-width rule.

A translation is costly (seconds): it is kept in the program cache (:mod:`ntbridge.programs`) per
model, input shape and dtype, and each request reads the model's current weights into it
(:meth:`~.translator.Translated.with_weights`).

Example:
    >>> graph = empirical_graph(nn.TransformerEncoder(layer, 2).eval(), x, {})
    >>> graph.path, graph.output_shape(tuple(x.shape))
    ('torch.export', (8, 10, 16))
"""

from __future__ import annotations

import jax
import torch
from torch import nn

from ... import programs
from ...errors import ConversionError, InputTypeError, UnsupportedLayerError
from ..conversion import convert
from ..embedding import id_readers
from ..families import BATCH_NORMS, DROPOUTS
from ..graph import Graph
from .aten import jax_dtype
from .steps import Step, program_steps
from .translator import Translated, cache_key, translate


class Translation:
    """A translated model as the empirical kernels see it (a :class:`~..graph.Graph`'s protocol).

    Attributes:
      path: ``"torch.export"`` (a converted :class:`~..graph.Graph`'s is ``"layers"``).
      params: the model's parameters and the buffers and constants its forward reads, by name.
      parameter_names: the names in ``params`` that are parameters (what kernels differentiate).
      layers: the translation's :class:`~.steps.Step` s (for the ``"structured"`` strategy).
      apply_fn: ``apply_fn(params, x) -> model(x)`` in eval mode, ``x`` of any batch size.
      signature: what fixes the function, for program keys.
      tensors: the torch parameters and buffers ``params`` were read from, by name.
    """

    path = "torch.export"

    def __init__(self, translated: Translated, steps: tuple[Step, ...], signature: tuple,
                 input_dtype: torch.dtype, tensors: dict[str, torch.Tensor]):
        self.layers, self.tensors = steps, tensors
        self.params = {**translated.params, **translated.state}
        self.parameter_names = frozenset(translated.params)
        self.apply_fn = translated.apply_fn
        self.signature = signature
        self._input_dtype = jax_dtype(input_dtype)

    def __repr__(self) -> str:
        return (f"Translation({len(self.layers)} steps, {len(self.parameter_names)} parameters, "
                f"path='torch.export')")

    def output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The output shape for inputs of ``input_shape`` (``(N, *example shape)``)."""
        x = jax.ShapeDtypeStruct(tuple(input_shape), self._input_dtype)
        key = programs.ProgramKey.of("output shape", self.signature, x)
        return programs.cached(key, lambda: tuple(jax.eval_shape(self.apply_fn, self.params, x).shape))


def empirical_graph(model: nn.Module, x1: torch.Tensor, conversion: dict,
                    weights: nn.Module | None = None) -> Graph | Translation:
    """The model an empirical kernel of ``model`` on inputs like ``x1`` runs (see the module doc).

    Args:
      model: the torch model (its architecture).
      x1: ``(N, ...)`` inputs, floating or integer (token ids).
      conversion: keyword options of :func:`ntbridge.convert`.
      weights: a model of the same architecture whose weights to use (default: ``model``'s).

    Raises:
      ConversionError, UnsupportedLayerError: the model can neither be converted nor translated
        (the translator's reason).
      InputTypeError: integer inputs that the model does not take.
    """
    weights = model if weights is None else weights
    key = cache_key(model, x1)
    entry = programs.ProgramKey.of("translation", key, ())
    if programs.get(entry) is None:  # translated before: no converter
        try:
            graph = convert(weights, **conversion)
            if x1.is_floating_point():
                return graph
            if id_readers(graph):  # token ids read by an Embedding
                check_eval_mode(model)
                return graph
        except (UnsupportedLayerError, ConversionError):
            pass  # no converter, or not traceable by torch.fx: the translation serves
    check_eval_mode(model)
    translated, steps = programs.cached(entry, lambda: _translation(model, x1))
    tensors = {**dict(weights.named_parameters()), **dict(weights.named_buffers())}
    return Translation(translated.with_weights(weights), steps, ("torch.export", key), x1.dtype,
                           tensors)


def _translation(model: nn.Module, x1: torch.Tensor) -> tuple[Translated, tuple[Step, ...]]:
    if not x1.is_floating_point():
        _check_takes_indices(model, x1)
    translated = translate(model, x1)
    return translated, program_steps(translated.program)


def _check_takes_indices(model: nn.Module, ids: torch.Tensor) -> None:
    """InputTypeError unless ``model`` runs on (one example of) the integer inputs ``ids``.

    torch.export does not check dtypes, and JAX would promote integers to floats: torch itself
    must accept them, as token ids (e.g. ``nn.Embedding``) or by converting them.
    """
    try:
        with torch.no_grad():
            model(ids[:1])
    except Exception as e:  # any error of the user's forward on these inputs
        raise InputTypeError(
            f"x1 has dtype {ids.dtype}, which the model does not take ({type(e).__name__}: "
            f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}). Integer inputs are "
            f"token ids (e.g. for nn.Embedding); for other models pass x1.float() (or .double() "
            f"for float64 kernels).") from None


def _random_in_training(module: nn.Module) -> bool:
    """Whether ``module``'s forward in training mode differs from eval mode's (dropout, batch
    statistics)."""
    if isinstance(module, DROPOUTS):
        return module.p > 0
    if isinstance(module, nn.MultiheadAttention):
        return module.dropout > 0
    return isinstance(module, BATCH_NORMS)


def check_eval_mode(model: nn.Module) -> None:
    """UnsupportedLayerError naming the first module whose training mode the translation (made in
    eval mode) would not reproduce."""
    for name, module in model.named_modules():
        if module.training and _random_in_training(module):
            raise UnsupportedLayerError(
                f"module '{name}' ({type(module).__name__}) is in training mode, where its forward "
                f"is random (dropout) or uses batch statistics; a model without a converter is "
                f"translated in eval mode: call model.eval() for its empirical kernels.")
