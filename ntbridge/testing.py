"""Assertions for kernels in users' own test suites (and the ``ntbridge compare`` command).

Example:
    >>> ntbridge.testing.assert_kernels_close(ntbridge.ntk(model, x), torch.load("ntk.pt"), rtol=1e-5)
"""

from __future__ import annotations

import dataclasses

import sys

import numpy as np


@dataclasses.dataclass(frozen=True)
class KernelComparison:
    """How far ``actual`` is from ``expected``; ``close`` uses numpy's ``allclose`` rule."""

    shape: tuple[int, ...]
    close: bool
    max_abs_error: float
    max_rel_error: float
    rel_frobenius_error: float
    worst_index: tuple[int, ...]
    worst_actual: float
    worst_expected: float
    rtol: float
    atol: float

    def report(self) -> str:
        verdict = "close" if self.close else "NOT close"
        return (f"kernels of shape {self.shape} are {verdict} (rtol={self.rtol:g}, atol={self.atol:g})\n"
                f"  max |actual - expected|        {self.max_abs_error:.3e}\n"
                f"  max relative error             {self.max_rel_error:.3e}\n"
                f"  relative Frobenius error       {self.rel_frobenius_error:.3e}\n"
                f"  worst entry {self.worst_index}: actual {self.worst_actual:.6g}, "
                f"expected {self.worst_expected:.6g}")


def _numpy(k, name: str) -> np.ndarray:
    torch = sys.modules.get("torch")  # not imported: k cannot be a torch tensor
    if torch is not None and isinstance(k, torch.Tensor):
        k = k.detach().cpu().numpy()
    a = np.asarray(k)
    if not np.issubdtype(a.dtype, np.floating):
        raise TypeError(f"{name} must hold floating-point numbers, got dtype {a.dtype}.")
    return a.astype(np.float64)


def compare_kernels(actual, expected, rtol: float = 1e-5, atol: float = 0.0) -> KernelComparison:
    """Compare two kernels (torch tensors or arrays of the same shape) entry by entry.

    An entry is close when ``|actual - expected| <= atol + rtol * |expected|``; NaNs are never close.
    """
    a, e = _numpy(actual, "actual"), _numpy(expected, "expected")
    if a.shape != e.shape:
        raise ValueError(f"actual has shape {a.shape} but expected has shape {e.shape}.")
    diff = np.abs(a - e)
    excess = np.where(np.isnan(diff), np.inf, diff - (atol + rtol * np.abs(e)))
    worst = np.unravel_index(np.argmax(excess), a.shape) if a.size else ()
    norm = np.linalg.norm(e)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(diff == 0, 0.0, diff / np.abs(e))
    return KernelComparison(
        shape=a.shape, close=bool(a.size == 0 or np.all(excess <= 0)),
        max_abs_error=float(np.max(diff)) if a.size else 0.0,
        max_rel_error=float(np.max(rel)) if a.size else 0.0,
        rel_frobenius_error=float(np.linalg.norm(a - e) / norm) if norm else float(np.linalg.norm(a - e)),
        worst_index=tuple(int(i) for i in worst),
        worst_actual=float(a[worst]) if a.size else 0.0,
        worst_expected=float(e[worst]) if a.size else 0.0, rtol=rtol, atol=atol)


def assert_kernels_close(actual, expected, rtol: float = 1e-5, atol: float = 0.0) -> None:
    """Raise ``AssertionError`` with a readable report unless the kernels are close.

    The report gives the largest absolute and relative errors, the relative Frobenius error and
    where the worst entry is.
    """
    result = compare_kernels(actual, expected, rtol, atol)
    if not result.close:
        raise AssertionError(result.report())
