"""The files the ``ntbridge`` command reads and writes: models by import path, state dicts and
input arrays read without unpickling arbitrary objects (``numpy.load(allow_pickle=False)``,
``torch.load(weights_only=True)``), and kernels written as ``.npy`` or ``.pt``. Bad input raises
:class:`BadInput`, whose message says what is wrong and what to do. torch is imported by the
functions that need it, so that the command starts without it.

Example:
    >>> x = load_input("inputs.npy", "--x1")      # a torch tensor
"""

from __future__ import annotations

import importlib
import inspect
import os
import pickle
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

if TYPE_CHECKING:  # annotations only
    import torch
    from torch import nn


_NPY_MAGIC = b"\x93NUMPY"


class BadInput(Exception):
    """An argument of the command is unusable; the message says why and what to do."""


def load_callable(spec: str) -> Callable:
    module_name, sep, attr = spec.partition(":")
    if not (sep and module_name and attr):
        raise BadInput(f"MODEL must be 'package.module:callable', got {spec!r}.")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj = importlib.import_module(module_name)
    except ImportError as e:
        raise BadInput(f"cannot import module {module_name!r} of MODEL {spec!r}: {e}.") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise BadInput(f"module {module_name!r} has no attribute {attr!r} (MODEL {spec!r}).")
        obj = getattr(obj, part)
    if not callable(obj):
        raise BadInput(f"MODEL {spec!r} is not callable.")
    return obj


def module(obj, spec: str) -> nn.Module:
    from torch import nn
    if not isinstance(obj, nn.Module):
        raise BadInput(f"MODEL {spec!r} returned {type(obj).__name__}, not a torch.nn.Module.")
    return obj


def _torch_load(path: str, what: str):
    """``torch.load(weights_only=True)``: tensors and plain containers only, never other objects
    (torch's own warnings about the file are left out: the refusal says what matters)."""
    import torch
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise BadInput(f"refused {what} {path!r}: it contains pickled Python objects other than "
                       f"tensors, and this command never unpickles arbitrary objects. Save plain "
                       f"tensors instead, e.g. torch.save(model.state_dict(), path).") from None
    except (OSError, RuntimeError, EOFError) as e:
        raise BadInput(f"cannot read {what} {path!r}: {e}") from None


def load_weights(model: nn.Module, path: str) -> None:
    import torch
    state = _torch_load(path, "weights file")
    if not (isinstance(state, dict) and all(isinstance(v, torch.Tensor) for v in state.values())):
        raise BadInput(f"weights file {path!r} must hold a state dict (torch.save(model.state_dict(), "
                       f"path)), got {type(state).__name__}.")
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise BadInput(f"weights file {path!r} does not fit the model: {e}") from None


def _npy(path: str, name: str) -> np.ndarray:
    """The array of a ``.npy`` file, read without pickles."""
    try:
        with open(path, "rb") as f:
            magic = f.read(len(_NPY_MAGIC))
    except OSError as e:
        raise BadInput(f"cannot read {name} {path!r}: {e.strerror}.") from None
    if magic != _NPY_MAGIC:
        raise BadInput(f"{name} {path!r} is not a .npy file (it has no numpy header): save "
                       f"arrays with numpy.save(path, array), or pass a .pt tensor.")
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as e:
        if "pickle" in str(e):  # an object array
            raise BadInput(f"{name} {path!r} holds Python objects (an object array), not numbers; "
                           f"this command reads numeric arrays only and never unpickles.") from None
        raise BadInput(f"cannot read {name} {path!r} as a .npy array: {e}") from None
    except (OSError, EOFError) as e:
        raise BadInput(f"cannot read {name} {path!r} as a .npy array: {e}") from None


def load_array(path: str, name: str) -> np.ndarray:
    """A numeric array from ``.npy`` (no pickles) or ``.pt`` (a tensor, ``weights_only``)."""
    suffix = Path(path).suffix
    if suffix == ".npy":
        a = _npy(path, name)
    elif suffix == ".pt":
        import torch
        a = _torch_load(path, name)
        if not isinstance(a, torch.Tensor):
            raise BadInput(f"{name} {path!r} must hold one tensor, got {type(a).__name__}.")
        a = a.detach().cpu().numpy()
    else:
        raise BadInput(f"{name} {path!r}: inputs are .npy or .pt files.")
    if np.issubdtype(a.dtype, np.complexfloating):
        raise BadInput(f"{name} {path!r} holds complex numbers (dtype {a.dtype}); kernels take real "
                       f"inputs: save the real part, or the real and imaginary parts as features.")
    if not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)
            or a.dtype == np.bool_):
        raise BadInput(f"{name} {path!r} is not numeric (dtype {a.dtype}).")
    return a


def load_input(path: str | None, name: str) -> torch.Tensor | None:
    """The inputs in file ``path`` (``--x1``, ``--x2``): a batch ``(N, ...)`` of examples."""
    import torch
    if path is None:
        return None
    a = load_array(path, name)
    if a.ndim < 2:
        raise BadInput(f"{name} {path!r} has shape {a.shape}; inputs are batches of examples, "
                       f"(N, features...): save a single example with shape (1, {a.size}).")
    return torch.from_numpy(a)


def check_output(path: str | None, flag: str, suffixes: tuple[str, ...]) -> None:
    """BadInput, before any work, unless ``path`` (``None``: not asked for) ends in one of
    ``suffixes`` and its directory exists."""
    if path is None:
        return
    if Path(path).suffix not in suffixes:
        raise BadInput(f"{flag} {path!r}: write a {' or '.join(suffixes)} file.")
    if not Path(path).resolve().parent.is_dir():
        raise BadInput(f"{flag} {path!r}: the directory {str(Path(path).parent)!r} does not exist; "
                       f"create it first (mkdir -p).")


def check_factory(factory: Callable, spec: str) -> None:
    """BadInput unless ``factory`` can be called with one width."""
    try:
        inspect.signature(factory).bind(64)
    except TypeError:
        raise BadInput(f"MODEL_FACTORY {spec!r} must take the width, one int (e.g. def "
                       f"make(width): ...); its signature is {inspect.signature(factory)}.") from None
    except ValueError:  # no signature to read (a builtin): the call itself will tell
        pass


def save(k: torch.Tensor, path: str) -> None:
    """Write kernel ``k`` to ``path`` (``.pt`` or ``.npy``, checked by :func:`check_output`)."""
    if Path(path).suffix == ".pt":
        import torch
        torch.save(k.detach().cpu().clone(), path)
    else:
        np.save(path, k.detach().cpu().numpy())


def widths(text: str) -> list[int]:
    try:
        widths = [int(w) for w in text.split(",")]
    except ValueError:
        raise BadInput(f"--widths must be comma-separated ints, got {text!r}.") from None
    if min(widths) < 1:
        raise BadInput(f"--widths must be positive, got {text!r}.")
    return widths
