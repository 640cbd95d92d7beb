"""Hugging Face ``transformers`` models as ntbridge reads them, without importing the library.

A model is one of the library's (:func:`is_pretrained`) only where ``transformers`` is already
imported (the model's own module imported it): ntbridge never imports it itself. Its weights are
read as the library initialises them (:func:`init_std`). Such a model's forward returns a ``ModelOutput`` whose first field (``last_hidden_state``, or ``logits`` for a
model with a head) is what ntbridge takes as the model's output; it is exported without its
key/value cache (:func:`export_settings`).

Example:
    >>> model = GPT2Model(GPT2Config(n_embd=16, n_layer=2, n_head=2))
    >>> is_pretrained(model), is_pretrained(nn.Linear(2, 3))
    (True, False)
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

from torch import nn


def is_pretrained(model: nn.Module) -> bool:
    """Whether ``model`` is a Hugging Face ``PreTrainedModel``."""
    defined = sys.modules.get("transformers.modeling_utils")  # not imported: no such model
    return defined is not None and isinstance(model, defined.PreTrainedModel)


@contextlib.contextmanager
def export_settings(model: nn.Module) -> Iterator[None]:
    """While exported, an HF model makes no key/value cache (its output is then tensors only);
    its configuration is restored afterwards. Any other model is left as it is."""
    config = getattr(model, "config", None) if is_pretrained(model) else None
    if config is None or getattr(config, "use_cache", None) is None:
        yield
        return
    use_cache = config.use_cache
    config.use_cache = False
    try:
        yield
    finally:
        config.use_cache = use_cache


# the classes whose ``_init_weights`` draws every weight matrix and embedding as the library's
# generic one does (checked in transformers 5.25: BERT's adds other modules' initialisation after
# calling it; Llama, Mistral, Qwen2 do not override it). GPT-2's is not among them: it scales its
# residual projections, ``c_proj``, by 1/sqrt(2 n_layer), so its weights are read from their values.
_GENERIC_INIT = ("PreTrainedModel", "BertPreTrainedModel")


def init_std(model: nn.Module) -> float | None:
    """The standard deviation of the normal distribution an HF model draws its ``nn.Linear``,
    ``nn.ConvNd`` and ``nn.Embedding`` weights from (biases zero, norms' weights one, as
    ``PreTrainedModel._init_weights`` does): ``config.initializer_range`` (or ``init_std``,
    ``initializer_factor``, else 0.02). None for a model that is not an HF model, or whose
    ``_init_weights`` is its own (its weights are then read from their values)."""
    if not is_pretrained(model):
        return None
    owner = type(model)._init_weights.__qualname__.split(".")[0]
    if owner not in _GENERIC_INIT:
        return None
    config = model.config
    for name in ("initializer_range", "init_std", "initializer_factor"):
        if hasattr(config, name):
            return float(getattr(config, name) or 0.02) if name == "initializer_range" else \
                float(getattr(config, name))
    return 0.02


def library_inits(model: nn.Module) -> tuple[tuple[str, float], ...] | None:
    """The Hugging Face models in ``model`` (itself, or modules of a model wrapping them; the
    outermost of nested ones) as ``(qualified name, std)`` pairs, ``std`` the one their weights
    are drawn with (:func:`init_std`); None if one of them initialises its own way (its weights
    are then read from their values)."""
    outer: list[str] = []
    for name, module in model.named_modules():
        if is_pretrained(module) and not any(p == "" or name.startswith(p + ".") for p in outer):
            outer.append(name)
    stds = [init_std(model.get_submodule(name)) for name in outer]
    return None if None in stds else tuple(zip(outer, stds))
