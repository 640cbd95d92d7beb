"""What a request computes, as frozen values: one spec type per kernel kind.

A :class:`~ntbridge.pipeline.Request` carries one spec; the pipeline maps the spec's type to the
builder of its tiling task (:data:`ntbridge.pipeline.BUILDERS`). Specs check their own fields, so a
bad option is refused before any model is converted.

Example:
    >>> Analytic("ntk")
    Analytic(get='ntk', by_layer=False)
    >>> EmpiricalNTK(trace_axes=())
    EmpiricalNTK(implementation='auto', trace_axes=(), diagonal_axes=(), by_layer=False, interact=False)
"""

from __future__ import annotations

import dataclasses
import operator
from typing import ClassVar, Sequence, Union

from .errors import InputError, InputTypeError
from .options import IMPLEMENTATIONS

KERNEL_NAMES = ("nngp", "ntk")


def int_tuple(axes: Sequence[int], arg: str) -> tuple[int, ...]:
    """``axes`` as a tuple of ints; InputError naming ``arg`` if it is not a sequence of ints."""
    try:
        return tuple(int(a) for a in axes)
    except (TypeError, ValueError):
        raise InputError(f"{arg} must be a tuple of ints, got {axes!r}.") from None


def _axes(spec) -> None:
    """Normalize a spec's ``trace_axes`` and ``diagonal_axes`` to tuples of ints (in place)."""
    for name in ("trace_axes", "diagonal_axes"):
        object.__setattr__(spec, name, int_tuple(getattr(spec, name), name))


@dataclasses.dataclass(frozen=True)
class Analytic:
    """The infinite-width kernels ``get`` in closed form.

    Attributes:
      get: ``"nngp"``, ``"ntk"`` (one tensor) or a tuple of them (a ``Kernels`` record).
      by_layer: also each module's contribution to the NTK (chains of modules only): the result is
        ``(nngp, [contribution of each module with parameters])``.
    """

    get: str | tuple[str, ...] = KERNEL_NAMES
    by_layer: bool = False
    empirical: ClassVar[bool] = False

    def __post_init__(self):
        names = (self.get,) if isinstance(self.get, str) else tuple(self.get)
        if not names or any(n not in KERNEL_NAMES for n in names):
            raise InputError(f"get must be 'nngp', 'ntk' or a sequence of them, got {self.get!r}.")
        object.__setattr__(self, "get", self.get if isinstance(self.get, str) else names)


@dataclasses.dataclass(frozen=True)
class EmpiricalNTK:
    """The finite-width NTK of the model's current weights (see ``ntbridge.empirical``).

    Attributes:
      implementation: one of :data:`ntbridge.options.IMPLEMENTATIONS`.
      trace_axes, diagonal_axes: output axes averaged over / kept on their diagonal.
      by_layer: a dict of each module's contribution instead of their sum.
      interact: the model's examples interact (BatchNorm using batch statistics).
    """

    implementation: str = "auto"
    trace_axes: tuple[int, ...] = (-1,)
    diagonal_axes: tuple[int, ...] = ()
    by_layer: bool = False
    interact: bool = False
    empirical: ClassVar[bool] = True

    def __post_init__(self):
        if self.implementation not in IMPLEMENTATIONS:
            raise InputError(f"implementation must be one of {IMPLEMENTATIONS}, "
                             f"got {self.implementation!r}.")
        _axes(self)
        object.__setattr__(self, "by_layer", bool(self.by_layer))


@dataclasses.dataclass(frozen=True)
class EmpiricalNNGP:
    """The outputs' products ``f(x1) f(x2)`` of the model's current weights, axes as
    :class:`EmpiricalNTK`."""

    trace_axes: tuple[int, ...] = (-1,)
    diagonal_axes: tuple[int, ...] = ()
    interact: bool = False
    empirical: ClassVar[bool] = True

    def __post_init__(self):
        _axes(self)


@dataclasses.dataclass(frozen=True)
class MonteCarlo:
    """The running moments ``(mean, m2)`` of the empirical kernel ``get`` over the initialisations
    ``start <= s < start + count`` drawn from ``seed`` (see ``ntbridge.empirical.monte_carlo``)."""

    get: str = "ntk"
    seed: int = 0
    start: int = 0
    count: int = 1
    trace_axes: tuple[int, ...] = (-1,)
    diagonal_axes: tuple[int, ...] = ()
    empirical: ClassVar[bool] = True

    def __post_init__(self):
        if self.get not in KERNEL_NAMES:
            raise InputError(f"get must be 'ntk' or 'nngp', got {self.get!r}.")
        try:
            object.__setattr__(self, "seed", operator.index(self.seed))
        except TypeError:
            raise InputTypeError(f"seed must be an int, got {self.seed!r}.") from None
        _axes(self)


Spec = Union[Analytic, EmpiricalNTK, EmpiricalNNGP, MonteCarlo]
