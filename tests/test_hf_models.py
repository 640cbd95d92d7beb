"""Hugging Face models on the analytic route over torch.export graphs: tiny random GPT-2, BERT,
ViT and Llama (attention ``"sdpa"`` and ``"eager"``), read at ``last_hidden_state`` or a pooled
head, or called on a padded batch with its ``attention_mask``; their converted forward is the
model's own, and 1-layer GPT-2, BERT, Llama, Qwen2 and ViT at their own width agree with fresh
models' Monte-Carlo (NNGP and NTK)."""

import warnings
from functools import partial

import numpy as np
import pytest
import torch
from torch import nn

import ntbridge
from ntbridge.dlpack import precision, to_jax
from ntbridge.errors import InitMismatchWarning

from hf_zoo import Padded
from montecarlo import fresh_kernels, standard_error, z_scores

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

IDS = torch.tensor([[1, 2, 3, 4], [3, 5, 6, 1], [7, 7, 8, 2]])


def gpt2(d=32, attention="sdpa"):
    config = transformers.GPT2Config(n_embd=d, n_layer=1, n_head=4, n_inner=2 * d,
                                     vocab_size=20, n_positions=8, attn_implementation=attention)
    return transformers.GPT2Model(config).eval()


def bert(d=32, attention="sdpa", pool=False):
    config = transformers.BertConfig(hidden_size=d, num_hidden_layers=1, num_attention_heads=4,
                                     intermediate_size=2 * d, vocab_size=20,
                                     max_position_embeddings=8, attn_implementation=attention)
    return transformers.BertModel(config, add_pooling_layer=pool).eval()


def llama(d=32, attention="sdpa", family="Llama", kv_heads=2, **config):
    # RMSNorm written out, rotary embeddings, 2 key/value heads for 4 query heads, SwiGLU;
    # Mistral's layout is Llama's, Qwen2's adds biases to the queries, keys and values
    config = getattr(transformers, f"{family}Config")(
        hidden_size=d, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=kv_heads,
        intermediate_size=2 * d, vocab_size=20, max_position_embeddings=8,
        attn_implementation=attention, **config)
    return getattr(transformers, f"{family}Model")(config).eval()


def vit(attention="sdpa", d=32):
    config = transformers.ViTConfig(hidden_size=d, num_hidden_layers=1, num_attention_heads=4,
                                    intermediate_size=2 * d, image_size=8, patch_size=4,
                                    attn_implementation=attention)
    return transformers.ViTModel(config, add_pooling_layer=False).eval()


class Hidden(nn.Module):
    """``model(x).last_hidden_state``: one tensor, as fresh_kernels reads models."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x).last_hidden_state


class Pooled(Hidden):
    """BERT's pooled head: the first token, a Linear layer, tanh."""

    def forward(self, x):
        return self.model(x).pooler_output


PADDED = torch.tensor([[1, 2, 3, 0], [3, 5, 6, 1], [7, 7, 0, 0]])  # right-padded with 0
IMAGES = torch.randn(3, 3, 8, 8, generator=torch.Generator().manual_seed(0))
MODELS = {f"{name}, {attention}": (build, attention, x)
          for name, build, x in (("GPT-2", gpt2, IDS), ("BERT", bert, IDS), ("ViT", vit, IMAGES),
                                 ("Llama", llama, IDS),
                                 ("Mistral", partial(llama, family="Mistral"), IDS),
                                 ("Qwen2", partial(llama, family="Qwen2"), IDS))
          for attention in ("sdpa", "eager")}


def _forward(model, x):
    graph = ntbridge.convert(model, example=x)
    with precision(torch.float64):
        return graph, np.asarray(graph.apply_fn(graph.params, to_jax(x)))


@pytest.mark.parametrize("name", MODELS)
def test_the_converted_forward_is_the_models(name):
    build, attention, x = MODELS[name]
    torch.manual_seed(0)
    model, x = build(attention=attention).double(), x.double() if x.is_floating_point() else x
    graph, y = _forward(model, x)
    assert "ExportedAttention" in [type(n.module).__name__ for n in graph.layers]
    # some eager attentions take their softmax in float32 (ViT's), Llama's family its norms and
    # rotary tables: the model's own rounding
    rounded = attention == "eager" or name.split(",")[0] in ("Llama", "Mistral", "Qwen2")
    tolerance = 1e-6 if rounded else 1e-12
    np.testing.assert_allclose(y, model(x).last_hidden_state.detach().numpy(), atol=tolerance)


@pytest.mark.parametrize("name", ["GPT-2, sdpa", "GPT-2, eager", "BERT, sdpa", "Llama, eager"])
def test_a_padded_batchs_attention_mask_is_each_examples_key_padding(name):
    # Hugging Face's mask from attention_mask (index by example and key, & the causal mask, as
    # SDPA's boolean attn_mask or eager's additive one) is the keys' padding of each example
    build, attention, _ = MODELS[name]
    torch.manual_seed(0)
    model = Padded(build(attention=attention)).double()
    graph, y = _forward(model, PADDED)
    attention = next(n.module for n in graph.layers if "Attention" in type(n.module).__name__)
    assert attention.padding == 0
    tolerance = 1e-6 if name.startswith("Llama") else 1e-12
    expected = model(PADDED).detach().numpy()
    np.testing.assert_allclose(y, expected, atol=tolerance)
    assert np.abs(expected - Hidden(model.model)(PADDED).detach().numpy()).max() > 1e-3


def test_a_pooled_head_and_one_graph_for_both_attentions():
    torch.manual_seed(0)
    model = Pooled(bert(pool=True)).double()
    graph, y = _forward(model, IDS)
    assert [n.name for n in graph.layers][-3:] == ["select", "model.pooler.dense", "tanh"]
    np.testing.assert_allclose(y, model(IDS).detach().numpy(), atol=1e-12)
    assert ntbridge.kernel(model, IDS, init="infer").nngp.shape == (3, 3)
    # "sdpa" and "eager" become the same layers, fed alike, at the same variances
    layers = lambda g: [(type(n.module).__name__, n.inputs, repr(n.hyper)) for n in g.layers]
    graphs = []
    for attention in ("sdpa", "eager"):
        torch.manual_seed(0)
        graphs.append(layers(ntbridge.convert(gpt2(attention=attention), example=IDS)))
    assert graphs[0] == graphs[1]


@pytest.mark.slow
def test_the_default_init_is_hugging_faces_own():
    # BERT draws every weight, positions' and token types' rows included, from
    # normal(0, initializer_range); GPT-2 scales its residual projections by 1/sqrt(2 n_layer), so
    # its weights are read from their values, as init="infer" reads them
    graph = repr(ntbridge.convert(bert(), example=IDS))
    for rows in ("AddPositions(weight[:T]: (8, 32)) W_std=0.02", "AddRow(weight[0]: (2, 32)) W_std=0.02"):
        assert rows in graph
    model = gpt2().double()  # one layer: its c_proj drawn at 0.02 / sqrt(2), not 0.02
    default, read = ntbridge.nngp(model, IDS[:2]), ntbridge.nngp(model, IDS[:2], init="infer")
    torch.testing.assert_close(default, read, rtol=1e-12, atol=0)
    # in a model of the user's wrapping one, the library's init holds for its modules alone
    wrapper = nn.Sequential()
    wrapper.bert, wrapper.head = Hidden(bert()), nn.Linear(32, 3)
    graph = ntbridge.convert(wrapper, example=IDS)
    with warnings.catch_warnings():
        warnings.simplefilter("error", InitMismatchWarning)
        graph.check_init()
    layers = {n.name: n.hyper for n in graph.layers}
    assert layers["bert.model.embeddings.word_embeddings"]["W_std"] == 0.02
    dense = layers["bert.model.encoder.layer.0.output.dense"]  # fan_in 64
    assert dense["W_std"] == pytest.approx(0.02 * 64 ** 0.5)
    assert layers["head"]["W_std"] == pytest.approx(3 ** -0.5)


def test_llamas_parts_are_recognised():
    # the written-out RMSNorm as nn.RMSNorm holding the model's weight, the rotary embeddings in
    # the attention, the SwiGLU product of two branches; Llama draws every weight from
    # normal(0, initializer_range), as the default init reads it
    graph = ntbridge.convert(llama(), example=IDS)
    names = {n.name: n for n in graph.layers}
    assert type(names["layers.0.input_layernorm"].module).__name__ == "RMSNorm"
    assert "rotary" in repr(names["layers.0.self_attn"].module)
    assert "kv_heads=2" in repr(names["layers.0.self_attn"].module)
    assert any(type(n.module).__name__ == "Multiply" and not n.module.dependent
               for n in graph.layers)
    assert names["embed_tokens"].hyper["W_std"] == 0.02
    assert names["layers.0.mlp.gate_proj"].hyper["W_std"] == pytest.approx(0.02 * 32 ** 0.5)


@pytest.mark.slow
def test_one_key_head_and_tied_embeddings():
    # multi-query attention (one key/value head for 4 query heads): the model's forward, and the
    # kernel of full heads (as any grouping's); tied input and output embeddings are refused (they
    # have no infinite-width kernel), and shared_weights="independent" gives the untied model's
    torch.manual_seed(0)
    model = llama(kv_heads=1).double()
    graph, y = _forward(model, IDS)
    np.testing.assert_allclose(y, model(IDS).last_hidden_state.detach().numpy(), atol=1e-6)
    k, full = (ntbridge.kernel(llama(kv_heads=h).double(), IDS) for h in (1, 4))
    for get in ("nngp", "ntk"):
        torch.testing.assert_close(getattr(k, get), getattr(full, get), rtol=1e-10, atol=0)
    tied, untied = (transformers.LlamaForCausalLM(llama(tie_word_embeddings=t).config).eval()
                    for t in (True, False))
    with pytest.raises(ntbridge.errors.UnsupportedLayerError, match="no infinite-width kernel"):
        ntbridge.kernel(tied, IDS)
    k, expected = (ntbridge.kernel(m.double(), IDS, shared_weights="independent")
                   for m in (tied, untied))
    for get in ("nngp", "ntk"):
        torch.testing.assert_close(getattr(k, get), getattr(expected, get), rtol=1e-12, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("build, x", [(lambda: Hidden(gpt2(128)), IDS),
                                      (lambda: Padded(bert(128, "eager")), PADDED),
                                      (lambda: Padded(llama(128)), PADDED),
                                      (lambda: Hidden(llama(128, family="Qwen2")), IDS),
                                      (lambda: Hidden(vit(d=128)), IMAGES.double())],
                         ids=["GPT-2", "BERT, padded", "Llama, padded", "Qwen2", "ViT"])
def test_one_layer_models_match_fresh_wide_models(build, x):
    # 128 channels in 4 heads, as Hugging Face initialises them: the mean of 48 fresh models'
    # empirical NNGP and NTK within 5 standard errors of the kernel at the default init
    # (Hugging Face's normal(0, initializer_range), zero biases, LayerNorm 1 and 0; GPT-2's and
    # ViT's own inits read from another fresh model); BERT and Llama called on a padded batch
    # with its attention_mask; the attention rule's own error (~1e-4 here) is left out, which only
    # tightens the test
    nngps, ntks = fresh_kernels(build, x, 48, seed=100)
    torch.manual_seed(99)
    k = ntbridge.kernel(build().double(), x)
    for get, samples in (("nngp", nngps), ("ntk", ntks)):
        exact = getattr(k, get)
        assert standard_error(samples).max() < 0.05 * exact.abs().max(), get
        assert z_scores(samples, exact).max() < 5, get
