"""Products of branches: ``a * b * ...`` of same-shape outputs (Neural Tangents' ``FanInProd``).

When the factors are independent processes in the infinite-width limit (each starts with weight
layers of its own after the inputs they share, e.g. ``F.silu(fc1(x)) * fc2(x)``; ``ntbridge.convert``
refuses products of dependent factors), the expectation of a product is the product of
expectations: ``E[a(x) b(x) a(x') b(x')] = E[a a'] E[b b']``. So ``K = prod_i K_i`` entrywise,
every position pair and both layouts alike, and the NTK follows by the product rule,
``ntk = sum_i ntk_i prod_{j != i} K_j`` (the gradients of different factors are orthogonal in the
limit). All factors but one must have identically distributed channels, so that the product of
the channel averages is the average of the products (``ntbridge.convert`` checks it). The product is
not Gaussian: it feeds affine layers (or anything not needing a Gaussian input).

A factor may have size 1 where the others have positions, a gate per channel broadcast over the
positions (squeeze-and-excitation, ``h * sigmoid(fc2(relu(fc1(pool(h)))))``): its kernels have
size-1 position axes, and the products above broadcast over them in both layouts. Each channel
keeps a gate of its own, which the next weight layer's sum over channels averages. A factor
broadcast over channels (one gate for every channel) has no rule: the channels it multiplies
would share it, and no later sum would average it out.
"""

from __future__ import annotations

import math

from ..errors import ShapeError
from .kernel import Kernel
from .layers import Layer


def broadcast(shapes) -> tuple[int, ...]:
    """The shape of the factors' product: their shapes agree but where some have size 1 (module
    doc); raises ShapeError otherwise."""
    if len({len(s) for s in shapes}) == 1 and len({s[0] for s in shapes}) == 1:
        out = tuple(max(sizes) for sizes in zip(*shapes))
        if all(d in (1, o) for s in shapes for d, o in zip(s, out)):
            return out
    raise ShapeError(f"the factors' shapes {[tuple(s) for s in shapes]} must agree, or have size "
                     f"1 where the others have positions.")


def product_kernels(ks: tuple[Kernel, ...]) -> Kernel:
    """The kernel of the product of independent factors with kernels ``ks`` (see module doc)."""
    shape1, shape2 = broadcast([k.shape1 for k in ks]), broadcast([k.shape2 for k in ks])
    axis = ks[0].channel_axis
    if any(k.shape1[axis] != shape1[axis] for k in ks):
        raise ShapeError(f"a factor of shape {min((k.shape1 for k in ks), key=lambda s: s[axis])} "
                         f"is broadcast over the channels (axis {axis}) of the others, "
                         f"{shape1}: one gate shared by every channel has no kernel rule (the "
                         f"module doc of ntbridge.stax.products says why). Give the gate one "
                         f"channel per channel it multiplies.")
    nngps = [k.nngp for k in ks]
    ntk = None
    if all(k.ntk is not None for k in ks):
        ntk = sum(k.ntk * math.prod(nngps[:i] + nngps[i + 1:]) for i, k in enumerate(ks))
    return ks[0].replace(nngp=math.prod(nngps), ntk=ntk, cov1=math.prod(k.cov1 for k in ks),
                         cov2=math.prod(k.cov2 for k in ks), shape1=shape1, shape2=shape2,
                         is_gaussian=False)


def FanInProd() -> Layer:
    """The elementwise product of a tuple of inputs ``(N, C, *S)``, some of which may have size 1
    at positions (broadcast over them, as torch does).

    Example:
        >>> gate = dag([Dense(4, 8, W_std=1., b_std=0.), Relu(), Dense(4, 8, W_std=1., b_std=0.),
        ...             FanInProd()], [(INPUT,), (0,), (INPUT,), (1, 2)])   # relu(W1 x) * (W2 x)
    """

    def init_fn(key, shapes):
        return broadcast(shapes), {}

    return Layer(init_fn, lambda params, xs: math.prod(xs[1:], start=xs[0]), product_kernels)
