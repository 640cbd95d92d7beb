"""The torch.export -> JAX translator: a zoo of models no converter covers, checked against torch.

Forward parity with ``model(x)``, and the empirical NTK of the translated ``apply_fn`` against the
jacobian contraction of ``torch.func.jacrev`` on the same weights. Each model is exported once per
dtype (a module-level cache).
"""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest
import torch
from torch import nn

from ntbridge.converters.export import aten
from ntbridge.converters.export.translator import cache_key, translate
from ntbridge.dlpack import precision, to_jax
from ntbridge.empirical import empirical_ntk_fn
from ntbridge.errors import ConversionError, UnsupportedLayerError

from export_zoo import ZOO, Custom, example
from helpers import max_relative_error
from reference import full_ntk

FORWARD_RTOL = {torch.float64: 1e-12, torch.float32: 1e-5}
NTK_RTOL = {torch.float64: 1e-10, torch.float32: 1e-5}


@functools.cache
def zoo(name: str, dtype: torch.dtype = torch.float64):
    """``(model in eval mode, its translation, x1 (3 examples), x2 (2 examples))``."""
    model, x1, x2 = example(name, dtype)
    return model, translate(model, x1), x1, x2


def forward(t, x: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    with precision(dtype):
        return np.asarray(jax.jit(t.apply_fn)({**t.params, **t.state}, to_jax(x)))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", list(ZOO))
def test_forward_matches_torch(name, dtype):
    model, t, x1, x2 = zoo(name, dtype)
    with torch.no_grad():
        expected = model(x1).numpy()
    assert max_relative_error(forward(t, x1, dtype), expected) <= FORWARD_RTOL[dtype]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ZOO))
def test_any_batch_size(name):
    """One export serves other batch sizes: one example, and more than the example had."""
    model, t, x1, x2 = zoo(name)
    x = torch.cat([x1, x2])
    with torch.no_grad():
        expected = model(x).numpy()
    assert max_relative_error(forward(t, x, torch.float64), expected) <= FORWARD_RTOL[torch.float64]
    one = forward(t, x[:1], torch.float64)
    assert max_relative_error(one, expected[:1]) <= FORWARD_RTOL[torch.float64]


CASES = [(name, "jacobian") for name in ZOO] + [
    (name, "ntvp") for name in ZOO if name != "transformer"]  # the transformer's ntvp program compiles slowly


@pytest.mark.slow
@pytest.mark.parametrize("name, strategy", CASES)
def test_empirical_ntk_matches_torch_func(name, strategy):
    model, t, x1, x2 = zoo(name)
    with precision(torch.float64):
        k = empirical_ntk_fn(t.apply_fn, strategy)(t.params, to_jax(x1), to_jax(x2), trace_axes=(),
                                                   state=t.state)
    expected = full_ntk(model, x1, x2, batch=True).numpy()  # independent examples: the rows of
    # the joint batch's Jacobian are the per-example Jacobians (and no vmap of the model is needed)
    assert k.shape == expected.shape
    assert max_relative_error(k, expected) <= NTK_RTOL[torch.float64]


def test_empirical_ntk_float32():
    model, t, x1, x2 = zoo("attention", torch.float32)
    k = empirical_ntk_fn(t.apply_fn)(t.params, to_jax(x1), to_jax(x2), trace_axes=(), state=t.state)
    assert max_relative_error(k, full_ntk(model, x1, x2, batch=True).numpy()) <= NTK_RTOL[torch.float32]


def test_padding_row_has_no_gradient():
    """As in torch, nn.Embedding's padding_idx row gets no gradient."""
    model, t, x1, _ = zoo("embedding")
    ids = x1.clone()
    ids[:, 0] = 0
    with precision(torch.float64):
        loss = lambda p: t.apply_fn({**p, **t.state}, to_jax(ids)).sum()
        grad = jax.jit(jax.grad(loss))(t.params)  # one program (op by op, each operator compiles)
    assert np.all(np.asarray(grad["embed.weight"])[0] == 0)
    assert np.any(np.asarray(grad["embed.weight"])[1:] != 0)


@pytest.mark.slow
def test_translates_eval_mode_and_restores_the_mode():
    model, _, x1, _ = zoo("transformer")
    model.train()
    try:
        t = translate(model, x1)
        assert model.training and all(m.training for m in model.modules())
        with torch.no_grad():
            expected = model.eval()(x1).numpy()
    finally:
        model.eval()
    assert max_relative_error(forward(t, x1, torch.float64), expected) <= FORWARD_RTOL[torch.float64]


def test_with_weights_reads_the_current_weights():
    model, t, x1, _ = zoo("custom")
    torch.manual_seed(1)
    other = Custom().double().eval()
    assert cache_key(other, x1) != cache_key(model, x1)
    assert cache_key(model, x1) == cache_key(model, x1[:1])
    with torch.no_grad():
        expected = other(x1).numpy()
    assert max_relative_error(forward(t.with_weights(other), x1, torch.float64), expected) <= 1e-12
    assert max_relative_error(forward(t, x1, torch.float64), expected) > 1e-3


class Branching(nn.Module):
    def __init__(self, use_cond: bool):
        super().__init__()
        self.linear, self.use_cond = nn.Linear(3, 3), use_cond

    def forward(self, x):
        if self.use_cond:
            return torch.cond(x.sum() > 0, lambda x: self.linear(x), lambda x: -x, (x,))
        if x.sum() > 0:
            return self.linear(x)
        return -x


def test_data_dependent_branch_is_refused_with_torch_export_advice():
    with pytest.raises(ConversionError, match=r"(?s)torch\.export could not export Branching.*"
                                              r"if x\.sum\(\) > 0.*torch\.cond"):
        translate(Branching(use_cond=False), torch.randn(3, 3))


def test_torch_cond_is_translated():
    torch.manual_seed(0)
    model = Branching(use_cond=True)
    t = translate(model, torch.randn(3, 3))
    for sign in (1.0, -1.0):
        x = sign * torch.rand(4, 3)
        with torch.no_grad():
            expected = model(x).numpy()
        assert max_relative_error(forward(t, x, torch.float32), expected) <= FORWARD_RTOL[torch.float32]


def test_untranslated_operator_names_operator_and_module(monkeypatch):
    monkeypatch.delitem(aten.OPS, torch.ops.aten.cumsum)
    with pytest.raises(UnsupportedLayerError, match=r"aten\.cumsum\.default of module 'mix' \(Mix\)"
                                                    r".* has no JAX translation.*aten\.OPS"):
        translate(Custom(), torch.randn(3, 5))


def test_unsupported_arguments_name_operator_and_module():
    model = nn.Sequential(nn.Linear(3, 4), nn.Unflatten(1, (1, 4)), nn.MaxPool1d(3, ceil_mode=True))
    with pytest.raises(UnsupportedLayerError, match=r"max_pool2d_with_indices\.default of module "
                                                    r"'2' \(MaxPool1d\): pooling with ceil_mode"):
        translate(model, torch.randn(3, 3))


F = nn.functional


def _activations(x):
    return (F.gelu(x) + F.gelu(x, approximate="tanh") + F.silu(x) + F.elu(x) + F.leaky_relu(x)
            + F.softplus(x) + F.hardtanh(x) + x.clamp(-0.5, 0.5) + x.pow(2) + 2 ** x
            + x.abs().pow(x) + torch.erf(x) + x.abs().sqrt().exp().log1p() + x.sign()
            + torch.minimum(x, x.flip(-1)) + x.masked_fill(x > 0.5, 0.25) + (x // 0.5) + x % 0.5
            + x.tril() + F.log_softmax(x, -1) + torch.rsqrt(x.abs() + 1)
            + (x.abs() + 1).reciprocal()
            + torch.maximum(x, -x.detach()) + x.round() + x.floor() + x.ceil() + x.trunc()
            + torch.atan2(x, x.flip(-1)) + x.sin() + x.cos() + torch.where(x != 0, x.sinh(), 1.0))


def _reductions(x):
    return torch.cat([x.var(-1), x.std(-1), x.amax(-1), x.max(-1).values, x.amin(1).repeat(1, 1),
                      x.prod(-1), x.norm(dim=-1), x.topk(2, -1).values.flatten(1),
                      x.argmax(-1).double(), x.cumprod(-1).mean(-1), x.logsumexp(-1),
                      x.min(-1).values, x.argmin(-1).double(), (x > -3).all(-1).double()], dim=1)


def _shapes(x):
    y = x.clone()
    y[:, 0] = 1.0
    y[..., 1] *= 2
    y[:, 1, 2] = 0.0
    y[:, [0, 2]] = y[:, [0, 2]] * 3.0
    return (torch.stack([y, x], 1).flatten(1)[:, :24].reshape(-1, 4, 6)
            + sum(x.split(2, -1)).repeat(1, 1, 3) + x.gather(-1, x.argsort(-1)[..., :6])
            + x.index_select(-1, torch.tensor([5, 0, 1, 2, 3, 4])) + x.roll(1, -1)
            + F.pad(x, (1, 1))[..., 1:-1] + torch.einsum("bij,bkj->bik", x, x)[..., :1]
            + (x.mT @ x)[:, :4] + (x[:, 0] @ x[0].T)[:, None, :1]
            + F.scaled_dot_product_attention(x, x, x, is_causal=True)
            + x.unsqueeze(1).squeeze(1).transpose(1, 2).mT + torch.arange(6) * torch.ones(4, 1)
            + x.float().double())


def _normalization(x):
    return (F.layer_norm(x, x.shape[-1:]) + F.group_norm(x, 2) + F.max_pool1d(x, 3, 1, 1)
            + F.avg_pool1d(x, 3, 1, 1, count_include_pad=False) + F.avg_pool1d(x, 3, 1, 1))


class Convolutions(nn.Module):
    def __init__(self):
        super().__init__()
        self.up1 = nn.ConvTranspose1d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2,
                                      dilation=2)
        self.up2 = nn.ConvTranspose2d(1, 2, (2, 3), stride=(1, 2), padding=(0, 1))

    def forward(self, x):
        return torch.cat([self.up1(x).flatten(1), self.up2(x[:, None]).flatten(1)], 1)


class Functional(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)



@pytest.mark.slow
@pytest.mark.parametrize("build", [
    *(functools.partial(Functional, fn) for fn in (_activations, _reductions, _shapes,
                                                    _normalization)), Convolutions],
    ids=["activations", "reductions", "shapes", "normalization", "convolutions"])
def test_operators_match_torch(build):
    model = build().double()
    x = torch.randn(3, 4, 6, dtype=torch.float64)
    t = translate(model, x)
    with torch.no_grad():
        expected = model(x).numpy()
    assert max_relative_error(forward(t, x, torch.float64), expected) <= FORWARD_RTOL[torch.float64]
