"""Graph aggregation nodes first, ``A @ h`` on ``(N, V, C)`` (Kipf's layout), in every dense
spelling: a buffer or a normalisation of it computed in ``forward``, ``torch.matmul``,
``A.matmul(h)``, transposes around ``h @ A.T`` on ``(N, C, V)``. Each against the exact kernel
of a linear model, ``A (x x^T + 1) A^T`` (Neural Tangents' ``Aggregate``), and a wide model
against Monte-Carlo at its own width; refusals."""

import pytest
import torch
from torch import nn

import ntbridge
from ntbridge import errors

from helpers import assert_forward_matches
from montecarlo import fresh_kernels, standard_error, z_scores

V, F = 5, 3


def graph(seed=0, v=V) -> torch.Tensor:
    """A random symmetric 0/1 adjacency without self-loops, float64."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.triu((torch.rand(v, v, generator=gen) < 0.5).double(), 1)
    return a + a.T


def gcn_normalised(a: torch.Tensor) -> torch.Tensor:
    """``D^-1/2 (A + I) D^-1/2``, written as models write it in ``forward``."""
    a = a + torch.eye(a.shape[0], dtype=a.dtype)
    d = a.sum(1).rsqrt()
    return d[:, None] * a * d[None, :]


SPELLINGS = {  # name: (fn(h (N, V, C) nodes first, model) -> aggregated (N, V, C), matrix)
    "adj @ h": (lambda h, m: m.adj @ h, lambda a: a),
    "torch.matmul(adj, h)": (lambda h, m: torch.matmul(m.adj, h), lambda a: a),
    "adj.matmul(h)": (lambda h, m: m.adj.matmul(h), lambda a: a),
    "D^-1/2 (A + I) D^-1/2 @ h in forward": (lambda h, m: gcn_normalised(m.adj) @ h,
                                              gcn_normalised),
    "row-normalised with self-loops": (
        lambda h, m: ((m.adj + torch.eye(V, dtype=m.adj.dtype))
                      / (m.adj + torch.eye(V, dtype=m.adj.dtype)).sum(1, keepdim=True)) @ h,
        lambda a: (a + torch.eye(V, dtype=a.dtype)) / (a + torch.eye(V, dtype=a.dtype)).sum(1, True)),
    "(h.mT @ adj.T).mT": (lambda h, m: (h.mT @ m.adj.T).mT, lambda a: a),
    "(h.transpose(1, 2) @ adj.T).transpose(1, 2)": (
        lambda h, m: (h.transpose(1, 2) @ m.adj.T).transpose(1, 2), lambda a: a),
}


class NodesFirst(nn.Module):
    """``spelling(Linear(x), model)`` on ``x (N, V, F)``: a Linear of each node's features, then
    the aggregation (a non-symmetric buffer, so that A and A^T differ)."""

    def __init__(self, spelling, a, width=4):
        super().__init__()
        self.register_buffer("adj", a)
        self.lin, self.spelling = nn.Linear(F, width), spelling

    def forward(self, x):
        return self.spelling(self.lin(x), self)


def _x(n, seed):
    return torch.randn(n, V, F, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("name", SPELLINGS)
def test_nodes_first_aggregation_is_exact(name):
    """The model is linear: NTK (per output unit) ``A (x1 x2^T + 1) A^T`` over node pairs, NNGP
    that over ``3 F`` (torch's init, W_std**2 = 1/3, b_std**2 = 1/(3F))."""
    spelling, matrix = SPELLINGS[name]
    a = graph() + torch.triu(torch.ones(V, V, dtype=torch.float64))  # not symmetric
    model = NodesFirst(spelling, a).double()
    x1, x2 = _x(3, 1), _x(2, 2)
    m = matrix(a)
    inner = torch.einsum("nvf,mwf->nmvw", x1, x2) + 1
    ntk = torch.einsum("uv,nmvw,xw->nmux", m, inner, m)
    k = ntbridge.kernel(model, x1, x2)
    torch.testing.assert_close(k.ntk, ntk, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(k.nngp, ntk / (3 * F), rtol=1e-12, atol=1e-12)
    assert_forward_matches(model, x1)


class KipfGCN(nn.Module):
    """Kipf and Welling's 2-layer GCN, nodes first, ``A_hat`` computed in ``forward`` from the
    buffer: ``A_hat relu(A_hat x W1) W2``, with the nodes' mean as its output's head."""

    def __init__(self, width=256, out=64):
        super().__init__()
        self.register_buffer("adj", graph(3, 4))
        self.lin1, self.lin2 = nn.Linear(2, width), nn.Linear(width, out)

    def forward(self, x):
        a_hat = gcn_normalised(self.adj)
        return (a_hat @ self.lin2(torch.relu(a_hat @ self.lin1(x)))).mean(1)


@pytest.mark.slow
def test_kipf_gcn_matches_monte_carlo_at_its_width():
    x = torch.randn(3, 4, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    nngp, ntk = fresh_kernels(KipfGCN, x, 60)
    k = ntbridge.kernel(KipfGCN().double(), x)
    for samples, exact in ((nngp, k.nngp), (ntk, k.ntk)):
        assert standard_error(samples).max() < 0.05 * exact.abs().max()  # the check has power
        assert z_scores(samples, exact).max() < 5


def test_refusals_name_the_form_that_works():
    class ChannelsFirst(nn.Module):  # A @ h with h (N, C, V): mixes channels
        def __init__(self):
            super().__init__()
            self.register_buffer("adj", graph())
            self.node = nn.Conv1d(F, V, 1)

        def forward(self, x):
            return self.adj @ self.node(x)

    with pytest.raises(errors.UnsupportedLayerError, match=r"read channels first .* write "
                                                           r"h @ adjacency\.T there"):
        ntbridge.nngp(ChannelsFirst().double(), torch.randn(2, F, V, dtype=torch.float64))
    with pytest.raises(errors.UnsupportedLayerError, match=r"x\.T: of a tensor's attributes only "
                                                           r"x\.mT"):
        ntbridge.convert(NodesFirst(lambda h, m: m.adj @ h.T, graph()).double())


# ------------------------------- each example's own graph, nodes first: forward(x, adjacency)

PER_EXAMPLE = {  # name: (fn(h (N, V, C), adjacency (N, V, V)), transposed)
    "adjacency @ h": (lambda h, a: a @ h, False),
    "torch.bmm(adjacency, h)": (lambda h, a: torch.bmm(a, h), False),
    "torch.matmul(adjacency.mT, h)": (lambda h, a: torch.matmul(a.mT, h), True),
    "adjacency.transpose(1, 2).bmm(h)": (lambda h, a: a.transpose(1, 2).bmm(h), True),
}


class OwnGraphs(nn.Module):
    """``spelling(Linear(x), adjacency)`` on ``x (N, V, F)``, twice with a ReLU between when
    ``deep`` (then the nodes' mean and a Linear head)."""

    def __init__(self, spelling, width=4, deep=False, out=2):
        super().__init__()
        self.lin, self.spelling, self.deep = nn.Linear(F, width), spelling, deep
        if deep:
            self.lin2, self.head = nn.Linear(width, width), nn.Linear(width, out)

    def forward(self, x, adjacency):
        h = self.spelling(self.lin(x), adjacency)
        if not self.deep:
            return h
        h = self.spelling(self.lin2(torch.relu(h)), adjacency)
        return self.head(torch.relu(h).mean(1))


def _graphs(n, seed):
    """``(x (n, V, F), adjacencies (n, V, V))``, non-symmetric, float64."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n, V, F, generator=gen, dtype=torch.float64),
            torch.rand(n, V, V, generator=gen, dtype=torch.float64))


@pytest.mark.parametrize("name", PER_EXAMPLE)
def test_each_examples_graph_nodes_first_is_exact(name):
    """NTK per output unit ``A1 (x1 x2^T + 1) A2^T``, each example with its own ``A``."""
    spelling, transposed = PER_EXAMPLE[name]
    (x1, a1), (x2, a2) = _graphs(3, 1), _graphs(2, 2)
    m1, m2 = (a.mT if transposed else a for a in (a1, a2))
    inner = torch.einsum("nvf,mwf->nmvw", x1, x2) + 1
    ntk = torch.einsum("nuv,nmvw,mxw->nmux", m1, inner, m2)
    k = ntbridge.kernel(OwnGraphs(spelling).double(), (x1, a1), (x2, a2))
    torch.testing.assert_close(k.ntk, ntk, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(k.nngp, ntk / (3 * F), rtol=1e-12, atol=1e-12)


def test_nodes_first_graph_model_empirical_ntk_is_torch_funcs():
    torch.manual_seed(0)
    model = OwnGraphs(PER_EXAMPLE["torch.bmm(adjacency, h)"][0], deep=True).double()
    x, a = _graphs(3, 0)
    params = dict(model.named_parameters())
    jac = torch.func.jacrev(lambda p: torch.func.functional_call(model, p, (x, a)))(params)
    exact = sum(torch.einsum("nop,mop->nm", j.flatten(2), j.flatten(2)) for j in jac.values()) / 2
    torch.testing.assert_close(ntbridge.empirical_ntk(model, (x, a)), exact, rtol=1e-10,
                               atol=1e-12)


@pytest.mark.slow
def test_nodes_first_graph_model_matches_monte_carlo_at_its_width():
    x, a = _graphs(3, 0)
    build = lambda: OwnGraphs(PER_EXAMPLE["adjacency @ h"][0], width=256, deep=True, out=64)

    class Fixed(nn.Module):  # fresh_kernels calls model(x): the graphs are fixed
        def __init__(self):
            super().__init__()
            self.model = build()

        def forward(self, x):
            return self.model(x, a)

    nngp, ntk = fresh_kernels(Fixed, x, 60)
    torch.manual_seed(0)
    k = ntbridge.kernel(build().double(), (x, a))
    for samples, exact in ((nngp, k.nngp), (ntk, k.ntk)):
        assert standard_error(samples).max() < 0.05 * exact.abs().max()  # the check has power
        assert z_scores(samples, exact).max() < 5


def test_nodes_first_pairs_are_checked():
    model = OwnGraphs(PER_EXAMPLE["adjacency @ h"][0]).double()
    x, a = _graphs(3, 0)
    with pytest.raises(errors.ShapeError, match=r"node features x \(N, V, C\), nodes first as the "
                                                r"model reads them, and adjacencies \(N, V, V\), "
                                                r"got x \(3, 5, 3\) and adjacency \(3, 4, 4\)"):
        ntbridge.ntk(model, (x, a[:, :4, :4]))
