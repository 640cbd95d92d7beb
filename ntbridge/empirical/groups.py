"""A network's parameter leaves, their groups (the layer owning each, for ``by_layer``), and
``apply_fn`` restricted to some leaves."""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp


def group_of(model) -> Callable[[tuple], str]:
    """Names the group (layer) of a parameter leaf from its pytree path.

    A ``Graph``: the qualified name of the module owning the parameter. A bare ``apply_fn``: the
    top-level key (or index) of the params pytree.
    """
    owners = {n.key(p): n.owner(p) for n in getattr(model, "layers", None) or ()
              for p in n.param_names}

    def group(path):
        top = path[0]
        name = str(getattr(top, "key", getattr(top, "idx", getattr(top, "name", top))))
        return owners.get(name, name)

    return group


def leaf_paths(params) -> list[tuple]:
    """The pytree path of each leaf of ``params``, in ``jax.tree.leaves`` order."""
    return [path for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]


def restrict(apply_fn, params, keep: Sequence[int]):
    """``(fn(sub, x), sub)``: ``apply_fn`` as a function of the leaves ``keep`` only."""
    leaves, treedef = jax.tree.flatten(params)

    def fn(sub, x):
        full = list(leaves)
        for i, v in zip(keep, sub):
            full[i] = v
        return apply_fn(jax.tree.unflatten(treedef, full), x)

    return fn, [leaves[i] for i in keep]


def sum_groups(parts: dict[str, list[jax.Array]], by_layer: bool):
    groups = {name: functools.reduce(jnp.add, values) for name, values in parts.items()}
    return groups if by_layer else functools.reduce(jnp.add, groups.values())
