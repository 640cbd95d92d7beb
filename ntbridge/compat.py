"""Every private torch and JAX API ntbridge uses, each behind one function here.

Neither library promises these names; ``tests/test_compat.py`` checks each one (that it exists,
with the signature or behaviour used), so a release that moves one fails there first, by name.

Example:
    >>> distributed_client()            # None outside a jax.distributed job
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

CLIENT_METHODS = ("wait_at_barrier", "key_value_set_bytes", "blocking_key_value_get_bytes",
                  "key_value_delete")


def distributed_client() -> Any | None:
    """The key-value store and barriers of the running ``jax.distributed`` job (JAX offers them
    through ``jax._src.distributed.global_state.client`` only), or None where there is none."""
    from jax._src import distributed

    return getattr(getattr(distributed, "global_state", None), "client", None)


def initialize_lapack() -> None:
    """Load JAX's LAPACK kernels (``jax._src.lax.linalg.initialize_lapack``), as lowering a
    linear-algebra op does: a program loaded from disk that calls them needs them."""
    from jax._src.lax import linalg

    linalg.initialize_lapack()


def is_op_overload(target: Any) -> bool:
    """Whether an fx node's target is one overload of an ATen operator (``torch._ops.OpOverload``,
    e.g. ``torch.ops.aten.add.Tensor``; its ``overloadpacket`` is ``torch.ops.aten.add``)."""
    return isinstance(target, torch._ops.OpOverload)


def tree_leaves(tree: Any) -> list:
    """The leaves of a pytree of torch's containers (``torch.utils._pytree.tree_leaves``)."""
    from torch.utils import _pytree

    return _pytree.tree_leaves(tree)


def tree_map(fn: Callable, tree: Any, *rests: Any) -> Any:
    """``tree`` with ``fn`` applied to each leaf and the leaves at the same place in ``rests``
    (trees of ``tree``'s structure): ``torch.utils._pytree.tree_map``."""
    from torch.utils import _pytree

    return _pytree.tree_map(fn, tree, *rests)


def same_embed_dim(module: nn.MultiheadAttention) -> bool:
    """Whether the attention's keys and values have its queries' width (``kdim == vdim ==
    embed_dim``, torch's ``_qkv_same_embed_dim``): self-attention's packed projection."""
    return module._qkv_same_embed_dim


def reset_function(module: nn.Module) -> Callable[[], None] | None:
    """The function re-initialising ``module``'s own parameters in place: ``reset_parameters``,
    or torch's private ``_reset_parameters`` of ``nn.MultiheadAttention`` (it has no public one);
    None where there is neither."""
    reset = getattr(module, "reset_parameters", None)
    if reset is None and isinstance(module, nn.MultiheadAttention):
        reset = module._reset_parameters
    return reset if callable(reset) else None
