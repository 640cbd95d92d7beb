"""The rules of the layers of torch's decoders, graph networks, gates and elementwise functions,
against Neural Tangents 0.6.5's own rules for the same layers.

Run: python benchmarks/layers.py --nt-python nt/bin/python [--only TEXT]

Each case is a small torch model and the equivalent ``neural_tangents.stax`` network (the same
widths, ``W_std = 1.3`` and ``b_std = 0.2`` for every affine layer, channels-first inputs given to
NT channels-last). Both kernels (NNGP and NTK, float64, x1 of 5 examples against x2 of 3) are
computed in both parameterizations: ntbridge's ``"ntk"`` against NT's ``"ntk"``, and ntbridge's
default ``"standard"`` (torch's, the NTK with the layers' actual widths) against NT's
``"standard"``. Printed: the largest difference of each kernel relative to its largest entry.

Where the libraries' conventions differ, the case states the translation:

* transposed convolutions: torch's default init reads ``fan_in`` from ``weight.size(1) *
  prod(kernel_size)`` (output channels), NT's from the input channels, so ntbridge's ``W_std`` is
  NT's times ``sqrt(out_channels / in_channels)``. Geometry: torch's ``padding=0`` is NT's
  ``"VALID"``; ``kernel_size=4, stride=2, padding=1`` is NT's ``"SAME"`` (both pad the dilated
  input by 2 on each side); other paddings have no NT counterpart;
* resizing: ``jax.image.resize`` (NT's ``ImageResize``) samples at half-pixel centres: its
  ``"linear"`` is torch's ``(bi)linear`` with ``align_corners=False`` (``antialias=False`` when
  downsampling: NT's default antialiases when downsampling, as torch's ``antialias=True`` does,
  which ntbridge refuses), its ``"nearest"`` is torch's ``"nearest-exact"``, and torch's
  ``"nearest"`` too for integer upscaling factors. Cubic resizing has no NT kernel rule;
* graphs: nodes-first inputs ``(N, V, C)`` are NT's own layout (its ``Aggregate`` default), given
  as they are; a PyTorch Geometric ``GCNConv`` is NT's ``Aggregate`` with PyG's ``gcn_norm`` as
  the pattern, then ``Dense`` (``M (h W) + b = (M h) W + b``), each ``Data`` one example;
* ``x ** k`` is NT's ``Monomial(k)``, ``(x + 1) ** 2`` its ``Polynomial([1, 2, 1])``,
  ``exp(-x ** 2)`` its ``Gaussian(1, -1)``, ``sqrt(2) sin(sqrt(2 g) x + pi / 4)`` its ``Rbf(g)``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

import ntbridge

W_STD, B_STD = 1.3, 0.2
N1, N2 = 5, 3

# The NT side: every case's network built from its expression, its kernels saved by name.
NT_WORKLOAD = """
import json, sys
import jax, numpy as np
jax.config.update("jax_enable_x64", True)
from neural_tangents import stax
from neural_tangents.stax import *
cases, folder = json.loads(sys.argv[1]), sys.argv[2]
inputs = np.load(folder + "/inputs.npz")
out = {}
for name, expr, W, b in cases:
    for p in ("ntk", "standard"):
        D = lambda n, **kw: Dense(n, W, b, parameterization=p, **kw)
        C = lambda n, f, **kw: Conv(n, f, W_std=W, b_std=b, parameterization=p, **kw)
        CT = lambda n, f, **kw: ConvTranspose(n, f, W_std=W, b_std=b, parameterization=p, **kw)
        x1, x2 = inputs[name + "/x1"], inputs[name + "/x2"]
        kw = {}
        if name + "/pattern1" in inputs.files:
            kw["pattern"] = (inputs[name + "/pattern1"], inputs[name + "/pattern2"])
        try:
            k = eval(expr)[2](x1, x2, ("nngp", "ntk"), **kw)
        except Exception as e:  # reported by the caller
            print(json.dumps([name, f"{type(e).__name__}: {e}"]))
            continue
        out[f"{name}/{p}/nngp"], out[f"{name}/{p}/ntk"] = np.asarray(k.nngp), np.asarray(k.ntk)
np.savez(folder + "/nt.npz", **out)
"""


@dataclasses.dataclass
class Case:
    """One layer's comparison: ``torch()`` builds the model, ``nt`` is the stax network (``D``,
    ``C``, ``CT``: Dense, Conv, ConvTranspose with the common stds and the parameterization), on
    inputs of per-example shape ``shape`` (torch's channels-first layout)."""

    name: str
    torch: Callable
    nt: str
    shape: tuple[int, ...]
    graph: np.ndarray | None = None  # an adjacency: the model's buffer, NT's pattern
    graphs: bool = False  # each example's own adjacency, given to forward(x, adjacency)
    scale: float = 1.0  # of the inputs (exp of exp grows fast)
    layout: str = "channels first"  # or "nodes first" (NT's own layout), or "pyg" (Data inputs)


class Branches(nn.Module):
    """``head(join(f(a(x)), b(x)))``: two branches of one input joined by ``join``."""

    def __init__(self, a, b, join, head, f=torch.relu):
        super().__init__()
        self.a, self.b, self.head, self.join, self.f = a, b, head, join, f

    def forward(self, x):
        return self.head(self.join(self.f(self.a(x)), self.b(x)))


class Then(nn.Module):
    """``head(g(body(x)))`` for a function ``g`` traced by fx."""

    def __init__(self, body, g, head):
        super().__init__()
        self.body, self.g, self.head = body, g, head

    def forward(self, x):
        return self.head(self.g(self.body(x)))


class MLP(nn.Module):
    """``(N, 16) -> (N, 1)``: two hidden layers of 64 with the elementwise function ``f`` after
    each."""

    def __init__(self, f):
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(16, 64), nn.Linear(64, 64), nn.Linear(64, 1)
        self.f = f

    def forward(self, x):
        return self.l3(self.f(self.l2(self.f(self.l1(x)))))


class Graph(nn.Module):
    """``(N, 3, V) -> (N, 1)``: two rounds of a per-node Conv1d(k=1), ReLU and ``h @ adjacency``,
    then the mean over nodes."""

    def __init__(self, adjacency: np.ndarray):
        super().__init__()
        self.register_buffer("adjacency", torch.as_tensor(adjacency))
        self.n1, self.n2, self.head = nn.Conv1d(3, 8, 1), nn.Conv1d(8, 8, 1), nn.Linear(8, 1)

    def forward(self, x):
        h = torch.relu(self.n1(x)) @ self.adjacency
        h = torch.relu(self.n2(h)) @ self.adjacency
        return self.head(h.mean(-1))


class PerExampleGraph(nn.Module):
    """:class:`Graph` with each example's own adjacency: ``forward(x (N, 3, V), adjacency (N, V, V))``."""

    def __init__(self):
        super().__init__()
        self.n1, self.n2, self.head = nn.Conv1d(3, 8, 1), nn.Conv1d(8, 8, 1), nn.Linear(8, 1)

    def forward(self, x, adjacency):
        h = torch.relu(self.n1(x)) @ adjacency
        h = torch.relu(self.n2(h)) @ adjacency
        return self.head(h.mean(-1))


class NodesFirstGraph(nn.Module):
    """:class:`Graph` nodes first, ``x (N, V, 3)``: ``adjacency.T @ h``, the same aggregation."""

    def __init__(self, adjacency: np.ndarray):
        super().__init__()
        self.register_buffer("adjacency", torch.as_tensor(adjacency))
        self.n1, self.n2, self.head = nn.Linear(3, 8), nn.Linear(8, 8), nn.Linear(8, 1)

    def forward(self, x):
        h = self.adjacency.T @ torch.relu(self.n1(x))
        h = self.adjacency.T @ torch.relu(self.n2(h))
        return self.head(h.mean(1))


class NodesFirstPerExample(NodesFirstGraph):
    """:class:`NodesFirstGraph` with each example's own graph: ``torch.bmm(adjacency.mT, h)``."""

    def __init__(self):
        super().__init__(np.eye(7))

    def forward(self, x, adjacency):
        h = torch.bmm(adjacency.mT, torch.relu(self.n1(x)))
        h = torch.bmm(adjacency.mT, torch.relu(self.n2(h)))
        return self.head(h.mean(1))


class PygGCN(nn.Module):
    """PyTorch Geometric's 2-layer GCN, ``(x (V, 3), edge_index) -> (V, 1)``: NT's ``Aggregate``
    with PyG's normalised adjacency as the pattern, then ``Dense`` (``M (h W) + b = (M h) W +
    b``)."""

    def __init__(self):
        super().__init__()
        from torch_geometric.nn import GCNConv
        self.c1, self.c2 = GCNConv(3, 8), GCNConv(8, 1)

    def forward(self, x, edge_index):
        return self.c2(self.c1(x, edge_index).relu(), edge_index)


relu, flat = nn.ReLU, nn.Flatten
NT_GAP = "GlobalAvgPool(), D(1)"


def gap(c: int) -> nn.Sequential:
    """Global average pooling of ``c`` channels of 2d maps and a Linear readout (NT_GAP)."""
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), flat(), nn.Linear(c, 1))


def conv(c_in: int, c_out: int) -> nn.Conv2d:
    """A 3x3 convolution that keeps the map's size (NT: ``C(c_out, (3, 3), padding='SAME')``)."""
    return nn.Conv2d(c_in, c_out, 3, padding=1)


def transpose_cases() -> list[Case]:
    return [
        Case("ConvTranspose1d k3 s2 p0 (VALID)",
             lambda: nn.Sequential(nn.ConvTranspose1d(3, 8, 3, stride=2), relu(),
                                   nn.Conv1d(8, 8, 3, padding=1), relu(), flat(),
                                   nn.Linear(8 * 11, 1)),
             "serial(CT(8, (3,), strides=(2,)), Relu(), C(8, (3,), padding='SAME'), Relu(), "
             "Flatten(), D(1))", (3, 5)),
        Case("ConvTranspose1d k4 s2 p1 (SAME)",
             lambda: nn.Sequential(nn.ConvTranspose1d(3, 8, 4, stride=2, padding=1), relu(),
                                   nn.Conv1d(8, 8, 3, padding=1), relu(), flat(),
                                   nn.Linear(8 * 10, 1)),
             "serial(CT(8, (4,), strides=(2,), padding='SAME'), Relu(), "
             "C(8, (3,), padding='SAME'), Relu(), Flatten(), D(1))", (3, 5)),
        Case("ConvTranspose2d k2 s2 p0, k4 s2 p1, GAP",
             lambda: nn.Sequential(nn.ConvTranspose2d(3, 8, 2, stride=2), relu(),
                                   nn.ConvTranspose2d(8, 6, 4, stride=2, padding=1), relu(),
                                   gap(6)),
             f"serial(CT(8, (2, 2), strides=(2, 2)), Relu(), "
             f"CT(6, (4, 4), strides=(2, 2), padding='SAME'), Relu(), {NT_GAP})", (3, 3, 3)),
        Case("ConvTranspose2d k3 s(1,2) p0, Flatten",
             lambda: nn.Sequential(nn.ConvTranspose2d(3, 8, 3, stride=(1, 2)), relu(),
                                   conv(8, 8), relu(), flat(), nn.Linear(8 * 5 * 7, 1)),
             "serial(CT(8, (3, 3), strides=(1, 2)), Relu(), C(8, (3, 3), padding='SAME'), "
             "Relu(), Flatten(), D(1))", (3, 3, 3)),
        Case("ConvTranspose3d k2 s2 p0, GAP",
             lambda: nn.Sequential(nn.ConvTranspose3d(3, 8, 2, stride=2), relu(),
                                   nn.AdaptiveAvgPool3d(1), flat(), nn.Linear(8, 1)),
             f"serial(CT(8, (2, 2, 2), strides=(2, 2, 2)), Relu(), {NT_GAP})", (3, 2, 2, 2)),
    ]


def resize_cases() -> list[Case]:
    resizes = [  # (label, torch's Upsample arguments, NT's ImageResize arguments, in, out size)
        ("nearest x2", dict(scale_factor=2, mode="nearest"), "'nearest'", 4, 8),
        ("nearest-exact 5->8", dict(size=8, mode="nearest-exact"), "'nearest'", 5, 8),
        ("nearest 5->8 (differs: torch floors i * 5/8)", dict(size=8, mode="nearest"),
         "'nearest'", 5, 8),
        ("bilinear x2 align_corners=False", dict(scale_factor=2, mode="bilinear"), "'linear'",
         4, 8),
        ("bilinear 5->8 align_corners=False", dict(size=8, mode="bilinear"), "'linear'", 5, 8),
        ("bilinear 8->5 antialias=False", dict(size=5, mode="bilinear"),
         "'linear', antialias=False", 8, 5),
    ]
    return [Case(f"Upsample {label}, GAP",
                 lambda kw=kw: nn.Sequential(conv(3, 8), relu(), nn.Upsample(**kw), conv(8, 8),
                                             relu(), gap(8)),
                 f"serial(C(8, (3, 3), padding='SAME'), Relu(), "
                 f"ImageResize((-1, {n_out}, {n_out}, -1), {method}), "
                 f"C(8, (3, 3), padding='SAME'), Relu(), {NT_GAP})", (3, n_in, n_in))
            for label, kw, method, n_in, n_out in resizes]


def linear_map_cases() -> list[Case]:
    """Sum pooling, products, indexing, concatenations and graph aggregation."""
    return [
        Case("SumPool 2x2 s2 (AvgPool2d divisor_override=1), Flatten",
             lambda: nn.Sequential(conv(3, 8), relu(), nn.AvgPool2d(2, divisor_override=1),
                                   conv(8, 8), relu(), flat(), nn.Linear(8 * 3 * 3, 1)),
             "serial(C(8, (3, 3), padding='SAME'), Relu(), SumPool((2, 2), strides=(2, 2)), "
             "C(8, (3, 3), padding='SAME'), Relu(), Flatten(), D(1))", (3, 6, 6)),
        Case("SumPool 3x3 s1 zero-padded (count_include_pad), GAP",
             lambda: nn.Sequential(conv(3, 8), relu(),
                                   nn.AvgPool2d(3, stride=1, padding=1, divisor_override=1),
                                   conv(8, 8), relu(), gap(8)),
             f"serial(C(8, (3, 3), padding='SAME'), Relu(), SumPool((3, 3), strides=(1, 1), "
             f"padding='SAME'), C(8, (3, 3), padding='SAME'), Relu(), {NT_GAP})", (3, 5, 5)),
        Case("FanInProd relu(a(x)) * b(x)",
             lambda: Branches(nn.Linear(16, 64), nn.Linear(16, 64), torch.mul, nn.Linear(64, 1)),
             "serial(FanOut(2), parallel(serial(D(64), Relu()), D(64)), FanInProd(), D(1))",
             (16,)),
        Case("FanInProd erf(a(x)) * erf(b(x)) after a hidden layer",
             lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), Branches(
                 nn.Linear(32, 64), nn.Linear(32, 64), lambda a, b: a * torch.erf(b),
                 nn.Linear(64, 1), f=torch.erf)),
             "serial(D(32), Relu(), FanOut(2), parallel(serial(D(64), Erf()), serial(D(64), "
             "Erf())), FanInProd(), D(1))", (16,)),
        Case("Index x[..., 2:7], Flatten",
             lambda: Then(nn.Sequential(nn.Conv1d(3, 8, 3, padding=1), relu()),
                          lambda h: h[..., 2:7],
                          nn.Sequential(nn.Conv1d(8, 8, 3, padding=1), relu(), flat(),
                                        nn.Linear(8 * 5, 1))),
             "serial(C(8, (3,), padding='SAME'), Relu(), Index(Slice[:, 2:7, :]), "
             "C(8, (3,), padding='SAME'), Relu(), Flatten(), D(1))", (3, 9)),
        Case("Index x[:, :, 0] (a position)",
             lambda: Then(nn.Sequential(nn.Conv1d(3, 8, 3, padding=1), relu(),
                                        nn.Conv1d(8, 8, 3, padding=1), relu()),
                          lambda h: h[:, :, 0], nn.Linear(8, 1)),
             "serial(C(8, (3,), padding='SAME'), Relu(), C(8, (3,), padding='SAME'), Relu(), "
             "Index(Slice[:, 0, :]), D(1))", (3, 9)),
        Case("FanInConcat channels, Flatten",
             lambda: nn.Sequential(Branches(nn.Conv1d(3, 8, 3, padding=1),
                                            nn.Conv1d(3, 4, 3, padding=1),
                                            lambda a, b: torch.cat([a, b], 1),
                                            nn.Conv1d(12, 8, 3, padding=1)),
                                   relu(), flat(), nn.Linear(8 * 7, 1)),
             "serial(FanOut(2), parallel(serial(C(8, (3,), padding='SAME'), Relu()), "
             "C(4, (3,), padding='SAME')), FanInConcat(-1), C(8, (3,), padding='SAME'), Relu(), "
             "Flatten(), D(1))", (3, 7)),
        Case("FanInConcat positions, GAP",
             lambda: nn.Sequential(Branches(nn.Conv1d(3, 8, 3, padding=1),
                                            nn.Conv1d(3, 8, 1),
                                            lambda a, b: torch.cat([a, b], 2),
                                            nn.Conv1d(8, 8, 3, padding=1), f=lambda a: a),
                                   relu(), nn.AdaptiveAvgPool1d(1), flat(), nn.Linear(8, 1)),
             "serial(FanOut(2), parallel(C(8, (3,), padding='SAME'), C(8, (1,))), FanInConcat(1), "
             f"C(8, (3,), padding='SAME'), Relu(), {NT_GAP})", (3, 5)),
        Case("Aggregate h @ adjacency (ring + chords), mean over nodes",
             lambda: Graph(_adjacency(7)),
             "serial(C(8, (1,)), Relu(), Aggregate(), C(8, (1,)), Relu(), Aggregate(), "
             "GlobalAvgPool(), D(1))", (3, 7), graph=_adjacency(7)),
        Case("Aggregate h @ adjacency, each example's own graph",
             PerExampleGraph,
             "serial(C(8, (1,)), Relu(), Aggregate(), C(8, (1,)), Relu(), Aggregate(), "
             "GlobalAvgPool(), D(1))", (3, 7), graphs=True),
        Case("Aggregate A.T @ h, nodes first (N, V, C), mean over nodes",
             lambda: NodesFirstGraph(_adjacency(7)),
             "serial(D(8), Relu(), Aggregate(), D(8), Relu(), Aggregate(), "
             "GlobalAvgPool(), D(1))", (7, 3), graph=_adjacency(7), layout="nodes first"),
        Case("Aggregate torch.bmm(A.mT, h), nodes first, own graphs",
             NodesFirstPerExample,
             "serial(D(8), Relu(), Aggregate(), D(8), Relu(), Aggregate(), "
             "GlobalAvgPool(), D(1))", (7, 3), graphs=True, layout="nodes first"),
        Case("PyG GCNConv twice, Data x1 against another graph x2", PygGCN,
             "serial(Aggregate(), D(8), Relu(), Aggregate(), D(1))", (7, 3), layout="pyg"),
    ]


def elementwise_cases() -> list[Case]:
    elementwise = [  # (label, torch function, NT layer)
        ("exp", torch.exp, "Exp()"),
        ("0.5 exp(0.4 x)", lambda h: 0.5 * torch.exp(0.4 * h), "Exp(0.5, 0.4)"),
        ("Gaussian exp(-x**2)", lambda h: torch.exp(-h ** 2), "Gaussian(1, -1)"),
        ("Rbf(0.5): sqrt(2) sin(x + pi/4)", lambda h: 2 ** 0.5 * torch.sin(h + math.pi / 4),
         "Rbf(0.5)"),
        ("sin", torch.sin, "Sin()"),
        ("2 sin(0.5 x + 0.3)", lambda h: 2 * torch.sin(0.5 * h + 0.3), "Sin(2, 0.5, 0.3)"),
        ("cos", torch.cos, "Cos()"),
        ("erf", torch.erf, "Erf()"),
        ("abs", torch.abs, "Abs()"),
        ("sign", torch.sign, "Sign()"),
        ("x ** 2", lambda h: h ** 2, "Monomial(2)"),
        ("x ** 3", lambda h: h ** 3, "Monomial(3)"),
        ("(x + 1) ** 2", lambda h: (h + 1) ** 2, "Polynomial([1., 2., 1.])"),
    ]
    return [Case(f"elementwise {label}", lambda fn=fn: MLP(fn),
                 f"serial(D(64), {layer}, D(64), {layer}, D(1))", (16,),
                 scale=0.3 if label == "exp" else 1.0)
            for label, fn, layer in elementwise]


def cases() -> list[Case]:
    return transpose_cases() + resize_cases() + linear_map_cases() + elementwise_cases()


def _adjacency(v: int) -> np.ndarray:
    """``(v, v)``: a ring of ``v`` nodes with two chords and self-loops, each column divided by
    its sum (not symmetric: ``h @ adjacency`` and ``h @ adjacency.T`` differ)."""
    a = np.eye(v) + np.roll(np.eye(v), 1, 1) + np.roll(np.eye(v), -1, 1)
    a[0, v // 2] = a[v // 2, 0] = a[1, v - 2] = a[v - 2, 1] = 1
    return a / a.sum(0)


def _stds(model: nn.Module) -> dict[str, float]:
    """ntbridge's ``W_std`` of each affine module, so that its variance is NT's (see doc)."""
    stds = {}
    for name, m in model.named_modules():
        if isinstance(m, (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)):
            stds[name] = W_STD * math.sqrt(m.out_channels / m.in_channels)
        elif isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            stds[name] = W_STD
    return stds


def channels_last(x: np.ndarray, case: Case) -> np.ndarray:
    """``(N, C, *S) -> (N, *S, C)``: NT's layout (nodes-first inputs are in it already)."""
    return np.moveaxis(x, 1, -1) if x.ndim > 2 and case.layout == "channels first" else x


def pyg_graph(x: np.ndarray, rng: np.random.Generator):
    """``(Data, pattern (1, V, V))``: a random undirected graph on the nodes of ``x (1, V, F)``
    and PyG's own GCN normalisation of it as a dense matrix (NT's pattern)."""
    from torch_geometric.data import Data
    from torch_geometric.nn.conv.gcn_conv import gcn_norm
    v = x.shape[1]
    upper = np.triu(rng.random((v, v)) < 0.4, 1)
    edges = torch.as_tensor(np.stack(np.nonzero(upper | upper.T)))
    index, weight = gcn_norm(edges, None, v, add_self_loops=True, dtype=torch.float64)
    pattern = torch.zeros(v, v, dtype=torch.float64).index_put_((index[1], index[0]), weight,
                                                                accumulate=True)
    return Data(x=torch.from_numpy(x[0]), edge_index=edges), pattern.numpy()[None]


def _graphs(n: int, v: int, rng: np.random.Generator) -> np.ndarray:
    """``(n, v, v)``: random graphs with self-loops, each column divided by its sum."""
    a = (rng.random((n, v, v)) < 0.3) + np.eye(v)
    return a / a.sum(1, keepdims=True)


def ours(case: Case, x1, x2) -> dict[str, np.ndarray]:
    """ntbridge's kernels of the case's torch model by ``parameterization/kind`` (inputs: arrays,
    or pairs of arrays ``(x, adjacency)``)."""
    torch.manual_seed(0)
    model = case.torch().double().eval()
    tensors = lambda x: (tuple(map(torch.from_numpy, x)) if isinstance(x, tuple)
                         else torch.from_numpy(x) if isinstance(x, np.ndarray) else x)
    stds = W_STD if case.layout == "pyg" else _stds(model)
    out = {}
    for p in ("ntk", "standard"):
        k = ntbridge.kernel(model, tensors(x1), tensors(x2),
                            parameterization=p, W_std=stds, b_std=B_STD)
        out[f"{p}/nngp"], out[f"{p}/ntk"] = k.nngp.numpy(), k.ntk.numpy()
    return out


def theirs(nt_python: str, selected: list[Case], inputs: dict) -> tuple[dict, dict]:
    """NT's kernels by ``case/parameterization/kind``, and its errors by case name."""
    with tempfile.TemporaryDirectory() as folder:
        np.savez(Path(folder) / "inputs.npz", **inputs)
        spec = [(c.name, c.nt, W_STD, B_STD) for c in selected]
        run = subprocess.run([nt_python, "-c", NT_WORKLOAD, json.dumps(spec), folder],
                             capture_output=True, text=True, check=True)
        errors = dict(json.loads(line) for line in run.stdout.splitlines() if line.startswith("["))
        with np.load(Path(folder) / "nt.npz") as f:
            return dict(f), errors


def relative(a: np.ndarray, ref: np.ndarray) -> float:
    """The largest difference relative to the largest entry of ``ref``."""
    return float(np.abs(a - ref).max() / np.abs(ref).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nt-python", metavar="PATH", required=True,
                        help="a Python with neural-tangents 0.6.5")
    parser.add_argument("--only", default="", help="the cases whose name contains this")
    args = parser.parse_args()
    selected = [c for c in cases() if args.only in c.name]
    rng = np.random.default_rng(0)
    data, inputs = {}, {}
    for c in selected:
        sizes = (1, 1) if c.layout == "pyg" else (N1, N2)  # a Data is one graph
        x1, x2 = (c.scale * rng.standard_normal((n, *c.shape)) for n in sizes)
        data[c.name] = x1, x2
        inputs[c.name + "/x1"], inputs[c.name + "/x2"] = (channels_last(x, c) for x in (x1, x2))
        if c.layout == "pyg":
            (d1, p1), (d2, p2) = pyg_graph(x1, rng), pyg_graph(x2, rng)
            inputs[c.name + "/pattern1"], inputs[c.name + "/pattern2"] = p1, p2
            data[c.name] = d1, d2
        if c.graph is not None:
            inputs[c.name + "/pattern1"] = np.broadcast_to(c.graph, (N1, *c.graph.shape))
            inputs[c.name + "/pattern2"] = np.broadcast_to(c.graph, (N2, *c.graph.shape))
        if c.graphs:
            nodes = c.shape[0] if c.layout == "nodes first" else c.shape[-1]
            p1, p2 = (_graphs(n, nodes, rng) for n in (N1, N2))
            inputs[c.name + "/pattern1"], inputs[c.name + "/pattern2"] = p1, p2
            data[c.name] = (x1, p1), (x2, p2)
    nt, errors = theirs(args.nt_python, selected, inputs)
    print(f"{'layer':<58} {'ntk param: NNGP':>16} {'NTK':>9} {'standard: NNGP':>16} {'NTK':>9}")
    for c in selected:
        if c.name in errors:
            print(f"{c.name:<58} NT: {errors[c.name]}")
            continue
        try:
            mine = ours(c, *data[c.name])
        except Exception as e:  # a refusal: reported, the other cases go on
            print(f"{c.name:<58} ntbridge: {type(e).__name__}: {e}")
            continue
        diffs = [relative(mine[key].reshape(nt[f"{c.name}/{key}"].shape), nt[f"{c.name}/{key}"])
                 for key in ("ntk/nngp", "ntk/ntk", "standard/nngp", "standard/ntk")]
        print(f"{c.name:<58} {diffs[0]:>16.1e} {diffs[1]:>9.1e} {diffs[2]:>16.1e} {diffs[3]:>9.1e}")


if __name__ == "__main__":
    main()
    sys.exit(0)
