"""The one cache of ntbridge's compiled programs, and of what tracing them derives.

Every entry is keyed by a :class:`ProgramKey` derived from what determines the program (the
architecture and options of the computation, the shapes and dtypes of its arguments, JAX's x64
mode, the devices), never by the identity of a function object; so a float32 program is never
reused for float64 inputs, and a fresh model object of the same architecture reuses the programs of
the first.

Compiled programs also outlive the process: :func:`compile` keeps each executable XLA builds in a
directory (by default ``$XDG_CACHE_HOME/ntbridge`` or ``~/.cache/ntbridge``; on macOS
``~/Library/Caches/ntbridge``; on Windows ``%LOCALAPPDATA%\\ntbridge``), under a hash of the
program's key, ntbridge's source, the compiler options, the JAX version and the devices. A later
process that needs the same program loads it instead of tracing, lowering and compiling it. A key
that names something by identity (a user's module or function, whose repr may not say what it
computes) cannot name it in another process: such programs are stored under a hash of the lowered
program and its arguments' tree structure instead (so they are lowered, but not compiled,
again). ``NTBRIDGE_CACHE_DIR=path`` moves the directory; ``NTBRIDGE_CACHE_DIR=off`` turns the disk
cache off. Only ntbridge's own programs go there: JAX's configuration (including its own
compilation cache) is not touched.

Entries are written to a temporary file and renamed into place, so concurrent processes sharing the
directory never read a partial entry; an entry that cannot be read is ignored and rewritten; a
directory that cannot be written warns once (:class:`~ntbridge.errors.CacheWarning`) and the
programs are compiled as if there were no cache; a program that cannot be serialized is not kept.
Nothing about the cache ever fails a call. Entries are executables: keep the directory as
private as your home directory (the default is).

Example:
    >>> key = ProgramKey.of("tiles", ("analytic", graph.signature), (x1, x2))
    >>> fn = cached(key, lambda: compile(key, lambda: jax.jit(f).lower(x1, x2), devices))
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import functools
import gc
import hashlib
import os
import pickle
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Hashable, Sequence, TypeVar

import jax
import numpy as np

from .compat import distributed_client, initialize_lapack
from .devices import compiler_options, reject_options
from .errors import CacheWarning, warn

T = TypeVar("T")
MAX_ENTRIES = 256  # in memory, least recently used dropped first


def _x64() -> bool:
    """Whether JAX's x64 mode is on here (globally or in this thread's ``jax.enable_x64``)."""
    return jax.dtypes.canonicalize_dtype(np.float64) == np.float64


@dataclasses.dataclass(frozen=True)
class ProgramKey:
    """What determines a cached program (or a value derived by tracing one).

    Attributes:
      purpose: what is cached ("tiles", "strategy", "output shape", ...).
      computation: the architecture and options that fix the function (hashable).
      arguments: the tree structure and ``(shape, dtype)`` of every argument leaf.
      x64: JAX's x64 mode when the key was made.
      devices: ``(platform, id)`` of the devices the program runs on.
    """

    purpose: str
    computation: Hashable
    arguments: tuple
    x64: bool
    devices: tuple

    @classmethod
    def of(cls, purpose: str, computation: Hashable, arguments: Any,
           devices: Sequence = ()) -> "ProgramKey":
        """The key of ``purpose`` for ``computation`` applied to ``arguments`` (a pytree of arrays
        or ``jax.ShapeDtypeStruct``s), on ``devices``."""
        leaves, tree = jax.tree.flatten(arguments)
        spec = tuple((tuple(a.shape), str(a.dtype)) for a in leaves)
        return cls(purpose, computation, (tree, spec), _x64(),
                   tuple((d.platform, d.id) for d in devices))


_ENTRIES: collections.OrderedDict[ProgramKey, Any] = collections.OrderedDict()
_LOCK = threading.RLock()  # threads share the cache: each entry is built once


def cached(key: ProgramKey, build: Callable[[], T]) -> T:
    """The entry under ``key``, built by ``build()`` on first use (LRU-bounded, thread-safe)."""
    with _LOCK:
        if key in _ENTRIES:
            _ENTRIES.move_to_end(key)
        else:
            _ENTRIES[key] = build()
            if len(_ENTRIES) > MAX_ENTRIES:
                _ENTRIES.popitem(last=False)
        return _ENTRIES[key]


def get(key: ProgramKey) -> Any | None:
    """The entry under ``key`` if there is one (nothing is built)."""
    with _LOCK:
        return _ENTRIES.get(key)


def entries(purpose: str) -> list[tuple[ProgramKey, Any]]:
    """The entries whose key is for ``purpose``, as ``(key, entry)`` pairs (a snapshot)."""
    with _LOCK:
        return [(key, entry) for key, entry in _ENTRIES.items() if key.purpose == purpose]


def clear() -> None:
    """Forget every in-memory entry (the disk cache stays)."""
    with _LOCK:
        _ENTRIES.clear()


@atexit.register
def _release() -> None:
    """At exit, free the compiled programs (ntbridge's and JAX's caches) and, outside a
    ``jax.distributed`` job (whose own exit hook shuts it down), JAX's backends, while XLA is still
    up: left to the interpreter's teardown, an executable or a client freed after XLA's CPU runtime
    can abort the process ("terminate called without an active exception", exit status 134)."""
    clear()
    if distributed_client() is None:
        from jax.extend import backend

        backend.clear_backends()  # JAX's caches with them
    else:
        jax.clear_caches()
    gc.collect()


# ---- the disk cache ----

def cache_dir() -> Path | None:
    """The directory of the disk cache, or None when it is off (see the module doc)."""
    env = os.environ.get("NTBRIDGE_CACHE_DIR")
    if env is not None:
        return None if env.strip().lower() in ("", "0", "off", "none") else Path(env)
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local"))
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "ntbridge"


_WARNED: set[str] = set()


def _warn_once(directory: Path, error: Exception) -> None:
    if str(directory) not in _WARNED:
        _WARNED.add(str(directory))
        warn(CacheWarning(f"ntbridge cannot write its compilation cache in {directory} ({error}); "
                          f"programs are compiled without it. Set NTBRIDGE_CACHE_DIR to a writable "
                          f"directory, or NTBRIDGE_CACHE_DIR=off."))


_PLAIN = (str, bytes, int, float, complex, type(None))  # bool is an int


def _text(value: Any) -> str | None:
    """``value`` as text that names it alike in every process: plain values (strings, numbers,
    None) in tuples, lists, sets and tree structures; None for anything else (see the module
    doc)."""
    if isinstance(value, (*_PLAIN, jax.tree_util.PyTreeDef)):
        return repr(value)
    if isinstance(value, (tuple, list, set, frozenset)):
        parts = [_text(v) for v in value]
        if None in parts:
            return None
        ordered = sorted(parts) if isinstance(value, (set, frozenset)) else parts
        return f"{type(value).__name__}({', '.join(ordered)})"
    return None


@functools.cache
def _source_digest() -> str:
    """A hash of ntbridge's source files: an entry named by its key holds the program the code
    that stored it traced."""
    root = Path(__file__).parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _entry_path(name: str, options: dict, devices: Sequence) -> Path | None:
    directory = cache_dir()
    if directory is None:
        return None
    h = hashlib.sha256()
    for part in (name, _source_digest(), sorted(options.items()), jax.__version__,
                 jax.lib.__version__ if hasattr(jax.lib, "__version__") else "",
                 [(d.platform, d.device_kind, d.id) for d in devices],
                 devices[0].client.platform_version):
        h.update(repr(part).encode())
    return directory / f"v3-{h.hexdigest()}.xla"


def _calls_lapack(compiled: jax.stages.Compiled) -> bool:
    """Whether the program calls LAPACK's kernels (a linear-algebra op's custom call)."""
    return 'custom_call_target="lapack_' in compiled.as_text()


def _load(path: Path, devices: Sequence):
    from jax.experimental import serialize_executable

    try:
        payload, in_tree, out_tree, lapack = pickle.loads(path.read_bytes())
        # JAX loads LAPACK's kernels when it lowers a linear-algebra op: a program from disk that
        # calls them would crash a process that lowered none. Loading them imports SciPy's linear
        # algebra (0.2 s), so only such programs do.
        if lapack:
            initialize_lapack()
        return serialize_executable.deserialize_and_load(payload, in_tree, out_tree,
                                                         execution_devices=list(devices))
    except FileNotFoundError:
        return None
    except Exception:  # a corrupt or foreign entry: compile again and rewrite it
        return None


def _store(path: Path, compiled) -> None:
    """``compiled`` kept in the disk cache at ``path``, if it can be: storing never fails the call
    that compiled the program. A program XLA cannot serialize is not kept (warned about once per
    kind of failure, unless it is one of pickle's); a directory that cannot be written warns once
    (:class:`~ntbridge.errors.CacheWarning`)."""
    from jax.experimental import serialize_executable
    try:
        blob = pickle.dumps((*serialize_executable.serialize(compiled), _calls_lapack(compiled)))
    except (ValueError, TypeError, pickle.PicklingError):  # a program XLA cannot serialize
        return
    except Exception as e:  # XLA's own runtime errors, or no memory for the entry
        if type(e).__name__ not in _WARNED:
            _WARNED.add(type(e).__name__)
            warn(CacheWarning(f"ntbridge cannot keep a compiled program in its compilation cache "
                              f"({type(e).__name__}: {e}); it is compiled again by a later "
                              f"process."))
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".xla")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            os.replace(tmp, path)  # atomic: readers see the whole entry or none
        except BaseException:
            os.unlink(tmp)
            raise
    except Exception as e:  # unwritable or full, mostly (OSError)
        _warn_once(path.parent, e)


def compile(key: ProgramKey, lower: Callable[[], jax.stages.Lowered],
            devices: Sequence, kind: str = "default") -> jax.stages.Compiled:
    """The program ``key`` for ``devices``: loaded from the disk cache when an earlier process
    compiled it, else ``lower()`` compiled with ntbridge's compiler options for programs of
    ``kind`` (:func:`ntbridge.devices.compiler_options`) and stored. A key that names
    its program by value finds the entry without lowering it (see the module doc)."""
    platform = devices[0].platform
    options = compiler_options(platform, kind)
    name, lowered = _text((key.purpose, key.computation, key.arguments, key.x64, key.devices)), None
    if name is None:  # the key holds an object known by identity: the program's text names it,
        lowered = lower()  # with its arguments' tree (an unused argument leaves no trace in it)
        name = f"{key.arguments!r}\n{lowered.as_text()}"
    path = _entry_path(name, options, devices)
    compiled = None if path is None else _load(path, devices)
    if compiled is not None:
        return compiled
    if lowered is None:
        lowered = lower()
    try:
        compiled = lowered.compile(compiler_options=options or None)
    except RuntimeError:
        if not options:
            raise
        compiled = lowered.compile()  # raises if the program itself is at fault
        reject_options(platform)  # an XLA without these (experimental) options
        path = _entry_path(name, {}, devices)
    if path is not None:
        _store(path, compiled)
    return compiled
