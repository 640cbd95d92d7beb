"""The first calls users make, every measured row of them in one run, side by side with Neural
Tangents 0.6.5 and torch.func on the same machine load:

1. never-seen architectures: ``never_seen.py``'s random MLPs, CNNs, residual and concatenating
   networks, each first call in a fresh process with an empty program cache, against Neural
   Tangents' first call on the same architecture (target <= 0.25x);
2. new input sizes: ``first_call.py``'s workloads (FC float64 and float32, CNNs with a Flatten
   and a global-pooling head), fresh processes, empty and warm caches; a new x2 size and a
   larger x1 against the first call (target <= 0.3x), and each first call against Neural
   Tangents';
3. the empirical NTK of Hugging Face models (``empirical_first_call.py``: BERT, GPT-2 and Llama,
   tiny and small random configurations) against torch.func's first, second and steady calls
   (target: never slower);
4. the text classifier of ``attention.py`` (2 encoder layers, torch's attention) at N = 32:
   steady calls and the reported error per rule (target under 1.5 s with an error within 1e-3),
   and its calls in a fresh process.

Run: python benchmarks/first_calls_table.py --nt-python nt/bin/python [--rounds 3] [--count 19]
(15 minutes on 2 cores; ``first_call.py`` says how to make the Neural Tangents
environment). Each part prints its own rows; ``benchmarks/README.md`` ("First calls, one run")
keeps a run's table.
"""

from __future__ import annotations

import argparse
import time

import attention
import empirical_first_call
import first_call
import never_seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nt-python", required=True, help="a Python with neural-tangents 0.6.5")
    parser.add_argument("--rounds", type=int, default=3, help="fresh processes per measurement")
    parser.add_argument("--count", type=int, default=19, help="never-seen architectures")
    parser.add_argument("--models", default=empirical_first_call.MODELS)
    args = parser.parse_args()
    start = time.perf_counter()
    print(f"## 1. Never-seen architectures\n{first_call.HEADER}")
    never_seen.rows(args.count, 0, args.nt_python)
    print(f"\n## 2. First calls and new sizes\n{first_call.HEADER}")
    first_call.first_calls(args.rounds, args.nt_python)
    print("\n## 3. Empirical NTK of Hugging Face models, N = 32")
    empirical_first_call.table(args.models, 32, args.rounds)
    print("\n## 4. The text classifier's steady calls, N = 32")
    attention.rule_rows(quick=False)
    attention.fresh_rows(args.rounds, quick=False)
    print(f"\n(one run: {(time.perf_counter() - start) / 60:.0f} minutes)")


if __name__ == "__main__":
    main()
