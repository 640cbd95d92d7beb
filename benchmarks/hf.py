"""A Hugging Face model's analytic kernel against the same network written with torch's modules.

``python benchmarks/hf.py [--quick]``: a 2-layer ``GPT2Model`` (d = 64, 4 heads, MLP 256,
``gelu_new``, vocabulary 1000; converted from its ``torch.export`` graph) and the same network of
``nn.Embedding`` tokens and positions, ``nn.TransformerEncoder`` of pre-norm
``nn.TransformerEncoderLayer`` (GELU tanh, a causal mask) and a final ``nn.LayerNorm`` (converted
module by module), on N = 64 sequences of T = 16 tokens, float32, every layer at the same
variances (``W_std=1``, ``b_std=0.1``, independent layers). Rows: the largest relative
difference of their NNGP and NTK (the same kernel: 0 up to rounding), the first call of each
(conversion, export, compilation) and the median of 3 steady calls (the two models' calls
alternating), and the ratio of GPT-2's to the encoder's (goal <= 1.2).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn
from transformers import GPT2Config, GPT2Model, logging

import ntbridge

logging.set_verbosity_error()
D, HEADS, LAYERS, VOCAB = 64, 4, 2, 1000


class Encoder(nn.Module):
    """GPT-2's network written with torch's modules."""

    def __init__(self, t: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, D), nn.Embedding(t, D)
        layer = nn.TransformerEncoderLayer(D, HEADS, 4 * D, dropout=0.0,
                                           activation=nn.GELU("tanh"), batch_first=True,
                                           norm_first=True)
        self.enc = nn.TransformerEncoder(layer, LAYERS, norm=nn.LayerNorm(D),
                                         enable_nested_tensor=False)
        self.register_buffer("mask", torch.ones(t, t, dtype=torch.bool).triu(1))

    def forward(self, ids):
        t = ids.shape[1]
        h = self.wte(ids) + self.wpe(torch.arange(t, device=ids.device))
        return self.enc(h, mask=self.mask)


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="N = 8, T = 8")
    n, t = (8, 8) if parser.parse_args().quick else (64, 16)
    torch.manual_seed(0)
    gpt2 = GPT2Model(GPT2Config(n_embd=D, n_layer=LAYERS, n_head=HEADS, n_inner=4 * D,
                                vocab_size=VOCAB, n_positions=t)).eval()
    encoder = Encoder(t).eval()
    ids = torch.randint(0, VOCAB, (n, t))
    options = dict(W_std=1.0, b_std=0.1, shared_weights="independent")
    call = lambda model: ntbridge.kernel(model, ids, **options)
    (a, first_a), (b, first_b) = _timed(lambda: call(gpt2)), _timed(lambda: call(encoder))
    times = [(_timed(lambda: call(gpt2))[1], _timed(lambda: call(encoder))[1])
             for _ in range(3)]  # alternating: a shared machine's load falls on both alike
    steady_a, steady_b = (statistics.median(column) for column in zip(*times))
    for get in ("nngp", "ntk"):
        x, y = getattr(a, get), getattr(b, get)
        print(f"{get}: largest relative difference {((x - y).abs().max() / y.abs().max()):.2e}")
    print(f"first call: GPT-2 {first_a:.2f} s, encoder {first_b:.2f} s")
    print(f"steady call: GPT-2 {steady_a:.3f} s, encoder {steady_b:.3f} s, "
          f"ratio {steady_a / steady_b:.2f} (goal <= 1.2)")


if __name__ == "__main__":
    main()
