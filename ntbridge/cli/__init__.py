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

import os
import sys

from ..errors import NtbridgeError
from .commands import BAD_INPUT
from .files import BadInput
from .parser import parser

__all__ = ["main"]


def command() -> None:
    """The ``ntbridge`` command: :func:`main` on the command line, its output flushed, then the
    process ends without the interpreter's teardown, in which XLA's and torch's runtimes freed
    in turn can abort a finished command ("terminate called without an active exception", seen
    on a busy machine)."""
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def main(argv: list[str] | None = None) -> int:
    """Run the command on ``argv`` (default: ``sys.argv[1:]``); returns its exit status."""
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    try:
        return args.run(args)
    except (BadInput, NtbridgeError, ImportError, ValueError) as e:
        print(f"ntbridge {args.command}: error: {e}", file=sys.stderr)
        return BAD_INPUT
