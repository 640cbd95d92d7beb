"""Tiny random Hugging Face models (no downloads), for the tests of ``transformers`` models.

``build(name, attn_implementation)`` makes one of ``NAMES`` in float64 and eval mode, seeded
(``inputs(name, n)``: ``n`` inputs for it, token ids or images);
:class:`FirstOutput` is the model as ntbridge reads it (its first output, for torch.func),
:class:`Padded` the same with an ``attention_mask`` of the pads.
"""

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

NAMES = ("gpt2", "bert", "llama", "vit")
VOCABULARY = 40


def _config(name: str):
    if name == "gpt2":
        return transformers.GPT2Config(n_embd=8, n_layer=1, n_head=2, vocab_size=VOCABULARY,
                                       n_positions=8, bos_token_id=0, eos_token_id=0)
    if name == "bert":
        return transformers.BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                       intermediate_size=16, vocab_size=VOCABULARY,
                                       max_position_embeddings=8)
    if name == "vit":
        return transformers.ViTConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=16, image_size=8, patch_size=4,
                                      num_channels=3)
    return transformers.LlamaConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                    num_key_value_heads=1, intermediate_size=16,
                                    vocab_size=VOCABULARY, max_position_embeddings=8,
                                    bos_token_id=0, eos_token_id=0)


def build(name: str, attn_implementation: str = "sdpa") -> nn.Module:
    """The model ``name`` (one of :data:`NAMES`), float64, eval mode, torch's seed 0."""
    torch.manual_seed(0)
    config = _config(name)
    config._attn_implementation = attn_implementation
    model = getattr(transformers, {"gpt2": "GPT2Model", "bert": "BertModel", "llama": "LlamaModel",
                                   "vit": "ViTModel"}[name])(config)
    return model.double().eval()


class FirstOutput(nn.Module):
    """An HF model's first output (``last_hidden_state``), as a tensor."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(ids)[0]


class Padded(FirstOutput):
    """The model called as on a padded batch, ``attention_mask = ids != 0`` (0: the pad)."""

    def forward(self, ids):
        return self.model(ids, attention_mask=(ids != 0).long())[0]


def inputs(name: str, n: int) -> torch.Tensor:
    """``n`` inputs of model ``name``: token ids ``(n, 5)``, or images ``(n, 3, 8, 8)`` (float64)."""
    if name == "vit":
        return torch.randn(n, 3, 8, 8, dtype=torch.float64)
    return torch.randint(0, VOCABULARY, (n, 5))
