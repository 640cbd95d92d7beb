"""Empirical kernels of Hugging Face models (tiny random configs) equal torch.func's.

The models have no converter; the torch.export translation serves them: their key/value caches are
off, their attention (``sdpa`` and ``eager``, grouped queries for Llama) is translated as one
operator, and their output is the ``ModelOutput``'s first field.
"""

import jax
import pytest
import torch
import torch.nn.functional as F

import ntbridge
from ntbridge.converters.export.aten import OPS
from ntbridge.converters.export.translator import translate
from ntbridge.dlpack import precision, to_jax

from helpers import max_relative_error
from hf_zoo import FirstOutput, Padded, build, inputs
from reference import full_ntk

# Llama's RMSNorm computes in float32 whatever the model's dtype (HF's ``.to(torch.float32)``):
# torch's and XLA's float32 rsqrt differ by an ulp (6e-8), which the float64 kernel inherits
TOLERANCE = {"gpt2": 1e-8, "bert": 1e-8, "llama": 1e-6, "vit": 1e-8}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "bert", "llama", "vit"])
def test_empirical_ntk_matches_torch_func(name):
    model = build(name)
    config = model.config.to_dict()
    ids1, ids2 = inputs(name, 2), inputs(name, 1)  # token ids, or ViT's images
    k = ntbridge.empirical_ntk(model, ids1, ids2, trace_axes=(), implementation="jacobian")
    expected = full_ntk(FirstOutput(model), ids1, ids2, batch=True)  # (N1, N2, T, d, T, d)
    assert k.shape == expected.shape and k.dtype == torch.float64
    assert max_relative_error(k.detach(), expected) <= TOLERANCE[name]
    assert model.config.to_dict() == config and not model.training  # the model is left as it was


@pytest.mark.slow
def test_a_padded_batchs_empirical_ntk_matches_torch_func():
    # BERT called with attention_mask = ids != 0: each example's pads masked as keys
    model = Padded(build("bert"))
    ids1, ids2 = torch.tensor([[1, 2, 3, 0, 0], [4, 5, 6, 7, 8]]), torch.tensor([[9, 3, 0, 0, 0]])
    k = ntbridge.empirical_ntk(model, ids1, ids2, trace_axes=(), implementation="jacobian")
    expected = full_ntk(model, ids1, ids2, batch=True)
    assert max_relative_error(k.detach(), expected) <= TOLERANCE["bert"]
    unpadded = full_ntk(FirstOutput(model.model), ids1, ids2, batch=True)
    assert max_relative_error(unpadded, expected) > 1e-3


def test_eager_attention_translates_exactly():
    """``attn_implementation="eager"`` (matmuls, softmax) as well as the default ``sdpa``."""
    model, x = build("gpt2", "eager"), inputs("gpt2", 2)
    translated = translate(model, x)
    with precision(torch.float64):  # one compiled program (op by op, each operator compiles)
        y = jax.jit(translated.apply_fn)({**translated.params, **translated.state}, to_jax(x))
    assert max_relative_error(y, model(x)[0].detach().numpy()) <= 1e-12


ATTENTION_CASES = {
    "plain": (4, 4, {}),
    "causal": (4, 4, {"is_causal": True}),
    "grouped, scaled": (4, 2, {"enable_gqa": True, "scale": 0.3}),
    "boolean mask": (4, 4, {"attn_mask": torch.rand(6, 7) > 0.3}),
    "additive mask": (4, 4, {"attn_mask": torch.randn(2, 1, 6, 7, dtype=torch.float64)}),
    "a row masked out": (4, 4, {"attn_mask": torch.arange(7) < torch.arange(6)[:, None]}),
}


@pytest.mark.parametrize("case", list(ATTENTION_CASES))
def test_scaled_dot_product_attention_matches_torch(case):
    heads, kv_heads, kwargs = ATTENTION_CASES[case]
    length = 6 if "is_causal" not in kwargs else 7
    q = torch.randn(2, heads, length, 3, dtype=torch.float64)
    k, v = (torch.randn(2, kv_heads, 7, 3, dtype=torch.float64) for _ in range(2))
    expected = F.scaled_dot_product_attention(q, k, v, **kwargs)
    with precision(torch.float64):
        args = {key: to_jax(a) if isinstance(a, torch.Tensor) else a for key, a in kwargs.items()}
        y = OPS[torch.ops.aten.scaled_dot_product_attention](to_jax(q), to_jax(k), to_jax(v), **args)
    assert max_relative_error(y, expected.numpy()) <= 1e-12


def test_cat_skips_one_dimensional_empty_tensors_as_torch_does():
    """Hugging Face's empty key/value caches are ``(0,)`` tensors concatenated along -2."""
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    with precision(torch.float64):
        y = OPS[torch.ops.aten.cat]([to_jax(torch.empty(0, dtype=torch.float64)), to_jax(x)], -2)
    assert max_relative_error(y, torch.cat([torch.empty(0, dtype=torch.float64), x], -2).numpy()) == 0
