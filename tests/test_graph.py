"""Graph aggregation ``h @ A.T`` with the adjacency a buffer of the model (dense or torch.sparse):
the kernel of a per-node Linear followed by aggregation against torch.func's exact NTK, forwards,
Monte-Carlo of a wide 2-layer graph network with a pooled head, refusals, programs keyed by the
adjacency."""

import numpy as np
import pytest
import torch
from torch import nn

import ntbridge
from ntbridge import errors

from montecarlo import check_architecture
from test_conv import assert_forward_matches
from test_indexing import assert_linear_kernels

V = 6


def adjacency(seed=0, v=V) -> torch.Tensor:
    """A random symmetric graph with self-loops, normalized as GCN's D^-1/2 (A + I) D^-1/2."""
    gen = torch.Generator().manual_seed(seed)
    a = (torch.rand(v, v, generator=gen) < 0.4).double()
    a = ((a + a.T) > 0).double() + torch.eye(v, dtype=torch.float64)
    d = a.sum(1).rsqrt()
    return d[:, None] * a * d[None, :]


class Aggregated(nn.Module):
    """``fn(node(x), adjacency)``: a per-node Linear (Conv1d of kernel 1), then ``fn``."""

    def __init__(self, fn, a=None, sparse=False, width=4):
        super().__init__()
        torch.manual_seed(0)
        a = adjacency() if a is None else a
        self.register_buffer("adj", a.to_sparse() if sparse else a)
        self.node, self.fn = nn.Conv1d(3, width, 1), fn

    def forward(self, x):
        return self.fn(self.node(x), self)


FORMS = {
    "h @ adj.T": (lambda h, m: h @ m.adj.T, False),
    "sparse: h @ adj.t()": (lambda h, m: h @ m.adj.t(), True),
    "torch.matmul(h, adj) (symmetric)": (lambda h, m: torch.matmul(h, m.adj), False),
    "h.matmul(adj.mT)": (lambda h, m: h.matmul(m.adj.mT), False),
    "twice, then a node": (lambda h, m: (h @ m.adj.T @ m.adj.T)[..., 2:3], False),
}


def _x(n=3, dtype=torch.float64):
    return torch.randn(n, 3, V, dtype=dtype)


@pytest.mark.slow
@pytest.mark.parametrize("name", FORMS)
def test_aggregation_kernels_are_exact(name):
    fn, sparse = FORMS[name]
    network = assert_linear_kernels(Aggregated(fn, sparse=sparse), _x(), _x(2))
    assert network.full_spatial


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_forwards_match_torch(dtype):
    for fn, sparse in FORMS.values():
        assert_forward_matches(Aggregated(fn, sparse=sparse), _x(dtype=dtype))


@pytest.mark.slow
def test_nonsymmetric_adjacency_aggregates_the_transpose_of_the_right_factor():
    """h @ M is the aggregation by A = M^T: the kernel is A K A^T, not M K M^T."""
    a = torch.triu(torch.ones(V, V, dtype=torch.float64))
    network = assert_linear_kernels(Aggregated(lambda h, m: h @ m.adj, a=a), _x(), _x(2))
    assert network.full_spatial


class GraphNet(nn.Module):
    """Two rounds of (per-node Linear, aggregation, ReLU), mean over the nodes, a Linear head."""

    def __init__(self, width=256, sparse=False):
        super().__init__()
        a = adjacency(1, 4)
        self.register_buffer("adj", a.to_sparse() if sparse else a)
        self.node1, self.node2 = nn.Conv1d(2, width, 1), nn.Conv1d(width, width, 1)
        self.head = nn.Linear(width, 256)

    def forward(self, x):
        h = torch.relu(self.node1(x) @ self.adj.T)
        h = torch.relu(self.node2(h) @ self.adj.T)
        return self.head(h.mean(-1))


@pytest.mark.slow
@pytest.mark.parametrize("parameterization", ["standard", "ntk"])
def test_graph_network_matches_monte_carlo(parameterization):
    check_architecture(lambda: (GraphNet(), (2, 4)), parameterization)


@pytest.mark.slow
def test_sparse_and_dense_buffers_give_one_kernel():
    x = torch.randn(4, 2, 4, dtype=torch.float64)
    dense, sparse = GraphNet(8).double(), GraphNet(8, sparse=True).double()
    sparse.load_state_dict(dense.state_dict() | {"adj": dense.adj.to_sparse()})
    k1, k2 = ntbridge.kernel(dense, x), ntbridge.kernel(sparse, x)
    assert torch.equal(k1.nngp, k2.nngp) and torch.equal(k1.ntk, k2.ntk)


def test_the_adjacency_keys_the_programs():
    x = _x()
    kernels = [ntbridge.nngp(Aggregated(lambda h, m: (h @ m.adj.T).mean(-1), a=adjacency(seed))
                             .double(), x) for seed in (0, 1)]
    assert not torch.allclose(*kernels)


def test_refusals_name_the_call_and_the_alternative():
    class SecondInput(nn.Module):
        def __init__(self):
            super().__init__()
            self.node = nn.Conv1d(3, 4, 1)

        def forward(self, x, adj):
            return self.node(x) @ adj.T

    with pytest.raises(errors.ConversionError, match="takes several inputs"):
        ntbridge.convert(SecondInput())
    with pytest.raises(errors.UnsupportedLayerError, match=r"matmul in Aggregated\.forward: only "
                                                           r"h @ M .*write h @ self\.adjacency\.T"):
        ntbridge.convert(Aggregated(lambda h, m: m.adj @ h).double())
    model = Aggregated(lambda h, m: h @ m.adj.T).double()
    model.adj = nn.Parameter(adjacency())
    with pytest.raises(errors.UnsupportedLayerError, match="uses the tensor 'adj' directly"):
        ntbridge.convert(model)
    with pytest.raises(errors.ShapeError, match=r"inputs of 5 nodes along the last axis, for an "
                                                r"adjacency of 6"):
        ntbridge.nngp(Aggregated(lambda h, m: h @ m.adj.T).double(), _x()[..., :5])
