"""The ``Kernel`` record that flows through a network's ``kernel_fn``, and the kernel of the inputs.

Shapes (torch layout, channels first; the channel axis is averaged out):

* ``nngp``, ``ntk``: ``(N1, N2)`` for vectors; for inputs ``(N, C, *S)`` with spatial shape ``S``,
  ``(N1, N2, *S)`` when ``diagonal_spatial`` (the covariance of each position with itself) or
  ``(N1, N2, S1, S1', S2, S2', ...)`` (every pair of positions, axes interleaved) otherwise.
* ``cov1``, ``cov2``: each example's covariance with itself, ``(N1, ...)`` and ``(N2, ...)``, with
  the same spatial part as ``nngp``.

Sequences ``(N, T, d)`` (``tokens``: features last, as torch's ``batch_first`` layers and per-token
layers use them) have the token axis as their one spatial axis: ``(N1, N2, T, T')`` for every pair
of tokens, as Neural Tangents' ``channel_axis=-1`` layers keep it.
"""

from __future__ import annotations

import dataclasses
import string
from typing import Any

import jax
import jax.numpy as jnp

from ..errors import ShapeError

_DESCRIBED = {"nngp", "ntk", "cov1", "cov2", "shape1", "shape2", "diagonal_spatial", "tokens"}


@dataclasses.dataclass(frozen=True)
class Kernel:
    """NNGP and NTK of one layer's outputs, plus what the next layer's rule needs to know.

    Attributes:
      nngp: covariance of the outputs for x1 against x2, per channel.
      ntk: the neural tangent kernel, or None when only the NNGP is wanted.
      cov1, cov2: covariance of each x1 (x2) example with itself.
      shape1, shape2: shapes of the layer's outputs for x1 and x2, ``(N, C, *S)``.
      x1_is_x2: whether x2 is x1 (the kernels are then symmetric).
      is_gaussian: whether the outputs are Gaussian in the infinite-width limit (after an affine
        layer, not after a nonlinearity); closed-form nonlinearity rules need it.
      diagonal_spatial: whether only same-position covariances are kept (see module doc).
      tokens: whether the outputs are sequences ``(N, T, d)``, features last (see module doc).
      replicate: for layers whose rule is a numerical expectation with independent replicates
        (attention's, ``softmax_moments.py``), the one replicate to use alone (an integer scalar;
        None: all of them), so that a network's kernel can be computed once per replicate and
        its error estimated from their spread (``covariances.evaluate_error``).
      ids1, ids2: the token ids ``(N1, T)``, ``(N2, T)`` when this is the kernel of a model's
        input ids (None otherwise): what per-example masks (``key_padding_mask``) are made of.
      sources: how non-Gaussian outputs are made of Gaussian sources (``stax.sources.Sources``).
      blocks: a concatenation's kernels, one per block of its channels (``stax.channel_blocks``).
      sampling: the network's rule of their expectations (``Layer.sampling``; None: default).
      adjacency1, adjacency2: each example's graph ``(N1, V, V)``, ``(N2, V, V)`` when this is the
        kernel of a graph model's inputs (``stax.aggregation.node_features_kernel``; None otherwise): what
        per-example aggregations (``stax.aggregation.InputAggregate``) weigh the nodes with.
    """

    nngp: jax.Array
    ntk: jax.Array | None
    cov1: jax.Array
    cov2: jax.Array
    shape1: tuple[int, ...]
    shape2: tuple[int, ...]
    x1_is_x2: bool
    is_gaussian: bool
    diagonal_spatial: bool
    tokens: bool = False
    replicate: jax.Array | None = None
    ids1: jax.Array | None = None
    ids2: jax.Array | None = None
    adjacency1: jax.Array | None = None
    adjacency2: jax.Array | None = None
    sources: Any = None
    sampling: Any = None
    blocks: tuple[Kernel, ...] | None = None

    def replace(self, **changes) -> "Kernel":
        """A copy with ``changes``; changing kernels or shapes drops ``sources`` and ``blocks``
        unless given (a layer without a rule for them makes outputs they do not describe)."""
        dropped = {"sources": None, "blocks": None} if _DESCRIBED.intersection(changes) else {}
        return dataclasses.replace(self, **{**dropped, **changes})

    @property
    def spatial_shape(self) -> tuple[int, ...]:
        return self.shape1[1:-1] if self.tokens else self.shape1[2:]

    @property
    def channel_axis(self) -> int:
        """The axis of the outputs' channels: 1, or the last of sequences (``tokens``)."""
        return len(self.shape1) - 1 if self.tokens else 1

    def position(self, axis: int) -> int:
        """Which spatial dimension (of :attr:`spatial_shape`) the outputs' ``axis`` is."""
        return axis - 1 if self.tokens else axis - 2


jax.tree_util.register_dataclass(
    Kernel,
    data_fields=["nngp", "ntk", "cov1", "cov2", "replicate", "ids1", "ids2", "adjacency1",
                 "adjacency2", "sources", "blocks"],
    meta_fields=["shape1", "shape2", "x1_is_x2", "is_gaussian", "diagonal_spatial", "tokens",
                 "sampling"],
)


def _spatial_letters(ndim: int) -> tuple[str, str]:
    """Einsum letters for ``ndim`` spatial axes of x1 and of x2."""
    letters = string.ascii_lowercase[8:]  # leave a-h for batch and channel axes
    return letters[:ndim], letters[ndim:2 * ndim]


def _covariance(x: jax.Array, y: jax.Array, *, batch_pairs: bool, diagonal_spatial: bool):
    """Channel-averaged covariance of x ``(N, C, *S)`` with y ``(M, C, *S)``."""
    s, t = _spatial_letters(x.ndim - 2)
    if diagonal_spatial:
        t = s
    out_spatial = s if diagonal_spatial else "".join(a + b for a, b in zip(s, t))
    batch_y = "b" if batch_pairs else "a"
    out_batch = "ab" if batch_pairs else "a"
    expr = f"ac{s},{batch_y}c{t}->{out_batch}{out_spatial}"
    return jnp.einsum(expr, x, y, precision=jax.lax.Precision.HIGHEST) / x.shape[1]


def jax_kernel_dtype(input_dtype) -> jnp.dtype:
    """The JAX dtype of the kernels of JAX inputs of ``input_dtype``: the inputs' own for floats; for
    token ids, the widest float JAX has enabled (float64 in x64 mode, else float32). The torch
    side's rule, which validates the user's tensors: :func:`ntbridge.dlpack.torch_kernel_dtype`."""
    if jnp.issubdtype(input_dtype, jnp.floating):
        return jnp.dtype(input_dtype)
    return jax.dtypes.canonicalize_dtype(jnp.float64)


def input_kernel(x1: jax.Array, x2: jax.Array | None, *, compute_ntk: bool,
                 diagonal_spatial: bool) -> Kernel:
    """The kernel of the raw inputs: ``x1 @ x2.T / C`` (per position for spatial inputs).

    Args:
      x1: ``(N1, C)`` or ``(N1, C, *S)``.
      x2: ``(N2, ...)`` with the same trailing shape, or None for x2 = x1.
      compute_ntk: whether the result carries an NTK (zero for the inputs: they have no parameters).
      diagonal_spatial: keep only same-position covariances.
    """
    x1_is_x2 = x2 is None
    x2 = x1 if x2 is None else x2
    cov = lambda x: _covariance(x, x, batch_pairs=False, diagonal_spatial=diagonal_spatial)
    nngp = _covariance(x1, x2, batch_pairs=True, diagonal_spatial=diagonal_spatial)
    cov1 = cov(x1)
    return Kernel(
        nngp=nngp,
        ntk=jnp.zeros_like(nngp) if compute_ntk else None,
        cov1=cov1,
        cov2=cov1 if x1_is_x2 else cov(x2),
        shape1=tuple(x1.shape), shape2=tuple(x2.shape),
        x1_is_x2=x1_is_x2, is_gaussian=False, diagonal_spatial=diagonal_spatial)


def sequence_kernel(x1: jax.Array, x2: jax.Array | None, *, compute_ntk: bool,
                    diagonal_spatial: bool) -> Kernel:
    """The kernel of sequences ``(N, T, d)``: ``x1[n, t] . x2[m, t'] / d`` for every token pair
    (only ``t = t'`` when ``diagonal_spatial``).

    Example:
        >>> sequence_kernel(jnp.ones((2, 5, 3)), None, compute_ntk=False,
        ...                 diagonal_spatial=False).nngp.shape
        (2, 2, 5, 5)
    """
    if x1.ndim != 3:
        raise ShapeError(f"sequence models take inputs (N, T, features), got {tuple(x1.shape)}")
    swap = lambda x: None if x is None else jnp.swapaxes(x, 1, 2)
    k = input_kernel(swap(x1), swap(x2), compute_ntk=compute_ntk, diagonal_spatial=diagonal_spatial)
    return k.replace(shape1=tuple(x1.shape), shape2=tuple((x1 if x2 is None else x2).shape),
                     tokens=True)


def features_last_kernel(x1: jax.Array, x2: jax.Array | None, *, compute_ntk: bool,
                         diagonal_spatial: bool) -> Kernel:
    """The kernel of inputs read features last (by ``nn.Linear``): sequences ``(N, T, d)`` keep
    their token pairs (:func:`sequence_kernel`), as torch applies the layer to each token; other
    inputs as :func:`input_kernel`.

    Example:
        >>> features_last_kernel(jnp.ones((2, 5, 3)), None, compute_ntk=False,
        ...                      diagonal_spatial=False).tokens
        True
    """
    read = sequence_kernel if x1.ndim == 3 else input_kernel
    return read(x1, x2, compute_ntk=compute_ntk, diagonal_spatial=diagonal_spatial)


def spatial_axes(n_batch: int, ndim: int, diagonal_spatial: bool) -> list[tuple[int, ...]]:
    """The axes of each spatial dimension in a kernel array with ``n_batch`` leading batch axes.

    ``(n_batch + d,)`` for diagonal layouts, the pair ``(n_batch + 2d, n_batch + 2d + 1)`` otherwise.
    """
    if diagonal_spatial:
        return [(n_batch + d,) for d in range(ndim)]
    return [(n_batch + 2 * d, n_batch + 2 * d + 1) for d in range(ndim)]


def spatial_diagonal(a: jax.Array, n_batch: int, diagonal_spatial: bool) -> jax.Array:
    """Same-position entries ``(batch..., *S)`` of a kernel array in either layout."""
    if diagonal_spatial:
        return a
    ndim = (a.ndim - n_batch) // 2
    s, _ = _spatial_letters(ndim)
    batch = "abcdefgh"[:n_batch]
    return jnp.einsum(batch + "".join(c + c for c in s) + "->" + batch + s, a)


def reshape_spatial(a: jax.Array, n_batch: int, diagonal_spatial: bool,
                    new_spatial: tuple[int, ...]) -> jax.Array:
    """A kernel array of inputs whose spatial axes were reshaped (row-major) to ``new_spatial``."""
    batch = a.shape[:n_batch]
    if diagonal_spatial:
        return a.reshape(*batch, *new_spatial)
    ndim, new = (a.ndim - n_batch) // 2, len(new_spatial)
    firsts = [n_batch + 2 * d for d in range(ndim)]
    a = jnp.transpose(a, [*range(n_batch), *firsts, *[i + 1 for i in firsts]])
    a = a.reshape(*batch, *new_spatial, *new_spatial)
    interleave = [i for d in range(new) for i in (n_batch + d, n_batch + new + d)]
    return jnp.transpose(a, [*range(n_batch), *interleave])


def _diagonal_variances(cov: jax.Array, diagonal_spatial: bool) -> jax.Array:
    """Each example's variance at each position, ``(N, *S)``, from its covariance ``cov``."""
    return spatial_diagonal(cov, 1, diagonal_spatial)


def _broadcast(v: jax.Array, batch_pairs: int | None, side: int, diagonal_spatial: bool):
    """Reshape variances ``(N, *S)`` to broadcast against a kernel entry of the pair layout.

    ``batch_pairs`` is the batch axis position (0 or 1) in an ``(N1, N2, ...)`` kernel, or None for a
    same-example ``(N, ...)`` covariance; ``side`` is 0 for the first of each spatial pair, 1 for the
    second.
    """
    shape = list(v.shape[:1])
    if batch_pairs is not None:
        shape = [v.shape[0], 1] if batch_pairs == 0 else [1, v.shape[0]]
    for size in v.shape[1:]:
        shape += [size] if diagonal_spatial else ([size, 1] if side == 0 else [1, size])
    return v.reshape(shape)


def variances(k: Kernel) -> dict[str, tuple[jax.Array, jax.Array]]:
    """For ``nngp``, ``cov1`` and ``cov2``: the variances ``(q1, q2)`` of both sides of each entry.

    Each pair broadcasts against its array, so an elementwise rule ``f(c, q1, q2)`` can be applied to
    every entry at once, whatever the spatial layout.
    """
    d = k.diagonal_spatial
    v1, v2 = (_diagonal_variances(c, d) for c in (k.cov1, k.cov2))
    return {
        "nngp": (_broadcast(v1, 0, 0, d), _broadcast(v2, 1, 1, d)),
        "cov1": (_broadcast(v1, None, 0, d), _broadcast(v1, None, 1, d)),
        "cov2": (_broadcast(v2, None, 0, d), _broadcast(v2, None, 1, d)),
    }


def swap_perm(ndim: int, diagonal_spatial: bool) -> tuple[int, ...]:
    """The axes permutation exchanging x1 and x2 in a kernel array of rank ``ndim`` (batch axes and
    each spatial pair transposed)."""
    perm = [1, 0]
    for i in range(2, ndim, 1 if diagonal_spatial else 2):
        perm += [i] if diagonal_spatial else [i + 1, i]
    return tuple(perm)


def safe_sqrt(x: jax.Array) -> jax.Array:
    """``sqrt(max(x, 0))`` whose derivative is 0 (not infinite) where ``x <= 0``.

    Kernels take square roots of variances and of ``1 - cos^2``, which vanish at zero inputs and
    on the diagonal; there, whatever multiplies the infinite derivative vanishes too (a variance is
    minimal at zero, the cosine maximal at x1 == x2), so 0 is the limit autodiff should see.

    Example:
        >>> jax.grad(safe_sqrt)(0.0)
        Array(0., dtype=float32, weak_type=True)
    """
    positive = x > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, x, 1)), 0)


def safe_reciprocal(x: jax.Array) -> jax.Array:
    """``1 / x`` where ``x`` is nonzero, else 0 (a zero scale), with finite derivatives everywhere.

    Example:
        >>> safe_reciprocal(jnp.array([2.0, 0.0]))
        Array([0.5, 0. ], dtype=float32)
    """
    nonzero = x != 0
    return jnp.where(nonzero, 1 / jnp.where(nonzero, x, 1), 0)


def map_arrays(k: Kernel, fn) -> Kernel:
    """``k`` with ``fn(array, n_batch)`` applied to nngp, ntk (2 batch axes), cov1 and cov2 (1;
    once when x2 is x1)."""
    cov1 = fn(k.cov1, 1)
    return k.replace(nngp=fn(k.nngp, 2), ntk=None if k.ntk is None else fn(k.ntk, 2), cov1=cov1,
                     cov2=cov1 if k.x1_is_x2 else fn(k.cov2, 1))
