"""``"auto"``'s weighing of a compilation against the work, for models without a converter.

The first empirical NTK of a model that the layer registry does not convert costs a
``torch.export``, its translation, the strategies' lowering and XLA's compilation: tens of seconds
for a small transformer, against well under a second of ``torch.func`` work at tens of examples.
The compiled program is several times faster than ``torch.func`` once it exists, so it pays back
over the calls that follow. The choice is the classic one of renting against buying:

* a call whose shapes have a compiled program runs it;
* else the call's ``torch.func`` time is estimated (:func:`torch_seconds`), and the
  compilation's (that of this architecture's last first call, measured; before any,
  :data:`SECONDS_PER_TENSOR` per parameter tensor); the call runs torch-side (:mod:`.torch_func`) while the ``torch.func`` time of this
  architecture's calls so far, this one included, stays below the compilation's, and compiles
  once it would not (so no sequence of calls spends more than about twice what the better of
  the two would have).

Records are per model object (weakly referenced), inputs' shape per example and dtype, and
parameters' names, shapes and dtypes, as the translation's cache; a new process starts afresh.

Example:
    >>> choice = weigh(model, x1, x2, axes)
    >>> choice.strategy, choice.reason
    ('torch.func', 'compiling (about 12.3 s) cannot pay back here: torch.func needs about 0.41 s')
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import NamedTuple

import torch

from ..converters.export.translator import cache_key
from .axes import Axes
from .torch_func import jacobian_fn

SECONDS_PER_TENSOR = 0.3  # a first call's compile per parameter tensor (2 CPU cores, measured)
FLOPS_PER_S = 1e10  # the contraction's rate torch-side


@dataclasses.dataclass
class Record:
    """What an architecture's calls have cost: ``spent`` (seconds torch-side), ``compile_s`` (the
    last measured first call of a program, None before any) and ``compiled`` (the shapes with a
    program)."""

    spent: float = 0.0
    compile_s: float | None = None
    compiled: set = dataclasses.field(default_factory=set)


class Choice(NamedTuple):
    """``strategy`` (``"torch.func"`` or ``"xla"``), why in words, and the estimates
    (``{"torch.func": {"estimated_s": ...}, "compile": {"estimated_s": ...}}``)."""

    strategy: str
    reason: str
    costs: dict


_RECORDS: dict[tuple, Record] = {}
_LOCK = threading.Lock()


def _record(model: torch.nn.Module, x1: torch.Tensor) -> Record:
    with _LOCK:
        return _RECORDS.setdefault(cache_key(model, x1), Record())


def _shapes(x1: torch.Tensor, x2: torch.Tensor | None, axes: Axes) -> tuple:
    return len(x1), None if x2 is None else len(x2), axes


def torch_seconds(model: torch.nn.Module, x1: torch.Tensor, x2: torch.Tensor | None,
                  probe: int = 1) -> float:
    """The estimated time of :func:`~.torch_func.torch_ntk` on these inputs: the Jacobians of
    ``probe`` examples timed (after one example's, which warms ``torch.func`` up), scaled to every
    example (an upper bound: ``vmap`` over more examples is cheaper per example), and the
    contraction's flops at :data:`FLOPS_PER_S`."""
    jac, block = jacobian_fn(model), x1[:probe]
    with torch.no_grad():
        jac(x1[:1])
        start = time.perf_counter()
        j = jac(block)
        seconds = (time.perf_counter() - start) / len(block)
    size = sum(a[0].numel() for a in j.values())  # one example's Jacobian: out units x parameters
    n2 = len(x1) if x2 is None else len(x2)
    examples = len(x1) + (0 if x2 is None else n2)
    return seconds * examples + 2 * len(x1) * n2 * size / FLOPS_PER_S


def weigh(model: torch.nn.Module, x1: torch.Tensor, x2: torch.Tensor | None,
          axes: Axes) -> Choice:
    """Torch-side or a compiled program for this call (see the module doc)."""
    record = _record(model, x1)
    if _shapes(x1, x2, axes) in record.compiled:
        return Choice("xla", "the program of these shapes is compiled (an earlier call)", {})
    compile_s = record.compile_s
    if compile_s is None:
        compile_s = SECONDS_PER_TENSOR * sum(1 for _ in model.parameters())
    work = torch_seconds(model, x1, x2)
    costs = {"torch.func": {"estimated_s": work}, "compile": {"estimated_s": compile_s}}
    so_far = f" ({record.spent:.3g} s in earlier calls)" if record.spent else ""
    if record.spent + work < compile_s:
        return Choice("torch.func", f"compiling (about {compile_s:.3g} s) cannot pay back here: "
                                    f"torch.func needs about {work:.3g} s{so_far}", costs)
    return Choice("xla", f"compiling (about {compile_s:.3g} s) pays back: torch.func would need "
                         f"about {work:.3g} s{so_far}", costs)


def ran(model: torch.nn.Module, x1: torch.Tensor, x2: torch.Tensor | None, axes: Axes,
        strategy: str, seconds: float) -> None:
    """Record a call's measured time: torch-side time adds to ``spent``; a program's first call
    sets ``compile_s`` and marks its shapes compiled."""
    record, shapes = _record(model, x1), _shapes(x1, x2, axes)
    with _LOCK:
        if strategy == "torch.func":
            record.spent += seconds
        elif shapes not in record.compiled:
            record.compile_s = seconds
            record.compiled.add(shapes)


def clear() -> None:
    """Forget every record (tests; a new process starts afresh)."""
    with _LOCK:
        _RECORDS.clear()

