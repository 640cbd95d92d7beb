import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import ntbridge
from ntbridge import dlpack
from ntbridge.dlpack import precision, shares_memory, to_jax, to_torch
from ntbridge.errors import InputTypeError

from reference import full_ntk

cuda = pytest.mark.skipif(
    not torch.cuda.is_available() or not any(d.platform == "gpu" for d in jax.devices()),
    reason="needs CUDA in torch and in JAX")


def test_to_jax_is_zero_copy_on_cpu():
    t = torch.randn(64, 33)
    a = to_jax(t)
    assert shares_memory(t, a)
    np.testing.assert_array_equal(np.asarray(a), t.numpy())


def test_to_torch_is_zero_copy_on_cpu():
    a = jax.device_put(jnp.sin(jnp.arange(100.0)).reshape(10, 10), jax.devices("cpu")[0])
    t = to_torch(a)
    assert shares_memory(t, a)
    np.testing.assert_array_equal(t.numpy(), np.asarray(a))


def test_non_contiguous_and_misaligned_are_copied_once_and_correct():
    base = torch.randn(8, 6)
    for t in (base.T, base[:, ::2], base.flatten()[1:]):  # transposed, strided, misaligned
        a = to_jax(t)
        assert not shares_memory(t, a)
        np.testing.assert_array_equal(np.asarray(a), t.numpy())


def test_requires_grad_is_detached_and_low_precision_is_float32():
    t = torch.randn(4, 3, requires_grad=True)
    assert shares_memory(t, to_jax(t))
    for dtype in (torch.float16, torch.bfloat16):
        assert to_jax(t.to(dtype)).dtype == jnp.float32


def test_float64_only_inside_precision_and_global_config_untouched():
    before = jax.config.jax_enable_x64
    t = torch.randn(3, 3, dtype=torch.float64)
    with precision(torch.float64):
        a = to_jax(t)
        assert a.dtype == jnp.float64 and shares_memory(t, a)
    assert jax.config.jax_enable_x64 == before


def test_float32_models_give_float32_kernels_where_x64_is_on():
    """JAX's x64 mode turned on by the user does not make a float32 model's kernels float64 (token
    ids and attention included)."""
    torch.manual_seed(0)
    model = Classifier(vocab=50, width=16).eval()
    ids = torch.randint(0, 50, (6, 4))
    expected = ntbridge.ntk(model, ids)
    with jax.enable_x64(True):
        k = ntbridge.ntk(model, ids)
    assert k.dtype == expected.dtype == torch.float32
    torch.testing.assert_close(k, expected, rtol=0, atol=0)


class Classifier(torch.nn.Module):
    def __init__(self, vocab, width):
        super().__init__()
        self.emb, self.head = torch.nn.Embedding(vocab, width), torch.nn.Linear(width, 1)
        self.att = torch.nn.MultiheadAttention(width, 2, batch_first=True)

    def forward(self, ids):
        h = self.emb(ids)
        return self.head(self.att(h, h, h, need_weights=False)[0].mean(1))


@pytest.mark.parametrize("dtype, says", [(torch.int64, "x1 has dtype"), (torch.bool, "x1 has dtype"),
                                         (torch.complex64, "x1 is complex .* pass x1.real")])
def test_non_float_inputs_are_refused(dtype, says):
    with pytest.raises(InputTypeError, match=says):
        dlpack.torch_kernel_dtype(torch.zeros(2, 2, dtype=dtype), "x1")


@pytest.mark.parametrize("requires_grad", [False, True])
def test_ntk_result_reaches_torch_without_copy(monkeypatch, requires_grad):
    """The program's output becomes the returned tensor without a copy (x2 given: with x2 = None
    the result is the symmetrized output, a new tensor), with autograd history or without."""
    handed = []
    original = ntbridge.tiling.transfer.to_torch

    def spy(a):
        t = original(a)
        handed.append((shares_memory(t, a), t.data_ptr()))
        return t

    monkeypatch.setattr(ntbridge.tiling.transfer, "to_torch", spy)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    k = ntbridge.ntk(model, torch.randn(5, 3, requires_grad=requires_grad), torch.randn(4, 3))
    assert handed == [(True, k.data_ptr())] and k.shape == (5, 4)
    assert (k.grad_fn is not None) == requires_grad


@cuda
def test_cuda_zero_copy_both_ways_and_stream_order():
    x = torch.randn(2048, 512, device="cuda")
    y = x * 2 + 1  # queued on torch's stream; JAX must see the finished values
    a = to_jax(y)
    assert shares_memory(y, a)
    b = jnp.sin(a)
    t = to_torch(b)
    assert t.device == y.device and shares_memory(t, b)
    torch.testing.assert_close(t, torch.sin(y))


@cuda
def test_cuda_kernel_result_on_the_gpu():
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    x = torch.randn(5, 3)
    k_gpu = ntbridge.ntk(model.cuda(), x.cuda())
    k_cpu = ntbridge.ntk(model.cpu(), x)  # computed on the CPU, though JAX's default is the GPU
    assert k_gpu.device.type == "cuda" and k_cpu.device.type == "cpu"
    assert ntbridge.empirical_ntk(model, x).device.type == "cpu"
    torch.testing.assert_close(k_gpu.cpu(), k_cpu, rtol=1e-5, atol=1e-6)


@cuda
@pytest.mark.parametrize("implementation", ["jacobian", "ntvp", "structured", "auto"])
def test_cuda_empirical_ntk_every_strategy(implementation):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 6 * 6, 5))
    x1, x2 = torch.randn(3, 3, 8, 8), torch.randn(2, 3, 8, 8)
    k = ntbridge.empirical_ntk(model.cuda(), x1.cuda(), x2.cuda(), trace_axes=(),
                               implementation=implementation)
    assert k.device.type == "cuda"
    expected = full_ntk(model.cpu(), x1, x2)
    assert (torch.linalg.norm(k.cpu() - expected) / torch.linalg.norm(expected)).item() <= 1e-5
