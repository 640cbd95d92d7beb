"""Weights used at two places of a model: the same module twice, one parameter in two modules
(tied input and output embeddings), or copies of one module holding equal weights.

Weights used twice are jointly Gaussian at both places, so the kernel is not that of independent
layers; the analytic kernels have that rule for ``nn.TransformerEncoder``'s layers
(:mod:`ntbridge.stax.tied`) and refuse the other cases rather than compute the kernel of another
network. ``shared_weights="independent"`` asks for the kernel of independently drawn weights.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ..errors import UnsupportedLayerError
from .graph import Node


def looks_random(t: torch.Tensor) -> bool:
    """Whether ``t`` looks drawn at random: data (not on the meta device), more than one entry,
    not all equal (LayerNorm's ones and zero biases are the same in every copy without being
    shared)."""
    flat = t.detach().flatten()
    return not t.is_meta and flat.numel() > 1 and bool((flat != flat[0]).any())


def _fingerprint(t: torch.Tensor) -> tuple:
    flat = t.detach().flatten()
    return tuple(t.shape), t.dtype, tuple(flat[:8].tolist())


# Why tied input and output embeddings are refused, whatever the rules: their kernel has no limit.
TIED_EMBEDDINGS = (
    "Tied input and output embeddings have no infinite-width kernel: where the stream carries a "
    "token's own embedding row to the output (a residual network), that token's logit has a mean "
    "of order width, sqrt(width) times the other logits' spread (docs/transformers.md, 'Tied "
    "embeddings').")


def _found(node: Node, first: Node, how: str) -> UnsupportedLayerError:
    tied = how.startswith("the same parameter") and (
        isinstance(node.module, nn.Embedding) != isinstance(first.module, nn.Embedding))
    return UnsupportedLayerError(
        f"{node.where} uses the weights of {first.where} ({how}). Weights used at two places are "
        f"correlated there, which the analytic kernels have a rule for only between the layers of "
        f"an nn.TransformerEncoder; computing the kernel of independent weights would describe "
        f"another network. {TIED_EMBEDDINGS + ' ' if tied else ''}Pass "
        f"shared_weights='independent' if that network is what you want (e.g. copies you "
        f"re-initialise), give each place its own module, or use ntbridge.empirical_ntk (this "
        f"model's own kernel).")


def check_reuse(nodes: list[Node]) -> None:
    """Raise UnsupportedLayerError naming the two modules if the nodes use weights twice (module
    doc): one module at two nodes, one parameter in two modules, or equal random weights."""
    modules: dict[int, Node] = {}
    tensors: dict[int, Node] = {}
    values: dict[tuple, list[tuple[torch.Tensor, Node]]] = {}
    for node in nodes:
        if id(node.module) in modules and next(node.module.parameters(), None) is not None:
            raise _found(node, modules[id(node.module)], "the same module, called twice")
        modules[id(node.module)] = node
        for name, p in node.module.named_parameters():
            if id(p) in tensors:
                raise _found(node, tensors[id(p)], f"the same parameter, its '{name}'")
            tensors[id(p)] = node
            if not looks_random(p):
                continue
            same = values.setdefault(_fingerprint(p), [])
            for q, other in same:
                if other is not node and torch.equal(p, q):
                    raise _found(node, other, f"equal values of '{name}', as copies of one "
                                              f"module hold until trained")
            same.append((p, node))


def copies(layers: Sequence[nn.Module]) -> set[bool]:
    """For every random parameter (:func:`looks_random`) of ``layers[1:]``, whether it equals the
    first layer's: ``{True}`` for copies of one layer (``nn.TransformerEncoder``'s, until trained),
    ``{False}`` for independent layers, both for a mix (empty for fewer than two layers)."""
    first = dict(layers[0].named_parameters())
    return {bool(torch.equal(p, dict(layer.named_parameters())[k]))
            for layer in layers[1:] for k, p in first.items() if looks_random(p)}


def children(module: nn.Sequential) -> list[tuple[str, nn.Module]]:
    """The children of ``module`` by name, a child listed twice included (``named_children``
    lists it once)."""
    return [(name, m) for name, m in module.named_modules(remove_duplicate=False)
            if name and "." not in name]
