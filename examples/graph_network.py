"""A 2-layer graph network (``A_hat h`` aggregation, mean pooling) on two synthetic tasks
generated here deterministically: infinite-width NNGP and NTK regression, against the same network
without the graph. First the signals of one graph (the adjacency a buffer of the model), then
graph classification with each example's own graph (the adjacency an input of ``forward``).

The data: one graph of 20 nodes in two communities (a stochastic block model), and signals on its
nodes. Class 0 signals diffuse along the graph's edges (``exp(-t L) z``, ``L`` its Laplacian, ``z``
white noise); class 1 signals diffuse along a ring through the same nodes in a random order, which
ignores the communities. Every signal is scaled to the same norm, so the two classes have the same
distribution at each node: they differ only in which structure they are smooth on.

The model: per-node linear maps (``nn.Conv1d(., ., 1)`` on ``(N, channels, nodes)``, torch's
layout for features per node) and two rounds of aggregation with the normalised adjacency
``A_hat = D^-1/2 (A + I) D^-1/2``, kept as a buffer of the model. With nodes along the last axis,
``A_hat h`` is written ``h @ self.adjacency.T`` (each node becomes the weighted sum of its
neighbours). ntbridge converts it as Neural Tangents' ``Aggregate``: the kernel of node pairs
becomes ``A_hat K A_hat^T``, exactly. The adjacency is a constant of the model, the same graph for
every example, so the examples are signals on one graph. The baseline is the same network with
``A_hat = I``: it sees each node's value alone (the spread of values over the nodes, not which
nodes are neighbours), and classifies the signals worse (it is skipped in the quick run).

The second task gives each example its own graph: a community graph with its nodes in a random
order, and a signal that is smooth on it (class 0) or on another such graph (class 1). The model
takes the pair, ``forward(x, adjacency)`` with ``x`` ``(N, 1, V)`` and ``adjacency`` ``(N, V, V)``,
and aggregates with ``h @ adjacency.mT``; the kernels take pairs, ``ntbridge.kernel(model, (x,
adjacency), ...)``, and the rule is Neural Tangents' ``Aggregate`` with a ``pattern`` per
example. Without the graphs (``A_hat = I``) both classes look alike: chance accuracy.

    python examples/graph_network.py   # NTBRIDGE_EXAMPLE_QUICK=1 for a smaller run

Runs in about 65 s on 2 shared CPU cores (`time python examples/graph_network.py`).
"""

import math
import os

import torch
from torch import nn

import ntbridge
from ntbridge.predict import gp_inference, gradient_descent_mse_ensemble

QUICK = os.environ.get("NTBRIDGE_EXAMPLE_QUICK") == "1"
N_TRAIN, N_TEST = (80, 80) if QUICK else (400, 400)
NODES, DIFFUSION = 20, 1.0


class GraphNetwork(nn.Module):
    """``(N, 1, V) -> (N, 1)``: two rounds of a per-node linear map, aggregation ``A_hat h`` and
    ReLU, then the mean over nodes and a Linear readout.

    Example:
        >>> net = GraphNetwork(torch.eye(5))
        >>> net(torch.randn(3, 1, 5)).shape
        torch.Size([3, 1])
    """

    def __init__(self, adjacency: torch.Tensor | None, width: int = 64):
        super().__init__()
        if adjacency is not None:  # (V, V), the same graph for every example
            self.register_buffer("adjacency", adjacency)
        self.node1, self.node2 = nn.Conv1d(1, width, 1), nn.Conv1d(width, width, 1)
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.node1(x) @ self.adjacency.T)  # A_hat h, nodes along the last axis
        h = torch.relu(self.node2(h) @ self.adjacency.T)
        return self.head(h.mean(-1))


class PerExampleGraphNetwork(GraphNetwork):
    """:class:`GraphNetwork` with each example's own ``A_hat``: ``forward(x (N, 1, V), adjacency
    (N, V, V)) -> (N, 1)``.

    Example:
        >>> net = PerExampleGraphNetwork()
        >>> net(torch.randn(3, 1, 5), torch.eye(5).expand(3, 5, 5)).shape
        torch.Size([3, 1])
    """

    def __init__(self, width: int = 64):
        super().__init__(None, width)

    def forward(self, x: torch.Tensor, adjacency: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.node1(x) @ adjacency.mT)  # each example's A_hat h
        h = torch.relu(self.node2(h) @ adjacency.mT)
        return self.head(h.mean(-1))


def community_graph(gen: torch.Generator) -> torch.Tensor:
    """``(V, V)`` 0/1 symmetric adjacency: two communities of ``V/2`` nodes, edges inside with
    probability 0.5, across with 0.05."""
    side = torch.arange(NODES) < NODES // 2
    p = torch.where(side[:, None] == side[None], 0.5, 0.05)
    upper = torch.triu((torch.rand(NODES, NODES, generator=gen) < p).double(), 1)
    return upper + upper.T


def ring_graph(gen: torch.Generator) -> torch.Tensor:
    """``(V, V)``: a ring through the nodes in a random order."""
    order = torch.randperm(NODES, generator=gen)
    a = torch.zeros(NODES, NODES, dtype=torch.float64)
    a[order, order.roll(1)] = 1
    return a + a.T


def normalised(a: torch.Tensor) -> torch.Tensor:
    """``D^-1/2 (A + I) D^-1/2``."""
    a = a + torch.eye(len(a), dtype=a.dtype)
    d = a.sum(1).rsqrt()
    return d[:, None] * a * d[None]


def diffused(a: torch.Tensor, n: int, gen: torch.Generator) -> torch.Tensor:
    """``(n, 1, V)``: white noise diffused along ``a``'s edges, ``exp(-t L) z``, each signal
    scaled to norm ``sqrt(V)``."""
    laplacian = torch.diag(a.sum(1)) - a
    lam, u = torch.linalg.eigh(laplacian)
    heat = u @ torch.diag(torch.exp(-DIFFUSION * lam)) @ u.T
    x = torch.randn(n, NODES, generator=gen, dtype=torch.float64) @ heat
    return (x * (NODES ** 0.5 / x.norm(dim=1, keepdim=True)))[:, None]


def data(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(graph (V, V), x (N_TRAIN + N_TEST, 1, V), y (.., 1))``: classes alternate, ``y = -1``
    for signals smooth on the graph, ``+1`` for those smooth on the ring."""
    graph, ring = community_graph(gen), ring_graph(gen)
    n = (N_TRAIN + N_TEST) // 2
    x = torch.stack([diffused(graph, n, gen), diffused(ring, n, gen)], 1).reshape(2 * n, 1, NODES)
    y = torch.tensor([-1.0, 1.0], dtype=torch.float64).repeat(n)[:, None]
    return graph, x, y


def graph_set(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x (N_TRAIN + N_TEST, 1, V), A_hat (.., V, V), y (.., 1))``: each example a community
    graph with its nodes shuffled and a signal smooth on it (``y = -1``) or on another such graph
    (``y = +1``)."""
    shuffled = lambda a, p: a[p][:, p]
    xs, graphs = [], []
    for i in range(N_TRAIN + N_TEST):
        graph = shuffled(community_graph(gen), torch.randperm(NODES, generator=gen))
        smooth_on = graph if i % 2 == 0 else shuffled(community_graph(gen),
                                                      torch.randperm(NODES, generator=gen))
        xs.append(diffused(smooth_on, 1, gen)[0])
        graphs.append(normalised(graph))
    y = torch.tensor([-1.0, 1.0], dtype=torch.float64).repeat((N_TRAIN + N_TEST) // 2)[:, None]
    return torch.stack(xs), torch.stack(graphs), y


def accuracies(model: nn.Module, x, y: torch.Tensor) -> tuple[float, float]:
    """Test accuracy of NNGP (GP inference) and NTK (t = inf) regression on ``model``'s kernels,
    the first ``N_TRAIN`` examples for training, the rest for testing (``x``: a tensor, or for
    graph inputs a pair of tensors)."""
    train = tuple(t[:N_TRAIN] for t in x) if isinstance(x, tuple) else x[:N_TRAIN]
    k = ntbridge.kernel(model, x, train)  # (N_TRAIN + N_TEST, N_TRAIN), one program
    n, y_train, y_test = N_TRAIN, y[:N_TRAIN], y[N_TRAIN:]
    nngp = gp_inference(k.nngp[:n], y_train, k.nngp[n:], diag_reg=1e-4)
    ntk = gradient_descent_mse_ensemble(k.ntk[:n], y_train, k.ntk[n:], t=math.inf, diag_reg=1e-4)
    hits = lambda f: (f.mean.sign() == y_test).double().mean().item()
    return hits(nngp), hits(ntk)


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    graph, x, y = data(gen)
    torch.manual_seed(0)
    runs = [("graph network, A_hat = D^-1/2 (A + I) D^-1/2", normalised(graph)),
            ("without the graph, A_hat = I", torch.eye(NODES, dtype=x.dtype))]
    for label, adjacency in runs[:1] if QUICK else runs:
        acc_nngp, acc_ntk = accuracies(GraphNetwork(adjacency).double(), x, y)
        print(f"{label}: test accuracy NNGP {acc_nngp:.3f}, NTK (t = inf) {acc_ntk:.3f}")
    x, graphs, y = graph_set(gen)
    alone = torch.eye(NODES, dtype=x.dtype).expand_as(graphs)
    runs = [("each example's own graph, forward(x, adjacency)", graphs),
            ("without the graphs, A_hat = I", alone)]
    for label, adjacency in runs[:1] if QUICK else runs:
        model = PerExampleGraphNetwork().double()
        acc_nngp, acc_ntk = accuracies(model, (x, adjacency), y)
        print(f"{label}: test accuracy NNGP {acc_nngp:.3f}, NTK (t = inf) {acc_ntk:.3f}")


if __name__ == "__main__":
    main()
