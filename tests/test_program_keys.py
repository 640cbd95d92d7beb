"""Programs are keyed by the converted graph's whole description: changing any attribute of any
layer (one at a time) changes the kernel, in memory and in the disk cache, while two models alike
share their programs."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ntbridge
from ntbridge import programs


def mlp(act: nn.Module, width: int = 8, bias: bool = True) -> nn.Module:
    return nn.Sequential(nn.Linear(4, width, bias=bias), act, nn.Linear(width, 1))


def cnn(*layers: nn.Module) -> nn.Module:
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(3, 1))


def conv(k=3, stride=1, padding=1, dilation=1, bias=True, padding_mode="zeros", groups=1):
    return cnn(nn.Conv2d(3, 3, k, stride, padding, dilation, groups, bias, padding_mode),
               nn.ReLU())


def encoder(activation="gelu", nhead=2, dim_feedforward=16, norm_first=False,
            layer_norm_eps=1e-5, bias=True):
    return nn.Sequential(nn.Linear(8, 8), nn.TransformerEncoderLayer(
        8, nhead, dim_feedforward, 0.0, activation, layer_norm_eps, batch_first=True,
        norm_first=norm_first, bias=bias)).eval()


def norms(eps=1e-5, weight=2.0, affine=True, bn_eps=1e-5, bn_affine=True, bn_var=1.0):
    ln, bn = nn.LayerNorm(6, eps, elementwise_affine=affine), nn.BatchNorm1d(6, bn_eps,
                                                                            affine=bn_affine)
    with torch.no_grad():
        if affine:
            ln.weight.fill_(weight)
        if bn_affine:
            bn.weight.fill_(0.5)
        bn.running_var.fill_(bn_var)
    return nn.Sequential(nn.Linear(4, 6), ln, nn.ReLU(), nn.Linear(6, 6), bn.eval(),
                         nn.Linear(6, 1))


class Attention(nn.Module):
    """``head(mean over tokens of x + attn(x, x, x, mask)))`` on sequences ``(N, T, 8)``."""

    def __init__(self, num_heads=2, bias=True, causal=False):
        super().__init__()
        self.inp, self.head = nn.Linear(8, 8), nn.Linear(8, 1)
        self.attn = nn.MultiheadAttention(8, num_heads, bias=bias, batch_first=True)
        self.register_buffer("mask", torch.triu(torch.full((3, 3), float("-inf")), 1)
                             if causal else torch.zeros(3, 3))

    def forward(self, x):
        h = self.inp(x)
        return self.head((h + self.attn(h, h, h, attn_mask=self.mask, need_weights=False)[0])
                         .mean(1))


def pooling(pool: nn.Module) -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 3, 1), pool, nn.Flatten())


def embedding(padding_idx=None, dim=8):
    return nn.Sequential(nn.Embedding(6, dim, padding_idx=padding_idx), nn.Linear(dim, 1))


def dropout(p=0.2, training=True):
    return mlp(nn.Dropout(p)).train(training)


def upsample(mode="nearest", align_corners=None, scale_factor=2):
    return pooling(nn.Upsample(scale_factor=scale_factor, mode=mode, align_corners=align_corners))


IMAGES, TOKENS = (3, 5, 5), (3, 8)
FAMILIES = {  # name: (build, the input's shape (ids: "ids"), kwargs changing one attribute each)
    "linear": (lambda **kw: mlp(nn.ReLU(), **kw), (4,), [dict(width=12), dict(bias=False)]),
    "leaky relu": (lambda s=0.1: mlp(nn.LeakyReLU(s)), (4,), [dict(s=0.3)]),
    "elu": (lambda a=1.0: mlp(nn.ELU(a)), (4,), [dict(a=0.5)]),
    "celu": (lambda c=1.0: mlp(nn.CELU(c)), (4,), [dict(c=0.5)]),
    "hardtanh": (lambda lo=-1.0, hi=1.0: mlp(nn.Hardtanh(lo, hi)), (4,),
                 [dict(lo=-0.5), dict(hi=0.5)]),
    "softplus": (lambda beta=1.0, threshold=20.0: mlp(nn.Softplus(beta, threshold)), (4,),
                 [dict(beta=2.0), dict(threshold=1.0)]),
    "gelu": (lambda approximate="none": mlp(nn.GELU(approximate)), (4,),
             [dict(approximate="tanh")]),
    "softshrink": (lambda lambd=0.5: mlp(nn.Softshrink(lambd)), (4,), [dict(lambd=0.2)]),
    "hardshrink": (lambda lambd=0.5: mlp(nn.Hardshrink(lambd)), (4,), [dict(lambd=0.2)]),
    "threshold": (lambda t=0.1, v=0.0: mlp(nn.Threshold(t, v)), (4,), [dict(t=0.3), dict(v=0.5)]),
    "rrelu": (lambda lower=0.1, upper=0.3: mlp(nn.RReLU(lower, upper)).eval(), (4,),
              [dict(lower=0.2), dict(upper=0.4)]),
    "conv": (conv, IMAGES, [dict(k=2), dict(stride=2), dict(padding=0), dict(dilation=2),
                            dict(bias=False), dict(padding_mode="circular"), dict(groups=3)]),
    "norm": (norms, (4,), [dict(eps=0.5), dict(weight=1.5), dict(affine=False),
                           dict(bn_eps=0.5), dict(bn_affine=False), dict(bn_var=2.0)]),
    "pooling": (lambda kind="avg", k=2, s=None, p=0, ceil=False, pad=True, out=2: pooling({
        "avg": lambda: nn.AvgPool2d(k, s, p, ceil, pad), "lp": lambda: nn.LPPool2d(1, k, s),
        "adaptive": lambda: nn.AdaptiveAvgPool2d(out)}[kind]()), IMAGES,
        [dict(k=3), dict(s=1), dict(p=1), dict(ceil=True), dict(p=1, pad=False),
         dict(kind="lp"), dict(kind="adaptive"), dict(kind="adaptive", out=3)]),
    "embedding": (embedding, "ids", [dict(padding_idx=0), dict(dim=4)]),
    "dropout": (dropout, (4,), [dict(p=0.5), dict(training=False)]),
    "upsample": (upsample, IMAGES, [dict(mode="bilinear"), dict(mode="bilinear",
                                                                align_corners=True),
                                    dict(scale_factor=3)]),
    "encoder": (encoder, TOKENS, [dict(activation="relu"), dict(activation=nn.SiLU()),
                                  dict(activation=F.silu),
                                  dict(dim_feedforward=32), dict(norm_first=True),
                                  dict(layer_norm_eps=0.5), dict(bias=False)]),
    "attention": (Attention, TOKENS, [dict(causal=True)]),
}
SLOW = {"encoder", "attention", "conv", "pooling", "elu", "celu", "softshrink", "hardshrink",
        "threshold", "hardtanh"}


def _input(shape) -> torch.Tensor:
    if shape == "ids":
        return torch.tensor([[0, 1, 2], [3, 0, 5], [4, 4, 1]])
    return torch.randn(3, *shape)


def _nngp(build, x, **kw) -> torch.Tensor:
    torch.manual_seed(0)
    return ntbridge.nngp(build(**kw), x)


def test_each_attribute_changes_the_key():
    """Every change (without compiling anything): the graph's signature and architecture, which
    key its programs, differ from the first model's, and are equal for an equal model."""
    for family, (build, shape, changes) in FAMILIES.items():
        first, again = ntbridge.convert(build()), ntbridge.convert(build())
        assert (again.signature, again.architecture) == (first.signature, first.architecture)
        assert programs._text(first.signature) is not None, family  # named by value on disk
        for change in changes:
            other = ntbridge.convert(build(**change))
            assert other.signature != first.signature, (family, change)
            assert other.architecture != first.architecture, (family, change)


def _count(directory) -> tuple[int, int]:
    """Programs in memory and on disk."""
    return len(programs._ENTRIES), sum(1 for p in directory.iterdir() if p.suffix == ".xla")


@pytest.mark.parametrize("family", [pytest.param(f, marks=pytest.mark.slow) if f in SLOW else f
                                    for f in FAMILIES])
def test_each_attribute_changes_the_kernel(family, tmp_path, monkeypatch):
    """With the disk cache on, each model's programs are looked up in memory and then on disk:
    a key missing an attribute would return the first model's kernel from either."""
    monkeypatch.setenv("NTBRIDGE_CACHE_DIR", str(tmp_path))
    programs.clear()
    build, shape, changes = FAMILIES[family]
    torch.manual_seed(1)
    x = _input(shape)
    base = _nngp(build, x)
    before = _count(tmp_path)
    torch.testing.assert_close(_nngp(build, x), base, rtol=0, atol=0)  # a fresh, equal model
    assert _count(tmp_path) == before  # shares its programs
    for change in changes:
        assert not torch.equal(_nngp(build, x, **change), base), change


@pytest.mark.slow
def test_encoder_activation_without_the_disk_cache(monkeypatch):
    """The encoder layer's activation (a string, a function or a module) in one process with the
    disk cache off: each order gives each model its own kernel."""
    monkeypatch.setenv("NTBRIDGE_CACHE_DIR", "off")
    torch.manual_seed(1)
    x = torch.randn(2, 3, 8)
    gelu, relu = _nngp(encoder, x), _nngp(encoder, x, activation="relu")
    assert not torch.equal(gelu, relu)
    programs.clear()
    torch.testing.assert_close(_nngp(encoder, x, activation="relu"), relu, rtol=0, atol=0)
    torch.testing.assert_close(_nngp(encoder, x), gelu, rtol=0, atol=0)
    torch.testing.assert_close(_nngp(encoder, x, activation=F.relu), relu, rtol=0, atol=0)
    torch.testing.assert_close(_nngp(encoder, x, activation=nn.GELU()), gelu, rtol=0, atol=0)
