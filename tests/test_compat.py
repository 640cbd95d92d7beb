"""The private torch and JAX APIs of ntbridge.compat: each test fails as soon as a release moves
one or changes what ntbridge relies on, before any computation that uses it does."""

import inspect

import torch
from torch import nn

from ntbridge import compat


def test_the_key_value_store_is_where_ntbridge_reads_it():
    """JAX offers jax.distributed's key-value store through a private module only."""
    from jax._src import distributed
    from jax._src.lib import _jax

    assert hasattr(distributed.global_state, "client")
    assert compat.distributed_client() is distributed.global_state.client  # None: no job here
    missing = [m for m in compat.CLIENT_METHODS if not hasattr(_jax.DistributedRuntimeClient, m)]
    assert not missing


def test_lapack_initialisation_takes_no_arguments_and_runs():
    from jax._src.lax import linalg

    assert not any(p.default is p.empty for p in inspect.signature(
        linalg.initialize_lapack).parameters.values())
    compat.initialize_lapack()


def test_aten_overloads_are_op_overloads_of_their_packet():
    add = torch.ops.aten.add
    assert compat.is_op_overload(add.Tensor) and add.Tensor.overloadpacket is add
    assert not compat.is_op_overload(add) and not compat.is_op_overload(torch.add)


def test_pytree_leaves_and_map_of_torch_containers():
    tree = {"a": (torch.ones(1), [2.0, None]), "b": torch.zeros(2)}
    assert [type(x) for x in compat.tree_leaves(tree)] == [torch.Tensor, float, type(None),
                                                           torch.Tensor]
    doubled = compat.tree_map(lambda x, y: x + y, (1, [2, 3]), (10, [20, 30]))
    assert doubled == (11, [22, 33])


def test_attention_knows_whether_keys_and_values_have_the_embedding_width():
    assert compat.same_embed_dim(nn.MultiheadAttention(8, 2))
    assert not compat.same_embed_dim(nn.MultiheadAttention(8, 2, kdim=4, vdim=4))


def test_multihead_attention_resets_through_its_private_function():
    torch.manual_seed(0)
    attention = nn.MultiheadAttention(8, 2)
    assert not hasattr(attention, "reset_parameters")
    reset = compat.reset_function(attention)
    assert reset is not None and not inspect.signature(reset).parameters
    before = attention.in_proj_weight.detach().clone()
    reset()
    assert not torch.equal(before, attention.in_proj_weight)
    linear = nn.Linear(2, 2)
    assert compat.reset_function(linear) == linear.reset_parameters
    assert compat.reset_function(nn.ReLU()) is None
