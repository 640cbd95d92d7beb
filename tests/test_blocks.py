"""Tiles computed in cache-sized blocks (ntbridge.tiling.blocks) equal the kernel in one piece."""

import jax
import numpy as np
import pytest
import torch
from torch import nn

import ntbridge
from ntbridge.errors import InputError
from ntbridge.tiling import blocks


def _cnn(head: str) -> nn.Sequential:
    tail = ([nn.Flatten(), nn.Linear(4 * 6 * 6, 3)] if head == "Flatten" else
            [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3)])
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.ReLU(),
                         nn.AvgPool2d(2, padding=1), *tail)


MODELS = {
    "FC": (lambda: nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(),
                                 nn.Linear(16, 2)), (5,)),
    "CNN Flatten": (lambda: _cnn("Flatten"), (2, 8, 8)),
    "CNN GAP": (lambda: _cnn("GAP"), (2, 8, 8)),
}


@pytest.mark.parametrize("name", MODELS)
def test_blocks_give_the_kernel_in_one_piece(name, monkeypatch):
    """Blocks of 3 examples (the last one padded), x2 given or not, float64: the blocked tile
    equals the whole within rounding, and with x2 = None it is exactly symmetric (the blocks below
    the diagonal are transposes, those on it symmetrized)."""
    make, shape = MODELS[name]
    graph = ntbridge.convert(make().double(), parameterization="ntk")
    rng = np.random.default_rng(0)
    x1, x2 = rng.standard_normal((10, *shape)), rng.standard_normal((7, *shape))
    whole = graph.analytic_task(("nngp", "ntk")).fn
    pair_bytes = lambda a1: blocks.BLOCK_BYTES // (blocks.LIVE_ARRAYS * 9)  # blocks of 3
    blocked = jax.jit(blocks.in_blocks(whole, pair_bytes, graph.perm))
    with jax.enable_x64(True):
        for b in (x2, None):
            expected, got = whole(None, x1, b), blocked(None, x1, b)
            for e, g in zip(expected, got):
                e, g = np.asarray(e), np.asarray(g)
                assert g.shape == e.shape
                np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-12 * np.abs(e).max())
                if b is None:
                    assert (g == g.T).all()


def test_requests_are_blocked_on_cpu_and_symmetric():
    """ntbridge.kernel's analytic task is blocked on CPUs; the result with x2 = None is exactly
    symmetric and equals the unblocked kernel_fn."""
    torch.manual_seed(0)
    model = _cnn("GAP").double()
    x = torch.randn(40, 2, 8, 8, dtype=torch.float64)
    k = ntbridge.kernel(model, x)
    with jax.enable_x64(True):
        reference = ntbridge.convert(model).kernel_fn(jax.numpy.asarray(x.numpy()))
    for got, expected in zip(k, reference):
        assert torch.equal(got, got.T)
        np.testing.assert_allclose(got.numpy(), np.asarray(expected), rtol=1e-12)


def test_training_dropout_is_not_tiled_with_itself():
    """Training-mode Dropout's kernel of x1 with itself has same-example terms on its diagonal:
    diagonal tiles computed from two copies of the examples would miss them, so the kernel is one
    tile (an explicit smaller batch_size is refused); with x2 given, tiles are fine."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 1)).train()
    x, y = torch.randn(10, 3), torch.randn(6, 3)
    whole = ntbridge.nngp(model, x, batch_size=0)
    assert torch.equal(ntbridge.nngp(model, x), whole)
    assert not torch.allclose(whole, ntbridge.nngp(model, x, x.clone()))  # the Dropout terms
    with pytest.raises(InputError, match="batch_size=3.*Dropout"):
        ntbridge.nngp(model, x, batch_size=3)
    torch.testing.assert_close(ntbridge.nngp(model, x, y, batch_size=3),
                               ntbridge.nngp(model, x, y, batch_size=0))


def test_gradients_through_blocks(monkeypatch):
    """Gradients of a blocked kernel (x2 = None: blocks above the diagonal and their transposes)
    equal those of the kernel in one piece."""
    torch.manual_seed(0)
    model = _cnn("GAP").double()
    x = torch.randn(9, 2, 8, 8, dtype=torch.float64)
    weights = torch.randn(9, 9, dtype=torch.float64)
    grads = []
    monkeypatch.setenv("NTBRIDGE_CACHE_DIR", "off")  # its keys do not hold the block size
    for block_bytes in (blocks.BLOCK_BYTES, 2 ** 40):  # blocks of 4 examples; one block
        monkeypatch.setattr(blocks, "BLOCK_BYTES", block_bytes)
        ntbridge.programs.clear()
        x1 = x.clone().requires_grad_()
        (ntbridge.ntk(model, x1) * weights).sum().backward()
        grads.append(x1.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-10, atol=1e-12)
