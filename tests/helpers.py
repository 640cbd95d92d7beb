"""What several test modules share: relative errors (two formulas, named for the difference), the
MLP and self-attention models, and the checks of converted forwards and kernels."""

import jax
import numpy as np
import torch
from torch import nn

import ntbridge
from ntbridge.dlpack import precision, to_jax, to_torch
from ntbridge.stax import input_kernel

from reference import channel_averaged_ntk


def frobenius_relative_error(a, b) -> float:
    """``|a - b| / |b|`` in the Frobenius norm (torch tensors)."""
    return (torch.linalg.norm(a - b) / torch.linalg.norm(b)).item()


def max_relative_error(a, b) -> float:
    """The largest difference relative to the largest entry of ``b``, ``max|a - b| / max|b|`` (torch
    tensors, or anything numpy reads)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return float(((a - b).abs().max() / b.abs().max()).detach())
    a, b = np.asarray(a), np.asarray(b)
    return float(np.abs(a - b).max() / np.abs(b).max())


def mlp(d_in: int, widths, d_out: int, act=nn.ReLU, bias: bool = True) -> nn.Sequential:
    """``nn.Linear`` layers of the given hidden widths, each followed by ``act`` (a module class,
    instantiated per layer, or one module instance used after every hidden layer), then a linear
    readout to ``d_out``. torch's default init, layers created in order (the same weights as
    ``nn.Sequential(nn.Linear(...), act(), ...)`` spelled out)."""
    layers, fan_in = [], d_in
    for width in widths:
        layers += [nn.Linear(fan_in, width, bias=bias), act if isinstance(act, nn.Module) else act()]
        fan_in = width
    return nn.Sequential(*layers, nn.Linear(fan_in, d_out, bias=bias))


class Attention(nn.Module):
    """Self-attention alone, with an optional fixed mask (a buffer)."""

    def __init__(self, e, heads, bias=True, mask=None):
        super().__init__()
        self.attn = nn.MultiheadAttention(e, heads, bias=bias, batch_first=True)
        self.register_buffer("mask", mask)

    def forward(self, x):
        return self.attn(x, x, x, attn_mask=self.mask, need_weights=False)[0]


# ---------------------------------------------------------------- converted forwards and kernels
FORWARD_RTOL = {torch.float32: 1e-5, torch.float64: 1e-12}
# ReLU's NTK factor (pi - arccos c) / (2 pi) amplifies a rounding error e of c near 1 (an example
# with itself) to sqrt(2 e): layouts that round c differently agree to ~sqrt(float64 eps).
LAYOUT_NTK_RTOL = 10 * torch.finfo(torch.float64).eps ** 0.5


def assert_forward_matches(model: nn.Module, x: torch.Tensor) -> None:
    """The translated ``apply_fn`` reproduces ``model(x)`` to the dtype's tolerance (max-norm)."""
    assert_forwards_match([model], [x])


def assert_forwards_match(models: list[nn.Module], xs: list[torch.Tensor]) -> None:
    """:func:`assert_forward_matches` for each model and its input, all of them in one compiled
    program (one compile, not one per model: most of their time)."""
    dtype = xs[0].dtype
    models = [model.to(dtype) for model in models]
    with precision(dtype):
        graphs = [ntbridge.convert(model) for model in models]
        outs = jax.jit(lambda ps, xs: [g.apply_fn(p, x) for g, p, x in zip(graphs, ps, xs)])(
            [g.params for g in graphs], [to_jax(x) for x in xs])
    for model, x, got in zip(models, xs, outs):
        got, expected = to_torch(got), model(x).detach()
        assert got.shape == expected.shape
        error = (got - expected).abs().max() / expected.abs().max()
        assert error <= FORWARD_RTOL[dtype], f"{model}: relative error {error:.2e}"


def assert_layouts_agree(model: nn.Module, x: torch.Tensor):
    """The kernels of float64 ``model`` at ``x`` from the diagonal and the full spatial layouts
    agree; returns the converted network and the diagonal layout's kernel."""
    with precision(torch.float64):
        network = ntbridge.convert(model).network
        kernel = lambda d: jax.jit(lambda a: network.kernel_fn(
            input_kernel(a, None, compute_ntk=True, diagonal_spatial=d)))(to_jax(x))
        diagonal, full = kernel(True), kernel(False)
    np.testing.assert_allclose(full.nngp, diagonal.nngp, rtol=1e-12)
    np.testing.assert_allclose(full.ntk, diagonal.ntk, rtol=LAYOUT_NTK_RTOL)
    return network, diagonal


def same_positions(a: np.ndarray) -> np.ndarray:
    """``(N1, N2, S1, S1', S2, S2', ...) -> (N1, N2, S1, S2, ...)``: the entries with s = s'."""
    for d in range((a.ndim - 2) // 2):
        a = np.moveaxis(np.diagonal(a, axis1=2 + d, axis2=3 + d), -1, 2 + d)
    return a


def assert_kernels(cases: dict[str, tuple]) -> dict:
    """For each ``name: (model, x1, x2, (nngp, ntk))``: the kernels of the float64 model at its
    inputs are the expected ones (given in the full layout), in the full layout and, where the
    network allows it, the diagonal one. All of them in one compiled program (one compile, not one
    per model and layout: most of their time). Returns the networks by name."""
    with precision(torch.float64):
        networks = {name: ntbridge.convert(model).network for name, (model, *_) in cases.items()}
        layouts = {name: (False,) if network.full_spatial else (False, True)
                   for name, network in networks.items()}
        kernels = jax.jit(lambda inputs: {name: [networks[name].kernel_fn(input_kernel(
            a1, a2, compute_ntk=True, diagonal_spatial=diagonal)) for diagonal in layouts[name]]
            for name, (a1, a2) in inputs.items()})(
            {name: (to_jax(x1), to_jax(x2)) for name, (_, x1, x2, _) in cases.items()})
    for name, (*_, expected) in cases.items():
        for diagonal, k in zip(layouts[name], kernels[name]):
            for got, want in zip((k.nngp, k.ntk), expected):
                want = same_positions(want) if diagonal else want
                np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-12,
                                           err_msg=f"{name}, diagonal_spatial={diagonal}")
    return networks


def linear_kernels(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor):
    """``(nngp, ntk)`` of a float64 model linear in the weights of first-layer convolutions of one
    fan-in: its NTK is torch.func's at any width and its NNGP that NTK / (3 fan_in) (torch's
    init)."""
    ntk = channel_averaged_ntk(model, x1, x2)
    fan_in = next(m for m in model.modules() if isinstance(m, nn.modules.conv._ConvNd)).weight[0]
    return ntk / (3 * fan_in.numel()), ntk


def assert_linear_kernels(model: nn.Module, x1: torch.Tensor, x2: torch.Tensor):
    """The kernels of such a model are :func:`linear_kernels`, in both layouts where the network
    allows the diagonal one. Returns the network."""
    model = model.double()
    return assert_kernels({"": (model, x1, x2, linear_kernels(model, x1, x2))})[""]
