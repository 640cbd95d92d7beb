"""Concatenations along channels, and elementwise functions of them.

``torch.cat([a, b], dim=1)`` of two branches' outputs has channels of two laws: its kernel is
their channel-weighted average, which is all an affine layer after it needs, but not what a
nonlinearity needs. The concatenation's kernel keeps each block's kernel (``Kernel.blocks``), and
an elementwise function ``f`` takes its rule on each block: ``f(cat(a, b)) = cat(f(a), f(b))``,
so its kernel is the blocks' kernels after ``f``, weighted by the blocks' shares of the channels.

Example:
    >>> k = concat_kernels([ka, kb], axis=1)          # ka: 8 channels, kb: 16
    >>> relu_k = per_block(k, relu.kernel_fn)         # (relu(ka) * 8 + relu(kb) * 16) / 24
"""

from __future__ import annotations

from typing import Callable, Sequence

from .kernel import Kernel


def weighted_sum(ks: Sequence[Kernel], weights: Sequence[float], is_gaussian: bool) -> Kernel:
    """The kernels' weighted sum, field by field (NTK None if any has none), with ``ks[0]``'s
    shapes and flags."""
    total = lambda xs: sum(w * x for w, x in zip(weights, xs))
    ntks = [k.ntk for k in ks]
    return ks[0].replace(nngp=total([k.nngp for k in ks]), cov1=total([k.cov1 for k in ks]),
                         cov2=total([k.cov2 for k in ks]),
                         ntk=None if any(t is None for t in ntks) else total(ntks),
                         is_gaussian=is_gaussian)


def per_block(k: Kernel, rule: Callable[[Kernel], Kernel]) -> Kernel:
    """The kernel of an elementwise function of a concatenation along channels (``k.blocks``):
    ``rule`` on each block, weighted by its share of the channels (exact whatever the blocks'
    correlation: a function of each channel alone, averaged over channels). Not Gaussian."""
    shares = [b.shape1[k.channel_axis] / k.shape1[k.channel_axis] for b in k.blocks]
    out = weighted_sum([rule(b) for b in k.blocks], shares, False)
    return out.replace(shape1=k.shape1, shape2=k.shape2)
