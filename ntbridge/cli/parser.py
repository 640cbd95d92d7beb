"""The ``ntbridge`` command's arguments: one parser, a subparser per subcommand."""

from __future__ import annotations

import argparse

from ..options import IMPLEMENTATIONS
from .commands import compare, demo, kernel, sweep


def parser(description: str) -> argparse.ArgumentParser:
    """The command's parser; ``description``: its first line of help."""
    parser = argparse.ArgumentParser(prog="ntbridge", description=description,
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
