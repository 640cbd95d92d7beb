"""The ``ntbridge`` command: kernels of torch models from the shell, and kernel checks for CI.

It starts fast: torch and JAX are imported only by the subcommands that compute (``demo``,
``kernel``, ``sweep``), when they run; ``--help`` and ``compare`` import neither.

Subcommands (``ntbridge SUBCOMMAND --help`` for each):

* ``demo``: the kernels of a small MLP and a width sweep (table and plot).
* ``kernel MODEL --x1 a.npy [--x2 b.npy] [--get ntk|nngp|empirical] --out k.npy``.
* ``sweep MODEL_FACTORY --widths 64,256,1024 --x1 a.npy [--plot sweep.png] [--seeds N]``.
* ``compare expected.npy actual.npy [--rtol R --atol A]``: exit status 0 when close, 1 when not,
  2 on bad input.

``MODEL`` is ``package.module:callable`` (importable from the current directory too) returning an
``nn.Module``; for ``sweep`` a factory taking the width. Weights (``--weights file.pt``) and inputs
(``.npy`` or ``.pt``) are read without unpickling arbitrary objects (``numpy.load(allow_pickle=False)``,
``torch.load(weights_only=True)``). ``--json`` prints one JSON object on stdout for machines; bad
input exits with status 2 and a message on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # annotations only: the subcommands that compute import torch themselves
    import torch
    from torch import nn

from . import files
from .errors import InitMismatchWarning, NtbridgeError
from .files import BadInput
from .options import IMPLEMENTATIONS

BAD_INPUT = 2
PLOT_SUFFIXES = (".png", ".pdf", ".svg")


def _mlp(width: int, d_in: int = 16) -> nn.Sequential:
    from torch import nn
    return nn.Sequential(nn.Linear(d_in, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, 1))


def _matrix(name: str, k: torch.Tensor) -> str:
    rows = "\n".join("  " + " ".join(f"{v:8.4f}" for v in row) for row in k.tolist())
    return f"{name} {tuple(k.shape)}:\n{rows}"


def _print_json(data: dict) -> None:
    print(json.dumps(data, indent=2))


# ---- subcommands ----

def _write_plot(sweep, path: str) -> str | None:
    try:
        return sweep.plot(path)
    except ImportError as e:
        print(f"(no plot: {e})", file=sys.stderr)
        return None


def demo(args) -> int:
    import torch

    from . import analysis, api

    widths = files.widths(args.widths)
    files.check_output(args.plot, "--plot", PLOT_SUFFIXES)
    x = torch.randn(args.n, 16, generator=torch.Generator().manual_seed(0))
    start = time.perf_counter()
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
    print(f"Total {time.perf_counter() - start:.1f} s.")
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
    from . import api

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
            "out": args.out, "seconds": seconds}
    if args.json:
        _print_json(info)
    else:
        print(f"{args.get} kernel {tuple(k.shape)} {info['dtype']} written to {args.out} "
              f"({seconds:.2f} s)")
    return 0


def sweep(args) -> int:
    from .analysis import width_sweep

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
    from .testing import compare_kernels

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


# ---- the parser ----

def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ntbridge", description=__doc__.splitlines()[0],
                                     epilog="Run 'ntbridge SUBCOMMAND --help' for each subcommand.")
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON object (for machines)")

    p = sub.add_parser("demo", parents=[common], help="kernels of a small MLP and a width sweep",
                       description="The analytic kernels of a small MLP, and how far freshly "
                       "initialised torch MLPs of growing width are from them (table and plot).")
    p.add_argument("--widths", default="64,256,1024,4096", help="comma-separated widths")
    p.add_argument("--seeds", type=int, default=3, help="seeds per width (default 3)")
    p.add_argument("--n", type=int, default=6, help="number of inputs (default 6)")
    p.add_argument("--plot", default="ntbridge-demo-sweep.png", metavar="PATH",
                   help="where to write the sweep's plot (default ./ntbridge-demo-sweep.png)")
    p.set_defaults(run=demo)

    p = sub.add_parser("kernel", parents=[common], help="a model's kernel on inputs, to a file",
                       description="Compute a model's analytic NTK/NNGP or its empirical NTK.")
    p.add_argument("model", metavar="MODEL", help="package.module:callable returning an nn.Module")
    p.add_argument("--x1", required=True, help="inputs (N1, ...) as .npy or .pt")
    p.add_argument("--x2", help="inputs (N2, ...) as .npy or .pt (default: x1)")
    p.add_argument("--get", choices=("ntk", "nngp", "empirical"), default="ntk",
                   help="analytic ntk (default), analytic nngp, or the empirical NTK of the weights")
    p.add_argument("--out", required=True, help="output file, .npy or .pt")
    p.add_argument("--weights", help="a state dict saved with torch.save (loaded weights_only)")
    p.add_argument("--parameterization", choices=("standard", "ntk"), default="standard",
                   help="of the analytic kernels (default standard)")
    p.add_argument("--init", choices=("torch", "infer"), default="torch",
                   help="the init the analytic kernels assume: torch's default (default), or the "
                   "variances of the weights (infer, with --weights)")
    p.add_argument("--W-std", type=float, dest="W_std", metavar="STD",
                   help="the weights' standard deviation the analytic kernels assume, every layer")
    p.add_argument("--b-std", type=float, dest="b_std", metavar="STD",
                   help="the biases' standard deviation the analytic kernels assume, every layer")
    p.add_argument("--batch-size", type=int, metavar="N",
                   help="tiles of N x N examples (default: the largest that fits in memory)")
    p.add_argument("--progress", action="store_true", help="a progress bar on stderr")
    p.set_defaults(run=kernel)

    p = sub.add_parser("sweep", parents=[common], help="finite vs infinite width over widths",
                       description="Relative error of freshly initialised models' kernels vs "
                       "their infinite-width limits, over widths and seeds (ntbridge.analysis).")
    p.add_argument("model_factory", metavar="MODEL_FACTORY",
                   help="package.module:callable taking the width, returning an nn.Module")
    p.add_argument("--widths", required=True, help="comma-separated widths, e.g. 64,256,1024")
    p.add_argument("--x1", required=True, help="inputs (N1, ...) as .npy or .pt")
    p.add_argument("--x2", help="inputs (N2, ...) as .npy or .pt (default: x1)")
    p.add_argument("--seeds", type=int, default=3, help="models per width (default 3)")
    p.add_argument("--plot", metavar="PATH", help="write a log-log plot (PNG; needs matplotlib)")
    p.add_argument("--csv", metavar="PATH", help="write the results as CSV")
    p.add_argument("--parameterization", choices=("standard", "ntk"), default="standard")
    p.add_argument("--implementation", default="auto", choices=IMPLEMENTATIONS,
                   help="of the empirical NTK (default auto)")
    p.set_defaults(run=sweep)

    p = sub.add_parser("compare", parents=[common], help="are two kernels close? (exit 0/1/2)",
                       description="Compare two kernels entry by entry: exit 0 when "
                       "|actual - expected| <= atol + rtol |expected| everywhere, 1 when not, "
                       "2 on bad input (missing file, shape mismatch, non-numeric data).")
    p.add_argument("expected", help=".npy or .pt")
    p.add_argument("actual", help=".npy or .pt")
    p.add_argument("--rtol", type=float, default=1e-5, help="relative tolerance (default 1e-5)")
    p.add_argument("--atol", type=float, default=0.0, help="absolute tolerance (default 0)")
    p.set_defaults(run=compare)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.run(args)
    except (BadInput, NtbridgeError, ImportError, ValueError) as e:
        print(f"ntbridge {args.command}: error: {e}", file=sys.stderr)
        return BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
