"""Graph aggregation ``h @ A.T`` with the adjacency a buffer of the model (dense or torch.sparse):
the kernel of a per-node Linear followed by aggregation against torch.func's exact NTK, forwards,
Monte-Carlo of a wide 2-layer graph network with a pooled head, refusals, programs keyed by the
adjacency. Each example's own adjacency given to ``forward(x, adjacency)``: the buffer's kernels
when every example has the same graph, one graph at a time on the diagonal, torch.func's empirical
NTK, Monte-Carlo, gradients in the adjacency, tiles, sparse inputs, refusals."""

import pytest
import torch
from torch import nn

import ntbridge
from ntbridge import errors

from helpers import assert_forwards_match, assert_linear_kernels
from montecarlo import assert_within_standard_error, check_architecture, sample_kernels

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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_forwards_match_torch(dtype):
    assert_forwards_match([Aggregated(fn, sparse=sparse) for fn, sparse in FORMS.values()],
                          [_x(dtype=dtype) for _ in FORMS])


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

    with pytest.raises(errors.ConversionError, match=r"computes with forward's second input 'adj'.*"
                                                     r"normalise it before"):
        ntbridge.convert(SecondInput())
    with pytest.raises(errors.ShapeError, match=r"adjacency @ h aggregates node features \(N, 6, "
                                                r"C\), nodes first, got \(3, 4, 6\)"):
        ntbridge.nngp(Aggregated(lambda h, m: m.adj @ h).double(), _x())
    model = Aggregated(lambda h, m: h @ m.adj.T).double()
    model.adj = nn.Parameter(adjacency())
    with pytest.raises(errors.UnsupportedLayerError, match="uses the tensor 'adj' directly"):
        ntbridge.convert(model)
    with pytest.raises(errors.ShapeError, match=r"inputs of 5 nodes along the last axis, for an "
                                                r"adjacency of 6"):
        ntbridge.nngp(Aggregated(lambda h, m: h @ m.adj.T).double(), _x()[..., :5])


# ---------------------------------------------------- each example's own graph: forward(x, adjacency)

FORMS_3D = {  # (form, whether it aggregates with the adjacency transposed)
    "h @ a.transpose(-1, -2)": lambda h, a: h @ a.transpose(-1, -2),
    "h @ a.mT": lambda h, a: h @ a.mT,
    "h @ a": lambda h, a: h @ a,
}
ONLY_PER_EXAMPLE = {
    "torch.bmm(h, a.permute(0, 2, 1))": lambda h, a: torch.bmm(h, a.permute(0, 2, 1)),
    "h.matmul(torch.transpose(a, 1, 2))": lambda h, a: h.matmul(torch.transpose(a, 1, 2)),
}


class PerExample(nn.Module):
    """GraphNet's two rounds with ``form(h, adjacency)``, each example's adjacency an input."""

    def __init__(self, form=FORMS_3D["h @ a.mT"], width=8):
        super().__init__()
        torch.manual_seed(0)
        self.node1, self.node2 = nn.Conv1d(2, width, 1), nn.Conv1d(width, width, 1)
        self.head, self.form = nn.Linear(width, 256 if width > 8 else 2), form

    def forward(self, x, adjacency):
        h = torch.relu(self.form(self.node1(x), adjacency))
        h = torch.relu(self.form(self.node2(h), adjacency))
        return self.head(h.mean(-1))


class Shared(PerExample):
    """The same with one adjacency for every example, a buffer."""

    def __init__(self, form, a):
        super().__init__(form)
        self.register_buffer("adj", a)

    def forward(self, x):
        return super().forward(x, self.adj)


def _graph_inputs(n, seed=0, v=4):
    """``(x (n, 2, v), adjacencies (n, v, v))``, non-symmetric, float64."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n, 2, v, generator=gen, dtype=torch.float64),
            torch.rand(n, v, v, generator=gen, dtype=torch.float64))


def _close(a, b, rtol=1e-12):
    """Equal up to rounding: float64's, relative to the largest entry."""
    assert (a - b).abs().max() <= rtol * b.abs().max(), (a - b).abs().max()


@pytest.mark.slow
@pytest.mark.parametrize("name", FORMS_3D)
def test_one_graph_for_every_example_is_the_buffers_kernel(name):
    (x1, a), (x2, _) = _graph_inputs(3), _graph_inputs(2, seed=1)
    one = a[0]
    mine = ntbridge.kernel(PerExample(FORMS_3D[name]).double(), (x1, one.expand(3, 4, 4)),
                           (x2, one.expand(2, 4, 4)))
    buffer = ntbridge.kernel(Shared(FORMS_3D[name], one).double(), x1, x2)
    _close(mine.nngp, buffer.nngp)
    _close(mine.ntk, buffer.ntk)


@pytest.mark.slow
def test_each_example_pairs_with_its_own_graph():
    """The diagonal is each example with its own graph alone; other spellings agree."""
    x, a = _graph_inputs(3)
    k = ntbridge.kernel(PerExample().double(), (x, a))
    for i in range(3):
        alone = ntbridge.kernel(Shared(FORMS_3D["h @ a.mT"], a[i]).double(), x[i:i + 1])
        _close(k.nngp[i, i], alone.nngp[0, 0])
        _close(k.ntk[i, i], alone.ntk[0, 0])
    for form in ONLY_PER_EXAMPLE.values():
        other = ntbridge.kernel(PerExample(form).double(), (x, a))
        _close(other.nngp, k.nngp)
        _close(other.ntk, k.ntk)


def test_empirical_ntk_is_torch_funcs():
    """The converted forward and its empirical NTK against torch.func's Jacobians of the model."""
    model = PerExample().double()
    x, a = _graph_inputs(3)
    params = dict(model.named_parameters())
    jac = torch.func.jacrev(lambda p: torch.func.functional_call(model, p, (x, a)))(params)
    exact = sum(torch.einsum("nop,mop->nm", j.flatten(2), j.flatten(2)) for j in jac.values()) / 2
    _close(ntbridge.empirical_ntk(model, (x, a)), exact)


@pytest.mark.slow
@pytest.mark.parametrize("parameterization", ["standard", "ntk"])
def test_per_example_graph_network_matches_monte_carlo(parameterization):
    model = PerExample(width=256).double()
    inputs = _graph_inputs(3)
    nngp, ntk = sample_kernels(model, inputs, 100, parameterization, chunk=50, ntk_outputs=2)
    k = ntbridge.kernel(model, inputs, parameterization=parameterization)
    assert_within_standard_error(nngp, k.nngp, "NNGP")
    assert_within_standard_error(ntk, k.ntk, f"NTK ({parameterization})")


@pytest.mark.slow
def test_kernels_differentiate_in_the_features_and_the_adjacency():
    """Autograd against central differences along a random direction (float64: the differences'
    error is O(h^2) of a smooth map, far below the 1e-7 relative tolerance)."""
    model = PerExample().double()
    x, a = _graph_inputs(3)
    x.requires_grad_(), a.requires_grad_()
    ntbridge.ntk(model, (x, a)).sum().backward()
    gen, h = torch.Generator().manual_seed(2), 1e-5
    dx, da = (torch.randn(t.shape, generator=gen, dtype=t.dtype) for t in (x, a))
    f = lambda s: ntbridge.ntk(model, (x.detach() + s * dx, a.detach() + s * da)).sum()
    numeric = (f(h) - f(-h)) / (2 * h)
    analytic = (x.grad * dx).sum() + (a.grad * da).sum()
    assert abs(numeric - analytic) <= 1e-7 * abs(analytic)


@pytest.mark.slow
def test_tiles_and_sparse_adjacencies_give_the_same_kernel():
    model = PerExample().double()
    x, a = _graph_inputs(5)
    whole = ntbridge.kernel(model, (x, a))
    tiled = ntbridge.kernel(model, (x, a), batch_size=2)
    _close(tiled.nngp, whole.nngp)
    _close(tiled.ntk, whole.ntk)
    sparse = ntbridge.kernel(model, (x, a.to_sparse()))
    assert torch.equal(sparse.nngp, whole.nngp) and torch.equal(sparse.ntk, whole.ntk)


def test_graph_inputs_refusals_say_what_to_pass():
    model = PerExample().double()
    x, a = _graph_inputs(3)
    with pytest.raises(errors.InputError, match=r"forward\(x, adjacency\): pass x1=\(x, adjacency\)"):
        ntbridge.ntk(model, x)
    with pytest.raises(errors.InputError, match=r"x2 is Tensor; .* pair of tensors"):
        ntbridge.ntk(model, (x, a), x)
    with pytest.raises(errors.ShapeError, match=r"adjacencies \(N, V, V\), got x \(3, 2, 4\) and "
                                                r"adjacency \(3, 3, 4\)"):
        ntbridge.ntk(model, (x, a[:, :3]))
    with pytest.raises(errors.InputError, match="the model's forward takes one tensor"):
        ntbridge.ntk(nn.Sequential(nn.Flatten(), nn.Linear(8, 1)).double(), (x, a))
    with pytest.raises(errors.UnsupportedLayerError, match=r"write every aggregation in one "
                                                           r"layout"):
        ntbridge.convert(PerExample(lambda h, a: a @ h @ a.mT))
    with pytest.raises(errors.ConversionError, match=r"normalise it before passing it"):
        ntbridge.convert(PerExample(lambda h, a: h @ (a / a.sum(-1, keepdim=True))))

    class Three(nn.Module):
        def forward(self, x, a, b):
            return x

    with pytest.raises(errors.ConversionError, match="takes 3 inputs"):
        ntbridge.convert(Three())
