"""The records results come in: analytic kernels (:class:`Kernels`) and Monte-Carlo estimates
(:class:`Estimate`). Both print as summaries; the values are one attribute away."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from .dlpack import describe


class Kernels(NamedTuple):
    """The analytic kernels asked for with ``get``; those not asked for are None.

    Example:
        >>> k = ntbridge.kernel(model, torch.randn(20, 16), torch.randn(5, 16))
        >>> k                        # a summary; the values are k.nngp and k.ntk
        Kernels(nngp=(20, 5) float32 cpu, ntk=(20, 5) float32 cpu)
    """

    nngp: Any = None
    ntk: Any = None

    @classmethod
    def pick(cls, values: dict, get: str | tuple[str, ...]):
        """``values[get]`` for one name, else the record of the names in ``get``."""
        return values[get] if isinstance(get, str) else cls(**{n: values[n] for n in get})

    def __repr__(self) -> str:
        kernels = (f"{name}={'None' if k is None else describe(k)}"
                   for name, k in self._asdict().items())
        return f"Kernels({', '.join(kernels)})"


class Estimate(NamedTuple):
    """A Monte-Carlo kernel estimate: the mean over ``n_samples`` initialisations and its
    standard error (same shape), as torch tensors.

    Example:
        >>> ntbridge.monte_carlo(model, torch.randn(8, 16), n_samples=100)  # the README's model
        Estimate(mean=(8, 8) float32 cpu, n_samples=100, mean standard error 0.269)
    """

    mean: torch.Tensor
    standard_error: torch.Tensor
    n_samples: int

    def __repr__(self) -> str:
        return (f"Estimate(mean={describe(self.mean)}, n_samples={self.n_samples}, "
                f"mean standard error {self.standard_error.mean().item():.3g})")
