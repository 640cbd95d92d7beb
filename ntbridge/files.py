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
import os
import pickle
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

if TYPE_CHECKING:  # annotations only
    import torch
    from torch import nn


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
    """``torch.load(weights_only=True)``: tensors and plain containers only, never other objects."""
    import torch
    try:
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


def load_array(path: str, name: str) -> np.ndarray:
    """A numeric array from ``.npy`` (no pickles) or ``.pt`` (a tensor, ``weights_only``)."""
    suffix = Path(path).suffix
    if suffix == ".npy":
        try:
            a = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as e:
            raise BadInput(f"cannot read {name} {path!r} as a .npy array without pickles: {e}") from None
    elif suffix == ".pt":
        import torch
        a = _torch_load(path, name)
        if not isinstance(a, torch.Tensor):
            raise BadInput(f"{name} {path!r} must hold one tensor, got {type(a).__name__}.")
        a = a.detach().cpu().numpy()
    else:
        raise BadInput(f"{name} {path!r}: inputs are .npy or .pt files.")
    if not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)
            or a.dtype == np.bool_):
        raise BadInput(f"{name} {path!r} is not numeric (dtype {a.dtype}).")
    return a


def load_input(path: str | None, name: str) -> torch.Tensor | None:
    import torch
    return None if path is None else torch.from_numpy(load_array(path, name))


def save(k: torch.Tensor, path: str) -> None:
    if Path(path).suffix == ".pt":
        import torch
        torch.save(k.detach().cpu().clone(), path)
    elif Path(path).suffix == ".npy":
        np.save(path, k.detach().cpu().numpy())
    else:
        raise BadInput(f"--out {path!r}: write a .npy or .pt file.")


def widths(text: str) -> list[int]:
    try:
        widths = [int(w) for w in text.split(",")]
    except ValueError:
        raise BadInput(f"--widths must be comma-separated ints, got {text!r}.") from None
    if min(widths) < 1:
        raise BadInput(f"--widths must be positive, got {text!r}.")
    return widths
