"""PyTorch Geometric models converted from their modules (GCNConv, GraphConv, SAGEConv, GINConv,
global_mean_pool/global_add_pool) with ``Data`` and ``Batch`` inputs: exact kernels of one layer
against reference math built with PyG's own normalisation, the empirical NTK against torch.func,
wide models against Monte-Carlo of fresh PyG-initialised models at their own width, x1 against x2,
refusals."""

import pytest
import torch
from torch import nn

import ntbridge
from ntbridge import errors

tg = pytest.importorskip("torch_geometric")
from torch_geometric.data import Batch, Data  # noqa: E402
from torch_geometric.nn import (GATConv, GCNConv, GINConv, GraphConv, SAGEConv,  # noqa: E402
                                global_add_pool, global_max_pool, global_mean_pool)
from torch_geometric.nn.conv.gcn_conv import gcn_norm  # noqa: E402

from montecarlo import fresh_kernels, standard_error, z_scores  # noqa: E402

F = 3


def data(v=5, seed=0, weighted=False) -> Data:
    """A random undirected graph of ``v`` nodes (a ring and random chords, some repeated, no
    self-loops), float64 features."""
    gen = torch.Generator().manual_seed(seed)
    ring = torch.stack([torch.arange(v), (torch.arange(v) + 1) % v])
    start = torch.randint(0, v, (v,), generator=gen)
    chords = torch.stack([start, (start + torch.randint(1, v, (v,), generator=gen)) % v])
    edges = torch.cat([ring, chords], 1)
    edges = torch.cat([edges, edges.flip(0)], 1)
    weight = torch.rand(edges.shape[1], generator=gen, dtype=torch.float64) + 0.5
    return Data(x=torch.randn(v, F, generator=gen, dtype=torch.float64), edge_index=edges,
                edge_weight=weight if weighted else None)


def dense(edges, weight, v) -> torch.Tensor:
    """``M[target, source]`` summed over the edges."""
    return torch.zeros(v, v, dtype=torch.float64).index_put_((edges[1], edges[0]), weight,
                                                           accumulate=True)


class One(nn.Module):
    """One layer ``conv(x, edge_index[, edge_weight])``."""

    def __init__(self, conv, weighted=False):
        super().__init__()
        self.conv, self.weighted = conv, weighted

    def forward(self, x, edge_index, edge_weight):
        return self.conv(x, edge_index, edge_weight) if self.weighted else self.conv(x, edge_index)


class Twice(nn.Module):
    """The sum of two GCNConv of the same input: independent weights, the kernels add."""

    def __init__(self):
        super().__init__()
        self.a, self.b = GCNConv(F, 2), GCNConv(F, 2)

    def forward(self, x, edge_index, edge_weight):
        return self.a(x, edge_index, edge_weight) + self.b(x, edge_index, edge_weight)


def test_one_layer_kernels_are_exact():
    """Linear models: NTK per output unit ``M x x^T M^T`` (+ 1 for a bias, + ``x x^T`` for a
    root weight), NNGP with the layer's init variances, ``M`` from PyG's own normalisation."""
    d = data(weighted=True)
    v, x = d.x.shape[0], d.x
    gram = x @ x.T
    edges, norm = gcn_norm(d.edge_index, d.edge_weight, v, add_self_loops=True)
    m = dense(edges, norm, v)
    counts = dense(d.edge_index, torch.ones(d.edge_index.shape[1], dtype=torch.float64), v)
    mean = counts / counts.sum(1, keepdim=True).clamp(min=1)
    weighted = dense(d.edge_index, d.edge_weight, v)
    edges2, norm2 = gcn_norm(d.edge_index, d.edge_weight, v, improved=True, add_self_loops=True)
    improved = dense(edges2, norm2, v)
    edges3, norm3 = gcn_norm(d.edge_index, None, v, improved=True, add_self_loops=True,
                             dtype=torch.float64)  # without weights, PyG's loops weigh 1
    unweighted = dense(edges3, norm3, v)
    cases = {  # model: (NTK, NNGP)
        One(GCNConv(F, 2), True): (m @ gram @ m.T + 1, 2 / (F + 2) * m @ gram @ m.T),
        One(GCNConv(F, 2, improved=True), True): (improved @ gram @ improved.T + 1,
                                            2 / (F + 2) * improved @ gram @ improved.T),
        One(GCNConv(F, 2, improved=True)): (unweighted @ gram @ unweighted.T + 1,
                                            2 / (F + 2) * unweighted @ gram @ unweighted.T),
        One(GCNConv(F, 2, normalize=False, bias=False), True): (
            weighted @ gram @ weighted.T, 2 / (F + 2) * weighted @ gram @ weighted.T),
        Twice(): (2 * (m @ gram @ m.T + 1), 4 / (F + 2) * m @ gram @ m.T),
        One(SAGEConv(F, 2)): (mean @ gram @ mean.T + 1 + gram,
                              (mean @ gram @ mean.T + 1 + gram) / (3 * F)),
        One(GraphConv(F, 2), True): (weighted @ gram @ weighted.T + 1 + gram,
                                     (weighted @ gram @ weighted.T + 1 + gram) / (3 * F)),
    }
    for model, (ntk, nngp) in cases.items():
        k = ntbridge.kernel(model.double(), d)
        torch.testing.assert_close(k.ntk, ntk, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(k.nngp, nngp, rtol=1e-12, atol=1e-12)


class GCN(nn.Module):
    """A 2-layer GCN for node classification (PyG's tutorial), edge weights optional."""

    def __init__(self, width=8, out=4):
        super().__init__()
        self.conv1, self.conv2 = GCNConv(F, width), GCNConv(width, out)

    def forward(self, x, edge_index, edge_weight):
        return self.conv2(self.conv1(x, edge_index, edge_weight).relu(), edge_index, edge_weight)


class GIN(nn.Module):
    """Two GIN layers (inner MLPs), a per-graph pooling, a Linear head."""

    def __init__(self, width=8, out=4):
        super().__init__()
        mlp = lambda i: nn.Sequential(nn.Linear(i, width), nn.ReLU(), nn.Linear(width, width))
        self.gin1, self.gin2 = GINConv(mlp(F), eps=0.5), GINConv(mlp(width))
        self.head = nn.Linear(width, out)

    def forward(self, x, edge_index, batch):
        h = self.gin2(self.gin1(x, edge_index).relu(), edge_index).relu()
        return self.head(global_add_pool(h, batch))


class Sage(nn.Module):
    def __init__(self, aggr="mean", width=8):
        super().__init__()
        self.conv1 = SAGEConv(F, width, aggr=aggr)
        self.conv2 = GraphConv(width, 4, aggr="mean")

    def forward(self, x, edge_index):
        return global_mean_pool(self.conv2(self.conv1(x, edge_index).tanh(), edge_index), None)


def _batch():
    return Batch.from_data_list([data(4, 1), data(6, 2), data(5, 3)])


def _call(fn, d, model=None):
    """``fn`` called with ``d``'s attributes named as ``model.forward``'s inputs (``model``: ``fn``
    itself when None)."""
    code = (model or fn).forward.__code__
    return fn(*[getattr(d, n) for n in code.co_varnames[1:code.co_argcount]])


@pytest.mark.parametrize("build, inputs", [
    (lambda: GCN(), lambda: data(weighted=True)),
    (lambda: GIN(), _batch),
    (lambda: Sage("sum"), lambda: data(6)),
])
def test_forward_and_empirical_ntk_are_torch_funcs(build, inputs):
    torch.manual_seed(0)
    model, d = build().double(), inputs()
    params = dict(model.named_parameters())
    out = _call(model, d)
    jac = torch.func.jacrev(lambda p: _call(lambda *a: torch.func.functional_call(model, p, a),
                                            d, model))(params)
    exact = sum(torch.einsum("vop,wop->vw", j.flatten(2), j.flatten(2)) for j in jac.values())
    got = ntbridge.empirical_ntk(model, d)
    torch.testing.assert_close(got, exact / out.shape[-1], rtol=1e-10, atol=1e-12)


class Fresh(nn.Module):
    """``build()`` on one fixed graph, a module of the node features alone (for fresh_kernels)."""

    def __init__(self, build, d):
        super().__init__()
        self.model, self.d = build(), d

    def forward(self, x):
        return _call(lambda *a: self.model(x, *a[1:]), self.d, self.model)


@pytest.mark.slow
@pytest.mark.parametrize("build, inputs", [
    (lambda: GCN(width=256, out=64), lambda: data(4, weighted=True)),
    (lambda: GIN(width=256, out=64), lambda: Batch.from_data_list([data(3, 1), data(4, 2)])),
])
def test_wide_models_match_monte_carlo_at_their_width(build, inputs):
    """Fresh models as PyG initialises them (GCNConv's glorot weights and zero bias): their
    empirical NNGP and NTK average to the analytic kernels, node by node or graph by graph."""
    d = inputs()
    nngp, ntk = fresh_kernels(lambda: Fresh(build, d), d.x, 60)
    torch.manual_seed(0)
    k = ntbridge.kernel(build().double(), d)
    for samples, exact in ((nngp, k.nngp), (ntk, k.ntk)):
        assert samples.shape[1:] == exact.shape
        assert standard_error(samples).max() < 0.05 * exact.abs().max()  # the check has power
        assert z_scores(samples, exact).max() < 5


def test_x2_is_the_block_of_the_union_and_batches_pool_each_graph():
    torch.manual_seed(0)
    gcn, gin = GCN().double(), GIN().double()
    d1, d2 = data(5, 1), data(3, 2)
    assert ntbridge.nngp(gcn, d1, d2).shape == (5, 3)
    torch.testing.assert_close(ntbridge.ntk(gcn, d1, d1), ntbridge.ntk(gcn, d1), rtol=1e-12,
                               atol=1e-12)
    batch = _batch()
    k = ntbridge.kernel(gin, batch)
    assert k.ntk.shape == (3, 3)
    graphs = batch.to_data_list()
    pair = ntbridge.kernel(gin, graphs[0], graphs[2])
    torch.testing.assert_close(pair.ntk[0, 0], k.ntk[0, 2], rtol=1e-10, atol=1e-12)
    estimate = ntbridge.monte_carlo(gcn, d1, d2, n_samples=4)
    assert estimate.mean.shape == estimate.standard_error.shape == (5, 3)


def test_refusals_name_the_layer_and_what_works():
    class GAT(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = GATConv(F, 4)

        def forward(self, x, edge_index):
            return self.conv(x, edge_index)

    class MaxPooled(GIN):
        def forward(self, x, edge_index, batch):
            return global_max_pool(self.gin1(x, edge_index), batch)

    with pytest.raises(errors.UnsupportedLayerError, match=r"GATConv \(attention over neighbours "
                                                           r"has no kernel rule here\).*GCNConv"):
        ntbridge.convert(GAT().double())
    with pytest.raises(errors.UnsupportedLayerError, match=r"global_max_pool has no kernel rule.*"
                                                           r"global_mean_pool or global_add_pool"):
        ntbridge.convert(MaxPooled().double())
    with pytest.raises(errors.UnsupportedLayerError, match=r"SAGEConv\(normalize=True\)"):
        ntbridge.convert(One(SAGEConv(F, 2, normalize=True)).double())
    trained = One(GINConv(nn.Sequential(nn.Linear(F, 4)), train_eps=True)).double()
    with pytest.raises(errors.UnsupportedLayerError, match=r"train_eps=True"):
        ntbridge.ntk(trained, data())
    ntbridge.empirical_ntk(trained, data())  # the finite model's kernel works
    with pytest.raises(errors.InputError, match=r"pass x1 as a Data"):
        ntbridge.ntk(GCN().double(), data().x)
    with pytest.raises(errors.InputError, match=r"x1 is a PyTorch Geometric Data, but"):
        ntbridge.ntk(nn.Sequential(nn.Linear(F, 2)).double(), data())
    class Correlated(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = GCNConv(F, 4)

        def forward(self, x, edge_index):
            h = self.conv(x, edge_index)
            return h + h.relu()

    with pytest.raises(errors.UnsupportedLayerError, match=r"correlated"):
        ntbridge.ntk(Correlated().double(), data())

    class WholeData(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = GCNConv(F, 4)

        def forward(self, data):
            return self.conv(data.x, data.edge_index)

    with pytest.raises(errors.UnsupportedLayerError, match=r"forward takes the Data's tensors"):
        ntbridge.ntk(WholeData().double(), data())
    with pytest.raises(errors.InputError, match=r"x2 is Tensor"):
        ntbridge.ntk(GCN().double(), data(), data().x)
