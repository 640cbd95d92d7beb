"""Node classification on a graph with PyTorch Geometric: the infinite-width NNGP of a 2-layer GCN
as a Gaussian process, against the same GCN trained, and against the NNGP of the network without
the graph (an MLP of the nodes' own features).

The graph: scikit-learn's handwritten digits (8x8 images, available offline), one node per image,
each joined to its 10 nearest neighbours in pixel space, the pixels' noisy copies as its features
(so that a node's neighbours carry information its own features have lost). Five labelled nodes
per class (transductive: the kernel is of every pair of nodes, labelled or not); the others are
to be classified.

The GCN is PyG's (``GCNConv``, Kipf and Welling's ``D^-1/2 (A + I) D^-1/2`` aggregation);
``ntbridge.kernel(model, data)`` with the ``Data`` converts it from its modules and gives the
node-by-node NNGP ``(V, V)``, exact; GP inference on it classifies the unlabelled nodes. The
trained GCN is the same class at width 64, trained with Adam on the labelled nodes' cross-entropy.

    python examples/node_classification.py   # NTBRIDGE_EXAMPLE_QUICK=1 for a smaller run

Runs in about 31 s on 2 shared CPU cores (the quick run: 14 s) (`time python examples/node_classification.py`).
"""

import os

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.neighbors import kneighbors_graph
from torch import nn
from torch_geometric.data import Data
from torch_geometric.nn import GCNConv

import ntbridge
from ntbridge.predict import gp_inference

QUICK = os.environ.get("NTBRIDGE_EXAMPLE_QUICK") == "1"
NODES = 500 if QUICK else 1797
LABELLED, NEIGHBOURS, NOISE = 5, 10, 1.5  # labelled nodes per class, graph degree, feature noise


class GCN(nn.Module):
    """``(x (V, F), edge_index (2, E)) -> (V, classes)``: two ``GCNConv`` with a ReLU between.

    Example:
        >>> GCN(64, 10)(torch.randn(4, 64), torch.tensor([[0, 1], [1, 0]])).shape
        torch.Size([4, 10])
    """

    def __init__(self, features: int, classes: int, width: int = 64):
        super().__init__()
        self.conv1, self.conv2 = GCNConv(features, width), GCNConv(width, classes)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


def graph(gen: torch.Generator) -> tuple[Data, torch.Tensor]:
    """``(data, labelled)``: the digits' k-NN graph with noisy features (float64), and the mask
    of ``LABELLED`` nodes per class."""
    digits = load_digits()
    pixels = torch.tensor(digits.data[:NODES], dtype=torch.float64)
    pixels = (pixels - pixels.mean(0)) / (pixels.std(0) + 1)
    knn = kneighbors_graph(pixels.numpy(), NEIGHBOURS).tocoo()
    edges = torch.tensor(np.stack([knn.col, knn.row]), dtype=torch.long)  # node <- neighbours
    edges = torch.cat([edges, edges.flip(0)], 1).unique(dim=1)  # symmetric
    x = pixels + NOISE * torch.randn(pixels.shape, generator=gen, dtype=torch.float64)
    y = torch.tensor(digits.target[:NODES])
    labelled = torch.zeros(NODES, dtype=torch.bool)
    for c in range(10):
        labelled[torch.nonzero(y == c)[:LABELLED, 0]] = True
    return Data(x=x, edge_index=edges, y=y), labelled


def gp_accuracy(k: torch.Tensor, y: torch.Tensor, labelled: torch.Tensor) -> float:
    """Accuracy on the unlabelled nodes of GP inference with the node kernel ``k (V, V)``."""
    targets = nn.functional.one_hot(y[labelled], 10).double() - 0.1
    mean = gp_inference(k[labelled][:, labelled], targets, k[~labelled][:, labelled],
                        diag_reg=1e-3).mean
    return (mean.argmax(1) == y[~labelled]).double().mean().item()


def trained_accuracy(data: Data, labelled: torch.Tensor, steps: int = 200) -> float:
    """Accuracy on the unlabelled nodes of the GCN trained on the labelled ones."""
    torch.manual_seed(0)
    model = GCN(data.x.shape[1], 10).double()
    optimiser = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    for _ in range(steps):
        optimiser.zero_grad()
        loss = nn.functional.cross_entropy(model(data.x, data.edge_index)[labelled],
                                           data.y[labelled])
        loss.backward()
        optimiser.step()
    with torch.no_grad():
        predicted = model(data.x, data.edge_index).argmax(1)
    return (predicted[~labelled] == data.y[~labelled]).double().mean().item()


def main() -> None:
    data, labelled = graph(torch.Generator().manual_seed(0))
    print(f"{NODES} nodes, {data.edge_index.shape[1]} edges, {int(labelled.sum())} labelled")
    torch.manual_seed(0)
    k = ntbridge.nngp(GCN(data.x.shape[1], 10).double(), data)  # (V, V)
    mlp = nn.Sequential(nn.Linear(data.x.shape[1], 64), nn.ReLU(), nn.Linear(64, 10)).double()
    k_alone = ntbridge.nngp(mlp, data.x)  # the same network without the graph
    print(f"NNGP of the GCN (GP inference): accuracy {gp_accuracy(k, data.y, labelled):.3f}")
    print(f"NNGP without the graph (an MLP): accuracy "
          f"{gp_accuracy(k_alone, data.y, labelled):.3f}")
    print(f"GCN trained (width 64, Adam): accuracy {trained_accuracy(data, labelled):.3f}")


if __name__ == "__main__":
    main()
