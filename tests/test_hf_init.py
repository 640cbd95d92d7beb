"""The default ``init="torch"`` reads a Hugging Face model's modules as the library initialises
them (``normal(0, initializer_range)`` weights, zero biases), never as torch's ``nn.Linear``
default; a model with its own ``_init_weights`` is read from its values."""

import pytest
import torch
from torch import nn

import ntbridge

from montecarlo import fresh_kernels, z_scores

llama = pytest.importorskip("transformers.models.llama.modeling_llama")
transformers = pytest.importorskip("transformers")


class TinyMLP(llama.LlamaPreTrainedModel):
    """Llama's MLP block alone as a PreTrainedModel (its weights initialised by ``post_init``)."""

    def __init__(self, config):
        super().__init__(config)
        self.mlp = llama.LlamaMLP(config)
        self.post_init()

    def forward(self, x):
        return self.mlp(x)


class OwnInit(TinyMLP):
    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            nn.init.uniform_(module.weight, -0.1, 0.1)


def config(hidden: int = 128):
    return transformers.LlamaConfig(hidden_size=8, intermediate_size=hidden,
                                    initializer_range=0.2, num_attention_heads=2,
                                    num_key_value_heads=2)


def test_weights_are_read_as_the_library_draws_them():
    graph = ntbridge.convert(TinyMLP(config()))
    stds = {n.name: n.hyper["W_std"] for n in graph.layers if "W_std" in n.hyper}
    assert stds == pytest.approx({"mlp.gate_proj": 0.2 * 8 ** 0.5, "mlp.up_proj": 0.2 * 8 ** 0.5,
                                  "mlp.down_proj": 0.2 * 128 ** 0.5})


def test_kernel_of_fresh_models_matches_monte_carlo():
    """Fresh models as HF builds them: their kernels' mean is the analytic kernel's within 5 of
    their standard errors; torch's nn.Linear default (W_std = 1/sqrt(3)) is far from it."""
    x = torch.randn(4, 8, dtype=torch.float64)
    build = lambda: TinyMLP(config())
    k = ntbridge.kernel(build().double(), x)
    nngp, ntk = fresh_kernels(build, x, 16)
    assert z_scores(nngp, k.nngp).max() < 5 and z_scores(ntk, k.ntk).max() < 5
    linear_default = ntbridge.nngp(build().double(), x, W_std=3 ** -0.5)
    assert z_scores(nngp, linear_default).max() > 5


def test_a_model_with_its_own_init_is_read_from_its_values():
    model, x = OwnInit(config()).double(), torch.randn(3, 8, dtype=torch.float64)
    torch.testing.assert_close(ntbridge.ntk(model, x), ntbridge.ntk(model, x, init="infer"),
                               rtol=0, atol=0)
