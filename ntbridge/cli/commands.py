"""The ``ntbridge`` command's subcommands (see :mod:`ntbridge.cli`); each returns its exit status."""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # annotations only: the subcommands that compute import torch themselves
    import torch
    from torch import nn

from ..errors import InitMismatchWarning
from . import files
from .files import BadInput

BAD_INPUT = 2
PLOT_SUFFIXES = (".png", ".pdf", ".svg")

_IMPORTED = time.perf_counter()  # before torch and JAX: the subcommands import them


def since_start() -> float:
    """Seconds since this process started, the interpreter's start-up and every import included:
    from the operating system's record of the process where it keeps one (``/proc``), else from
    the import of this module (before torch and JAX are imported)."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            started = int(stat.read().rpartition(")")[2].split()[19]) / os.sysconf("SC_CLK_TCK")
            return max(float(uptime.read().split()[0]) - started, 0.0)
    except (OSError, ValueError, IndexError, AttributeError):
        return time.perf_counter() - _IMPORTED



def _mlp(width: int, d_in: int = 16) -> nn.Sequential:
    from torch import nn
    return nn.Sequential(nn.Linear(d_in, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, 1))


def _matrix(name: str, k: torch.Tensor) -> str:
    rows = "\n".join("  " + " ".join(f"{v:8.4f}" for v in row) for row in k.tolist())
    return f"{name} {tuple(k.shape)}:\n{rows}"


def _print_json(data: dict) -> None:
    print(json.dumps(data, indent=2))


def _write_plot(sweep, path: str) -> str | None:
    try:
        return sweep.plot(path)
    except ImportError as e:
        print(f"(no plot: {e})", file=sys.stderr)
        return None


def demo(args) -> int:
    import torch

    from .. import analysis, api

    widths = files.widths(args.widths)
    files.check_output(args.plot, "--plot", PLOT_SUFFIXES)
    x = torch.randn(args.n, 16, generator=torch.Generator().manual_seed(0))
    k = api.kernel(_mlp(widths[0]), x, parameterization="ntk")
    sweep = analysis.width_sweep(_mlp, widths, x, n_seeds=args.seeds,
                                 implementation="structured")
    plot = _write_plot(sweep, args.plot)
    if args.json:
        _print_json({"nngp": k.nngp.tolist(), "ntk_parameterization_ntk": k.ntk.tolist(),
                     "sweep": sweep.to_dict(), "plot": plot})
        return 0
    print(f"ntbridge demo: MLP 16 -> [width, ReLU] x 2 -> 1 on {args.n} fixed Gaussian inputs.\n")
    print(_matrix("Analytic NNGP", k.nngp))
    print(_matrix("Analytic NTK, NTK parameterization (width-independent)", k.ntk))
    print("\nFreshly initialised torch models vs their infinite-width kernels "
          "(standard parameterization):\n")
    print(sweep)
    print("\nThe errors fall towards width**-0.5 (finite-width fluctuations); deeper networks reach "
          "that regime at larger widths.")
    if plot:
        print(f"Plot written to {plot}")
    print(f"Total {since_start():.1f} s since the command started (imports included).")
    return 0


def _analytic_options(args) -> dict:
    """The analytic kernel's options from ``--init``, ``--W-std``, ``--b-std``, checked against
    ``--get`` and ``--weights``."""
    init = {"init": args.init, "W_std": args.W_std, "b_std": args.b_std}
    given = [f"--{k.replace('_', '-')}" for k, v in init.items() if v not in (None, "torch")]
    if args.get == "empirical":
        if given:
            raise BadInput(f"{', '.join(given)} choose the init the analytic kernels assume; the "
                           f"empirical kernel (--get empirical) uses the weights themselves.")
        return {}
    if args.weights and args.init != "infer":
        raise BadInput("--weights sets the weights of the empirical kernel (--get empirical); the "
                       "analytic kernel reads them only with --init infer (their variances). Add "
                       "--init infer, or drop --weights.")
    return {"parameterization": args.parameterization, **init}


def _warn(command: str, caught: list) -> None:
    """Print the warnings of a computation on stderr, InitMismatchWarning in the command's words."""
    for w in caught:
        message = w.message
        if isinstance(message, InitMismatchWarning):
            print(f"ntbridge {command}: warning: the analytic kernel assumes torch's default init "
                  f"(--init torch), but {'; '.join(message.modules)}. Pass --init infer (with "
                  f"--weights) to use the variances of those weights, or --W-std/--b-std to "
                  f"state them.", file=sys.stderr)
        else:
            print(f"ntbridge {command}: warning: {message}", file=sys.stderr)


def kernel(args) -> int:
    from .. import api

    files.check_output(args.out, "--out", (".npy", ".pt"))
    options = _analytic_options(args)
    model = files.module(files.load_callable(args.model)(), args.model)
    if args.weights:
        files.load_weights(model, args.weights)
    x1, x2 = files.load_input(args.x1, "--x1"), files.load_input(args.x2, "--x2")
    if x1.is_floating_point():
        model = model.to(x1.dtype)
    batching = {"batch_size": args.batch_size, "progress": args.progress or None}
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if args.get == "empirical":
            k = api.empirical_ntk(model, x1, x2, **batching)
        else:
            k = api.kernel(model, x1, x2, args.get, **options, **batching)
    _warn("kernel", caught)
    seconds = time.perf_counter() - start
    files.save(k, args.out)
    info = {"get": args.get, "shape": list(k.shape), "dtype": str(k.dtype).removeprefix("torch."),
            "out": args.out, "seconds": seconds, "total_seconds": since_start()}
    if args.json:
        _print_json(info)
    else:
        print(f"{args.get} kernel {tuple(k.shape)} {info['dtype']} written to {args.out} "
              f"(the kernel {seconds:.2f} s; {info['total_seconds']:.1f} s since the command "
              f"started, imports and files included)")
    return 0


def sweep(args) -> int:
    from ..analysis import width_sweep

    files.check_output(args.plot, "--plot", PLOT_SUFFIXES)
    files.check_output(args.csv, "--csv", (".csv",))
    widths = files.widths(args.widths)
    factory = files.load_callable(args.model_factory)
    files.check_factory(factory, args.model_factory)
    build = lambda width: files.module(factory(width), args.model_factory)
    x1, x2 = files.load_input(args.x1, "--x1"), files.load_input(args.x2, "--x2")
    result = width_sweep(build, widths, x1, x2, n_seeds=args.seeds,
                         parameterization=args.parameterization,
                         implementation=args.implementation)
    if args.plot:
        result.plot(args.plot)
    if args.csv:
        result.to_csv(args.csv)
    if args.json:
        _print_json({**result.to_dict(), "plot": args.plot, "csv": args.csv})
        return 0
    print(result)
    for what, path in (("Plot", args.plot), ("CSV", args.csv)):
        if path:
            print(f"{what} written to {path}")
    return 0


def compare(args) -> int:
    from ..testing import compare_kernels

    for name, value in (("--rtol", args.rtol), ("--atol", args.atol)):
        if not value >= 0:  # NaN too
            raise BadInput(f"{name} must be a non-negative number, got {value}.")
    expected, actual = files.load_array(args.expected, "expected"), files.load_array(args.actual, "actual")
    if expected.shape != actual.shape:
        raise BadInput(f"expected has shape {expected.shape} but actual has shape {actual.shape}.")
    result = compare_kernels(actual.astype(np.float64), expected.astype(np.float64),
                             rtol=args.rtol, atol=args.atol)
    if args.json:
        _print_json({"close": result.close, "shape": list(result.shape),
                     "max_abs_error": result.max_abs_error, "max_rel_error": result.max_rel_error,
                     "rel_frobenius_error": result.rel_frobenius_error,
                     "worst_index": list(result.worst_index), "rtol": args.rtol, "atol": args.atol})
    else:
        print(result.report())
    return 0 if result.close else 1


