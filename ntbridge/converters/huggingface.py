"""Hugging Face ``transformers`` models as ntbridge reads them, without importing the library.

A model is one of the library's (:func:`is_pretrained`) only where ``transformers`` is already
imported (the model's own module imported it): ntbridge never imports it itself. Such a model's
forward returns a ``ModelOutput`` whose first field (``last_hidden_state``, or ``logits`` for a
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
    transformers = sys.modules.get("transformers")
    return transformers is not None and isinstance(model, transformers.PreTrainedModel)


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
