"""A network's parameter leaves and their groups (the layer owning each, for ``by_layer``)."""

from __future__ import annotations

import functools
from typing import Callable

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


def sum_groups(parts: dict[str, list[jax.Array]], by_layer: bool):
    groups = {name: functools.reduce(jnp.add, values) for name, values in parts.items()}
    return groups if by_layer else functools.reduce(jnp.add, groups.values())
