"""The torch.export translator: the time to export and translate each model of the test zoo, and
the empirical NTK of its transformer by ntbridge's strategies vs torch.func, measured side by side.

Run: python benchmarks/export.py [--n 32] [--rounds 5]

The NTK rows time ``empirical_ntk_fn(apply_fn, strategy)`` of the translated transformer (float32,
``trace_axes=()``, x1 and x2 of N examples each) against torch.func's jacobian contraction on the
same model, called alternately (medians), after one warm-up call each (compilation).
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

from ntbridge.converters.export import export, translate
from ntbridge.dlpack import to_jax
from ntbridge.empirical import empirical_ntk_fn
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


def transformer_ntk(n: int, rounds: int) -> None:
    torch.manual_seed(0)
    build, inputs = ZOO["transformer"]
    model, x1, x2 = build().eval(), inputs(n), inputs(n)
    t = translate(model, x1)
    reference = lambda: torch_func_ntk(model, x1, x2, "jacobian")
    expected = reference().numpy()
    for strategy in ("jacobian", "ntvp"):
        fn = empirical_ntk_fn(t.apply_fn, strategy)
        ours = lambda: fn(t.params, to_jax(x1), to_jax(x2), trace_axes=(), state=t.state)
        error = float(np.abs(np.asarray(ours()) - expected).max() / np.abs(expected).max())
        a, b = interleaved_times(ours, reference, rounds)
        a, b = statistics.median(a), statistics.median(b)
        row(f"transformer NTK N={n}: {strategy} vs torch.func", a / b,
            f"{a * 1e3:.1f} ms vs {b * 1e3:.1f} ms (rel. difference {error:.1e})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=32, help="examples in x1 and in x2")
    parser.add_argument("--rounds", type=int, default=5, help="timed calls of each")
    args = parser.parse_args()
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, torch {torch.__version__}\n")
    translation_times()
    print()
    transformer_ntk(args.n, args.rounds)


if __name__ == "__main__":
    main()
