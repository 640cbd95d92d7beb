"""What every entry point hands back is the user's own: writable in place without a warning, and a
write never reaches what ntbridge keeps, cached values or an ``out`` file (the next call gives the
original result)."""

import contextlib
import warnings

import pytest
import torch

import ntbridge
from ntbridge.errors import InitMismatchWarning
from helpers import mlp

X1 = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
X2 = torch.randn(4, 3, generator=torch.Generator().manual_seed(1))
# Each batching option takes each of its values at least once for every entry point:
# (x2 given, batch_size, device_count, store_on_device, dtype, out= a .npy file where taken).
OPTIONS = [(False, None, 1, True, torch.float32, False),
           (True, 2, 2, False, torch.float64, False),
           (True, None, 2, True, torch.float32, True),
           (False, 2, 1, False, torch.float64, True)]


ENTRY_POINTS = {
    "ntk": ntbridge.ntk,
    "nngp": ntbridge.nngp,
    "kernel": ntbridge.kernel,
    "empirical_ntk": ntbridge.empirical_ntk,
    "empirical_ntk by_layer": lambda *a, **o: ntbridge.empirical_ntk(*a, by_layer=True, **o),
    "empirical_nngp": ntbridge.empirical_nngp,
    "monte_carlo": lambda *a, **o: ntbridge.monte_carlo(*a, n_samples=3, **o),
}
TAKE_OUT = {"ntk", "nngp", "kernel", "empirical_ntk", "empirical_nngp"}


@contextlib.contextmanager
def strict_warnings():
    """Any warning is an error (torch's warn-once ones every time), but ntbridge's own
    InitMismatchWarning."""
    always = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            warnings.simplefilter("default", InitMismatchWarning)
            yield
    finally:
        torch.set_warn_always(always)


def tensors(result) -> list[torch.Tensor]:
    """The arrays of a result (a tensor, a named tuple or dict of them, a WidthSweep's errors) as
    tensors; numpy arrays are shared with torch, not copied."""
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, ntbridge.analysis.WidthSweep):
        return [torch.from_numpy(e) for e in result.errors.values()]
    values = result.values() if isinstance(result, dict) else result
    return [v for v in values if isinstance(v, torch.Tensor)]


def check_writable_and_private(call) -> None:
    """``call()`` twice: each array of the first result takes an in-place write; the second result
    is the unmodified one."""
    with strict_warnings():
        first = tensors(call())
        originals = [t.clone() for t in first]
        assert originals
        for t in first:
            t.diagonal().add_(1.0)
        for t, original in zip(first, originals):
            assert torch.equal(t.diagonal(), original.diagonal() + 1.0), "the write was lost"
        again = tensors(call())
    assert len(again) == len(originals)
    for t, original in zip(again, originals):
        torch.testing.assert_close(t, original, rtol=0, atol=0)


def option_id(options: tuple) -> str:
    given_x2, batch_size, device_count, store_on_device, dtype, out = options
    return (f"x2={given_x2}-batch={batch_size}-devices={device_count}-on_device={store_on_device}-"
            f"{str(dtype).removeprefix('torch.')}-out={out}")


@pytest.mark.slow
@pytest.mark.parametrize("options", OPTIONS, ids=option_id)
@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_results_are_writable_and_private(name, options, tmp_path):
    given_x2, batch_size, device_count, store_on_device, dtype, out = options
    kwargs = dict(batch_size=batch_size, device_count=device_count, store_on_device=store_on_device)
    if out and name in TAKE_OUT:
        kwargs["out"] = str(tmp_path / "k.npy")
        if name == "kernel":
            kwargs["get"] = ("ntk",)  # a file holds one kernel
    model = mlp(3, [8], 2).to(dtype)
    x1, x2 = X1.to(dtype), X2.to(dtype) if given_x2 else None
    check_writable_and_private(lambda: ENTRY_POINTS[name](model, x1, x2, **kwargs))


@pytest.mark.slow
@pytest.mark.parametrize("given_x2, dtype", [(False, torch.float32), (True, torch.float64)])
def test_width_sweep_results_are_writable_and_private(given_x2, dtype):
    x1, x2 = X1[:4].to(dtype), X2[:3].to(dtype) if given_x2 else None
    check_writable_and_private(
        lambda: ntbridge.analysis.width_sweep(lambda width: mlp(3, [width], 2), [4, 8], x1, x2, n_seeds=2, implementation="jacobian"))


def test_monte_carlo_running_estimates_do_not_share_the_running_mean():
    model, x = mlp(3, [8], 2), X1
    expected = [e.mean.clone() for e in ntbridge.monte_carlo(model, x, n_samples=[2, 4])]
    running = ntbridge.monte_carlo(model, x, n_samples=[2, 4])
    next(running).mean.add_(100.0)
    torch.testing.assert_close(next(running).mean, expected[1], rtol=0, atol=0)
