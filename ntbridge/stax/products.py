"""Products of branches: ``a * b * ...`` of same-shape outputs (Neural Tangents' ``FanInProd``).

When the factors are independent processes in the infinite-width limit (each starts with weight
layers of its own after the inputs they share, e.g. ``F.silu(fc1(x)) * fc2(x)``; ``ntbridge.convert``
refuses products of dependent factors), the expectation of a product is the product of
expectations: ``E[a(x) b(x) a(x') b(x')] = E[a a'] E[b b']``. So ``K = prod_i K_i`` entrywise,
every position pair and both layouts alike, and the NTK follows by the product rule,
``ntk = sum_i ntk_i prod_{j != i} K_j`` (the gradients of different factors are orthogonal in the
limit). Every factor's channels must be identically distributed, so that the product of the
channel averages is the average of the products (``ntbridge.convert`` checks it). The product is
not Gaussian: it feeds affine layers (or anything not needing a Gaussian input).
"""

from __future__ import annotations

import math

from .combinators import same_shapes
from .kernel import Kernel
from .layers import Layer


def product_kernels(ks: tuple[Kernel, ...]) -> Kernel:
    """The kernel of the product of independent factors with kernels ``ks`` (see module doc)."""
    same_shapes([k.shape1 for k in ks])
    nngps = [k.nngp for k in ks]
    ntk = None
    if all(k.ntk is not None for k in ks):
        ntk = sum(k.ntk * math.prod(nngps[:i] + nngps[i + 1:]) for i, k in enumerate(ks))
    return ks[0].replace(nngp=math.prod(nngps), ntk=ntk, cov1=math.prod(k.cov1 for k in ks),
                         cov2=math.prod(k.cov2 for k in ks), is_gaussian=False)


def FanInProd() -> Layer:
    """The elementwise product of a tuple of same-shape inputs, ``(N, C, *S)`` each.

    Example:
        >>> gate = dag([Dense(4, 8, W_std=1., b_std=0.), Relu(), Dense(4, 8, W_std=1., b_std=0.),
        ...             FanInProd()], [(INPUT,), (0,), (INPUT,), (1, 2)])   # relu(W1 x) * (W2 x)
    """

    def init_fn(key, shapes):
        same_shapes(shapes)
        return tuple(shapes[0]), {}

    return Layer(init_fn, lambda params, xs: math.prod(xs[1:], start=xs[0]), product_kernels)
