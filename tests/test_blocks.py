"""Tiles computed in cache-sized blocks (ntbridge.tiling.blocks) equal the kernel in one piece."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ntbridge
from ntbridge import analytic, programs, stax
from ntbridge.errors import InputError
from ntbridge.specs import Analytic
from ntbridge.stax import covariances
from ntbridge.stax.kernel import jax_kernel_dtype
from ntbridge.tiling import blocks


def _cnn(head: str, convs: int = 2) -> nn.Sequential:
    """Two convolutions (or the first one alone: a cheaper program) and an average pooling, for
    inputs (N, 2, 6, 6)."""
    side = 3 if convs == 2 else 4
    tail = ([nn.Flatten(), nn.Linear(4 * side * side, 3)] if head == "Flatten" else
            [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3)])
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(),
                         *([nn.Conv2d(4, 4, 3), nn.ReLU()] if convs == 2 else []),
                         nn.AvgPool2d(2, padding=1), *tail)


def _analytic(graph, shape, platform=None):
    """The analytic task's ``(fn, args)`` for float64 inputs of ``shape`` (call it in x64 mode:
    its args, the layers' hyper-parameters, are float64 scalars)."""
    task = analytic.task(Analytic(), graph, jax.ShapeDtypeStruct(shape, jnp.float64), None,
                         platform)[0]
    return task.fn, task.args


def _both(fn):
    """One program of ``fn`` with x2 given and with x2 = None: ``[fn(args, x1, x2), fn(args, x1,
    None)]`` (one compilation instead of two)."""
    return jax.jit(lambda args, x1, x2: [fn(args, x1, b) for b in (x2, None)])


MODELS = {
    "FC": (lambda: nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 16), nn.GELU(),
                                 nn.Linear(16, 2)), (5,)),
    "CNN Flatten": (lambda: _cnn("Flatten", convs=1), (2, 6, 6)),
    "CNN GAP": (lambda: _cnn("GAP", convs=1), (2, 6, 6)),
    "Encoder": (lambda: nn.Sequential(nn.Linear(8, 8), nn.TransformerEncoderLayer(
        8, 2, 16, batch_first=True).eval()), (4, 8)),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_blocks_give_the_kernel_in_one_piece(name, monkeypatch):
    """Blocks of 3 examples (the last one overlapping the one before), x2 given or not, float64:
    the blocked tile equals the whole within rounding, and with x2 = None it is exactly symmetric
    (the blocks below the diagonal are transposes, those on it symmetrized); the encoder's kernels
    keep their token pairs (N1, N2, T, T)."""
    make, shape = MODELS[name]
    graph = ntbridge.convert(make().double(), parameterization="ntk", attention="linear")
    perm = analytic.perm_of(graph.network)
    rng = np.random.default_rng(0)
    x1, x2 = rng.standard_normal((10, *shape)), rng.standard_normal((7, *shape))
    pair_bytes = lambda a1: blocks.BLOCK_BYTES // (blocks.LIVE_ARRAYS * 9)  # blocks of 3
    with jax.enable_x64(True):
        whole, args = _analytic(graph, x1.shape)
        blocked = blocks.in_blocks(whole, pair_bytes, perm)
        results = (_both(f)(args, x1, x2) for f in (whole, blocked))
        for b, expected, got in zip((x2, None), *results):
            for e, g in zip(expected, got):
                e, g = np.asarray(e), np.asarray(g)
                assert g.shape == e.shape
                np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-12 * np.abs(e).max())
                if b is None:
                    assert (g == g.transpose(perm(g.ndim))).all()


@pytest.mark.slow
def test_requests_are_blocked_on_cpu_and_symmetric():
    """ntbridge.kernel's analytic task is blocked on CPUs; the result with x2 = None is exactly
    symmetric and equals the unblocked kernel_fn."""
    torch.manual_seed(0)
    model = _cnn("GAP", convs=1).double()
    x = torch.randn(16, 2, 6, 6, dtype=torch.float64)  # 3 blocks a side, of 6 (one overlapping)
    k = ntbridge.kernel(model, x)
    with jax.enable_x64(True):
        reference = ntbridge.convert(model).kernel_fn(jax.numpy.asarray(x.numpy()))
    for got, expected in zip(k, reference):
        assert torch.equal(got, got.T)
        np.testing.assert_allclose(got.numpy(), np.asarray(expected), rtol=1e-12)


def test_training_dropout_is_not_tiled_with_itself():
    """Training-mode Dropout's kernel of x1 with itself has same-example terms on its diagonal:
    diagonal tiles computed from two copies of the examples would miss them, so the kernel is one
    tile (an explicit smaller batch_size is refused); with x2 given, tiles are fine."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 1)).train()
    x, y = torch.randn(10, 3), torch.randn(6, 3)
    whole = ntbridge.nngp(model, x, batch_size=0)
    assert torch.equal(ntbridge.nngp(model, x), whole)
    assert not torch.allclose(whole, ntbridge.nngp(model, x, x.clone()))  # the Dropout terms
    with pytest.raises(InputError, match="batch_size=3.*Dropout"):
        ntbridge.nngp(model, x, batch_size=3)
    torch.testing.assert_close(ntbridge.nngp(model, x, y, batch_size=3),
                               ntbridge.nngp(model, x, y, batch_size=0))


@pytest.mark.slow
def test_gradients_through_blocks(monkeypatch):
    """Gradients of a blocked kernel (x2 = None: blocks above the diagonal and their transposes)
    equal those of the kernel in one piece."""
    torch.manual_seed(0)
    model = _cnn("GAP", convs=1).double()
    x = torch.randn(9, 2, 6, 6, dtype=torch.float64)
    weights = torch.randn(9, 9, dtype=torch.float64)
    grads = []
    monkeypatch.setenv("NTBRIDGE_CACHE_DIR", "off")  # its keys do not hold the block size
    for block_bytes in (blocks.BLOCK_BYTES, 2 ** 40):  # blocks of 5 examples; one block
        monkeypatch.setattr(blocks, "BLOCK_BYTES", block_bytes)
        ntbridge.programs.clear()
        x1 = x.clone().requires_grad_()
        (ntbridge.ntk(model, x1) * weights).sum().backward()
        grads.append(x1.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-10, atol=1e-12)


def test_per_example_data_goes_with_its_blocks(monkeypatch):
    """in_blocks hands each block its examples' rows of per_example's data (squared norms here, the
    blocks squared distances), x2 given or not; blocks of more than SHARED_UP_TO examples compute
    it themselves."""
    norms = lambda a: (a * a).sum(1)

    def fn(args, a1, a2, known=None):
        n1, n2 = (norms(a1), norms(a2)) if known is None else known
        return n1[:, None] + n2[None, :] - 2 * a1 @ a2.T

    rng = np.random.default_rng(0)
    x1, x2 = rng.standard_normal((150, 4)), rng.standard_normal((100, 4))
    for size, shared in ((3, True), (2 * blocks.SHARED_UP_TO, False)):  # x1: 2 blocks of 75
        monkeypatch.setattr(blocks, "block_size", lambda pair_bytes: size)
        sides = []
        per_example = lambda args, a: sides.append(a.shape) or norms(a)
        blocked = jax.jit(blocks.in_blocks(fn, lambda a1: 8, lambda ndim: (1, 0), per_example))
        with jax.enable_x64(True):
            for b in (x2, None):
                other = x1 if b is None else b
                expected = ((x1[:, None] - other[None]) ** 2).sum(-1)
                np.testing.assert_allclose(blocked(None, x1, b), expected, rtol=1e-12, atol=1e-12)
        assert sides == ([(size, 4)] * 3 if shared else [])  # x1 and x2; x1 once with x2 = None


class ConvResidual(nn.Module):
    """h = conv(x); h = h + conv2(relu(conv1(h))); a LayerNorm; global average pooling."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Conv2d(2, 4, 3, padding=1)
        self.conv1, self.conv2 = nn.Conv2d(4, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1)
        self.norm = nn.LayerNorm((4, 6, 6))
        self.conv3 = nn.Conv2d(4, 4, 3, padding=1)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))

    def forward(self, x):
        h = self.inp(x)
        h = h + self.conv2(F.relu(self.conv1(h)))
        return self.head(F.relu(self.conv3(self.norm(h))))


class DenseResidual(nn.Module):
    """A residual MLP with LayerNorm: vectors, no spatial axes."""

    def __init__(self):
        super().__init__()
        self.inp, self.out = nn.Linear(5, 16), nn.Linear(16, 2)
        self.fc1, self.fc2, self.norm = nn.Linear(16, 16), nn.Linear(16, 16), nn.LayerNorm(16)

    def forward(self, x):
        h = self.inp(x)
        h = self.norm(h + self.fc2(F.gelu(self.fc1(h))))
        return self.out(F.relu(h))


@pytest.mark.slow
@pytest.mark.parametrize("make, shape", [(ConvResidual, (2, 6, 6)), (DenseResidual, (5,))])
def test_own_covariances_computed_once_per_tile(make, shape, monkeypatch):
    """Blocks of 3 examples that take their covariances with themselves from one pass over the
    tile's examples (CPU tasks) equal the kernel in one piece, x2 given or not, float64: residual
    sums and LayerNorm included."""
    torch.manual_seed(0)
    graph = ntbridge.convert(make().double(), parameterization="ntk")
    monkeypatch.setattr(blocks, "block_size", lambda pair_bytes: 3)
    rng = np.random.default_rng(0)
    x1, x2 = rng.standard_normal((10, *shape)), rng.standard_normal((7, *shape))
    with jax.enable_x64(True):
        whole, args = _analytic(graph, x1.shape)
        blocked = _analytic(graph, x1.shape, "cpu")[0]
        for expected, got in zip(*(_both(f)(args, x1, x2) for f in (whole, blocked))):
            for e, g in zip(expected, got):
                e, g = np.asarray(e), np.asarray(g)
                np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-12 * np.abs(e).max())


@pytest.mark.slow
def test_own_covariances_replace_those_of_every_node_output():
    """A dag hook puts the examples' own covariances in place of those its layers compute, in each
    kernel of a layer with several outputs too (FanOut, parallel): the kernels are unchanged."""
    net = stax.serial(stax.Dense(4, 8, W_std=1.5, b_std=0.1), stax.FanOut(2),
                      stax.parallel(stax.serial(stax.Relu(), stax.Dense(8, 8, W_std=1.5, b_std=0.)),
                                    stax.Identity()),
                      stax.FanInSum(), stax.Erf(), stax.Dense(8, 1, W_std=1.5, b_std=0.1))
    rng = np.random.default_rng(0)
    with jax.enable_x64(True):
        x1, x2 = jnp.asarray(rng.standard_normal((5, 4))), jnp.asarray(rng.standard_normal((3, 4)))
        own = jax.jit(jax.vmap(lambda x: covariances.own_covariances(net, x, diagonal_spatial=True)))
        covs1, covs2 = own(x1), own(x2)
        assert isinstance(covs1[2], tuple)  # the parallel layer's two outputs
        k = stax.input_kernel(x1, x2, compute_ntk=True, diagonal_spatial=True)
        hooked = jax.jit(lambda k, c1, c2: net.kernel_fn(
            k, after=covariances.with_covariances(c1, c2)))(k, covs1, covs2)
        plain = jax.jit(net.kernel_fn)(k)
        for name in ("nngp", "ntk", "cov1", "cov2"):
            np.testing.assert_allclose(getattr(hooked, name), getattr(plain, name), rtol=1e-13)


@pytest.mark.slow
def test_blocks_compute_no_covariances_of_their_own():
    """XLA's flop count of a block of s1 x s2 examples (the program as traced: counting needs no
    compile) is alpha s1 s2 + beta (s1 + s2) + gamma: work per pair, per example and per block.
    Given its examples' own covariances, the block keeps its pairs' work and drops its examples'
    (beta: their covariances at every layer) but for reading their variances; at s = 3 the block
    then costs about a quarter less (measured 0.29 traced, 0.27 compiled)."""
    graph = ntbridge.convert(_cnn("GAP").double(), parameterization="ntk")
    own = jax.vmap(lambda x: covariances.own_covariances(graph.network, x, False))

    def flops(s1, s2, given):
        a, b = (jax.ShapeDtypeStruct((n, 2, 8, 8), jnp.float64) for n in (s1, s2))
        block = lambda args, a, b, covs: fn(args, a, b, covs if given else None)
        covs = jax.eval_shape(own, a), jax.eval_shape(own, b)
        return jax.jit(block).lower(args, a, b, covs).cost_analysis()["flops"]

    with jax.enable_x64(True):
        fn, args = _analytic(graph, (1, 2, 8, 8))
        terms = {}
        for given in (False, True):
            f = {(s1, s2): flops(s1, s2, given) for s1, s2 in ((2, 2), (2, 3), (3, 3))}
            alpha = f[3, 3] - 2 * f[2, 3] + f[2, 2]
            beta = f[2, 3] - f[2, 2] - 2 * alpha
            terms[given] = alpha, beta, f[3, 3]
    (alpha, beta, plain), (alpha_given, beta_given, given) = terms[False], terms[True]
    assert alpha_given == pytest.approx(alpha, rel=0.01)
    assert 0 <= beta_given < 0.05 * beta
    assert 1 - given / plain == pytest.approx(2 * 3 * beta / plain, rel=0.05)
    assert 0.2 < 1 - given / plain < 0.35


def test_blocks_are_as_equal_as_they_can_be():
    """balanced(n, size): the fewest blocks of at most ``size`` examples covering ``n``, padded by
    less than one row per block (a tile of 512 in blocks of at most 362: two of 256)."""
    for n in range(1, 300):
        for size in range(1, 70):
            side = blocks.balanced(n, size)
            count = -(-n // side)
            assert side <= size and count == -(-n // size)
            assert count * side - n < count
    assert blocks.balanced(512, 362) == 256


def test_a_pairs_bytes_are_its_kernels_positions():
    # blocks are sized by the kernel of the inputs in the layout the network reads: the positions
    # (or pairs of positions) of channels-first images, the token pairs of sequences (N, T, d) and
    # of token ids (N, T), in the kernels' dtype
    f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    network = lambda model: ntbridge.convert(model).network
    flat = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(256, 3))
    assert analytic._pair_bytes(network(flat), f32(5, 2, 8, 8)) == 4 * 64
    assert analytic._pair_bytes(network(_cnn("GAP")), f32(5, 2, 8, 8)) == 4 * 64 ** 2
    layer = lambda: nn.TransformerEncoderLayer(8, 2, 16, batch_first=True).eval()
    assert analytic._pair_bytes(network(layer()), f32(5, 6, 8)) == 4 * 36
    ids = jax.ShapeDtypeStruct((5, 6), jnp.int32)
    ids_kernel = jax_kernel_dtype(ids.dtype).itemsize  # the widest float enabled
    encoder = network(nn.Sequential(nn.Embedding(10, 8), layer()))
    assert analytic._pair_bytes(encoder, ids) == ids_kernel * 36


def test_a_pairs_bytes_are_traced_once_per_architecture_and_shape(monkeypatch):
    # the trace costs milliseconds, more than a small kernel's call: kept per architecture,
    # example shape and kernel dtype (token ids' kernels follow JAX's x64 mode)
    traced = []
    programs.clear()
    monkeypatch.setattr(analytic, "_pair_bytes", lambda network, a1: traced.append(a1) or 7)
    graph = lambda: ntbridge.convert(nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 2)))
    ids = jax.ShapeDtypeStruct((5, 6), jnp.int32)
    assert analytic._pair_bytes_of(graph(), ids) == 7
    assert analytic._pair_bytes_of(graph(), jax.ShapeDtypeStruct((9, 6), jnp.int32)) == 7
    assert len(traced) == 1  # a fresh model of the same architecture, another batch size
    analytic._pair_bytes_of(graph(), jax.ShapeDtypeStruct((5, 4), jnp.int32))
    with jax.enable_x64(not jax.config.jax_enable_x64):
        analytic._pair_bytes_of(graph(), ids)
    assert len(traced) == 3


@pytest.mark.parametrize("symmetric", [True, False])
def test_the_program_does_not_grow_with_the_examples(symmetric):
    """The loop finds each block from the one before: no table of the blocks (a constant of the
    program, gigabytes at ten million examples) grows with the square of the examples."""
    fn = lambda args, a1, a2: a1 @ (a1 if a2 is None else a2).T
    blocked = blocks.in_blocks(fn, lambda a1: 4, lambda ndim: (1, 0))  # blocks of 362 at most

    def size(n):
        a = jax.ShapeDtypeStruct((n, 3), jnp.float32)
        return len(jax.jit(blocked).lower(None, a, None if symmetric else a).as_text())

    assert size(20_000) < 1.05 * size(2_000)  # 1596 blocks or 56 x 56 vs 21 or 6 x 6
