"""What a layer computes, as a hashable value: the key of its compiled programs.

A :class:`~ntbridge.stax.layers.Layer` is closures over the values its constructor was given (and
over the layers it nests); :func:`describe` reads them all, so every attribute a rule reads is part
of the description without any list of attributes to keep up to date. A function is described by
its code (bytecode, constants, the names it reads) with the values it closes over and its
defaults; a module-level function or class of ntbridge, JAX, NumPy or the standard library by its
qualified name; arrays and tensors by their shape, dtype and a hash of their bytes; tuples, lists,
dicts, named tuples and dataclasses entry by entry.

What cannot be described by value (an ``nn.Module``, a user's function, whose globals may change
between processes) is described by identity, as :class:`ByIdentity`: programs of such a layer are
shared by the objects that built them alone, in this process, and are named on disk by their
lowered text (:mod:`ntbridge.programs`).

``hyper=False`` describes a network without the values of its layers' declared hyper-parameters
(``Layer.hyper``), which the analytic programs take as arguments, and without its ``init_fn``,
which they never call.

Example:
    >>> describe(Dense(3, 8, W_std=1.0, b_std=None)) == describe(Dense(3, 8, W_std=1.0, b_std=None))
    True
    >>> describe(LeakyRelu(0.1)) == describe(LeakyRelu(0.2))
    False
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import sys
import types
from typing import Any, Hashable

import numpy as np

from .layers import Layer

_PLAIN = (str, bytes, int, float, complex, type(None))  # bool is an int
_REPR = (range, slice, type(Ellipsis))
_EMPTY = "<empty cell>"
_NAMED = ("ntbridge", "jax", "jaxlib", "numpy", "math", "operator", "builtins", "functools",
          "torch", "typing")  # libraries whose module-level names say what they are


class ByIdentity:
    """An object that cannot be described by value: equal to itself only (module doc)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any):
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ByIdentity) and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __repr__(self) -> str:
        return f"ByIdentity({type(self.obj).__qualname__} at {id(self.obj):#x})"


def _named(obj: Any) -> str | None:
    """``name:module:qualname`` for a module-level object of a library in ``_NAMED``."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not (isinstance(module, str) and isinstance(qualname, str)
            and module.split(".")[0] in _NAMED and module in sys.modules):
        return None
    found: Any = sys.modules[module]
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return f"name:{module}:{qualname}" if found is obj else None


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _array(a: Any) -> str:
    a = np.ascontiguousarray(a)
    return _digest("array", repr(a.shape), str(a.dtype), hashlib.sha256(a.tobytes()).hexdigest())


class _Walk:
    """One description: each object's a hash of its parts' (a Merkle hash: shared sub-objects and
    cycles are described once); objects known by identity are listed and named by position."""

    def __init__(self, hyper: bool):
        self.hyper = hyper
        self.memo: dict[int, str] = {}
        self.keep: list = []  # the objects memoised: alive while their ids are
        self.hidden: set[int] = set()  # ids of hyper-parameter values described by keys only
        self.identities: list[ByIdentity] = []

    def __call__(self, value: Any) -> str:
        if isinstance(value, _PLAIN) or isinstance(value, _REPR):
            return f"{type(value).__name__}:{value!r}"
        key = id(value)
        if key in self.memo:
            return self.memo[key]
        self.memo[key] = f"cycle:{type(value).__qualname__}"
        self.keep.append(value)
        self.memo[key] = out = self._describe(value)
        return out

    def _all(self, tag: str, values) -> str:
        return _digest(tag, *(self(v) for v in values))

    def _describe(self, value: Any) -> str:
        if id(value) in self.hidden:
            return _digest("hyper", repr(_keys(value)))
        if isinstance(value, Layer):
            return self._layer(value)
        if isinstance(value, np.dtype):
            return f"dtype:{value}"
        if isinstance(value, (np.ndarray, np.generic)) or type(value).__module__.startswith(
                ("jax", "jaxlib")) and hasattr(value, "__array__"):
            return _array(value)
        if type(value).__module__.startswith("torch") and hasattr(value, "detach"):
            return _array(value.detach().cpu().numpy())
        if isinstance(value, enum.Enum):
            return _digest("enum", type(value).__qualname__, value.name)
        if isinstance(value, (tuple, list)):
            return self._all(type(value).__qualname__, value)
        if isinstance(value, (set, frozenset)):
            return _digest("set", *sorted(self(v) for v in value))
        if isinstance(value, dict):
            return self._all("dict", [i for item in value.items() for i in item])
        if (named := _named(value)) is not None:
            return named
        if isinstance(value, functools.partial):
            return self._all("partial", (value.func, value.args, value.keywords))
        if isinstance(value, types.MethodType):
            return self._all("method", (value.__func__, value.__self__))
        if isinstance(value, types.FunctionType):
            return self._function(value)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return self._all(type(value).__qualname__, [
                i for f in dataclasses.fields(value) for i in (f.name, getattr(value, f.name))])
        return self._identity(value)

    def _identity(self, obj: Any) -> str:
        self.identities.append(ByIdentity(obj))
        return f"identity:{len(self.identities) - 1}"

    def _layer(self, layer: Layer) -> str:
        if not self.hyper:
            self.hidden.update(_ids(layer.hyper))
        names = [name for name in layer._fields if self.hyper or name != "init_fn"]
        return self._all("Layer", [i for name in names for i in (name, getattr(layer, name))])

    def _function(self, fn: types.FunctionType) -> str:
        module = fn.__module__ or ""
        if module.split(".")[0] in _NAMED:
            code = _code(fn.__code__)
        else:  # a user's function: its globals are not known here
            if id(fn.__code__) not in self.memo:
                self.memo[id(fn.__code__)] = self._identity(fn.__code__)
                self.keep.append(fn.__code__)
            code = self.memo[id(fn.__code__)]
        cells = [c.cell_contents if _filled(c) else _EMPTY for c in fn.__closure__ or ()]
        return _digest("function", code, self._all("cells", cells), self(fn.__defaults__),
                       self(fn.__kwdefaults__))


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _ids(hyper: Any) -> list[int]:
    """The ids of a layer's hyper-parameter dicts (a network's: one per layer, nested)."""
    return [id(hyper)] if isinstance(hyper, dict) else [i for h in hyper for i in _ids(h)]


def _keys(hyper: Any) -> Hashable:
    """The structure of a layer's hyper-parameters, without their values."""
    if isinstance(hyper, dict):
        return tuple(sorted(hyper))
    return tuple(_keys(h) for h in hyper)


def _code(code: types.CodeType) -> str:
    """A code object by value: where it is, its bytecode, constants and the names it reads."""
    consts = [_code(c) if isinstance(c, types.CodeType) else _constant(c) for c in code.co_consts]
    return _digest(code.co_qualname, str(code.co_firstlineno), code.co_code.hex(), *consts,
                   repr(code.co_names), repr(code.co_freevars))


def _constant(c: Any) -> str:
    """A constant of compiled code as text alike in every process (sets sorted)."""
    if isinstance(c, frozenset):
        return f"frozenset({sorted(map(_constant, c))})"
    if isinstance(c, tuple):
        return f"({', '.join(map(_constant, c))},)"
    return repr(c)


def describe(value: Any, hyper: bool = True) -> tuple[str, tuple[ByIdentity, ...]]:
    """The description of ``value`` (a layer, or anything a layer is built from): a hash equal for
    two values that compute alike, different when any value they read differs, and the objects
    it names by identity (module doc). ``hyper=False``: without the values of declared
    hyper-parameters and without ``init_fn``."""
    walk = _Walk(hyper)
    return walk(value), tuple(walk.identities)
