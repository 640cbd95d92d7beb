"""``"auto"``'s weighing of a compilation against the work, for models without a converter.

The first empirical NTK of a model that the layer registry does not convert costs a
``torch.export``, its translation, the strategies' lowering and XLA's compilation: tens of seconds
for a small transformer, against well under a second of ``torch.func`` work at tens of examples.
The compiled program is several times faster than ``torch.func`` once it exists, so it pays back
over the calls that follow. The choice is the classic one of renting against buying:

* a call whose shapes have a compiled program runs it, unless its last call there was slower than
  ``torch.func``'s last rate per example predicts (a compiled program is not always the faster);
* else the call's ``torch.func`` time is estimated (:func:`torch_bound`, an upper bound from one
  forward pass; where that does not settle it, :func:`torch_seconds`), and the
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
REVERSE_COST = 4  # one example's Jacobian row (one output unit) in forwards of one example, at most


@dataclasses.dataclass
class Record:
    """What an architecture's calls have cost: ``spent`` (seconds torch-side), ``per_example``
    (the last torch-side call's seconds per example), ``compile_s`` (the last measured first call
    of a program, None before any), ``compiled`` (the shapes with a program) and ``steady`` (per
    shapes, the last call of their compiled program, seconds); ``unavailable``: why no program
    can be made (the model cannot be exported or translated), if so."""

    spent: float = 0.0
    per_example: float | None = None
    compile_s: float | None = None
    compiled: set = dataclasses.field(default_factory=set)
    steady: dict = dataclasses.field(default_factory=dict)
    unavailable: str | None = None


class Choice(NamedTuple):
    """``strategy`` (``"torch.func"`` or ``"xla"``), why in words, the estimates
    (``{"torch.func": {"estimated_s": ...}, "compile": {"estimated_s": ...}}``), and the
    Jacobians of x1's first examples computed on the way (for ``torch_ntk``'s ``known``)."""

    strategy: str
    reason: str
    costs: dict
    known: dict | None = None


_RECORDS: dict[tuple, Record] = {}
_LOCK = threading.Lock()


def _record(model: torch.nn.Module, x1: torch.Tensor) -> Record:
    with _LOCK:
        return _RECORDS.setdefault(cache_key(model, x1), Record())


def _shapes(x1: torch.Tensor, x2: torch.Tensor | None, axes: Axes) -> tuple:
    return len(x1), None if x2 is None else len(x2), axes


def torch_bound(model: torch.nn.Module, x1: torch.Tensor, x2: torch.Tensor | None) -> float:
    """An upper bound of :func:`~.torch_func.torch_ntk`'s time that costs one forward pass: the
    forward of one example, timed, :data:`REVERSE_COST` times per output unit and example (``vmap``
    over many examples only costs less per example), and the contraction's flops."""
    with torch.no_grad():
        start = time.perf_counter()
        units = model(x1[:1])[0].numel()
        one = time.perf_counter() - start
    size = units * sum(p.numel() for p in model.parameters())  # one example's Jacobian
    n2 = len(x1) if x2 is None else len(x2)
    return REVERSE_COST * one * units * _examples(x1, x2) + 2 * len(x1) * n2 * size / FLOPS_PER_S


def torch_seconds(model: torch.nn.Module, x1: torch.Tensor, x2: torch.Tensor | None,
                  probe: int = 8) -> tuple[float, dict]:
    """The estimated time of :func:`~.torch_func.torch_ntk` on these inputs, and the Jacobians of
    x1's first examples it computed (which ``torch_ntk`` takes as ``known``, so nothing is
    computed twice): one example's (which warms ``torch.func`` up), then those of the next
    ``probe`` examples at most, timed and scaled to the examples left (an upper bound: ``vmap``
    over more examples is cheaper per example), and the contraction's flops at
    :data:`FLOPS_PER_S`."""
    jac = jacobian_fn(model)
    n2, examples = len(x1) if x2 is None else len(x2), _examples(x1, x2)
    with torch.no_grad():
        start = time.perf_counter()
        known = jac(x1[:1])
        seconds = time.perf_counter() - start  # one example, with the warm-up: all there is
        if len(x1) > 1:
            start, block = time.perf_counter(), x1[1:1 + probe]
            more = jac(block)
            seconds = (time.perf_counter() - start) / len(block)
            known = {name: torch.cat([a, more[name]]) for name, a in known.items()}
    done = len(next(iter(known.values())))
    size = sum(a[0].numel() for a in known.values())  # one example's Jacobian: out x parameters
    return seconds * (examples - done) + 2 * len(x1) * n2 * size / FLOPS_PER_S, known


def _examples(x1: torch.Tensor, x2: torch.Tensor | None) -> int:
    return len(x1) + (0 if x2 is None else len(x2))


def _compiled(record: Record, x1: torch.Tensor, x2: torch.Tensor | None,
              shapes: tuple) -> Choice | None:
    """The choice for shapes with a compiled program: the program, unless its last call was
    slower than the last torch-side call's rate predicts for these examples (then None)."""
    steady, rate = record.steady.get(shapes), record.per_example
    if steady is not None and rate is not None and steady > rate * _examples(x1, x2):
        return None
    return Choice("xla", "the program of these shapes is compiled (an earlier call)", {})


def weigh(model: torch.nn.Module, x1: torch.Tensor, x2: torch.Tensor | None,
          axes: Axes) -> Choice:
    """Torch-side or a compiled program for this call (see the module doc)."""
    record, shapes = _record(model, x1), _shapes(x1, x2, axes)
    if shapes in record.compiled:
        if choice := _compiled(record, x1, x2, shapes):
            return choice
        work, known = torch_seconds(model, x1, x2)
        return Choice("torch.func", f"the compiled program's last call took "
                                    f"{record.steady[shapes]:.3g} s, torch.func needs about "
                                    f"{work:.3g} s", {"torch.func": {"estimated_s": work}}, known)
    if record.unavailable:
        work, known = torch_seconds(model, x1, x2)
        return Choice("torch.func", f"no compiled program: {record.unavailable}",
                      {"torch.func": {"estimated_s": work}}, known)
    compile_s = record.compile_s
    if compile_s is None:
        compile_s = SECONDS_PER_TENSOR * sum(1 for _ in model.parameters())
    work, known = torch_bound(model, x1, x2), None
    if record.spent + work >= compile_s:  # the bound is not enough: a closer estimate
        work, known = torch_seconds(model, x1, x2)
    costs = {"torch.func": {"estimated_s": work}, "compile": {"estimated_s": compile_s}}
    so_far = f" ({record.spent:.3g} s in earlier calls)" if record.spent else ""
    if record.spent + work < compile_s:
        return Choice("torch.func", f"compiling (about {compile_s:.3g} s) cannot pay back here: "
                                    f"torch.func needs about {work:.3g} s{so_far}", costs, known)
    return Choice("xla", f"compiling (about {compile_s:.3g} s) pays back: torch.func would need "
                         f"about {work:.3g} s{so_far}", costs)


def ran(model: torch.nn.Module, x1: torch.Tensor, x2: torch.Tensor | None, axes: Axes,
        strategy: str, seconds: float) -> None:
    """Record a call's measured time: torch-side time adds to ``spent`` and sets ``per_example``;
    a program's first call sets ``compile_s`` and marks its shapes compiled, a later one sets
    their ``steady`` time."""
    record, shapes = _record(model, x1), _shapes(x1, x2, axes)
    with _LOCK:
        if strategy == "torch.func":
            record.spent += seconds
            record.per_example = seconds / _examples(x1, x2)
        elif shapes in record.compiled:
            record.steady[shapes] = seconds
        else:
            record.compile_s = seconds
            record.compiled.add(shapes)


def unavailable(model: torch.nn.Module, x1: torch.Tensor, why: str) -> None:
    """Record that no program can be made for this architecture (``why``): torch-side from now."""
    _record(model, x1).unavailable = why


def clear() -> None:
    """Forget every record (tests; a new process starts afresh)."""
    with _LOCK:
        _RECORDS.clear()

