"""The empirical NTK of Hugging Face models (random configurations, no downloads) in fresh
processes: ntbridge's ``empirical_ntk`` (``implementation="auto"``, an empty program cache)
against ``torch.func``'s per-example Jacobians contracted (the torch.func tutorial's recipe), each
side in its own processes, alternating, so both see the same machine load.

Each process times three calls: the first (x1 of N token sequences, x2 = x1), a second with 20
other sequences against the first N, and the first again (steady). Rows give the medians over the
rounds and ntbridge's ratio to torch.func; ``info`` says which strategy auto took per call.

Run: python benchmarks/empirical_first_call.py [--rounds R] [--n N] [--models bert-tiny,...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

MODEL = """
import sys, time, json
import torch, transformers
from torch import nn
torch.manual_seed(0)
family, size = sys.argv[1].split("-")
n = int(sys.argv[2])
d, layers, heads, inner = (64, 2, 4, 128) if size == "tiny" else (256, 4, 4, 1024)
config = dict(vocab_size=1000, max_position_embeddings=64)
if family == "bert":
    body = transformers.BertModel(transformers.BertConfig(
        hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=inner, **config))
elif family == "gpt2":
    body = transformers.GPT2Model(transformers.GPT2Config(
        n_embd=d, n_layer=layers, n_head=heads, vocab_size=1000, n_positions=64))
else:
    body = transformers.LlamaModel(transformers.LlamaConfig(
        hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=heads, intermediate_size=inner, **config))

class Classifier(nn.Module):
    def __init__(self, body):
        super().__init__()
        self.body, self.head = body, nn.Linear(d, 3)

    def forward(self, ids):
        return self.head(self.body(ids).last_hidden_state.mean(1))

model = Classifier(body).eval()
ids, other = torch.randint(0, 1000, (n, 16)), torch.randint(0, 1000, (20, 16))
"""
TORCH_FUNC = MODEL + """
from torch.func import functional_call, jacrev, vmap
params = {k: v.detach() for k, v in model.named_parameters()}
one = lambda p, x: functional_call(model, p, (x[None],))[0]
jac = lambda x: vmap(jacrev(one), (None, 0))(params, x)

def kernel(x1, x2):
    j1 = jac(x1)
    j2 = j1 if x2 is None else jac(x2)
    return sum(torch.einsum("na...,mb...->nmab", j1[k], j2[k]) for k in j1).diagonal(0, 2, 3).mean(-1)

times = []
for x1, x2 in ((ids, None), (other, ids), (ids, None)):
    start = time.perf_counter()
    kernel(x1, x2)
    times.append(time.perf_counter() - start)
print(json.dumps({"times": times, "info": []}))
"""
NTBRIDGE = MODEL + """
import ntbridge
ntbridge.empirical_ntk  # ntbridge imports its modules on first use: an import, not the call
times, info = [], []
for x1, x2 in ((ids, None), (other, ids), (ids, None)):
    start = time.perf_counter()
    _, i = ntbridge.empirical_ntk(model, x1, x2, return_info=True)
    times.append(time.perf_counter() - start)
    info.append(i.implementation)
print(json.dumps({"times": times, "info": info}))
"""
CALLS = ("first", "second", "steady")


def _child(script: str, name: str, n: int) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = {"NTBRIDGE_CACHE_DIR": cache, "PYTHONWARNINGS": "ignore"}
        out = subprocess.run([sys.executable, "-c", script, name, str(n)], capture_output=True,
                             text=True, env={**os.environ, **env}, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def measure(name: str, n: int, rounds: int) -> None:
    """One row per call of ``name``: the medians of both sides and their ratio."""
    runs = {"torch.func": [], "ntbridge": []}
    for _ in range(rounds):
        runs["torch.func"].append(_child(TORCH_FUNC, name, n))
        runs["ntbridge"].append(_child(NTBRIDGE, name, n))
    for c, call in enumerate(CALLS):
        ours = statistics.median(r["times"][c] for r in runs["ntbridge"])
        theirs = statistics.median(r["times"][c] for r in runs["torch.func"])
        chosen = sorted({r["info"][c] for r in runs["ntbridge"]})
        print(f"| {name} | {call} | {ours:.3g} s | {theirs:.3g} s | {ours / theirs:.2f}x "
              f"| {', '.join(chosen)} |", flush=True)


MODELS = "bert-tiny,gpt2-tiny,llama-tiny,bert-small,gpt2-small,llama-small"


def table(models: str, n: int, rounds: int) -> None:
    """The Markdown table of :func:`measure`'s rows for the comma-separated ``models``."""
    print("| model | call | ntbridge | torch.func | ratio | auto's choice |")
    print("|---|---|---|---|---|---|")
    for name in models.split(","):
        measure(name, n, rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3, help="fresh processes per side")
    parser.add_argument("--n", type=int, default=32, help="examples of the first call")
    parser.add_argument("--models", default=MODELS)
    args = parser.parse_args()
    table(args.models, args.n, args.rounds)


if __name__ == "__main__":
    main()
