"""Nyström features (ntbridge.nystrom_features): the kernel projected onto the landmarks' span."""

import pytest
import torch
from torch import nn

import ntbridge
from ntbridge.errors import InputError, ShapeError


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 64), nn.Tanh(),
                         nn.Linear(64, 1)).double()


def _cnn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(8, 1)).double()


@pytest.mark.parametrize("make, shape", [(_mlp, (4,)), (_cnn, (2, 5, 5))])
def test_features_give_the_kernel_through_the_landmarks(make, shape):
    # phi(x) phi(y)^T = K(x, L) K(L, L)^-1 K(L, y), computed here by a solve; x in chunks of 3
    model, gen = make(), torch.Generator().manual_seed(1)
    x, y, landmarks = (torch.randn(n, *shape, generator=gen, dtype=torch.float64) for n in (7, 5, 6))
    phi_x = ntbridge.nystrom_features(model, x, landmarks, get=("nngp", "ntk"), chunk_size=3)
    phi_y = ntbridge.nystrom_features(model, y, landmarks, get=("nngp", "ntk"))
    for name in ("nngp", "ntk"):
        k = lambda a, b: ntbridge.kernel(model, a, b, get=name)
        reference = k(x, landmarks) @ torch.linalg.solve(k(landmarks, landmarks), k(landmarks, y))
        got = getattr(phi_x, name) @ getattr(phi_y, name).T
        torch.testing.assert_close(got, reference, rtol=1e-8, atol=1e-10 * reference.abs().max())


def test_landmarks_kernel_is_exact_and_repeats_are_left_out():
    # on the landmarks themselves the features give the kernel exactly, also when a landmark
    # is repeated (its second copy adds a zero eigenvalue: that column of phi is zero)
    model = _mlp()
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    landmarks = torch.cat([x, x[:1]])
    phi = ntbridge.nystrom_features(model, x, landmarks, get="ntk")
    assert phi.shape == (6, 7) and (phi.abs().amax(0) == 0).sum() == 1
    torch.testing.assert_close(phi @ phi.T, ntbridge.ntk(model, x), rtol=1e-8, atol=1e-12)


def test_bad_nystrom_inputs_are_named():
    model, x = _mlp(), torch.randn(4, 4, dtype=torch.float64)
    with pytest.raises(ShapeError, match=r"x and landmarks must have the same shape per example, "
                                         r"got x \(4, 4\) and landmarks \(3, 5\)"):
        ntbridge.nystrom_features(model, x, torch.randn(3, 5, dtype=torch.float64))
    with pytest.raises(InputError, match="chunk_size"):
        ntbridge.nystrom_features(model, x, x, chunk_size=0)
    with pytest.raises(InputError, match="landmarks must be a torch.Tensor, got ndarray"):
        ntbridge.nystrom_features(model, x, x.numpy())
    images = torch.randn(3, 2, 5, 5, dtype=torch.float64)
    with pytest.raises(ShapeError, match="end the model in a Linear"):
        ntbridge.nystrom_features(nn.Conv2d(2, 3, 3).double(), images, images)
