"""The empirical NTK/NNGP equal plain torch.func references on the same weights."""

import pytest
import torch
from torch import nn

import ntbridge
from ntbridge.errors import InputError

from reference import empirical_ntk, jacobians

TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


def rel_error(a, b):
    return (torch.linalg.norm(a - b) / torch.linalg.norm(b)).item()


def deep_mlp(dtype):
    return nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 32, bias=False), nn.ReLU(), nn.Linear(32, 3)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_empirical_ntk_matches_torch_func(dtype):
    model = deep_mlp(dtype)
    x1, x2 = torch.randn(7, 6, dtype=dtype), torch.randn(4, 6, dtype=dtype)
    full = empirical_ntk(model, x1, x2, trace=False)
    got_full = ntbridge.empirical_ntk(model, x1, x2, trace_axes=())
    assert got_full.shape == (7, 4, 3, 3) and got_full.dtype == dtype
    assert rel_error(got_full, full) <= TOL[dtype]
    got = ntbridge.empirical_ntk(model, x1, x2)
    assert rel_error(got, torch.diagonal(full, dim1=2, dim2=3).mean(-1)) <= TOL[dtype]
    diag = ntbridge.empirical_ntk(model, x1, x2, trace_axes=(), diagonal_axes=(-1,))
    assert rel_error(diag, torch.diagonal(full, dim1=2, dim2=3)) <= TOL[dtype]


def test_empirical_nngp_and_symmetry():
    model = deep_mlp(torch.float32)
    x = torch.randn(6, 6)
    k = ntbridge.empirical_ntk(model, x)
    assert torch.equal(k, k.T)
    full = ntbridge.empirical_ntk(model, x, trace_axes=())
    assert torch.equal(full, full.permute(1, 0, 3, 2))
    f = model(x).detach()
    assert rel_error(ntbridge.empirical_nngp(model, x), f @ f.T / 3) <= 1e-5


def test_bad_axes_and_parameterless_models():
    model = deep_mlp(torch.float32)
    x = torch.randn(3, 6)
    for kwargs in ({"trace_axes": (2,)}, {"trace_axes": (0,)}, {"trace_axes": (-1,), "diagonal_axes": (1,)}):
        with pytest.raises(InputError, match="axes"):
            ntbridge.empirical_ntk(model, x, **kwargs)
    with pytest.raises(InputError, match="no parameters"):
        ntbridge.empirical_ntk(nn.Sequential(nn.ReLU()), x)
    with pytest.raises(ntbridge.errors.InputTypeError, match="model.to"):
        ntbridge.empirical_ntk(model, x.double())
