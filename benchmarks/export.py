"""The torch.export translator: the time to export and translate each model of the test zoo, and
the empirical NTK of its transformer by ntbridge's public entry point vs torch.func, side by side.

Run: python benchmarks/export.py [--n 32] [--length 6] [--rounds 5]

The NTK rows time ``ntbridge.empirical_ntk(model, x1, x2, trace_axes=(), implementation=...)`` on
the zoo's transformer (d_model 16, 4 heads, 2 layers, a linear head; float32, eval mode; x1 and x2
of N sequences each) for ``"auto"`` and each strategy, against torch.func's jacobian contraction on
the same model, called alternately (medians), after one warm-up call each (export, compilation).
Targets: auto <= 1.0x torch.func, and auto within 1.2x of the fastest strategy.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

import jax
import numpy as np
import torch

import ntbridge
from ntbridge.converters.export.translator import export, translate
from ntbridge.options import STRATEGIES
from run import interleaved_times, row, torch_func_ntk

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from export_zoo import ZOO  # noqa: E402


def translation_times() -> None:
    """Per zoo model: torch.export (with the decompositions) alone, and the whole translation
    (export included), after a warm-up export (torch's one-time set-up)."""
    export(torch.nn.Linear(2, 2), torch.zeros(2, 2))
    print(f"{'model':<14} {'export':>9} {'translate (with export)':>24}   ops")
    for name, (build, inputs) in ZOO.items():
        torch.manual_seed(0)
        model, x = build().eval(), inputs(4)
        t0 = time.perf_counter()
        export(model, x)
        t1 = time.perf_counter()
        t = translate(model, x)
        exported, total = t1 - t0, time.perf_counter() - t1
        ops = {n.target for n in t.program.graph.nodes if n.op == "call_function"}
        print(f"{name:<14} {exported:>8.2f}s {total:>23.2f}s   {len(ops)} distinct operators")


def transformer_ntk(n: int, length: int, rounds: int) -> None:
    torch.manual_seed(0)
    model = ZOO["transformer"][0]().eval()
    x1, x2 = torch.randn(n, length, 16), torch.randn(n, length, 16)
    reference = lambda: torch_func_ntk(model, x1, x2, "jacobian")
    expected = reference().numpy()
    chosen = ntbridge.empirical_ntk(model, x1, x2, trace_axes=(), return_info=True)[1]
    medians = {}
    for implementation in ("auto", *STRATEGIES):
        ours = lambda: ntbridge.empirical_ntk(model, x1, x2, trace_axes=(),
                                              implementation=implementation)
        error = float(np.abs(ours().detach().numpy() - expected).max() / np.abs(expected).max())
        a, b = (statistics.median(t) for t in interleaved_times(ours, reference, rounds))
        medians[implementation] = a
        name = f"auto ({chosen.implementation})" if implementation == "auto" else implementation
        row(f"transformer NTK N={n}: {name} vs torch.func", a / b,
            f"{a * 1e3:.1f} ms vs {b * 1e3:.1f} ms (rel. difference {error:.1e})")
    fastest = min(STRATEGIES, key=medians.get)
    row(f"transformer NTK N={n}: auto vs the fastest ({fastest})",
        medians["auto"] / medians[fastest],
        f"{medians['auto'] * 1e3:.1f} ms vs {medians[fastest] * 1e3:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=32, help="sequences in x1 and in x2")
    parser.add_argument("--length", type=int, default=6, help="tokens per sequence")
    parser.add_argument("--rounds", type=int, default=5, help="timed calls of each")
    args = parser.parse_args()
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, torch {torch.__version__}\n")
    translation_times()
    print()
    transformer_ntk(args.n, args.length, args.rounds)


if __name__ == "__main__":
    main()
