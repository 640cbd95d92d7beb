"""Output axes of empirical kernels: traced (averaged), diagonal, kept; and the contraction
that applies them (see the package doc)."""

from __future__ import annotations

import dataclasses
import math
import string
from typing import Iterator, Sequence

import jax
import jax.numpy as jnp

from ..errors import InputError
from ..specs import int_tuple
from ..tiling.arrays import symmetrize

HIGHEST = jax.lax.Precision.HIGHEST


def normalize_axes(trace_axes: Sequence[int], diagonal_axes: Sequence[int],
                   ndim: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Output axes as non-negative indices into ``f``'s shape of rank ``ndim``, checked."""
    result = []
    for arg, axes in (("trace_axes", trace_axes), ("diagonal_axes", diagonal_axes)):
        axes = int_tuple(axes, arg)
        fixed = tuple(a % ndim if -ndim <= a < ndim else None for a in axes)
        if None in fixed or 0 in fixed:
            raise InputError(f"{arg}={axes} names an axis the output (rank {ndim}, axis 0 being "
                             f"the batch) does not have; use output axes 1..{ndim - 1} or negative "
                             f"indices.")
        if len(set(fixed)) != len(fixed):
            raise InputError(f"{arg}={axes} names an axis twice.")
        result.append(fixed)
    if set(result[0]) & set(result[1]):
        raise InputError(f"trace_axes={tuple(trace_axes)} and diagonal_axes="
                         f"{tuple(diagonal_axes)} overlap; an axis is traced or diagonal, not both.")
    return result[0], result[1]


@dataclasses.dataclass(frozen=True)
class Axes:
    """The rank of ``f`` (batch included) and its normalized trace and diagonal axes."""

    out_ndim: int
    trace: tuple[int, ...]
    diagonal: tuple[int, ...]

    @classmethod
    def of(cls, out_ndim: int, trace_axes: Sequence[int], diagonal_axes: Sequence[int]) -> "Axes":
        """The axes of an output of rank ``out_ndim``, normalized and checked (normalize_axes)."""
        return cls(out_ndim, *normalize_axes(trace_axes, diagonal_axes, out_ndim))

    def subscripts(self, letters: Iterator[str]) -> tuple[str, str, str]:
        """Einsum subscripts of ``f(x1)``'s axes, ``f(x2)``'s axes and of the kernel."""
        sa, sb, kept1, kept2 = [next(letters)], [next(letters)], "", ""
        for axis in range(1, self.out_ndim):
            la = next(letters)
            lb = la if axis in self.trace or axis in self.diagonal else next(letters)
            sa.append(la)
            sb.append(lb)
            if axis not in self.trace:
                kept1 += la
                kept2 += "" if axis in self.diagonal else lb
        return "".join(sa), "".join(sb), sa[0] + sb[0] + kept1 + kept2

    def scale(self, out_shape: Sequence[int]) -> int:
        """The number of entries the traced axes average over."""
        return math.prod(out_shape[axis] for axis in self.trace)

    def swap_perm(self, ndim: int) -> tuple[int, ...]:
        """The axes permutation exchanging x1 and x2 in a kernel array of rank ``ndim``."""
        kept = [a for a in range(1, self.out_ndim) if a not in self.trace]
        paired = [i for i, a in enumerate(kept) if a not in self.diagonal]
        perm = [1, 0] + list(range(2, 2 + len(kept))) + list(range(2 + len(kept), ndim))
        for j, i in enumerate(paired):
            perm[2 + i], perm[2 + len(kept) + j] = perm[2 + len(kept) + j], perm[2 + i]
        return tuple(perm)

    def symmetrized(self, k, x2):
        """The kernel(s) ``k``, symmetrized op by op (so exactly) when ``x2`` is None."""
        return jax.tree.map(lambda a: a if x2 is not None else symmetrize(a, self.swap_perm(a.ndim)),
                            k)


def contract_subscripts(rest_ndim: int, axes: Axes) -> str:
    """The einsum of :func:`contract` for arrays with ``rest_ndim`` trailing summed axes."""
    letters = iter(string.ascii_letters)
    sa, sb, out = axes.subscripts(letters)
    rest = "".join(next(letters) for _ in range(rest_ndim))
    return f"{sa}{rest},{sb}{rest}->{out}"


def contract(a: jax.Array, b: jax.Array, axes: Axes) -> jax.Array:
    """Contract ``a (N1, *out, *rest)`` with ``b (N2, *out, *rest)`` over ``rest`` and the axes rules.

    ``rest`` (e.g. a parameter's shape) is summed over; traced output axes are averaged.
    """
    return jnp.einsum(contract_subscripts(a.ndim - axes.out_ndim, axes), a, b,
                      precision=HIGHEST) / axes.scale(a.shape[:axes.out_ndim])
