"""Models that no converter covers, for the torch.export translator's tests and benchmark (the
sequence models pool their tokens by a maximum, which has no infinite-width rule).

``ZOO`` maps a name to ``(build, inputs)``: ``build()`` makes the model (float32, train mode as
torch leaves it) and ``inputs(n)`` a batch of ``n`` inputs; :func:`example` builds one for tests.
"""

import functools

import torch
from torch import nn


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.encoder(x).amax(1))


class CausalAttention(nn.Module):
    def __init__(self, length: int = 5):
        super().__init__()
        self.attention = nn.MultiheadAttention(8, 2, batch_first=True)
        self.register_buffer("mask", torch.triu(torch.ones(length, length, dtype=torch.bool), 1))
        self.out = nn.Linear(8, 2)

    def forward(self, x):
        h, _ = self.attention(x, x, x, attn_mask=self.mask, need_weights=False)
        return self.out(h.amax(1))


class Recurrent(nn.Module):
    def __init__(self, cell: type):
        super().__init__()
        self.rnn = cell(4, 6, batch_first=True)
        self.out = nn.Linear(6, 2)

    def forward(self, x):
        h, _ = self.rnn(x)
        return self.out(h[:, -1])


class Tokens(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 6, padding_idx=0)
        self.out = nn.Linear(6, 2)

    def forward(self, ids):
        return self.out(torch.tanh(self.embed(ids)).amax(1))


class ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=2, dilation=2, groups=2)
        self.bn2 = nn.BatchNorm2d(4)
        self.down = nn.Conv1d(4, 4, 2, stride=2)
        self.fc = nn.Linear(4 * 8, 3)
        for bn in (self.bn1, self.bn2):  # running statistics that differ from the identity
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        h = torch.relu(self.bn1(self.conv1(x)))
        h = torch.relu(h + self.bn2(self.conv2(h)))
        h = self.down(h.flatten(2))  # (N, 4, 64) -> (N, 4, 32)
        return self.fc(nn.functional.avg_pool1d(h, 4).flatten(1))


class Mix(nn.Module):
    def forward(self, h):
        h = torch.cumsum(h * h, dim=1)
        return torch.where(h > 1.0, h, -h)


class Custom(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(5, 6)
        self.mix = Mix()

    def forward(self, x):
        h = self.mix(self.linear(x))
        h = h.view(x.shape[0], 2, 3).softmax(-1).reshape(x.shape[0], -1)
        return h[:, [0, 2, 4, 5]] * h.sort(-1).values[:, -4:]


ZOO = {
    "transformer": (Transformer, lambda n: torch.randn(n, 5, 16)),
    "attention": (CausalAttention, lambda n: torch.randn(n, 5, 8)),
    "lstm": (lambda: Recurrent(nn.LSTM), lambda n: torch.randn(n, 4, 4)),
    "gru": (lambda: Recurrent(nn.GRU), lambda n: torch.randn(n, 4, 4)),
    "embedding": (Tokens, lambda n: torch.randint(0, 10, (n, 5))),
    "resnet": (ResNet, lambda n: torch.randn(n, 3, 8, 8)),
    "custom": (Custom, lambda n: torch.randn(n, 5)),
}


@functools.cache
def example(name: str, dtype: torch.dtype = torch.float64):
    """``(model in eval mode, x1 (3 examples), x2 (2 examples))``, built once per name and dtype
    (seed 0): tests that share it share its translation."""
    torch.manual_seed(0)
    build, inputs = ZOO[name]
    model = build().to(dtype).eval()
    x1, x2 = inputs(3), inputs(2)
    if x1.is_floating_point():
        x1, x2 = x1.to(dtype), x2.to(dtype)
    return model, x1, x2
