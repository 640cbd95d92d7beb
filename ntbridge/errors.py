"""The exceptions and warnings that ntbridge raises and that users catch.

Every error says what was wrong (the argument, or the module by its index and qualified name in the
model) and what to do instead.

Example:
    >>> import ntbridge
    >>> try:
    ...     ntbridge.ntk(model, x.long())
    ... except ntbridge.errors.InputError as e:
    ...     print(e)
"""

import functools
import os
import sys
import warnings
from typing import Callable, TypeVar

_Function = TypeVar("_Function", bound=Callable)

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn(warning: Warning) -> None:
    """Issue ``warning`` at the user's line: the first caller outside ntbridge (the stack level
    that Python 3.12's ``skip_file_prefixes`` would give)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(warning, stacklevel=level + 1)


def renamed(**old_to_new: str) -> Callable[[_Function], _Function]:
    """A decorator: the function also takes its arguments' previous keyword names, ``old=new``,
    for one release, with a :class:`DeprecationWarning` at the user's line; both names at once
    raise ``TypeError``.

    Example:
        >>> @renamed(lr="learning_rate")
        ... def step(x, learning_rate=1.0):
        ...     return x * learning_rate
        >>> step(2.0, lr=0.5)          # DeprecationWarning: lr is now learning_rate
        1.0
    """
    def decorate(function: _Function) -> _Function:
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            for old, new in old_to_new.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{function.__name__}() got {old}= and {new}=; {old} is "
                                        f"the previous name of {new}: pass {new} only.")
                    warn(DeprecationWarning(f"{function.__name__}(): {old}= is deprecated and "
                                            f"will be removed in the next release; pass {new}=."))
                    kwargs[new] = kwargs.pop(old)
            return function(*args, **kwargs)
        return wrapper
    return decorate


class NtbridgeError(Exception):
    """Base class of every error ntbridge raises."""


class InputError(NtbridgeError, ValueError):
    """An argument has a bad value: wrong shape, empty batch, unknown option."""


class InputTypeError(InputError, TypeError):
    """An argument has a bad type or dtype (e.g. integer inputs to a kernel function)."""


class ShapeError(InputError):
    """An input's shape does not fit the model (or x1 does not fit x2)."""


class UnsupportedLayerError(NtbridgeError, NotImplementedError):
    """A module has no converter, or no infinite-width kernel rule.

    Attributes:
      supported: for a module without a converter, the torch module types that convert (names).
    """

    def __init__(self, message: str, supported: tuple[str, ...] = ()):
        super().__init__(message)
        self.supported = supported


class GradientError(NtbridgeError, NotImplementedError):
    """A derivative ntbridge does not compute: a kernel differentiates once (no double backward)."""


class DependencyError(NtbridgeError, ImportError):
    """An optional dependency is missing or outside the versions ntbridge is tested with (e.g.
    GPyTorch for ``ntbridge.gpytorch``: ``pip install 'ntbridge[gp]'``)."""


class ConvergenceError(NtbridgeError, RuntimeError):
    """An iterative solver (``ntbridge.predict``'s ``solver="cg"``) did not reach its tolerance
    within its iteration limit.

    Attributes:
      residual: the worst relative residual (or, for matrix functions, the relative change of the
        estimate) reached.
      iterations: the iterations done.
    """

    def __init__(self, message: str, residual: float = float("nan"), iterations: int = 0):
        super().__init__(message)
        self.residual = residual
        self.iterations = iterations


class ConversionError(NtbridgeError):
    """A model could not be translated (e.g. torch.fx could not trace it)."""


class InitMismatchWarning(UserWarning):
    """The model's weights look inconsistent with the init the analytic kernel assumes.

    Attributes:
      modules: per module, where it is and what its weights show (the command line words its own
        advice from them).
    """

    def __init__(self, message: str, modules: tuple[str, ...] = ()):
        super().__init__(message)
        self.modules = modules


class MemoryBudgetError(NtbridgeError, MemoryError):
    """A kernel (or one tile of it) would not fit in memory, or a kernel file (``out=``) on its
    disk; raised before allocating or writing anything."""


class ProcessError(NtbridgeError, RuntimeError):
    """Another process of a ``jax.distributed`` run failed or did not answer in time."""


class CacheWarning(UserWarning):
    """ntbridge's compilation cache directory cannot be written; programs are compiled without it."""


class AccuracyWarning(UserWarning):
    """An approximation is less accurate than asked (e.g. ``ntbridge.features`` with too few
    features for its ``rtol``); the message gives the expected error and how to reach the target."""


class BatchStatisticsWarning(UserWarning):
    """A module normalises with its batch's own statistics (BatchNorm in training mode), so an
    empirical kernel is that of the joint batch ``cat(x1, x2)``: an entry depends on the other
    examples in the call, not on its pair alone. ``model.eval()`` gives the kernel of each pair."""


class LearningRateWarning(UserWarning):
    """A learning rate beyond the stability limit of discrete gradient descent
    (``ntbridge.predict.max_learning_rate``): the steps diverge."""
